"""SpillDispatcherActor on a ManualClock with fake Disk actors: capped backoff, re-routes, nothing dropped.

Time moves only when a test advances the clock; every wait is a poll on a condition, and
"nothing happened yet" is checked after letting the loop settle.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from loguru import logger

from riffle_actors.actors.spill import (
    DiskHealthChanged,
    GetSpillStats,
    SpillCompleted,
    SpillDispatcherActor,
    SpillJob,
    SpillStats,
)
from riffle_actors.actors.storage_messages import DiskIOError, WriteBatch, WriteResult
from riffle_actors.errors import RiffleError
from riffle_actors.records import Block
from riffle_actors.runtime import Actor, ActorRef, ActorSystem, ManualClock
from riffle_actors.state.disk_health import DiskHealthBoard
from riffle_actors.state.spill_plan import SpillRetryPolicy
from tests.actors.conftest import Poll, Settle

pytestmark = pytest.mark.asyncio

D0, D1 = "/data0", "/data1"


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    """Like the ``poll`` fixture, for a predicate that asks an actor."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await pred():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {pred}")
        await asyncio.sleep(0)


class FakeDisk(Actor):
    """Acknowledges writes, or fails them: ``failing`` makes a DiskIOError (EIO), ``crash_next`` a crash."""

    expected_errors = (RiffleError,)

    def __init__(self, name: str) -> None:
        self.disk_name = name
        self.writes: list[WriteBatch] = []
        self.failing = False
        self.crash_next = False

    def receive(self, msg: Any) -> Any:
        assert isinstance(msg, WriteBatch)
        self.writes.append(msg)
        if self.crash_next:
            self.crash_next = False
            raise RuntimeError("bug in the disk actor")
        if self.failing:
            raise DiskIOError(self.disk_name, "spill write", OSError(errno.EIO, "Input/output error"))
        size = sum(len(b.data) for b in msg.blocks)
        return WriteResult(self.disk_name, 0, size)


class Owner(Actor):
    """Stands in for the AppActor: records SpillCompleted."""

    def __init__(self) -> None:
        self.completed: list[SpillCompleted] = []

    def receive(self, msg: Any) -> Any:
        self.completed.append(msg)


class Rig:
    def __init__(self, system: ActorSystem, clock: ManualClock) -> None:
        self.system = system
        self.clock = clock
        self.disks = {D0: FakeDisk(D0), D1: FakeDisk(D1)}
        self.board = DiskHealthBoard([(D0, D0), (D1, D1)])
        self.owner = Owner()
        self.owner_ref: ActorRef | None = None
        self.spill: ActorRef | None = None

    async def start(self, policy: SpillRetryPolicy) -> Rig:
        refs = {name: await self.system.spawn(disk, name=f"disk:{name}") for name, disk in self.disks.items()}
        self.owner_ref = await self.system.spawn(self.owner, name="app:owner")
        self.spill = await self.system.spawn(SpillDispatcherActor(refs, clock=self.clock, health=self.board,
                                                                  retry=policy), name="spill")
        return self

    def job(self, preferred: str | None = None, flight_id: int = 1) -> SpillJob:
        assert self.owner_ref is not None
        return SpillJob(app_id="app-1", shuffle_id=0, partition_id=7, flight_id=flight_id,
                        blocks=(Block(block_id=flight_id, length=4, uncompress_length=4, crc=0,
                                      task_attempt_id=1, data=b"data"),),
                        preferred_disk=preferred, reply_to=self.owner_ref)

    async def stats(self) -> SpillStats:
        assert self.spill is not None
        return await self.spill.ask(GetSpillStats())

    def writes(self) -> tuple[int, int]:
        return len(self.disks[D0].writes), len(self.disks[D1].writes)

    def paused_after(self, writes: tuple[int, int]) -> bool:
        """The disks saw ``writes`` and the batch waits on the clock (its pause is registered)."""
        return self.writes() == writes and self.clock.pending() == 1


@pytest.fixture
def rig(system: ActorSystem, clock: ManualClock) -> Rig:
    return Rig(system, clock)


