"""PeriodicJobActor: a periodic job woken by the TimerActor, runs never overlap, failures logged, stop cancels.

Time moves by ManualClock only; ``timer.ask(FireDue())`` is the barrier after ``clock.advance``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import pytest_asyncio

from riffle_actors.runtime import (
    ActorRef,
    ActorSystem,
    FireDue,
    ManualClock,
    PeriodicJobActor,
    RunJob,
    TimerActor,
    TimerTable,
)

Poll = Callable[[Callable[[], bool]], Awaitable[None]]

pytestmark = pytest.mark.asyncio


@pytest.fixture
def table() -> TimerTable:
    """The timer's entries (its length: how many are scheduled)."""
    return TimerTable()


@pytest.fixture
def scheduled(table: TimerTable) -> Callable[[], int]:
    return lambda: len(table)


@pytest_asyncio.fixture
async def timer(system: ActorSystem, table: TimerTable) -> ActorRef:
    return await system.spawn(TimerActor(table=table), name="timer")


async def test_the_job_runs_at_each_interval_and_only_then(system: ActorSystem, clock: ManualClock,
                                                           poll: Poll, timer: ActorRef, scheduled: Callable[[], int]) -> None:
    runs: list[float] = []

    async def job() -> None:
        runs.append(clock.monotonic())

    await system.spawn(PeriodicJobActor(job, timer=timer, key="j", interval_s=lambda: 10.0), name="job")
    assert await timer.ask(FireDue()) == 1  # scheduled, not run
    clock.advance(9.9)
    await timer.ask(FireDue())
    assert runs == []
    clock.advance(0.1)
    await timer.ask(FireDue())
    await poll(lambda: len(runs) == 1)
    await poll(lambda: scheduled() == 1)  # the next run
    clock.advance(10.0)
    await timer.ask(FireDue())
    await poll(lambda: len(runs) == 2)
    assert runs[1] - runs[0] == pytest.approx(10.0)


async def test_a_first_delay_of_zero_runs_at_once_and_a_changed_interval_applies_next(
        system: ActorSystem, clock: ManualClock, poll: Poll, timer: ActorRef, scheduled: Callable[[], int]) -> None:
    runs: list[float] = []
    interval = [5.0]

    async def job() -> None:
        runs.append(clock.monotonic())

    actor = PeriodicJobActor(job, timer=timer, key="j", interval_s=lambda: interval[0], first_delay_s=0.0)
    await system.spawn(actor, name="job")
    await timer.ask(FireDue())
    await poll(lambda: actor.runs == 1)
    interval[0] = 20.0  # read when the next run is scheduled (after this one)
    await poll(lambda: scheduled() == 1)
    clock.advance(19.0)
    await timer.ask(FireDue())
    assert actor.runs == 1
    clock.advance(1.0)
    await timer.ask(FireDue())
    await poll(lambda: actor.runs == 2)


async def test_runs_never_overlap_and_a_slow_run_delays_the_next(system: ActorSystem, clock: ManualClock,
                                                                  poll: Poll, timer: ActorRef, scheduled: Callable[[], int]) -> None:
    gate = asyncio.Event()
    started = 0

    async def job() -> None:
        nonlocal started
        started += 1
        await gate.wait()

    actor = PeriodicJobActor(job, timer=timer, key="j", interval_s=lambda: 1.0, first_delay_s=0.0)
    ref = await system.spawn(actor, name="job")
    await timer.ask(FireDue())
    await poll(lambda: started == 1)
    assert await timer.ask(FireDue()) == 0  # nothing scheduled while the run goes on
    assert await ref.ask(RunJob()) is False  # a tick during a run does not start a second one
    clock.advance(30.0)
    await timer.ask(FireDue())
    assert started == 1
    gate.set()
    await poll(lambda: actor.runs == 1)
    await poll(lambda: scheduled() == 1)
    clock.advance(1.0)
    await timer.ask(FireDue())
    await poll(lambda: started == 2)


async def test_a_failing_run_is_counted_and_the_job_goes_on(system: ActorSystem, clock: ManualClock,
                                                             poll: Poll, timer: ActorRef, scheduled: Callable[[], int]) -> None:
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("gateway down")

    actor = PeriodicJobActor(job, timer=timer, key="j", interval_s=lambda: 1.0, first_delay_s=0.0)
    ref = await system.spawn(actor, name="job")
    await timer.ask(FireDue())
    await poll(lambda: actor.failures == 1)
    await poll(lambda: scheduled() == 1)
    clock.advance(1.0)
    await timer.ask(FireDue())
    await poll(lambda: actor.runs == 2)
    assert (actor.failures, ref.is_alive) == (1, True)


async def test_stopping_the_job_cancels_its_entry_and_its_run(system: ActorSystem, clock: ManualClock,
                                                              poll: Poll, timer: ActorRef, scheduled: Callable[[], int]) -> None:
    cancelled = asyncio.Event()

    async def job() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    actor = PeriodicJobActor(job, timer=timer, key="j", interval_s=lambda: 1.0)
    ref = await system.spawn(actor, name="job")
    assert await timer.ask(FireDue()) == 1
    await ref.stop()
    assert await timer.ask(FireDue()) == 0  # the entry is gone

    actor2 = PeriodicJobActor(job, timer=timer, key="j2", interval_s=lambda: 1.0, first_delay_s=0.0)
    ref2 = await system.spawn(actor2, name="job2")
    await timer.ask(FireDue())
    await poll(lambda: actor2._running)
    await ref2.stop()
    assert cancelled.is_set()
