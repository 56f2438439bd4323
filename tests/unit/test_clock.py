"""Clock, SystemClock and ManualClock (sync tests; the two loop-bound cases use asyncio.run)."""

from __future__ import annotations

import asyncio
import time

import pytest

from riffle_actors.runtime import Clock, ManualClock, SystemClock


def test_system_clock_reads_real_time() -> None:
    clock: Clock = SystemClock()
    assert abs(clock.time() - time.time()) < 5
    a = clock.monotonic()
    assert clock.monotonic() >= a


def test_manual_clock_moves_only_when_advanced() -> None:
    clock = ManualClock()
    assert clock.monotonic() == 1000.0 and clock.time() == 1000.0
    clock.advance(2.5)
    assert clock.monotonic() == 1002.5 and clock.time() == 1002.5
    wall = ManualClock(start=5.0, wall_start=1_700_000_000.0)
    wall.advance(1)
    assert (wall.monotonic(), wall.time()) == (6.0, 1_700_000_001.0)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_advance_runs_due_callbacks_in_deadline_order() -> None:
    clock = ManualClock(start=0.0)
    fired: list[str] = []
    clock.call_at(3, lambda: fired.append("c"))
    clock.call_at(1, lambda: fired.append("a"))
    clock.call_at(1, lambda: fired.append("a2"))
    clock.call_at(2, lambda: fired.append("b"))
    cancelled = clock.call_at(1.5, lambda: fired.append("never"))
    cancelled.cancel()
    clock.advance(0.5)
    assert fired == []
    clock.advance(1.5)
    assert fired == ["a", "a2", "b"]
    assert clock.pending() == 1
    clock.advance(1)
    assert fired == ["a", "a2", "b", "c"] and clock.pending() == 0


def test_callback_scheduled_during_advance_runs_if_due() -> None:
    clock = ManualClock(start=0.0)
    fired: list[int] = []
    clock.call_at(1, lambda: clock.call_at(2, lambda: fired.append(2)))
    clock.advance(5)
    assert fired == [2]


def test_failing_callback_does_not_stop_the_others() -> None:
    clock = ManualClock(start=0.0)
    fired: list[int] = []
    clock.call_at(1, lambda: 1 / 0)  # type: ignore[func-returns-value]
    clock.call_at(1, lambda: fired.append(1))
    clock.advance(1)
    assert fired == [1]


def test_manual_sleep_wakes_on_advance() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        sleeper = asyncio.ensure_future(clock.sleep(10))
        await asyncio.sleep(0)
        clock.advance(9)
        await asyncio.sleep(0)
        assert not sleeper.done()
        clock.advance(1)
        await asyncio.wait_for(sleeper, 1)
        cancelled = asyncio.ensure_future(clock.sleep(10))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert clock.pending() == 0

    asyncio.run(scenario())


def test_system_clock_call_at_and_sleep() -> None:
    async def scenario() -> None:
        clock = SystemClock()
        fired = asyncio.Event()
        clock.call_at(clock.monotonic() + 0.001, fired.set)
        await asyncio.wait_for(fired.wait(), 5)
        await clock.sleep(0)

    asyncio.run(scenario())
