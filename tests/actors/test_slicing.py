"""SliceLane and the AppActor's sliced reports and results: order, inline budget, failures, interleaving.

Lanes here either get a fake clock (every step advances it by a known amount, so which work runs
inline and which is deferred is decided exactly) or ``SLICE_S = 0`` (every operation becomes a
task that does one step per loop turn: the most interleaving there can be). Nothing depends on
how fast this machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest

from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, ActorSystem, slicing
from riffle_actors.actors.app import AppActor
from riffle_actors.actors.app_messages import (
    GetShuffleResult,
    Heartbeat,
    RegisterShuffle,
    ReportShuffleResult,
)
from riffle_actors.runtime.slicing import SliceLane
from riffle_actors.runtime.clock import ManualClock
from riffle_actors.errors import InvalidRequestError, NoRegisterError
from riffle_actors.protocol.bitmap import BlockIdSet
from riffle_actors.protocol.blockid import SPARK_DEFAULT

Poll = Callable[[Callable[[], bool]], Awaitable[None]]

pytestmark = pytest.mark.asyncio


class FakeNow:
    """A ``now`` for the lane that only moves when a step says so."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def work(log: list[str], name: str, n: int, now: FakeNow | None = None, cost: float = 0.0,
         fail_at: int | None = None) -> Generator[None, None, str]:
    """``n`` steps that log themselves (and advance ``now`` by ``cost``); returns ``name``."""
    for i in range(n):
        if i == fail_at:
            raise InvalidRequestError(f"{name} failed at step {i}")
        log.append(f"{name}{i}")
        if now is not None:
            now.t += cost
        yield
    return name


# ---------------------------------------------------------------------------- SliceLane
async def test_cheap_work_runs_inline_and_returns_its_value() -> None:
    now = FakeNow()
    lane = SliceLane(slice_s=1.0, now=now)
    log: list[str] = []
    assert lane.submit(work(log, "a", 3, now, 0.1)) == "a"
    assert lane.submit(work(log, "b", 2, now, 0.1)) == "b"
    assert log == ["a0", "a1", "a2", "b0", "b1"] and lane.idle


async def test_inline_work_is_bounded_per_loop_turn_not_per_operation() -> None:
    now = FakeNow()
    lane = SliceLane(slice_s=1.0, now=now)
    log: list[str] = []
    assert lane.submit(work(log, "a", 2, now, 0.4)) == "a"  # 0.8 of this turn's 1.0
    b = lane.submit(work(log, "b", 3, now, 0.4))  # one step fits, then the turn is over
    assert isinstance(b, asyncio.Task) and log == ["a0", "a1", "b0"]
    c = lane.submit(work(log, "c", 1, now, 0.0))  # queued behind b, even though it is cheap
    assert isinstance(c, asyncio.Task)
    assert await b == "b" and await c == "c"
    assert log == ["a0", "a1", "b0", "b1", "b2", "c0"]
    await asyncio.sleep(0)  # a new turn: inline again
    assert lane.submit(work(log, "d", 1, now, 0.4)) == "d"


async def test_operations_run_one_at_a_time_in_arrival_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_S", 0.0)
    lane = SliceLane()
    log: list[str] = []
    tasks = [lane.submit(work(log, name, n)) for name, n in (("a", 4), ("b", 1), ("c", 3))]
    assert all(isinstance(t, asyncio.Task) for t in tasks) and not lane.idle
    other: list[int] = []

    async def bystander() -> None:  # gets a turn between the steps
        for i in range(10):
            other.append(i)
            log.append("x")
            await asyncio.sleep(0)

    await asyncio.gather(bystander(), *tasks)
    assert [t.result() for t in tasks] == ["a", "b", "c"]
    assert [e for e in log if e != "x"] == ["a0", "a1", "a2", "a3", "b0", "c0", "c1", "c2"]
    assert log.index("x") < log.index("a3")  # interleaved, not run in one go
    assert lane.idle


async def test_a_failed_operation_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_S", 0.0)
    lane = SliceLane()
    log: list[str] = []
    first = lane.submit(work(log, "a", 5, fail_at=2))
    second = lane.submit(work(log, "b", 2))
    with pytest.raises(InvalidRequestError, match="a failed at step 2"):
        await first
    assert await second == "b"
    assert log == ["a0", "a1", "b0", "b1"]
    now = FakeNow()
    inline = SliceLane(slice_s=1.0, now=now)
    with pytest.raises(InvalidRequestError):  # inline, the failure is the caller's at once
        inline.submit(work(log, "c", 3, fail_at=1))


# ---------------------------------------------------------------------------- AppActor
class Sink(Actor):
    """Stands in for the MemoryManager and the SpillDispatcher: reports and results never use them."""

    def receive(self, msg: Any) -> None:
        return None