async def test_retries_follow_the_capped_backoff_as_time_advances(rig: Rig, poll: Poll,
                                                                  settle_loop: Settle) -> None:
    await rig.start(SpillRetryPolicy(first_backoff_s=1.0, max_backoff_s=4.0, stuck_after_retries=1000))
    for disk in rig.disks.values():
        disk.failing = True
    assert rig.spill is not None
    await rig.spill.tell(rig.job(preferred=D1))
    await poll(lambda: rig.paused_after((1, 1)))  # one disk, then the other at once; then a pause
    for pause_s, round_ in [(1.0, 2), (2.0, 3), (4.0, 4), (4.0, 5), (4.0, 6)]:  # doubling, capped at 4 s
        rig.clock.advance(pause_s - 0.01)
        await settle_loop()
        assert rig.writes() == (round_ - 1, round_ - 1), f"retried before the {pause_s}s pause ended"
        rig.clock.advance(0.01)
        await poll(lambda r=round_: rig.paused_after((r, r)))
    assert rig.owner.completed == []  # still in memory, still retried: never dropped

    rig.disks[D1].failing = False
    rig.clock.advance(4.0)
    await poll(lambda: len(rig.owner.completed) == 1)
    assert rig.owner.completed[0].disk == D1 and rig.owner.completed[0].flight_id == 1
    stats = await rig.stats()
    assert stats.completed == 1 and stats.failed_attempts == 12 and stats.pending == stats.running == 0
    assert stats.moved == {}  # it landed where the partition's files are


async def test_a_disk_coming_back_ends_the_pause_and_takes_the_batch(rig: Rig, poll: Poll) -> None:
    await rig.start(SpillRetryPolicy(first_backoff_s=60.0, max_backoff_s=60.0))
    assert rig.spill is not None
    await rig.spill.tell(DiskHealthChanged(D0, False, "taken out by the test"))
    await rig.spill.tell(DiskHealthChanged(D1, False, "taken out by the test"))
    await rig.spill.tell(rig.job(preferred=D0))

    async def paused() -> bool:
        return (await rig.stats()).retries_total >= 1

    await until(paused)
    assert rig.writes() == (0, 0)
    await rig.spill.tell(DiskHealthChanged(D1, True, "back"))  # no time passes: the news wakes it
    await poll(lambda: len(rig.owner.completed) == 1)
    assert rig.owner.completed[0].disk == D1 and rig.writes() == (0, 1)
    stats = await rig.stats()
    assert stats.moved == {(D0, D1): 1} and stats.moved_from(D0) == {D1: 1}
    assert stats.unhealthy_disks == {D0: "taken out by the test"}


async def test_a_quarantine_on_the_board_reroutes_the_next_attempt(rig: Rig, poll: Poll) -> None:
    await rig.start(SpillRetryPolicy())
    # the DiskMonitor's verdict, on the board the dispatcher reads
    rig.board.on_io_failure(D0, "ENOSPC", "spill write", "full", rig.clock.monotonic())
    assert rig.spill is not None
    await rig.spill.tell(rig.job(preferred=D0))
    await poll(lambda: len(rig.owner.completed) == 1)
    assert rig.owner.completed[0].disk == D1 and rig.writes() == (0, 1)


async def test_a_stuck_batch_is_reported_with_its_app_and_kept_until_a_disk_takes_it(
        rig: Rig, poll: Poll) -> None:
    await rig.start(SpillRetryPolicy(first_backoff_s=1.0, max_backoff_s=1.0, stuck_after_retries=6))
    errors: list[Any] = []
    sink = logger.add(lambda m: errors.append(m.record), level="ERROR", format="{message}")
    try:
        for disk in rig.disks.values():
            disk.failing = True
        assert rig.spill is not None
        await rig.spill.tell(rig.job(flight_id=3))
        for round_ in range(1, 3):  # 2 failed writes + 1 pause = 3 retries per round
            await poll(lambda r=round_: rig.paused_after((r, r)))
            rig.clock.advance(1.0)
        await poll(lambda: rig.paused_after((3, 3)))
        stats = await rig.stats()
        (stuck,) = stats.stuck
        assert (stuck.app_id, stuck.shuffle_id, stuck.partition_id, stuck.flight_id) == ("app-1", 0, 7, 3)
        assert stuck.retries >= 6 and stuck.failed_writes >= 5 and stuck.waiting_s == 2.0
        assert "spill write failed (EIO)" in stuck.last_error
        assert stats.stuck_total == 1
        reports = [r for r in errors if "has not reached a disk" in r["message"]]
        assert len(reports) == 1 and reports[0]["extra"]["app_id"] == "app-1"
        assert rig.owner.completed == []

        rig.disks[D0].failing = False
        rig.clock.advance(1.0)
        await poll(lambda: len(rig.owner.completed) == 1)
        assert rig.owner.completed[0].disk == D0
        stats = await rig.stats()
        assert stats.stuck == () and stats.stuck_total == 1 and stats.completed == 1
    finally:
        logger.remove(sink)


