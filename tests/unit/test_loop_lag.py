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