async def start_app(system: ActorSystem, clock: ManualClock, app_id: str = "app1") -> ActorRef:
    sink = await system.spawn(Sink(), "sink")
    app = await system.spawn(AppActor(app_id, clock=clock, heartbeat_timeout_s=600.0, memory=sink, spill=sink,
                                      single_buffer_spill_bytes=None), f"app:{app_id}")
    await app.ask(RegisterShuffle(shuffle_id=0, ranges=((0, 1000),), local_order=False))
    return app


def task_report(task: int, partitions: range, per_partition: int) -> ReportShuffleResult:
    p2b = tuple((p, tuple(SPARK_DEFAULT.get_block_id(seq, p, task) for seq in range(per_partition)))
                for p in partitions)
    return ReportShuffleResult(shuffle_id=0, task_attempt_id=task, partition_to_block_ids=p2b)


def get_all(partitions: int) -> GetShuffleResult:
    return GetShuffleResult(shuffle_id=0, partition_ids=tuple(range(partitions)), layout=None)


def ids_of(report: ReportShuffleResult) -> set[int]:
    return {i for _, ids in report.partition_to_block_ids for i in ids}


@pytest.fixture
def one_step_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_S", 0.0)


async def test_heartbeats_are_answered_while_a_report_is_in_progress(
        system: ActorSystem, clock: ManualClock, one_step_per_turn: None) -> None:
    app = await start_app(system, clock)
    big = task_report(1, range(400), 300)  # 120000 ids: ~60 steps, one per loop turn
    report = asyncio.ensure_future(app.ask(big))
    await asyncio.sleep(0)  # the report is asked first
    for _ in range(3):
        await app.ask(Heartbeat())  # a few loop turns each
        assert not report.done()
    assert await report == 120_000


async def test_a_get_asked_after_a_report_sees_all_of_it(system: ActorSystem, clock: ManualClock,
                                                         one_step_per_turn: None) -> None:
    app = await start_app(system, clock)
    reports = [task_report(t, range(t, 150 + t), 40) for t in range(3)]
    asks = [asyncio.ensure_future(app.ask(r)) for r in reports]
    get = asyncio.ensure_future(app.ask(get_all(200)))
    counts = await asyncio.gather(*asks)
    result = await get
    expected = set().union(*(ids_of(r) for r in reports))
    assert sum(counts) == len(expected)
    assert result == BlockIdSet(sorted(expected)).serialize()


async def test_reports_during_a_get_lose_no_id(system: ActorSystem, clock: ManualClock, poll: Poll,
                                               one_step_per_turn: None) -> None:
    app = await start_app(system, clock)
    first = task_report(1, range(300), 30)
    await app.ask(first)
    get = asyncio.ensure_future(app.ask(get_all(400)))
    later = [task_report(t, range(t * 7, t * 7 + 120), 3) for t in range(2, 12)]  # old and new partitions
    asks = [asyncio.ensure_future(app.ask(r)) for r in later]
    counts = await asyncio.gather(*asks)
    assert set(BlockIdSet.deserialize(await get)) == ids_of(first)  # FIFO: the get came first
    everything = ids_of(first).union(*(ids_of(r) for r in later))
    final = await app.ask(get_all(400))
    assert set(BlockIdSet.deserialize(final)) == everything
    assert sum(counts) == len(everything) - len(ids_of(first))


async def test_errors_of_sliced_operations_go_to_their_asker(system: ActorSystem, clock: ManualClock,
                                                             one_step_per_turn: None) -> None:
    app = await start_app(system, clock)
    good = task_report(1, range(50), 20)
    bad = ReportShuffleResult(shuffle_id=0, task_attempt_id=2, partition_to_block_ids=(
        *good.partition_to_block_ids, (60, (1, 2, -3))))
    with pytest.raises(InvalidRequestError, match="partition 60"):
        await app.ask(bad)
    with pytest.raises(NoRegisterError):
        await app.ask(ReportShuffleResult(shuffle_id=5, task_attempt_id=1,
                                          partition_to_block_ids=((0, (1,)),)))
    assert await app.ask(get_all(100)) == b""
    assert await app.ask(good) == 1000  # the actor lives on, and the bad report left nothing behind


async def test_stopping_the_app_fails_its_operations_in_progress(system: ActorSystem, clock: ManualClock,
                                                                 one_step_per_turn: None) -> None:
    app = await start_app(system, clock)
    running = asyncio.ensure_future(app.ask(task_report(1, range(400), 100)))
    queued = asyncio.ensure_future(app.ask(GetShuffleResult(shuffle_id=0, partition_ids=(1,), layout=None)))
    await asyncio.sleep(0)  # both are asked
    await app.ask(Heartbeat())  # and both are in the lane once this is answered
    assert not running.done()
    await app.stop()
    for fut in (running, queued):
        with pytest.raises(ActorDeadError):
            await fut
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "slice-lane" and not t.done()]