async def test_a_crashing_disk_actor_is_retried_after_a_pause_then_the_batch_moves(
        rig: Rig, poll: Poll, settle_loop: Settle) -> None:
    await rig.start(SpillRetryPolicy(first_backoff_s=1.0, max_backoff_s=4.0, crash_retries_per_disk=2))
    rig.disks[D0].crash_next = True  # unsupervised here: it stays dead, later asks fail with ActorDeadError
    assert rig.spill is not None
    await rig.spill.tell(rig.job(preferred=D0))
    await poll(lambda: rig.paused_after((1, 0)))

    async def failed(n: int) -> bool:
        return (await rig.stats()).failed_attempts == n

    assert await failed(1)
    rig.clock.advance(0.99)
    await settle_loop()
    assert await failed(1)  # the same disk again only after the pause
    rig.clock.advance(0.01)
    await until(lambda: failed(2))  # second crash in a row: the next disk, after the next pause
    await poll(lambda: rig.clock.pending() == 1)
    rig.clock.advance(2.0)
    await poll(lambda: len(rig.owner.completed) == 1)
    assert rig.owner.completed[0].disk == D1
    assert (await rig.stats()).moved == {(D0, D1): 1}


async def test_a_purged_owner_ends_the_retries_without_a_write(rig: Rig, poll: Poll) -> None:
    await rig.start(SpillRetryPolicy(first_backoff_s=1.0, max_backoff_s=1.0))
    assert rig.spill is not None and rig.owner_ref is not None
    for disk in rig.disks.values():
        disk.failing = True
    await rig.spill.tell(rig.job())
    await poll(lambda: rig.paused_after((1, 1)))
    await rig.owner_ref.stop()
    rig.clock.advance(1.0)

    async def idle() -> bool:
        s = await rig.stats()
        return s.running == 0 and s.pending == 0

    await until(idle)
    assert rig.writes() == (1, 1)


async def test_a_crash_of_the_dispatcher_writes_its_running_and_queued_batches_again(
        system: ActorSystem, clock: ManualClock, poll: Poll) -> None:
    """The backlog outlives the incarnation: a batch in flight when it crashed is written again, the
    queued ones follow in order, and each owner hears SpillCompleted exactly once."""
    from riffle_actors.actors.spill import SpillBacklog
    from riffle_actors.runtime import ChildSpec

    rig = Rig(system, clock)
    refs = {name: await system.spawn(disk, name=f"disk:{name}") for name, disk in rig.disks.items()}
    rig.owner_ref = await system.spawn(rig.owner, name="app:owner")
    for disk in rig.disks.values():
        disk.failing = True  # every write fails and pauses: the batches stay running
    backlog = SpillBacklog(refs, max_concurrency=2)
    spill = await system.start_child(None, ChildSpec("spill", lambda: SpillDispatcherActor(
        refs, clock=clock, health=rig.board, backlog=backlog)))
    for flight in (1, 2, 3):
        await spill.tell(rig.job(flight_id=flight))
    await poll(lambda: backlog.queue.running == 2 and backlog.queue.pending == 1 and clock.pending() == 2)
    spill.crash(RuntimeError("bug in the dispatcher"))
    await spill.tell(rig.job(flight_id=4))  # queued while it restarts: waits for the next incarnation
    await poll(lambda: spill.statistics().restarts == 1 and spill.statistics().state == "running")
    for disk in rig.disks.values():
        disk.failing = False
    clock.advance(1.0)
    await poll(lambda: len(rig.owner.completed) == 4)
    assert sorted(c.flight_id for c in rig.owner.completed) == [1, 2, 3, 4]
    stats = await spill.ask(GetSpillStats())
    assert stats.pending == stats.running == 0 and stats.completed == 4
