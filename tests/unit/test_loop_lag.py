"""LoopLagMonitor and its gauge ``riffle_server_event_loop_lag_seconds``, on a fake loop (no real time)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from riffle_actors.metrics import LoopLagMonitor, Metrics


class FakeHandle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """``time()`` and ``call_at()`` only: the test runs the due timer itself, as late as it likes."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timer: tuple[float, Callable[[], None], FakeHandle] | None = None

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle()
        self.timer = (when, callback, handle)
        return handle

    def fire(self, late_by: float) -> None:
        assert self.timer is not None
        when, callback, handle = self.timer
        assert not handle.cancelled
        self.now = when + late_by
        callback()


def lag_gauge(metrics: Metrics) -> float:
    text = metrics.render().decode()
    [line] = [ln for ln in text.splitlines() if ln.startswith("riffle_server_event_loop_lag_seconds ")]
    return float(line.split()[1])


def test_the_worst_lateness_since_the_last_read_is_reported_then_reset() -> None:
    loop = FakeLoop()
    monitor = LoopLagMonitor(period_s=0.01)
    monitor.start(loop)  # type: ignore[arg-type]
    assert loop.timer is not None and loop.timer[0] == pytest.approx(100.01)
    loop.fire(0.002)
    loop.fire(0.250)  # a stall
    loop.fire(0.001)
    assert loop.timer[0] == pytest.approx(loop.now + 0.01)  # the next one is due a period after this one ran
    assert monitor.take_max() == pytest.approx(0.250)
    assert monitor.take_max() == 0.0  # reset by the read
    loop.fire(0.0)
    loop.now += 0.7  # stalled right now, the timer is overdue: that counts too
    assert monitor.take_max() == pytest.approx(0.69)
    monitor.stop()
    assert loop.timer[2].cancelled


def test_the_gauge_is_exported_and_each_scrape_starts_a_new_window() -> None:
    metrics = Metrics()
    loop = FakeLoop()
    metrics.loop_lag.start(loop)  # type: ignore[arg-type]
    loop.fire(0.125)
    assert lag_gauge(metrics) == pytest.approx(0.125)
    assert lag_gauge(metrics) == 0.0
    metrics.loop_lag.stop()
    assert lag_gauge(Metrics()) == 0.0  # never started


def test_an_idle_server_wakes_once_a_second_for_it_and_a_busy_one_every_period() -> None:
    """Idle is free: without apps (after the linger), the timer runs at ``idle_period_s``."""
    loop = FakeLoop()
    busy = [True]
    monitor = LoopLagMonitor(period_s=0.01, idle_period_s=1.0, linger_s=5.0, busy=lambda: busy[0])
    monitor.start(loop)  # type: ignore[arg-type]
    assert loop.timer is not None and loop.timer[0] == pytest.approx(100.01)
    busy[0] = False
    loop.fire(0.0)
    assert loop.timer[0] == pytest.approx(loop.now + 0.01)  # lingering: the last app may still be purging
    while loop.now < 105.0:
        loop.fire(0.0)
    ticks = monitor.ticks
    loop.fire(0.0)
    assert loop.timer[0] == pytest.approx(loop.now + 1.0)  # idle: once a second
    for _ in range(10):
        loop.fire(0.0)
    assert monitor.ticks == ticks + 11
    loop.fire(0.3)  # a late idle tick is still measured against its due time
    assert monitor.take_max() == pytest.approx(0.3)
    busy[0] = True  # an app registered: the next timer is a period away again
    loop.fire(0.0)
    assert loop.timer[0] == pytest.approx(loop.now + 0.01)
