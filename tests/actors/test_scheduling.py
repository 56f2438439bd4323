"""Scheduling: an actor is on the loop only while it has mail; idle actors cost no task.

Every test waits on conditions (``poll``) and checks "nothing happened" after letting the loop settle;
time only matters for the restart backoff, which runs on the ManualClock of the ``system`` fixture.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from riffle_actors.runtime import (
    Actor,
    ActorDeadError,
    ActorRef,
    ActorSystem,
    ChildSpec,
    MailboxFullError,
    ManualClock,
    Supervisor,
    Terminated,
)
from riffle_actors.runtime.cell import YIELD_EVERY

Poll = Callable[[Callable[[], bool]], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]

pytestmark = pytest.mark.asyncio


def actor_tasks(ref: ActorRef | None = None) -> list[asyncio.Task[Any]]:
    """Unfinished tasks run by the runtime for ``ref`` (for every actor when None), owned tasks excluded."""
    names = {f"actor:{ref.name}"} if ref is not None else None
    return [t for t in asyncio.all_tasks() if not t.done() and t.get_name().startswith("actor:")
            and not t.get_name().endswith((":spawned", ":reply"))
            and (names is None or t.get_name() in names)]


class Recorder(Actor):
    """Plain receive: records messages (in ``log`` when given); ``"boom"`` crashes it."""

    def __init__(self, log: list[Any] | None = None, tag: str = "") -> None:
        self.seen: list[Any] = []
        self.log = log
        self.tag = tag
        self.stops = 0

    def receive(self, msg: Any) -> Any:
        if msg == "boom":
            raise RuntimeError("boom")
        self.seen.append(msg)
        if self.log is not None:
            self.log.append((self.tag, msg))
        return msg

    async def on_stop(self) -> None:
        self.stops += 1


class Gated(Actor):
    """Async receive that waits for ``gate`` on every message."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.seen: list[Any] = []

    async def receive(self, msg: Any) -> Any:
        await self.gate.wait()
        self.seen.append(msg)
        return msg


class Watcher(Actor):
    def __init__(self) -> None:
        self.terminated: list[Terminated] = []

    def receive(self, msg: Any) -> None:
        self.terminated.append(msg)


async def test_an_idle_actor_has_no_task_and_mail_schedules_it(system: ActorSystem, poll: Poll,
                                                                settle_loop: Settle) -> None:
    actor = Recorder()
    ref = await system.spawn(actor, name="idle")
    await settle_loop()
    assert actor_tasks(ref) == []
    ref.tell_nowait(1)
    await poll(lambda: actor.seen == [1])
    await settle_loop()
    assert actor_tasks(ref) == []
    for round_ in range(3):  # idle -> busy -> idle, again and again
        assert await ref.ask(("ask", round_)) == ("ask", round_)
        await settle_loop()
        assert actor_tasks(ref) == []
    assert ref.statistics().processed == 4 and ref.statistics().state == "running"


async def test_an_async_receive_has_a_task_only_while_busy(system: ActorSystem, poll: Poll,
                                                           settle_loop: Settle) -> None:
    gate = asyncio.Event()
    actor = Gated(gate)
    ref = await system.spawn(actor, name="gated")
    await settle_loop()
    assert actor_tasks(ref) == []
    reply = asyncio.ensure_future(ref.ask("a"))
    await poll(lambda: len(actor_tasks(ref)) == 1)
    await settle_loop()
    assert not reply.done()
    gate.set()
    assert await reply == "a"
    await poll(lambda: actor_tasks(ref) == [])
    assert await ref.ask("b") == "b"
    assert actor.seen == ["a", "b"]


async def test_a_busy_actor_yields_to_others_every_n_messages(system: ActorSystem, poll: Poll) -> None:
    log: list[Any] = []
    busy = await system.spawn(Recorder(log, "busy"))
    other = await system.spawn(Recorder(log, "other"))
    for i in range(3 * YIELD_EVERY):
        busy.tell_nowait(i)
    other.tell_nowait("hello")  # scheduled after busy: runs once busy has had one burst
    await poll(lambda: len(log) == 3 * YIELD_EVERY + 1)
    assert log.index(("other", "hello")) == YIELD_EVERY
    assert [m for tag, m in log if tag == "busy"] == list(range(3 * YIELD_EVERY))


