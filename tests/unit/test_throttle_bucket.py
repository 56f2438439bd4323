"""The disk throttle's token bucket (riffle_actors.state.throttle) and its thread-side use
(riffle_actors.actors.disk.DiskThrottle), with an injected clock: no loop, no sleeping."""

from __future__ import annotations

import threading

import pytest

from riffle_actors.actors.disk import DiskThrottle
from riffle_actors.config import ServerConfig, riffle_key_notes, validate_config
from riffle_actors.state.throttle import TokenBucket

M = 1 << 20


def test_a_full_bucket_grants_its_burst_at_once_then_the_rate():
    b = TokenBucket(M, now=0.0)
    assert b.acquire(M, 0.0) == 0.0  # one second's worth: the burst
    assert b.acquire(M // 2, 0.0) == pytest.approx(0.5)  # then the rate: half a second for half of it
    assert b.acquire(M // 2, 0.0) == pytest.approx(1.0)  # queued behind the previous caller
    assert b.tokens(0.0) == pytest.approx(-M)


def test_refill_follows_the_rate_and_stops_at_capacity():
    b = TokenBucket(1000, now=10.0)
    assert b.acquire(1000, 10.0) == 0.0
    assert b.tokens(10.25) == pytest.approx(250)
    assert b.acquire(250, 10.25) == 0.0
    assert b.acquire(1, 10.25) == pytest.approx(0.001)
    assert b.tokens(1000.0) == 1000  # a long idle time refills one bucket, no more


def test_zero_elapsed_and_a_clock_going_back_add_nothing():
    b = TokenBucket(1000, now=5.0)
    b.acquire(1000, 5.0)
    assert b.tokens(5.0) == 0
    assert b.tokens(4.0) == 0  # earlier than the last call: no refill (and no negative refill)
    assert b.acquire(100, 4.0) == pytest.approx(0.1)
    assert b.acquire(0, 4.0) == 0.0 and b.acquire(-5, 4.0) == 0.0  # nothing charged


def test_a_request_bigger_than_capacity_waits_for_it_in_full_and_is_never_refused():
    b = TokenBucket(M, now=0.0)
    assert b.acquire(5 * M, 0.0) == pytest.approx(4.0)  # the full bucket, then 4 s for the rest
    # the next caller waits behind it: the long-run rate holds
    assert b.acquire(M, 0.0) == pytest.approx(5.0)
    # an empty bucket: the whole request at the rate
    b2 = TokenBucket(M, now=0.0)
    b2.acquire(M, 0.0)
    assert b2.acquire(3 * M, 0.0) == pytest.approx(3.0)


def test_accounting_matches_bytes_over_rate():
    b = TokenBucket(1000, now=0.0)
    now = 0.0
    waits = []
    for _ in range(50):
        waits.append(b.acquire(300, now))
        now += waits[-1]  # a caller that sleeps what it is told
    assert b.granted == 15_000
    assert b.waited_s == pytest.approx(sum(waits))
    assert now == pytest.approx((15_000 - 1000) / 1000)  # everything beyond the burst at the rate


def test_bad_rates_are_refused():
    with pytest.raises(ValueError):
        TokenBucket(0, now=0.0)
    with pytest.raises(ValueError):
        TokenBucket(10, 0, now=0.0)


class _Clock:
    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        with self.lock:
            self.slept.append(s)


def test_disk_throttle_sleeps_the_wait_and_reports_each_charge():
    clock = _Clock()
    charged: list[tuple[str, int, float]] = []
    t = DiskThrottle(1000, on_charged=lambda op, n, w: charged.append((op, n, w)), clock=clock, sleep=clock.sleep)
    assert t.wait("write", 800) == 0.0
    assert t.wait("read", 700) == pytest.approx(0.5)  # reads and writes share the disk's bucket
    assert t.wait("read", 0) == 0.0
    assert clock.slept == [pytest.approx(0.5)]
    assert charged == [("write", 800, 0.0), ("read", 700, pytest.approx(0.5))]


def test_disk_throttle_from_many_threads_grants_exactly_the_rate():
    clock = _Clock()
    t = DiskThrottle(1000, clock=clock, sleep=clock.sleep)
    threads = [threading.Thread(target=lambda: [t.wait("write", 100) for _ in range(50)]) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.bucket.granted == 20_000
    # the clock stood still: the last grant waits for every byte beyond the burst
    assert max(clock.slept) == pytest.approx((20_000 - 1000) / 1000)


def test_io_limiter_is_a_key_of_ours_no_not_yet_warning():
    cfg = validate_config(ServerConfig, {"localfile_store": {"data_paths": ["/tmp/x"], "io_limiter": {
        "capacity": "1M", "read_enable": False}}})
    assert cfg.localfile_store.io_limiter.capacity == M
    assert cfg.localfile_store.io_limiter.write_enable is True
    assert not [m for _, m in riffle_key_notes(cfg) if "io_limiter" in m]


def test_set_capacity_changes_the_rate_and_burst_from_now_on():
    """A config reload of ``io_limiter.capacity``: what is owed stays owed, the new rate pays it off."""
    clock = _Clock()
    t = DiskThrottle(1000, clock=clock, sleep=clock.sleep)
    assert t.wait("write", 1500) == pytest.approx(0.5)  # 500 owed at 1000/s
    t.set_capacity(250)
    assert t.wait("write", 250) == pytest.approx(3.0)  # 750 owed at 250/s
    t.set_capacity(4000)
    clock.now += 10  # refills to the new burst only
    assert t.bucket.tokens(clock.now) == pytest.approx(4000)
    with pytest.raises(ValueError):
        t.set_capacity(0)
