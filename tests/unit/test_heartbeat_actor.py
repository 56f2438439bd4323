"""HeartbeatActor on a ManualClock, with in-memory coordinator links (no gRPC, no real time).

Covers the timing (first round at start, the next one only when the clock reaches the interval),
the per-coordinator bookkeeping (reachable, sent_ok, failed), the rate-limited warning of a
failing coordinator, a broken snapshot skipping one round, the announcement of a stop and the links
being closed on stop.
The wire encoding is covered by ``tests/integration/test_coordinator.py``.
"""

from __future__ import annotations

import pytest
from loguru import logger

from riffle_actors.actors.heartbeat import (
    AnnounceStopping,
    GetHeartbeatStats,
    HeartbeatAck,
    HeartbeatActor,
    HeartbeatSnapshot,
    SendHeartbeatNow,
)
from riffle_actors.runtime import ActorSystem, ManualClock, TimerActor
from tests.helpers import poll_until

SNAPSHOT = HeartbeatSnapshot(ip="10.0.0.7", grpc_port=19999, used_memory=5)


class FakeLink:
    """A coordinator that answers what ``answers`` says (an ack, or an exception to raise)."""

    def __init__(self, target: str, answers: dict[str, object]):
        self.target = target
        self.answers = answers
        self.sent: list[tuple[HeartbeatSnapshot, float]] = []
        self.closed = False

    async def send_heartbeat(self, snapshot: HeartbeatSnapshot, timeout_s: float) -> HeartbeatAck:
        self.sent.append((snapshot, timeout_s))
        answer = self.answers.get(self.target, HeartbeatAck(ok=True))
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, HeartbeatAck)
        return answer

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def system(clock: ManualClock):
    system = ActorSystem(clock=clock)
    await system.start()
    await system.spawn(TimerActor(), name="timer")  # the heartbeat's rounds are due on it
    yield system
    await system.stop_all()


def make_actor(clock: ManualClock, links: dict[str, FakeLink], answers: dict[str, object],
               targets: list[str], snapshot=lambda: SNAPSHOT, **kw) -> HeartbeatActor:
    def connect(target: str) -> FakeLink:
        links[target] = FakeLink(target, answers)
        return links[target]

    return HeartbeatActor(targets, 10.0, snapshot, clock=clock, connect=connect, **kw)


async def sleeping(clock: ManualClock) -> None:
    """Wait until the timer waits on the clock for the next round (so ``advance`` makes it due)."""
    await poll_until(lambda: clock.pending() > 0)


async def test_first_round_at_start_then_one_per_interval_on_the_clock(system, clock):
    links: dict[str, FakeLink] = {}
    ref = await system.spawn(make_actor(clock, links, {}, ["c1:1", "c2:2", "c1:1"]))
    await poll_until(lambda: len(links) == 2 and all(link.sent for link in links.values()))
    await sleeping(clock)
    assert sorted(links) == ["c1:1", "c2:2"]  # the quorum is de-duplicated
    assert links["c1:1"].sent == [(SNAPSHOT, 10.0)]  # the deadline of a send is the interval
    clock.advance(9.9)
    stats = await ref.ask(GetHeartbeatStats())
    assert stats.rounds == 1 and len(links["c1:1"].sent) == 1
    clock.advance(0.1)
    await poll_until(lambda: len(links["c2:2"].sent) == 2)
    stats = await ref.ask(GetHeartbeatStats())
    assert (stats.rounds, stats.sent_ok, stats.failed) == (2, 4, 0)
    assert stats.reachable == {"c1:1": True, "c2:2": True}


async def test_a_failing_coordinator_is_counted_and_warned_about_at_most_once_a_minute(system, clock):
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        links: dict[str, FakeLink] = {}
        answers: dict[str, object] = {"bad:1": HeartbeatAck(ok=False, problem="status ACCESS_DENIED: no")}
        ref = await system.spawn(make_actor(clock, links, answers, ["bad:1", "good:2"]))
        await poll_until(lambda: len(links) == 2 and all(link.sent for link in links.values()))
        await sleeping(clock)
        assert await ref.ask(SendHeartbeatNow()) == {"bad:1": False, "good:2": True}
        answers["bad:1"] = ConnectionError("refused")
        assert await ref.ask(SendHeartbeatNow()) == {"bad:1": False, "good:2": True}
        stats = await ref.ask(GetHeartbeatStats())
        assert (stats.rounds, stats.sent_ok, stats.failed) == (3, 3, 3)
        assert stats.reachable == {"bad:1": False, "good:2": True}
        bad = [w for w in warnings if "bad:1" in w]
        assert len(bad) == 1 and "status ACCESS_DENIED: no" in bad[0]
        # a minute later on the clock, the next failure is logged with the count swallowed meanwhile
        clock.advance(60)
        await poll_until(lambda: len([w for w in warnings if "bad:1" in w]) == 2)
        assert "ConnectionError('refused')" in warnings[-1]
        assert "more failures since the last warning" in warnings[-1]
        assert not [w for w in warnings if "good:2" in w]
    finally:
        logger.remove(sink)


