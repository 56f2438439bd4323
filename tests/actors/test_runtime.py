"""Actor runtime core: ordering, ask/tell, reply-later, back-pressure, failures, stop, death watch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from riffle_actors.runtime import (
    Actor,
    ActorDeadError,
    ActorRef,
    ActorSystem,
    Forward,
    MailboxFullError,
    MailboxStatistics,
    Terminated,
)

Poll = Callable[[Callable[[], bool]], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]

pytestmark = pytest.mark.asyncio


class Recorder(Actor):
    """Records every message; answers ``"get"`` with the record and ``"boom"`` / ``"oops"`` by raising."""

    expected_errors = (ValueError,)

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.stopped = False

    def receive(self, msg: Any) -> Any:
        if msg == "get":
            return list(self.seen)
        if msg == "oops":
            raise ValueError("expected")
        if msg == "boom":
            raise RuntimeError("unexpected")
        self.seen.append(msg)
        return msg

    async def on_stop(self) -> None:
        self.stopped = True


class Gated(Actor):
    """Async receive that waits for ``gate`` on every message: keeps messages queued on demand."""

    mailbox_size = 2

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.seen: list[Any] = []
        self.active = 0
        self.max_active = 0

    async def receive(self, msg: Any) -> Any:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self.gate.wait()
            if msg == "boom":
                raise RuntimeError("unexpected")
            self.seen.append(msg)
            return msg
        finally:
            self.active -= 1


class Watcher(Actor):
    def __init__(self) -> None:
        self.terminated: list[Terminated] = []

    def receive(self, msg: Any) -> None:
        if isinstance(msg, Terminated):
            self.terminated.append(msg)


async def test_tell_and_ask_keep_fifo_order(system: ActorSystem) -> None:
    ref = await system.spawn(Recorder(), name="rec")
    for i in range(50):
        await ref.tell(i)
    assert await ref.ask("x") == "x"
    ref.tell_nowait(50)
    assert await ref.ask("get") == [*range(50), "x", 50]
    assert ref.name == "rec" and ref.is_alive and system.get("rec") is ref


async def test_async_receive_processes_one_message_at_a_time(system: ActorSystem) -> None:
    gate = asyncio.Event()
    gate.set()
    actor = Gated(gate)
    ref = await system.spawn(actor)
    results = await asyncio.gather(*(ref.ask(i) for i in range(10)))
    assert results == list(range(10))
    assert actor.seen == list(range(10))
    assert actor.max_active == 1


class IoActor(Actor):
    """``"io"`` replies later with a future the test resolves; ``"coro"`` replies later with a coroutine."""

    expected_errors = (ValueError,)

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[Any]] = []

    def receive(self, msg: Any) -> Any:
        if msg == "io":
            fut = asyncio.get_running_loop().create_future()
            self.pending.append(fut)
            return fut
        if msg == "coro":
            return self._later(1)
        if msg == "coro-fail":
            return self._later(0)
        return ("pong", msg)

    async def _later(self, value: int) -> int:
        await asyncio.sleep(0)
        if not value:
            raise ValueError("io failed")
        return value


async def test_reply_later_future_does_not_block_the_mailbox(system: ActorSystem, poll: Poll) -> None:
    actor = IoActor()
    ref = await system.spawn(actor)
    io_reply = asyncio.ensure_future(ref.ask("io"))
    await poll(lambda: len(actor.pending) == 1)
    assert await ref.ask("ping") == ("pong", "ping")  # answered while the IO is still pending
    assert not io_reply.done()
    actor.pending[0].set_result(b"data")
    assert await io_reply == b"data"
    assert await ref.ask("coro") == 1
    with pytest.raises(ValueError, match="io failed"):  # expected: to the asker, actor keeps running
        await ref.ask("coro-fail")
    assert ref.is_alive and await ref.ask(2) == ("pong", 2)


async def test_reply_later_pending_on_stop_fails_with_actor_dead(system: ActorSystem, poll: Poll) -> None:
    actor = IoActor()
    ref = await system.spawn(actor)
    io_reply = asyncio.ensure_future(ref.ask("io"))
    await poll(lambda: len(actor.pending) == 1)
    await ref.stop()
    with pytest.raises(ActorDeadError):
        await io_reply
    assert actor.pending[0].cancelled()


async def test_ask_timeout(system: ActorSystem, poll: Poll) -> None:
    actor = IoActor()
    ref = await system.spawn(actor)
    with pytest.raises(TimeoutError):
        await ref.ask("io", timeout=0.01)
    assert await ref.ask("ping", timeout=1) == ("pong", "ping")


async def test_full_mailbox_backpressure(system: ActorSystem, poll: Poll, settle_loop: Settle) -> None:
    gate = asyncio.Event()
    actor = Gated(gate)  # mailbox_size = 2
    ref = await system.spawn(actor)
    await ref.tell("a")
    await poll(lambda: actor.active == 1)  # "a" is being processed, the mailbox is empty
    await ref.tell("b")
    await ref.tell("c")
    assert ref.statistics().depth == 2
    with pytest.raises(MailboxFullError):
        ref.tell_nowait("x")
    blocked = asyncio.ensure_future(ref.tell("d"))
    await settle_loop()
    assert not blocked.done()  # tell waits for space instead of growing the mailbox
    gate.set()
    await blocked
    await poll(lambda: actor.seen == ["a", "b", "c", "d"])


async def test_expected_errors_keep_the_actor_alive(system: ActorSystem) -> None:
    ref = await system.spawn(Recorder())
    with pytest.raises(ValueError, match="expected"):
        await ref.ask("oops")
    await ref.tell("oops")  # on a tell it is only logged
    assert await ref.ask(1) == 1
    assert ref.is_alive and ref.statistics().restarts == 0


async def test_unexpected_error_crashes_and_fails_every_queued_ask(
    system: ActorSystem, poll: Poll, settle_loop: Settle
) -> None:
    gate = asyncio.Event()
    actor = Gated(gate)
    ref = await system.spawn(actor)
    first = asyncio.ensure_future(ref.ask("boom"))
    await poll(lambda: actor.active == 1)
    queued = [asyncio.ensure_future(ref.ask(i)) for i in range(2)]
    await settle_loop()
    gate.set()
    with pytest.raises(RuntimeError, match="unexpected"):
        await first
    for fut in queued:
        with pytest.raises(ActorDeadError) as info:
            await fut
        assert isinstance(info.value.__cause__, RuntimeError)
    await poll(lambda: not ref.is_alive)  # unsupervised: stays dead
    assert ref.statistics().state == "stopped"
    with pytest.raises(ActorDeadError):
        await ref.ask(1)
    with pytest.raises(ActorDeadError):
        ref.tell_nowait(1)
    assert system.get(actor.name) is None


async def test_crash_in_plain_receive_fails_asks_queued_behind_it(system: ActorSystem) -> None:
    ref = await system.spawn(Recorder())
    replies = [asyncio.ensure_future(ref.ask(m)) for m in (1, "boom", 2, 3)]
    done = await asyncio.gather(*replies, return_exceptions=True)
    assert done[0] == 1
    assert isinstance(done[1], RuntimeError)
    assert all(isinstance(e, ActorDeadError) for e in done[2:])


async def test_stop_is_graceful(system: ActorSystem, poll: Poll, settle_loop: Settle) -> None:
    gate = asyncio.Event()
    actor = Gated(gate)
    ref = await system.spawn(actor)
    in_flight = asyncio.ensure_future(ref.ask("a"))
    await poll(lambda: actor.active == 1)
    queued = asyncio.ensure_future(ref.ask("b"))
    await settle_loop()
    await ref.stop()
    for fut in (in_flight, queued):
        with pytest.raises(ActorDeadError):
            await fut
    assert actor.seen == []
    assert ref.statistics().state == "stopped" and not ref.is_alive
    with pytest.raises(ActorDeadError):
        await ref.ask("c")
    with pytest.raises(ActorDeadError):
        await ref.tell("c")
    await ref.stop()  # idempotent


class SelfStopper(Actor):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def receive(self, msg: Any) -> Any:
        self.seen.append(msg)
        if msg == "quit":
            await self.ref.stop()  # from inside: returns at once, takes effect after this message
            return "bye"
        return msg


async def test_stop_from_inside_receive(system: ActorSystem, poll: Poll) -> None:
    actor = SelfStopper()
    ref = await system.spawn(actor)
    replies = [asyncio.ensure_future(ref.ask(m)) for m in ("quit", "after")]
    assert await replies[0] == "bye"
    with pytest.raises(ActorDeadError):
        await replies[1]
    await poll(lambda: not ref.is_alive)
    assert actor.seen == ["quit"]


class PlainSelfStopper(Actor):
    def receive(self, msg: Any) -> Any:
        if msg == "quit":
            self.stop_self()
        return msg


async def test_stop_self_from_a_plain_receive(system: ActorSystem, poll: Poll) -> None:
    ref = await system.spawn(PlainSelfStopper())
    replies = await asyncio.gather(*(ref.ask(m) for m in ("a", "quit", "b")), return_exceptions=True)
    assert replies[:2] == ["a", "quit"] and isinstance(replies[2], ActorDeadError)
    await poll(lambda: not ref.is_alive)


class Spawner(Actor):
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []
        self.release = asyncio.Event()

    def receive(self, msg: Any) -> Any:
        if msg == "sleep":
            self.tasks.append(self.spawn(asyncio.Event().wait()))
        elif msg == "fail-later":
            self.tasks.append(self.spawn(self._fail()))
        return len(self.tasks)

    async def _fail(self) -> None:
        await self.release.wait()
        raise OSError("background failure")


async def test_spawned_task_crash_crashes_the_actor(system: ActorSystem, poll: Poll) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    actor = Spawner()
    ref = await system.spawn(actor)
    ref.watch(watcher_ref)
    await ref.ask("sleep")
    await ref.ask("fail-later")
    actor.release.set()
    await poll(lambda: len(watcher.terminated) == 1)
    term = watcher.terminated[0]
    assert term.ref is ref and isinstance(term.reason, OSError)
    assert actor.tasks[0].cancelled()  # its sibling background task was cancelled
    assert not ref.is_alive


async def test_spawned_tasks_are_cancelled_on_stop(system: ActorSystem) -> None:
    actor = Spawner()
    ref = await system.spawn(actor)
    await ref.ask("sleep")
    await ref.stop()
    assert actor.tasks[0].cancelled()
    with pytest.raises(ActorDeadError):
        actor.spawn(asyncio.sleep(0))


async def test_death_watch(system: ActorSystem, poll: Poll, settle_loop: Settle) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    target = await system.spawn(Recorder())
    target.watch(watcher_ref)
    target.watch(watcher_ref)  # watching twice notifies once
    await target.stop()
    await poll(lambda: len(watcher.terminated) == 1)
    assert watcher.terminated[0] == Terminated(ref=target, reason=None)
    target.watch(watcher_ref)  # already dead: notified at once
    await poll(lambda: len(watcher.terminated) == 2)
    other = await system.spawn(Recorder())
    other.watch(watcher_ref)
    other.unwatch(watcher_ref)
    await other.stop()
    await settle_loop()
    assert len(watcher.terminated) == 2


async def test_tell_threadsafe(system: ActorSystem, poll: Poll) -> None:
    actor = Recorder()
    ref = await system.spawn(actor)
    thread = threading.Thread(target=lambda: [ref.tell_threadsafe(i) for i in range(1000)])
    thread.start()
    await poll(lambda: len(actor.seen) == 1000)
    thread.join()
    assert actor.seen == list(range(1000))


async def test_statistics(system: ActorSystem) -> None:
    ref = await system.spawn(Recorder(), name="stats")
    for i in range(5):
        ref.tell_nowait(i)
    assert ref.statistics() == MailboxStatistics(
        name="stats", depth=5, capacity=10_000, processed=0, restarts=0, state="running"
    )
    await ref.ask("get")
    stats = ref.statistics()
    assert (stats.depth, stats.processed) == (0, 6)
    assert [s.name for s in system.statistics()] == ["stats"]


class FailingStart(Actor):
    async def on_start(self) -> None:
        raise RuntimeError("cannot open")

    def receive(self, msg: Any) -> None:
        pass


async def test_failed_on_start_is_raised_to_spawn_and_frees_the_name(system: ActorSystem) -> None:
    with pytest.raises(RuntimeError, match="cannot open"):
        await system.spawn(FailingStart(), name="x")
    assert system.get("x") is None
    ref = await system.spawn(Recorder(), name="x")
    with pytest.raises(ValueError, match="already in use"):
        await system.spawn(Recorder(), name="x")
    assert ref.is_alive


async def test_stop_all_fails_pending_asks_and_leaves_no_tasks(clock: Any, settle_loop: Settle) -> None:
    system = ActorSystem(clock=clock)
    gate = asyncio.Event()
    gated = await system.spawn(Gated(gate))
    spawner = await system.spawn(Spawner())
    await spawner.ask("sleep")
    recorder = await system.spawn(Recorder())
    for i in range(3):
        recorder.tell_nowait(i)
    pending = [asyncio.ensure_future(gated.ask("blocked")), asyncio.ensure_future(gated.ask("blocked"))]
    await settle_loop()
    await system.stop_all()
    for fut in pending:
        with pytest.raises(ActorDeadError):
            await fut
    for ref in (gated, spawner, recorder):
        assert not ref.is_alive
    await settle_loop()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert system.statistics() == []


async def test_actor_ref_is_a_stable_identity(system: ActorSystem) -> None:
    ref: ActorRef = await system.spawn(Recorder(), name="id")
    assert {ref: 1}[system.get("id")] == 1  # type: ignore[index]
    assert "id" in repr(ref)


class Forwarder(Actor):
    """Hands every message on to ``target`` (as ``("fwd", msg)`` so the target's record shows the hop)."""

    def __init__(self, target: ActorRef) -> None:
        self.target = target
        self.handled = 0

    def receive(self, msg: Any) -> Any:
        self.handled += 1
        if msg == "self":
            return "here"
        return Forward(self.target, msg)


async def test_a_forwarded_ask_is_answered_by_the_second_actor_and_its_failure_is_the_askers(
        system: ActorSystem) -> None:
    rec = Recorder()
    target = await system.spawn(rec, "target")
    fwd = Forwarder(target)
    front = await system.spawn(fwd, "front")
    assert await front.ask("a") == "a"  # answered by the Recorder
    await front.tell("b")  # a tell stays a tell
    assert await front.ask("get") == ["a", "b"]
    with pytest.raises(ValueError, match="expected"):
        await front.ask("oops")
    with pytest.raises(RuntimeError, match="unexpected"):  # the target crashes on it, not the forwarder
        await front.ask("boom")
    assert front.is_alive and not target.is_alive
    with pytest.raises(ActorDeadError):  # the target's mailbox is closed: the reply fails at once
        await front.ask("c")
    assert await front.ask("self") == "here" and fwd.handled == 7


async def test_ask_nowait_returns_the_reply_future_or_refuses_at_once(system: ActorSystem, poll: Poll) -> None:
    gate = asyncio.Event()
    gated = Gated(gate)
    ref = await system.spawn(gated, "gated")  # mailbox of 2
    first = ref.ask_nowait("a")  # taken by the receive, which waits for the gate
    await poll(lambda: gated.active == 1)
    queued = [ref.ask_nowait("b"), ref.ask_nowait("c")]
    with pytest.raises(MailboxFullError):
        ref.ask_nowait("d")
    assert not first.done()
    gate.set()
    assert [await first, *[await f for f in queued]] == ["a", "b", "c"]
    failed = ref.ask_nowait("boom")
    with pytest.raises(RuntimeError, match="unexpected"):
        await failed
    await ref.stop()
    with pytest.raises(ActorDeadError):
        ref.ask_nowait("e")