async def test_a_crash_after_waking_restarts_with_the_same_ref(system: ActorSystem, poll: Poll,
                                                               settle_loop: Settle) -> None:
    ref = await system.start_child(None, ChildSpec("w", Recorder))
    await settle_loop()
    assert actor_tasks() == []  # the root supervisor and its child are both idle
    with pytest.raises(RuntimeError, match="boom"):
        await ref.ask("boom")
    assert await ref.ask("after") == "after"  # waits for the new incarnation, same ref
    assert ref.statistics().restarts == 1
    await settle_loop()
    assert actor_tasks() == []


class Background(Actor):
    """``"fail-later"`` starts an owned task that fails when ``release`` is set; ``"io"`` replies later."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.pending: list[asyncio.Future[Any]] = []

    def receive(self, msg: Any) -> Any:
        if msg == "fail-later":
            self.spawn(self._fail())
            return "started"
        if msg == "io":
            fut = asyncio.get_running_loop().create_future()
            self.pending.append(fut)
            return fut
        return msg

    async def _fail(self) -> None:
        await self.release.wait()
        raise OSError("background failure")


async def test_a_crash_while_idle_ends_the_incarnation(system: ActorSystem, poll: Poll,
                                                       settle_loop: Settle) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    actor = Background()
    ref = await system.spawn(actor)
    ref.watch(watcher_ref)
    assert await ref.ask("fail-later") == "started"
    await settle_loop()
    assert actor_tasks(ref) == []  # idle: only its owned task is on the loop
    actor.release.set()  # the owned task fails while the actor is idle
    await poll(lambda: len(watcher.terminated) == 1)
    assert isinstance(watcher.terminated[0].reason, OSError)
    assert not ref.is_alive
    with pytest.raises(ActorDeadError):
        await ref.ask("x")


async def test_a_reply_later_failure_while_idle_fails_the_ask_and_crashes(system: ActorSystem,
                                                                          poll: Poll) -> None:
    actor = Background()
    ref = await system.spawn(actor)
    reply = asyncio.ensure_future(ref.ask("io"))
    await poll(lambda: len(actor.pending) == 1)
    assert await ref.ask("ping") == "ping"  # the actor is idle again, the IO still pending
    actor.pending[0].set_exception(RuntimeError("disk gone"))
    with pytest.raises(RuntimeError, match="disk gone"):
        await reply
    await poll(lambda: not ref.is_alive)


async def test_kill_while_idle_restarts_a_supervised_actor(system: ActorSystem, poll: Poll,
                                                           settle_loop: Settle) -> None:
    log: list[Any] = []
    ref = await system.start_child(None, ChildSpec("k", lambda: Recorder(log)))
    await settle_loop()
    ref.crash(RuntimeError("killed"))
    await poll(lambda: ref.statistics().restarts == 1 and ref.statistics().state == "running")
    assert await ref.ask("alive") == "alive"
    assert log == [("", "alive")]


async def test_stop_while_idle_runs_on_stop_and_refuses_later_mail(system: ActorSystem,
                                                                   settle_loop: Settle) -> None:
    actor = Recorder()
    ref = await system.spawn(actor)
    await ref.ask(1)
    await settle_loop()
    await ref.stop()
    assert actor.stops == 1 and ref.statistics().state == "stopped"
    assert actor_tasks(ref) == []
    with pytest.raises(ActorDeadError):
        ref.tell_nowait(2)
    with pytest.raises(ActorDeadError):
        await ref.ask(2)


async def test_stop_before_a_scheduled_actor_runs_processes_nothing_more(system: ActorSystem) -> None:
    actor = Recorder()
    ref = await system.spawn(actor)
    ref.tell_nowait("queued")  # schedules the actor; the loop has not run it yet
    reply = asyncio.ensure_future(ref.ask("asked"))
    await ref.stop()
    assert actor.seen == [] and actor.stops == 1
    with pytest.raises(ActorDeadError):
        await reply


class GatedStops(Gated):
    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__(gate)
        self.stops = 0

    async def on_stop(self) -> None:
        self.stops += 1


async def test_stop_before_a_woken_async_actor_runs_ends_it_cleanly(system: ActorSystem) -> None:
    gate = asyncio.Event()
    gate.set()
    actor = GatedStops(gate)
    ref = await system.spawn(actor)
    ref.tell_nowait("queued")  # makes the actor's task; it has not run a step yet
    await ref.stop()
    assert actor.seen == [] and actor.stops == 1 and ref.statistics().state == "stopped"
    assert actor_tasks(ref) == []


async def test_kill_before_a_woken_async_actor_runs_crashes_it(system: ActorSystem, poll: Poll) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    gate = asyncio.Event()
    gate.set()
    actor = GatedStops(gate)
    ref = await system.spawn(actor)
    ref.watch(watcher_ref)
    ref.tell_nowait("queued")  # makes the actor's task; it has not run a step yet
    ref.crash(RuntimeError("killed"))
    await poll(lambda: len(watcher.terminated) == 1)
    assert isinstance(watcher.terminated[0].reason, RuntimeError) and actor.stops == 1
    assert actor.seen == []
    with pytest.raises(ActorDeadError):
        await ref.ask("after")


async def test_mail_sent_while_a_restart_is_pending_waits_for_the_next_incarnation(
        system: ActorSystem, clock: ManualClock, poll: Poll, settle_loop: Settle) -> None:
    log: list[Any] = []
    sup = await system.start_child(None, ChildSpec("sup", lambda: Supervisor("sup", restart_backoff_s=1.0)))
    ref = await system.start_child(sup, ChildSpec("r", lambda: Recorder(log)))
    with pytest.raises(RuntimeError, match="boom"):
        await ref.ask("boom")
    await poll(lambda: ref.statistics().state == "restarting")
    ref.tell_nowait("early")
    reply = asyncio.ensure_future(ref.ask("asked"))
    await settle_loop()
    assert log == [] and not reply.done()  # nothing runs it while it waits for the backoff
    clock.advance(1.0)
    assert await reply == "asked"
    assert log == [("", "early"), ("", "asked")] and ref.statistics().restarts == 1
    await settle_loop()
    assert actor_tasks() == []


class Small(Recorder):
    mailbox_size = 2


async def test_a_full_mailbox_blocks_senders_until_the_woken_actor_drains_it(
        system: ActorSystem, poll: Poll, settle_loop: Settle) -> None:
    actor = Small()
    ref = await system.spawn(actor)
    for round_ in range(2):  # the second round starts from idle with the blocked-senders queue made
        base = round_ * 10
        ref.tell_nowait(base + 1)
        ref.tell_nowait(base + 2)
        with pytest.raises(MailboxFullError):
            ref.tell_nowait(base + 99)
        blocked = [asyncio.ensure_future(ref.tell(base + 3)), asyncio.ensure_future(ref.ask(base + 4))]
        assert await blocked[1] == base + 4
        await blocked[0]
        assert actor.seen[-4:] == [base + 1, base + 2, base + 3, base + 4]
        await settle_loop()
        assert actor_tasks(ref) == [] and ref.statistics().depth == 0


var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


class ContextReader(Actor):
    def receive(self, msg: Any) -> Any:
        if msg == "set":
            var.set("actor")
        return var.get()


async def test_an_incarnation_keeps_its_own_context_across_wakes(system: ActorSystem,
                                                                 settle_loop: Settle) -> None:
    ref = await system.spawn(ContextReader())
    var.set("sender")  # the sender's context must not leak into the actor
    assert await ref.ask("get") == "unset"
    assert await ref.ask("set") == "actor"
    await settle_loop()
    assert await ref.ask("get") == "actor"  # set in one wake, seen in the next
    assert var.get() == "sender"


async def test_ten_thousand_idle_actors_have_no_task(system: ActorSystem, settle_loop: Settle) -> None:
    sup = await system.start_child(None, ChildSpec("many", lambda: Supervisor("many")))
    refs = [await system.start_child(sup, ChildSpec(f"a{i}", Recorder)) for i in range(10_000)]
    await settle_loop()
    assert actor_tasks() == []
    replies = await asyncio.gather(*(ref.ask(i) for i, ref in enumerate(refs)))
    assert replies == list(range(10_000))
    await settle_loop()
    assert actor_tasks() == []
    assert len(system.statistics()) == 10_000 + 2  # the root, "many" and its children
