"""TimerActor: deadline order, cancel, replace, periodic, dead targets; time moved by ManualClock only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from riffle_actors.runtime import (
    Actor,
    ActorRef,
    ActorSystem,
    Cancel,
    FireDue,
    ManualClock,
    Schedule,
    ScheduleEvery,
    SystemClock,
    TimerActor,
)

Poll = Callable[[Callable[[], bool]], Awaitable[None]]

pytestmark = pytest.mark.asyncio


class Sink(Actor):
    def __init__(self) -> None:
        self.got: list[Any] = []

    def receive(self, msg: Any) -> Any:
        if msg == "get":
            return list(self.got)
        self.got.append(msg)
        return None


async def setup(system: ActorSystem) -> tuple[ActorRef, ActorRef, Sink]:
    timer = await system.spawn(TimerActor(), name="timer")
    sink = Sink()
    return timer, await system.spawn(sink, name="sink"), sink


async def received(sink_ref: ActorRef) -> list[Any]:
    return await sink_ref.ask("get")  # FIFO: everything told before this ask has been processed


async def test_fires_in_deadline_order(system: ActorSystem, clock: ManualClock) -> None:
    timer, sink_ref, _ = await setup(system)
    now = clock.monotonic()
    for key, offset in [("c", 30), ("a", 10), ("b", 20), ("a2", 10), ("d", 40)]:
        await timer.ask(Schedule(key, now + offset, sink_ref, key))
    assert await timer.ask(FireDue()) == 5  # entries still scheduled
    clock.advance(9.9)
    assert await timer.ask(FireDue()) == 5
    assert await received(sink_ref) == []
    clock.advance(25)
    assert await timer.ask(FireDue()) == 1
    assert await received(sink_ref) == ["a", "a2", "b", "c"]  # equal deadlines keep scheduling order


async def test_clock_advance_wakes_the_timer_without_fire_due(system: ActorSystem, clock: ManualClock,
                                                              poll: Poll) -> None:
    timer, sink_ref, sink = await setup(system)
    await timer.ask(Schedule("k", clock.monotonic() + 5, sink_ref, "ping"))
    assert clock.pending() == 1  # one armed wake-up for the earliest deadline, not one per entry
    clock.advance(5)
    await poll(lambda: sink.got == ["ping"])


async def test_one_clock_handle_for_many_entries(system: ActorSystem, clock: ManualClock) -> None:
    timer, sink_ref, _ = await setup(system)
    for i in range(1000):
        await timer.ask(Schedule(i, clock.monotonic() + 1000 - i, sink_ref, i))
    assert clock.pending() == 1
    clock.advance(1000)
    assert await timer.ask(FireDue()) == 0
    assert await received(sink_ref) == list(range(999, -1, -1))


async def test_cancel_and_replace(system: ActorSystem, clock: ManualClock) -> None:
    timer, sink_ref, _ = await setup(system)
    now = clock.monotonic()
    await timer.ask(Schedule("x", now + 1, sink_ref, "x"))
    await timer.ask(Schedule("y", now + 2, sink_ref, "y"))
    await timer.ask(Schedule("y", now + 3, sink_ref, "y-replaced"))
    assert await timer.ask(Cancel("x")) is True
    assert await timer.ask(Cancel("x")) is False
    clock.advance(2.5)
    assert await timer.ask(FireDue()) == 1
    assert await received(sink_ref) == []
    clock.advance(1)
    assert await timer.ask(FireDue()) == 0
    assert await received(sink_ref) == ["y-replaced"]
    assert clock.pending() == 0


async def test_past_deadline_fires_at_once(system: ActorSystem, clock: ManualClock) -> None:
    timer, sink_ref, _ = await setup(system)
    await timer.ask(Schedule("late", clock.monotonic() - 1, sink_ref, "late"))
    assert await received(sink_ref) == ["late"]


async def test_periodic(system: ActorSystem, clock: ManualClock) -> None:
    timer, sink_ref, _ = await setup(system)
    await timer.ask(ScheduleEvery("hb", 10, sink_ref, "tick", first_delay_s=1))
    clock.advance(1)
    await timer.ask(FireDue())
    assert await received(sink_ref) == ["tick"]
    clock.advance(10)
    await timer.ask(FireDue())
    assert await received(sink_ref) == ["tick"] * 2
    clock.advance(35)  # three periods missed: one coalesced fire, then back on the grid
    await timer.ask(FireDue())
    assert await received(sink_ref) == ["tick"] * 3
    clock.advance(4)  # grid: 1, 11, 21, 31, 41, 51 -> next due at 51 (now 50)
    await timer.ask(FireDue())
    assert await received(sink_ref) == ["tick"] * 3
    clock.advance(1)
    await timer.ask(FireDue())
    assert await received(sink_ref) == ["tick"] * 4
    assert await timer.ask(Cancel("hb")) is True
    clock.advance(100)
    assert await timer.ask(FireDue()) == 0
    assert await received(sink_ref) == ["tick"] * 4
    with pytest.raises(ValueError):
        await timer.ask(ScheduleEvery("bad", 0, sink_ref, "x"))


async def test_dead_target_drops_its_entries(system: ActorSystem, clock: ManualClock) -> None:
    timer, sink_ref, _ = await setup(system)
    await timer.ask(ScheduleEvery("hb", 1, sink_ref, "tick"))
    await sink_ref.stop()
    clock.advance(1)
    assert await timer.ask(FireDue()) == 0  # the periodic entry was dropped, not rescheduled
    assert await timer.ask(Cancel("hb")) is False
    assert timer.is_alive


async def test_system_clock_wakes_early_for_an_earlier_deadline(poll: Poll) -> None:
    system = ActorSystem(clock=SystemClock())
    try:
        timer, sink_ref, sink = await setup(system)
        now = system.clock.monotonic()
        await timer.ask(Schedule("far", now + 3600, sink_ref, "far"))
        await timer.ask(Schedule("near", now + 0.005, sink_ref, "near"))  # re-arms the single timer
        await poll(lambda: sink.got == ["near"], timeout=5)
    finally:
        await system.stop_all()


async def test_entries_survive_a_crash_of_the_timer(system: ActorSystem, clock: ManualClock, poll: Poll) -> None:
    from riffle_actors.runtime import ChildSpec, TimerTable

    table = TimerTable()
    timer = await system.start_child(None, ChildSpec("timer", lambda: TimerActor(clock, table)))
    sink = Sink()
    sink_ref = await system.spawn(sink, name="sink")
    now = clock.monotonic()
    await timer.ask(Schedule("once", now + 10, sink_ref, "once"))
    await timer.ask(ScheduleEvery("every", 4.0, sink_ref, "tick"))
    timer.crash(RuntimeError("bug in the timer"))
    await poll(lambda: timer.statistics().restarts == 1 and timer.statistics().state == "running")
    assert len(table) == 2
    clock.advance(4)  # the new incarnation armed the wake-up again
    await poll(lambda: sink.got == ["tick"])
    timer.crash(RuntimeError("again"))
    clock.advance(8)  # due while no incarnation runs: fired when the next one starts, the grid kept
    await poll(lambda: timer.statistics().restarts == 2 and timer.statistics().state == "running")
    assert await timer.ask(FireDue()) == 1
    assert await received(sink_ref) == ["tick", "tick", "once"]
    clock.advance(3.9)
    assert await timer.ask(FireDue()) == 1 and await received(sink_ref) == ["tick", "tick", "once"]
    clock.advance(0.1)  # 16 s after the start: on the 4 s grid
    assert await timer.ask(FireDue()) == 1 and (await received(sink_ref))[-1] == "tick"
