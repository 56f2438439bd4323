"""SpillDispatcherActor: routes spill batches to disks, retries and re-routes, never drops.

A ``SpillJob`` is one in-flight batch of one partition. The dispatcher picks its disk (the
partition's current disk while healthy, else a healthy disk chosen by hashing the
partition, so its files stay together), runs at most ``max_concurrency`` writes at once,
and on failure retries: the same disk after a disk-actor restart, another healthy disk after
an IO error. The batch's data is still in memory the whole time, so nothing is lost; the
owning AppActor is told ``SpillCompleted`` only once the disk acknowledged data and index.
When no disk is healthy the job waits and retries with backoff (memory backpressure then
makes requireBuffer answer NO_BUFFER, and the failure is logged and counted); a disk coming
back (``DiskHealthChanged``) wakes it at once. A disk actor that crashes or fails in an
unexpected way is retried like a restart: the job is never dropped.

Disk health: with a ``DiskHealthBoard`` (the server's wiring) the DiskMonitor decides which
disk takes data (the Disk actors report their IO failures to it) and this actor only reads
the board; ``DiskHealthChanged`` messages are its wake-ups, and one saying ``healthy=False``
also keeps a disk out until one saying ``healthy=True`` arrives (the monitor's verdicts agree
with the board). Without a board (tests of this actor alone), its own view from write outcomes
applies: consecutive failures put a disk in quarantine for ``quarantine_s``.

A job re-routed away from the disk that held its partition's files (or that it tried first)
is counted per (from, to) pair in ``SpillStats.moved`` and logged, so ``/health`` can tell an
operator "N pending spills moved to <disk>".

See also: ``riffle_actors.actors.disk`` (the writer), ``riffle_actors.actors.app`` (the owner).
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from dataclasses import dataclass, field

from loguru import logger

from riffle_actors.runtime import Actor, ActorDeadError, ActorRef
from riffle_actors.actors.disk import AppPurgedError, DiskIOError, WriteBatch, WriteResult
from riffle_actors.runtime.clock import Clock, SystemClock
from riffle_actors.log import RateLimitedLog
from riffle_actors.records import Block
from riffle_actors.state.disk_health import DiskHealthBoard


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillJob:
    app_id: str
    shuffle_id: int
    partition_id: int
    flight_id: int
    blocks: tuple[Block, ...]
    preferred_disk: str | None
    reply_to: ActorRef
    epoch: int = 0  # incarnation of the shuffle (``ShuffleState.epoch``), echoed in SpillCompleted


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
class DiskHealthChanged:
    disk: str
    healthy: bool
    reason: str


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

    def moved_from(self, disk: str) -> dict[str, int]:
        """to disk -> number of spill jobs re-routed away from ``disk``."""
        return {to: n for (frm, to), n in self.moved.items() if frm == disk}


SpillMsg = SpillJob | DiskHealthChanged | GetSpillStats


class SpillDispatcherActor(Actor):
    mailbox_size = 1_000_000  # one tell per in-flight batch; refusing one would lose track of memory
    def __init__(self, disks: dict[str, ActorRef], *, max_concurrency: int = 8, clock: Clock | None = None,
                 failures_to_quarantine: int = 3, quarantine_s: float = 30.0, on_spilled=None,
                 on_spill_failed=None, health: DiskHealthBoard | None = None):
        self.disks = disks  # name -> DiskActor ref, in data_paths order
        self.health = health
        self.max_concurrency = max_concurrency
        self.clock = clock or SystemClock()
        self.failures_to_quarantine = failures_to_quarantine
        self.quarantine_s = quarantine_s
        self.on_spilled = on_spilled  # metrics hook: (disk, data_bytes, seconds)
        self.on_spill_failed = on_spill_failed  # metrics hook: (disk,)
        self._no_disk_log = RateLimitedLog(10.0)
        self._queue: deque[SpillJob] = deque()
        self._running = 0
        self._consecutive_failures: dict[str, int] = {}
        self._quarantined_until: dict[str, float] = {}
        self._unhealthy: dict[str, str] = {}  # disk -> reason, from DiskHealthChanged(healthy=False)
        self._disk_back = asyncio.Event()  # set (and replaced) when a disk becomes healthy again
        self.stats = SpillStats()

    # ------------------------------------------------------------- disk choice
    def healthy_disks(self) -> list[str]:
        if self.health is not None:
            return [d for d in self.disks if d not in self._unhealthy and self.health.placeable(d)]
        now = self.clock.monotonic()
        return [d for d in self.disks
                if d not in self._unhealthy and self._quarantined_until.get(d, 0.0) <= now]

    def choose_disk(self, job: SpillJob, exclude: set[str]) -> str | None:
        healthy = [d for d in self.healthy_disks() if d not in exclude]
        if not healthy:
            return None
        if job.preferred_disk in healthy:
            return job.preferred_disk
        key = f"{job.app_id}/{job.shuffle_id}/{job.partition_id}".encode()
        return healthy[zlib.crc32(key) % len(healthy)]

    # ------------------------------------------------------------- messages
    def receive(self, msg: SpillMsg):
        match msg:
            case SpillJob():
                self._queue.append(msg)
                self._pump()
            case DiskHealthChanged(disk=disk, healthy=healthy, reason=reason):
                if healthy:
                    self._unhealthy.pop(disk, None)
                    self._consecutive_failures.pop(disk, None)
                    self._quarantined_until.pop(disk, None)
                    self._disk_back.set()
                    self._disk_back = asyncio.Event()
                else:
                    self._unhealthy[disk] = reason
                self._pump()
            case GetSpillStats():
                self.stats.pending = len(self._queue)
                self.stats.running = self._running
                unhealthy = dict(self._unhealthy)
                if self.health is not None:
                    unhealthy.update(self.health.reasons())
                self.stats.unhealthy_disks = unhealthy
                return self.stats
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    def _pump(self) -> None:
        while self._queue and self._running < self.max_concurrency:
            job = self._queue.popleft()
            self._running += 1
            self.spawn(self._run(job))

    async def _run(self, job: SpillJob) -> None:
        try:
            disk = await self._write_until_done(job)
            data_bytes = sum(len(b.data) for b in job.blocks)
            try:
                await job.reply_to.tell(SpillCompleted(shuffle_id=job.shuffle_id, partition_id=job.partition_id,
                                                       flight_id=job.flight_id, disk=disk, data_bytes=data_bytes,
                                                       epoch=job.epoch))
            except ActorDeadError:
                pass  # the app was purged or crashed; its memory went with the purge
        finally:
            self._running -= 1
            self._pump()

    async def _write_until_done(self, job: SpillJob) -> str | None:
        tried: set[str] = set()
        attempt = 0
        backoff = 0.05
        origin = job.preferred_disk  # where the partition's files are (or the first disk tried)
        while True:
            if not job.reply_to.is_alive:
                # the owning app was purged: its data is not wanted, and must not reach the files
                # of a later app registered with the same id
                return None
            disk = self.choose_disk(job, tried)
            if disk is None:
                if tried:
                    tried.clear()  # every healthy disk failed once: start over after a pause
                else:
                    show, suppressed = self._no_disk_log.should_log("no-disk")
                    if show:
                        logger.bind(app_id=job.app_id).warning(
                            "no healthy disk for spill of {}/{}/{}; data stays in memory, retrying{}",
                            job.app_id, job.shuffle_id, job.partition_id,
                            f" ({suppressed} similar messages suppressed)" if suppressed else "")
                await self._wait_for_a_disk(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if origin is None:
                origin = disk
            attempt += 1
            started = self.clock.monotonic()
            try:
                result: WriteResult = await self.disks[disk].ask(WriteBatch(
                    app_id=job.app_id, shuffle_id=job.shuffle_id, partition_id=job.partition_id, blocks=job.blocks,
                    epoch=job.epoch))
            except AppPurgedError:
                return None
            except DiskIOError as e:
                self._count_failure(disk)
                self._note_failure(disk, e)
                tried.add(disk)
                continue
            except Exception as e:  # noqa: BLE001 - ActorDeadError or a crash of the disk actor
                # the disk actor crashed or restarted before acknowledging: write again (same disk
                # first; its supervisor restarts it). A batch written twice only adds bytes the
                # reader de-duplicates by block id; the batch is still in memory meanwhile.
                self._count_failure(disk)
                if not isinstance(e, ActorDeadError):
                    logger.bind(disk=disk, app_id=job.app_id).warning(
                        "spill of {}/{}/{} to disk {} failed unexpectedly ({!r}); retrying",
                        job.app_id, job.shuffle_id, job.partition_id, disk, e)
                if attempt % 3 == 0:
                    tried.add(disk)
                await asyncio.sleep(0.01 * attempt)
                continue
            elapsed = self.clock.monotonic() - started
            self._consecutive_failures.pop(disk, None)
            self.stats.completed += 1
            self.stats.spilled_bytes += result.data_file_len - result.offset
            self.stats.seconds_total += elapsed
            if self.on_spilled is not None:
                self.on_spilled(disk, result.data_file_len - result.offset, elapsed)
            if origin is not None and disk != origin:
                self._note_moved(job, origin, disk)
            return disk

    def _count_failure(self, disk: str) -> None:
        self.stats.failed_attempts += 1
        if self.on_spill_failed is not None:
            self.on_spill_failed(disk)

    async def _wait_for_a_disk(self, timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, waking early when a disk becomes healthy again."""
        try:
            await asyncio.wait_for(self._disk_back.wait(), timeout_s)
        except TimeoutError:
            pass

    def _note_moved(self, job: SpillJob, origin: str, disk: str) -> None:
        key = (origin, disk)
        n = self.stats.moved.get(key, 0) + 1
        self.stats.moved[key] = n
        if n & (n - 1) == 0:  # 1, 2, 4, 8, ...: a trail for operators without a line per spill
            logger.bind(disk=origin, app_id=job.app_id).warning(
                "spill of {}/{}/{} moved from disk {} to disk {} ({} spill(s) moved so far)",
                job.app_id, job.shuffle_id, job.partition_id, origin, disk, n)

    def _note_failure(self, disk: str, e: DiskIOError) -> None:
        if self.health is not None:
            return  # the Disk actor reported it to the DiskMonitor, which owns the verdict
        n = self._consecutive_failures.get(disk, 0) + 1
        self._consecutive_failures[disk] = n
        if n >= self.failures_to_quarantine or e.kind in ("ENOSPC", "EROFS"):
            self._quarantined_until[disk] = self.clock.monotonic() + self.quarantine_s
            logger.bind(disk=disk).error("disk {} quarantined for {:.0f}s after {} ({} failures in a row)",
                                         disk, self.quarantine_s, e.kind, n)
