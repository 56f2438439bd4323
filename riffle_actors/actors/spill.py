"""SpillDispatcherActor: routes spill batches to disks, retries and re-routes, never drops.

A ``SpillJob`` is one in-flight batch of one partition. The decisions about it live in
``riffle_actors.state.spill_plan`` (``SpillPlan``, ``SpillQueue``): its disk (the partition's
current disk while healthy, else a healthy disk chosen by hashing the partition, so its files
stay together), at most ``max_concurrency`` writes at once, and what follows a failure: another
healthy disk at once after an IO error, the same disk after a pause when its actor crashed or
restarted (an unexpected failure counts as one). This actor carries them out. The batch's data
is still in memory the whole time, so nothing is lost; the owning AppActor is told
``SpillCompleted`` only once a disk acknowledged data and index.

Retries never end and never grow without bound. When no disk can take the batch, it pauses on
the injected clock, from 0.05 s doubling up to ``SpillRetryPolicy.max_backoff_s`` (2 s), then
tries every disk healthy at that moment; a disk coming back (``DiskHealthChanged``) ends the
pause at once. Memory backpressure meanwhile makes requireBuffer answer NO_BUFFER. A batch
with ``stuck_after_retries`` (10) failed writes and pauses is *stuck*: it is logged at ERROR
with its app id (again at 20, 40 ... retries, and at INFO once it lands), counted in
``SpillStats.stuck_total``, and listed in ``SpillStats.stuck`` while it stays in memory.

Disk health: the DiskMonitor decides, on the ``DiskHealthBoard``, which disk takes data (the
Disk actors report their IO failures to it) and this actor only reads the board;
``DiskHealthChanged`` messages are its wake-ups, and one saying ``healthy=False`` also keeps a
disk out until one saying ``healthy=True`` arrives (the monitor's verdicts agree with the board).

A job re-routed away from the disk that held its partition's files (or that it tried first)
is counted per (from, to) pair in ``SpillStats.moved`` and logged, so ``/health`` can tell an
operator "N pending spills moved to <disk>".

See also: ``riffle_actors.actors.disk`` (the writer), ``riffle_actors.actors.app`` (the owner).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from loguru import logger

from riffle_actors.runtime import Actor, ActorDeadError, ActorRef
from riffle_actors.actors.storage_messages import (
    AppPurgedError,
    DiskHealthChanged,
    DiskIOError,
    WriteBatch,
    WriteResult,
)
from riffle_actors.runtime import Clock, SystemClock
from riffle_actors.log import RateLimitedLog
from riffle_actors.records import Block
from riffle_actors.state.disk_health import DiskHealthBoard
from riffle_actors.state.spill_plan import BatchKey, SpillAttempt, SpillPlan, SpillQueue, SpillRetryPolicy, \
    StuckSpill, WaitFor
from riffle_actors.state.tier_policy import HDFS_TIER


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillJob:
    app_id: str
    shuffle_id: int
    partition_id: int
    flight_id: int
    blocks: tuple[Block, ...]
    preferred_disk: str | None
    reply_to: ActorRef
    # the partition's disks before ``preferred_disk``: never written to again while another disk can take
    # the batch, so the bases of its virtual data file stay put (``riffle_actors.service.get_local_index``)
    earlier_disks: tuple[str, ...] = ()
    epoch: int = 0  # incarnation of the shuffle (``ShuffleState.epoch``), echoed in SpillCompleted
    huge: bool = False  # the partition is huge (the HDFS tier policy may send it to HDFS)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillCompleted:
    """Told to the owning AppActor; ``disk`` is None when the app/shuffle was purged meanwhile."""

    shuffle_id: int
    partition_id: int
    flight_id: int
    disk: str | None
    data_bytes: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class GetSpillStats:
    pass


@dataclass(slots=True)
class SpillStats:
    pending: int = 0
    running: int = 0
    completed: int = 0
    failed_attempts: int = 0
    spilled_bytes: int = 0
    seconds_total: float = 0.0
    unhealthy_disks: dict[str, str] = field(default_factory=dict)
    moved: dict[tuple[str, str], int] = field(default_factory=dict)  # (from disk, to disk) -> spill jobs
    retries_total: int = 0  # failed writes plus pauses without a disk, over every batch
    stuck_total: int = 0    # batches that ever became stuck
    stuck: tuple[StuckSpill, ...] = ()  # batches stuck now (still in memory, still retried), longest first

    def moved_from(self, disk: str) -> dict[str, int]:
        """to disk -> number of spill jobs re-routed away from ``disk``."""
        return {to: n for (frm, to), n in self.moved.items() if frm == disk}


SpillMsg = SpillJob | DiskHealthChanged | GetSpillStats


class SpillBacklog:
    """What the SpillDispatcher keeps across its restarts: the queue with its running table, the plan
    (held-out disks, re-route and stuck counters) and the stats. The server creates it once and hands
    it to every incarnation."""

    def __init__(self, disks: dict[str, ActorRef], *, max_concurrency: int = 8,
                 retry: SpillRetryPolicy | None = None):
        self.plan = SpillPlan(disks, retry)
        self.queue: SpillQueue[SpillJob] = SpillQueue(max_concurrency)
        self.stats = SpillStats()


class SpillDispatcherActor(Actor):
    """Carries out the ``SpillPlan``'s decisions: asks the Disk actors, pauses on its clock, reports.

    The plan decides (disk, retry, pause, stuck); this actor does the IO. Pauses run on the
    injected ``Clock`` (a ``ManualClock`` in tests) and end early when a ``DiskHealthChanged``
    says a disk is back.

    **What survives a crash.** Every batch it accepted, until its owner is told: the queue and its
    running table live in the ``SpillBacklog`` (``backlog``), which outlives the incarnation, and a
    batch leaves the running table only after its ``SpillCompleted`` was told (or its app was found
    purged). A crash cancels the incarnation's write tasks; the next incarnation's ``on_start`` runs
    every batch of the running table again, before the queue. A batch whose write had reached a disk
    before the crash is written again: the reader de-duplicates by block id (as after a Disk actor
    crash), and the data is in memory until the owner hears ``SpillCompleted``, so no batch stays in
    flight forever and ``finishShuffle`` never waits on a dead incarnation. The SpillJob tells queued
    meanwhile wait in the mailbox (which outlives the incarnation too). Only the wake-ups of pausing
    batches and the log rate limiter are per incarnation. Without a ``backlog`` (unit tests) each
    incarnation makes its own and a crash forgets it.
    """

    mailbox_size = 1_000_000  # one tell per in-flight batch; refusing one would lose track of memory

    def __init__(self, disks: dict[str, ActorRef], *, max_concurrency: int = 8, clock: Clock | None = None,
                 on_spilled=None, on_spill_failed=None, health: DiskHealthBoard,
                 retry: SpillRetryPolicy | None = None, backlog: SpillBacklog | None = None, hdfs=None):
        self.hdfs = hdfs  # an HdfsSpillRoute (riffle_actors.actors.hdfs_writer) when store_type has HDFS
        self.disks = disks  # name -> DiskActor ref, in data_paths order
        self.health = health
        self.clock = clock or SystemClock()
        self.on_spilled = on_spilled  # metrics hook: (disk, data_bytes, seconds)
        self.on_spill_failed = on_spill_failed  # metrics hook: (disk,)
        if backlog is None:
            backlog = SpillBacklog(disks, max_concurrency=max_concurrency, retry=retry)
        self.backlog = backlog
        self.plan = backlog.plan
        self.queue = backlog.queue
        self.stats = backlog.stats
        self._no_disk_log = RateLimitedLog(10.0, monotonic=self.clock.monotonic)
        self._pauses: set[Callable[[], None]] = set()  # wake-ups of the batches pausing now

    async def on_start(self) -> None:
        again = self.queue.restart()  # after a crash: the batches the last incarnation was writing
        if again:
            logger.warning("spill dispatcher restarted: writing {} interrupted batch(es) again ({} queued)",
                           len(again), self.queue.pending)
        self._start(again)

    def healthy_disks(self) -> list[str]:
        """Disks that may take data now: placeable on the board and not held out by a message."""
        return self.plan.placeable(self.health.placeable)

    # ------------------------------------------------------------- messages
    def receive(self, msg: SpillMsg):
        match msg:
            case SpillJob():
                self._start(self.queue.push(msg))
            case DiskHealthChanged(disk=disk, healthy=True):
                self.plan.readmit(disk)
                for wake in list(self._pauses):  # re-route what waits: the disk may take it now
                    wake()
            case DiskHealthChanged(disk=disk, reason=reason):
                self.plan.hold_out(disk, reason)
            case GetSpillStats():
                return self._snapshot()
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    def _snapshot(self) -> SpillStats:
        stats = self.stats
        stats.pending = self.queue.pending
        stats.running = self.queue.running
        stats.unhealthy_disks = {**self.plan.held_out, **self.health.reasons()}
        stats.moved = dict(self.plan.moved)
        stats.retries_total = self.plan.retries_total
        stats.stuck_total = self.plan.stuck_total
        stats.stuck = tuple(self.plan.stuck(self.clock.monotonic()))
        return stats

    def _start(self, jobs: list[SpillJob]) -> None:
        for job in jobs:
            self.spawn(self._run(job))

    async def _run(self, job: SpillJob) -> None:
        # No ``finally``: a batch interrupted by the end of this incarnation (cancelled, or a crash)
        # stays in the running table, and the next incarnation writes it again (see the class).
        disk = await self._write_until_done(job)
        data_bytes = sum(len(b.data) for b in job.blocks)
        try:
            await job.reply_to.tell(SpillCompleted(shuffle_id=job.shuffle_id, partition_id=job.partition_id,
                                                   flight_id=job.flight_id, disk=disk, data_bytes=data_bytes,
                                                   epoch=job.epoch))
        except ActorDeadError:
            pass  # the app was purged or crashed; its memory went with the purge
        self._start(self.queue.finished(job))  # no await since the tell: the owner knows, the slot is free

    async def _write_until_done(self, job: SpillJob) -> str | None:
        """Write ``job`` until a disk acknowledges it (its disk) or its app is gone (None)."""
        key = BatchKey(job.app_id, job.shuffle_id, job.partition_id, job.flight_id)
        attempt = self.plan.begin(key, job.preferred_disk, sum(len(b.data) for b in job.blocks),
                                  self.clock.monotonic(), earlier_disks=job.earlier_disks)
        try:
            while True:
                if not job.reply_to.is_alive:
                    # the owning app was purged: its data is not wanted, and must not reach the files
                    # of a later app registered with the same id
                    return None
                if self.hdfs is not None and await self.hdfs.try_spill(job, len(self.healthy_disks())):
                    self.stats.completed += 1
                    return HDFS_TIER  # the HDFS tier acknowledged it (else: local disks, below)
                step = self.plan.next_step(attempt, self.healthy_disks())
                if isinstance(step, WaitFor):
                    if step.no_disk:
                        self._warn_no_disk(job)
                    self._report_if_stuck(job, attempt)
                    await self._pause(step.delay_s)
                    continue
                disk = step.disk
                started = self.clock.monotonic()
                try:
                    result: WriteResult = await self.disks[disk].ask(WriteBatch(
                        app_id=job.app_id, shuffle_id=job.shuffle_id, partition_id=job.partition_id,
                        blocks=job.blocks, epoch=job.epoch))
                except AppPurgedError:
                    return None
                except DiskIOError as e:
                    self._count_failure(disk)  # the Disk actor reported it to the DiskMonitor
                    delay = self.plan.write_failed(attempt, disk, str(e).removeprefix(f"disk {disk}: "),
                                                   disk_fault=True)
                except Exception as e:  # noqa: BLE001 - ActorDeadError or a crash of the disk actor
                    # the disk actor crashed or restarted before acknowledging: write again (same disk
                    # first; its supervisor restarts it). A batch written twice only adds bytes the
                    # reader de-duplicates by block id; the batch is still in memory meanwhile.
                    self._count_failure(disk)
                    if not isinstance(e, ActorDeadError):
                        logger.bind(disk=disk, app_id=job.app_id).warning(
                            "spill of {}/{}/{} to disk {} failed unexpectedly ({!r}); retrying",
                            job.app_id, job.shuffle_id, job.partition_id, disk, e)
                    delay = self.plan.write_failed(attempt, disk, repr(e), disk_fault=False)
                else:
                    self._landed(job, attempt, disk, result, self.clock.monotonic() - started)
                    return disk
                self._report_if_stuck(job, attempt)
                if delay:
                    await self._pause(delay)
        finally:
            self.plan.end(attempt)

    async def _pause(self, delay_s: float) -> None:
        """Wait ``delay_s`` on the clock; a disk coming back (``DiskHealthChanged``) ends it at once."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = self.clock.call_at(self.clock.monotonic() + delay_s, wake)
        self._pauses.add(wake)
        try:
            await fut
        finally:
            handle.cancel()
            self._pauses.discard(wake)

    # ------------------------------------------------------------- reports
    def _count_failure(self, disk: str) -> None:
        self.stats.failed_attempts += 1
        if self.on_spill_failed is not None:
            self.on_spill_failed(disk)

    def _landed(self, job: SpillJob, attempt: SpillAttempt, disk: str, result: WriteResult,
                elapsed: float) -> None:
        landed = self.plan.landed(attempt, disk)
        written = result.data_file_len - result.offset
        self.stats.completed += 1
        self.stats.spilled_bytes += written
        self.stats.seconds_total += elapsed
        if self.on_spilled is not None:
            self.on_spilled(disk, written, elapsed)
        if landed.log_move:
            logger.bind(disk=landed.moved_from, app_id=job.app_id).warning(
                "spill of {}/{}/{} moved from disk {} to disk {} ({} spill(s) moved so far)",
                job.app_id, job.shuffle_id, job.partition_id, landed.moved_from, disk, landed.moved_so_far)
        if landed.was_stuck:
            logger.bind(disk=disk, app_id=job.app_id).info(
                "stuck spill of {}/{}/{} (flight {}) reached disk {} after {} retries",
                job.app_id, job.shuffle_id, job.partition_id, job.flight_id, disk, landed.retries)

    def _warn_no_disk(self, job: SpillJob) -> None:
        show, suppressed = self._no_disk_log.should_log("no-disk")
        if show:
            logger.bind(app_id=job.app_id).warning(
                "no healthy disk for spill of {}/{}/{}; data stays in memory, retrying{}",
                job.app_id, job.shuffle_id, job.partition_id,
                f" ({suppressed} similar messages suppressed)" if suppressed else "")

    def _report_if_stuck(self, job: SpillJob, attempt: SpillAttempt) -> None:
        if not self.plan.should_report_stuck(attempt):
            return
        logger.bind(app_id=job.app_id).error(
            "spill of {}/{}/{} (flight {}, {} bytes) has not reached a disk after {} retries in {:.1f}s "
            "(last failure: {}); it stays in memory and is retried at least every {}s on any healthy disk",
            job.app_id, job.shuffle_id, job.partition_id, job.flight_id, attempt.data_bytes, attempt.retries,
            self.clock.monotonic() - attempt.started_monotonic, attempt.last_error or "no healthy disk",
            self.plan.policy.max_backoff_s)
