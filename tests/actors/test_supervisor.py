"""Supervision: restart policies, stable refs across restarts, restart intensity and escalation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from riffle_actors.runtime import (
    Actor,
    ActorDeadError,
    ActorSystem,
    ChildSpec,
    ChildStartError,
    ManualClock,
    RestartIntensityExceeded,
    RestartPolicy,
    Supervisor,
    Terminated,
)

Poll = Callable[[Callable[[], bool]], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]

pytestmark = pytest.mark.asyncio


class Worker(Actor):
    """Counts messages per incarnation; ``"boom"`` crashes it, ``"count"`` answers the count."""

    instances = 0

    def __init__(self, log: list[str] | None = None) -> None:
        Worker.instances += 1
        self.incarnation = Worker.instances
        self.count = 0
        self.log = log if log is not None else []

    async def on_start(self) -> None:
        self.log.append(f"start {self.incarnation}")

    async def on_stop(self) -> None:
        self.log.append(f"stop {self.incarnation}")

    def receive(self, msg: Any) -> Any:
        if msg == "boom":
            raise RuntimeError("boom")
        if msg == "count":
            return (self.incarnation, self.count)
        self.count += 1
        return None


class Watcher(Actor):
    def __init__(self) -> None:
        self.terminated: list[Terminated] = []

    def receive(self, msg: Any) -> None:
        self.terminated.append(msg)


async def crash(ref: Any) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        await ref.ask("boom")


async def test_restart_keeps_the_ref_and_counts_restarts(system: ActorSystem, poll: Poll) -> None:
    log: list[str] = []
    ref = await system.start_child(None, ChildSpec("w", lambda: Worker(log)))
    first, _ = await ref.ask("count")
    await ref.tell("x")
    await crash(ref)
    # The ask waits in the mailbox until the new incarnation runs: same ref, fresh state.
    second, count = await ref.ask("count")
    assert second != first and count == 0
    assert ref.statistics().restarts == 1 and ref.statistics().state == "running"
    assert log == [f"start {first}", f"stop {first}", f"start {second}"]
    assert system.children() == {"w": ref}


async def test_permanent_restarts_after_crash_and_after_stop(system: ActorSystem, poll: Poll) -> None:
    ref = await system.start_child(None, ChildSpec("p", Worker, RestartPolicy.PERMANENT))
    await crash(ref)
    await ref.ask("count")
    await ref.stop()
    await poll(lambda: ref.statistics().state == "running")
    assert ref.statistics().restarts == 2 and ref.is_alive


async def test_transient_restarts_only_after_a_crash(system: ActorSystem, poll: Poll) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    ref = await system.start_child(None, ChildSpec("t", Worker, RestartPolicy.TRANSIENT))
    ref.watch(watcher_ref)
    await crash(ref)
    await ref.ask("count")
    assert ref.statistics().restarts == 1 and watcher.terminated == []
    await ref.stop()
    assert not ref.is_alive
    await poll(lambda: watcher.terminated == [Terminated(ref=ref, reason=None)])
    await poll(lambda: system.children() == {})


async def test_temporary_is_never_restarted(system: ActorSystem, poll: Poll) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    ref = await system.start_child(None, ChildSpec("tmp", Worker, RestartPolicy.TEMPORARY))
    ref.watch(watcher_ref)
    await crash(ref)
    await poll(lambda: len(watcher.terminated) == 1)
    assert isinstance(watcher.terminated[0].reason, RuntimeError)
    assert ref.statistics().state == "stopped" and ref.statistics().restarts == 0
    with pytest.raises(ActorDeadError):
        await ref.ask("count")
    await poll(lambda: system.children() == {})
    # The name is free again: an app that comes back gets a new actor.
    again = await system.start_child(None, ChildSpec("tmp", Worker, RestartPolicy.TEMPORARY))
    assert again is not ref and again.is_alive


async def test_stop_child_stops_even_a_permanent_child(system: ActorSystem, settle_loop: Settle) -> None:
    a = await system.start_child(None, ChildSpec("a", Worker))
    b = await system.start_child(None, ChildSpec("b", Worker))
    assert list(system.children()) == ["a", "b"]
    await system.stop_child(None, "a")
    await settle_loop()
    assert not a.is_alive and b.is_alive
    assert system.children() == {"b": b}
    await system.stop_child(None, "unknown")  # no-op


async def test_start_child_errors_do_not_crash_the_supervisor(system: ActorSystem) -> None:
    class BadStart(Worker):
        async def on_start(self) -> None:
            raise OSError("no disk")

    await system.start_child(None, ChildSpec("dup", Worker))
    with pytest.raises(ChildStartError, match="already"):
        await system.start_child(None, ChildSpec("dup", Worker))
    with pytest.raises(ChildStartError) as info:
        await system.start_child(None, ChildSpec("bad", BadStart))
    assert isinstance(info.value.__cause__, OSError)
    assert system.get("bad") is None
    assert system.root.is_alive and list(system.children()) == ["dup"]


async def test_restart_window_uses_the_injected_clock(system: ActorSystem, clock: ManualClock,
                                                      escalations: list[BaseException]) -> None:
    spec = ChildSpec("sup", lambda: Supervisor("sup", max_restarts=2, within_s=10))
    sup = await system.start_child(None, spec)
    ref = await system.start_child(sup, ChildSpec("w", Worker))
    for _ in range(5):  # 5 crashes, but never more than 2 within 10 s
        await crash(ref)
        await ref.ask("count")
        clock.advance(6)
    assert ref.statistics().restarts == 5
    assert sup.statistics().restarts == 0 and escalations == []


async def test_too_many_restarts_escalate_to_the_parent(system: ActorSystem, poll: Poll,
                                                        escalations: list[BaseException]) -> None:
    watcher = Watcher()
    watcher_ref = await system.spawn(watcher)
    spec = ChildSpec("mid", lambda: Supervisor("mid", max_restarts=2, within_s=10), RestartPolicy.TRANSIENT)
    sup = await system.start_child(None, spec)
    ref = await system.start_child(sup, ChildSpec("w", Worker))
    other = await system.start_child(sup, ChildSpec("other", Worker))
    ref.watch(watcher_ref)
    for _ in range(2):
        await crash(ref)
        await ref.ask("count")
    await crash(ref)  # third crash within the window: "mid" gives up
    await poll(lambda: sup.statistics().restarts == 1)  # root restarted "mid" (a fresh, childless one)
    assert not ref.is_alive and not other.is_alive
    assert watcher.terminated[0].ref is ref and isinstance(watcher.terminated[0].reason, RuntimeError)
    assert system.children(sup) == {}
    assert escalations == []


class Flaky(Actor):
    """Starts once, then every later start fails: a child that cannot be brought back."""

    def __init__(self, starts: list[int]) -> None:
        self.starts = starts

    async def on_start(self) -> None:
        self.starts.append(1)
        if len(self.starts) > 1:
            raise OSError("disk gone")

    def receive(self, msg: Any) -> None:
        raise RuntimeError("boom")


async def test_escalation_reaches_on_escalation(clock: ManualClock, poll: Poll) -> None:
    escalations: list[BaseException] = []
    system = ActorSystem(clock=clock, on_escalation=escalations.append, root_max_restarts=1, root_within_s=60)
    starts: list[int] = []
    storage = ChildSpec("storage", lambda: Supervisor("storage", max_restarts=2, within_s=60,
                                                      children=[ChildSpec("disk", lambda: Flaky(starts))]))
    await system.start_child(None, storage)
    disk = system.get("disk")
    assert disk is not None
    with pytest.raises(RuntimeError):
        await disk.ask("write")
    # disk restarts fail -> "storage" gives up -> root restarts it once (its static child fails to
    # start, so the new "storage" fails to start) -> more than 1 root restart -> escalation.
    await poll(lambda: len(escalations) == 1)
    exc = escalations[0]
    assert isinstance(exc, RestartIntensityExceeded) and "'storage'" in str(exc)
    assert not system.root.is_alive
    await system.stop_all()
    assert system.statistics() == []
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_supervisor_restart_brings_back_its_static_children(system: ActorSystem, poll: Poll) -> None:
    static = [ChildSpec("g1", Worker), ChildSpec("g2", Worker)]
    spec = ChildSpec("group", lambda: Supervisor("group", children=static))
    group = await system.start_child(None, spec)
    assert list(system.children(group)) == ["g1", "g2"]
    old = system.children(group)["g1"]
    await old.ask("work")
    old_incarnation, old_count = await old.ask("count")
    assert old_count == 1
    await group.stop()  # PERMANENT: the root restarts it, and it restarts its children
    await poll(lambda: group.statistics().state == "running" and len(system.children(group)) == 2)
    assert not old.is_alive
    new = system.children(group)["g1"]
    assert new is not old and new is system.get("g1") and new.is_alive
    incarnation, count = await new.ask("count")
    assert incarnation > old_incarnation and count == 0  # a fresh Worker built from the static spec


async def test_supervisor_ref_must_be_a_supervisor(system: ActorSystem) -> None:
    worker = await system.spawn(Worker())
    with pytest.raises(TypeError):
        await system.start_child(worker, ChildSpec("x", Worker))
    shared = Worker()
    await system.start_child(None, ChildSpec("once", lambda: shared))
    with pytest.raises(ChildStartError, match="new, never started"):  # factories must build new instances
        await system.start_child(None, ChildSpec("twice", lambda: shared))


async def test_restart_backoff_waits_on_the_clock(system: ActorSystem, clock: ManualClock, poll: Poll,
                                                  settle_loop: Settle) -> None:
    sup = await system.start_child(None, ChildSpec("slow", lambda: Supervisor("slow", restart_backoff_s=1.0)))
    ref = await system.start_child(sup, ChildSpec("w", Worker))
    await crash(ref)
    reply = asyncio.ensure_future(ref.ask("count"))  # queued while the restart is pending
    await settle_loop()
    assert ref.statistics().state == "restarting" and not reply.done()
    clock.advance(1.0)
    await poll(lambda: reply.done())
    assert reply.result()[1] == 0 and ref.statistics().restarts == 1