async def test_a_broken_snapshot_skips_one_round_not_the_loop(system, clock):
    links: dict[str, FakeLink] = {}
    broken = [True]

    def snapshot() -> HeartbeatSnapshot:
        if broken[0]:
            raise RuntimeError("no figures yet")
        return SNAPSHOT

    ref = await system.spawn(make_actor(clock, links, {}, ["c:1"], snapshot=snapshot))
    await sleeping(clock)
    assert (await ref.ask(GetHeartbeatStats())).rounds == 0 and links["c:1"].sent == []
    broken[0] = False
    clock.advance(10)
    await poll_until(lambda: links["c:1"].sent)
    assert (await ref.ask(GetHeartbeatStats())).rounds == 1


async def test_links_are_closed_when_the_actor_stops(system, clock):
    links: dict[str, FakeLink] = {}
    ref = await system.spawn(make_actor(clock, links, {}, ["c1:1", "c2:2"]))
    await poll_until(lambda: len(links) == 2)
    await ref.stop()
    assert all(link.closed for link in links.values())


async def test_a_stop_is_announced_to_every_coordinator_at_once_and_stays_announced(system, clock):
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        links: dict[str, FakeLink] = {}
        answers: dict[str, object] = {"down:2": ConnectionError("refused")}
        ref = await system.spawn(make_actor(clock, links, answers, ["c1:1", "down:2"]))
        await poll_until(lambda: len(links) == 2 and all(link.sent for link in links.values()))
        await sleeping(clock)
        assert links["c1:1"].sent[-1][0].status == "ACTIVE"

        assert await ref.ask(AnnounceStopping(timeout_s=1.5)) == {"c1:1": True, "down:2": False}
        told, timeout = links["c1:1"].sent[-1]
        assert (told.status, told.is_healthy, timeout) == ("DECOMMISSIONED", False, 1.5)
        assert told.server_id == SNAPSHOT.server_id  # same identity: the coordinator updates, not adds
        assert any("1 of 2 coordinators" in w and "down:2" in w for w in warnings)
        # the periodic rounds keep saying so (with the normal deadline)
        clock.advance(10)
        await poll_until(lambda: len(links["c1:1"].sent) == 3)
        assert links["c1:1"].sent[-1] == (told, 10.0)
    finally:
        logger.remove(sink)


async def test_a_deadline_longer_than_the_interval_is_cut_to_the_interval(system, clock):
    links: dict[str, FakeLink] = {}
    ref = await system.spawn(make_actor(clock, links, {}, ["c:1"]))
    await poll_until(lambda: links.get("c:1") and links["c:1"].sent)
    assert await ref.ask(AnnounceStopping(timeout_s=60)) == {"c:1": True}
    assert links["c:1"].sent[-1][1] == 10.0


async def test_each_periodic_round_refreshes_the_figures_first_and_a_failed_refresh_still_sends(system, clock):
    """One wake-up per period: the figures are refreshed right before the round that sends them."""
    links: dict[str, FakeLink] = {}
    order: list[str] = []
    fail = [False]
    used = [0]

    async def refresh() -> None:
        order.append("refresh")
        if fail[0]:
            raise RuntimeError("memory actor restarting")
        used[0] += 1

    def snapshot() -> HeartbeatSnapshot:
        order.append("snapshot")
        return HeartbeatSnapshot(ip="10.0.0.7", grpc_port=19999, used_memory=used[0])

    await system.spawn(make_actor(clock, links, {}, ["c:1"], snapshot=snapshot, refresh=refresh))
    await poll_until(lambda: len(links) == 1 and len(links["c:1"].sent) == 1)
    await sleeping(clock)
    assert order == ["refresh", "snapshot"] and links["c:1"].sent[0][0].used_memory == 1
    fail[0] = True
    clock.advance(10.0)
    await poll_until(lambda: len(links["c:1"].sent) == 2)
    assert order[2:] == ["refresh", "snapshot"]
    assert links["c:1"].sent[1][0].used_memory == 1  # the last figures went out
