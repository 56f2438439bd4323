"""DiskActor: one per entry of ``data_paths``; owns every file under its root and its threads.

It serialises appends on one writer thread (so a partition's index records stay in
data-file order, spec §5.4) and serves index/data reads on a small reader pool, never on
the event loop. Purges run on the writer thread too, after every write accepted before
them, and fence the purged app/shuffle so a late spill cannot recreate its files. A shuffle
fence covers the purged incarnations only (writes carry the shuffle's ``epoch``), so a shuffle
id registered again is written normally; an app id registered again is unfenced (``UnfenceApp``).

Replies are "reply later" futures: the mailbox keeps flowing while the threads work.
Failures surface as ``DiskIOError`` (an ``OSError`` classified by errno, naming the disk);
the SpillDispatcher decides what to do with a failed write, readers get a clear status, and
every failure is reported to the DiskMonitor (``DiskIOFailed``), which decides quarantine.
An operation that does not finish within ``io_timeout_s`` fails with kind TIMEOUT (a dying
disk can block a syscall for minutes); its thread stays blocked, later work queues behind it.
A purge is not one operation: it deletes in steps of ``PURGE_STEP_OPS`` entries on the writer
thread (spills interleave between them) and fails with TIMEOUT only when no entry at all was
deleted on the disk for ``io_timeout_s`` (a hung unlink), never because the app was large.
A write or metadata append for an app (or shuffle) whose purge is still running waits until it
ends before it is queued (an id registered again must not lose its new files to a later step);
that wait is not part of its ``io_timeout_s``.

The blocking operations come from an injected ``LocalIO`` (``riffle_actors.io.local``; fault
tests pass a ``FaultyLocalIO``). The thread pools, the ``LocalIO`` and the purge fences live in
a ``DiskResources`` object the server creates once per disk and hands to every incarnation:
a restarted Disk actor (after a crash or a kill mid-spill) keeps the same writer thread, so
its appends stay ordered behind whatever the previous incarnation left running, and its
fences still hold. An unexpected exception (not an ``OSError``) crashes the actor; its
supervisor restarts it and the SpillDispatcher retries the spill.

**What survives a crash** (a permanent child of the storage supervisor): the ``DiskResources``
(threads, IO layer, fences, counters, failed purges) and the mailbox. Work already handed to the
threads finishes whatever happens to the incarnation (only the waiting for it is cancelled: an
asker gets ``ActorDeadError``; the SpillDispatcher writes the batch again). Messages queued behind
the crash (``PurgeFiles``, ``UnfenceApp``, writes, reads) are handled by the next incarnation, in
order. Purges are idempotent (deleting what is gone is a no-op) and an app purge whose deletion
failed is retried by the next ``PurgeFiles``, by every new incarnation and by ``RetryFailedPurges``
(told by the timer every app expiry check interval), until it succeeds or the app id registers again, so a purged app's files are not leaked by a crash or a transient IO error.

**Disk throttle** (``[localfile_store.io_limiter]``, Riffle's): a ``DiskThrottle`` in the
``DiskResources`` (one token bucket per disk, ``riffle_actors.state.throttle``) charges each spill
append its data bytes before the write, each data read its length before the read and each index
read its size after it; the wait is slept on the disk's own thread, inside the queued job. So the
event loop never waits and jobs keep their order, and (as under Riffle's TimeoutLayer) the wait
counts towards ``disk_io_timeout_sec``.

**Scrubber** (``[localfile_store] scrub_rate``): the first incarnation starts the disk's scrubber task
(``riffle_actors.actors.scrub``), kept in the ``DiskResources`` so a restart does not start another;
it re-reads the data files on the reader pool at a bounded rate and records corrupt blocks in the
server's ``IntegrityLedger``. A ``PurgeFiles`` forgets the purged files' findings there.
**Index consistency** (``index_consistency_detection_enable``, Riffle's): each index read is checked
against its data file on the reader thread (``riffle_actors.protocol.index.index_inconsistency``: the
last record must end where the data file ends). A mismatch may be an append half done, so the pair
is read again while the partition's appends are held off (``read_index(consistent=True)``); a
mismatch that remains is logged as an ERROR naming the partition, the disk and both lengths, and
counted (``on_index_inconsistent``). The index is served as read (as in Riffle: the client's own
checks decide); nothing is copied anywhere (Riffle copies both files to /tmp/riffle-detection; a
server here writes nothing outside its data paths).

**Read CRC check** (``[localfile_store] read_crc_check_enable``, default on): a data read looks up the
index records of the blocks wholly inside its range (``LocalIO.index_entries_in``, a binary search over
the index file), reads the range once and checks each of those blocks' CRC (ISA-L) on the reader
thread, never on the event loop; the reply is those same bytes (no ``sendfile``, which would send
what the page cache holds then), or ``CorruptRange`` naming the blocks that do not match (the service
records them in the ``IntegrityLedger`` and refuses the read). A block cut by an edge of the range is
not checked (the Uniffle client reads ranges of whole blocks; its reader checks every block's CRC).

**Read-ahead** (``[localfile_store.read_ahead_options]``, Riffle's): a ``DiskReadAhead`` in the
``DiskResources`` decides on the event loop, for data reads whose app asked for it
(``ReadData.read_ahead``), which ranges to load (``riffle_actors.state.read_ahead``, O(1) per read)
and has them loaded with ``posix_fadvise(WILLNEED)`` on the disk's own read-ahead threads: never the
event loop, never ahead of the read itself in the reader pool. At most ``SEQUENTIAL_MAX_IN_FLIGHT``
sequential loads and ``read_plan_concurrency`` read-plan loads wait or run per disk; more are
skipped (counted as ignored). The bytes sit in the kernel's page cache, not in this process.

Its messages, replies and errors live in ``riffle_actors.actors.storage_messages``.

See also: ``riffle_actors.io.localfile`` (the blocking operations), ``riffle_actors.actors.spill``,
``riffle_actors.actors.disk_monitor``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from loguru import logger

from riffle_actors.actors.scrub import ScrubSettings, run_scrubber
from riffle_actors.actors.storage_messages import (
    AppendMeta,
    AppPurgedError,
    CorruptRange,
    DiskInfo,
    DiskIOError,
    DiskIOFailed,
    GetDiskInfo,
    PurgeFiles,
    ReadAheadHint,
    ReadData,
    ReadIndex,
    UnfenceApp,
    WriteBatch,
    WriteResult,
)
from riffle_actors.errors import RiffleError
from riffle_actors.io.local import LOCAL_IO, LocalIO
from riffle_actors.io.localfile import PURGE_STEP_OPS
from riffle_actors.io.meta_store import meta_path
from riffle_actors.io.safe_fs import RemovalProgress
from riffle_actors.protocol.crc import check_indexed
from riffle_actors.protocol.index import IndexEntry, index_inconsistency
from riffle_actors.runtime import Actor
from riffle_actors.state.integrity import CorruptBlock, IntegrityLedger
from riffle_actors.state.read_ahead import PlanCursor, ReadPlans, SequentialTracks
from riffle_actors.state.throttle import TokenBucket

_FENCE_LIMIT = 10_000


class DiskThrottle:
    """The disk's byte throughput limit (``[localfile_store.io_limiter]``), used on its IO threads.

    One ``TokenBucket`` per disk, shared by its writer and reader threads (as Riffle shares one
    limiter between a disk's reads and writes). ``wait(op, n)`` charges ``n`` bytes and sleeps the
    answered wait on the calling thread: those threads belong to the disk, so the event loop never
    waits, and a queued job keeps its place (a purge still runs after the writes before it).
    ``on_charged(op, n, wait_s)`` is called for every charge (the server counts it in metrics).
    ``clock``/``sleep`` are injectable for tests.
    """

    def __init__(self, capacity: int, *, read: bool = True, write: bool = True,
                 on_charged: Callable[[str, int, float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.read = read
        self.write = write
        self._clock = clock
        self._sleep = sleep
        self._on_charged = on_charged
        self._lock = threading.Lock()
        self.bucket = TokenBucket(capacity, now=clock())

    def charge(self, op: str, n: int) -> float:
        """Charge ``n`` bytes of ``op`` without sleeping; the seconds the caller must wait (the scrubber
        sleeps them on the event loop, holding no IO thread)."""
        if n <= 0:
            return 0.0
        with self._lock:
            wait = self.bucket.acquire(n, self._clock())
        if self._on_charged is not None:
            self._on_charged(op, n, wait)
        return wait

    def set_capacity(self, capacity: int) -> None:
        """A config reload: ``capacity`` bytes per second (and burst) from now on; what is owed stays
        owed, tokens above the new burst are dropped."""
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        with self._lock:
            b = self.bucket
            b.tokens(self._clock())  # refill at the old rate up to now
            b.rate = b.capacity = float(capacity)
            b._tokens = min(b._tokens, b.capacity)

    def wait(self, op: str, n: int) -> float:
        """Charge ``n`` bytes of ``op`` ("read" or "write"), sleep the wait; the seconds slept."""
        if n <= 0:
            return 0.0
        wait = self.charge(op, n)
        if wait > 0:
            self._sleep(wait)
        return wait


def _write_throttled(throttle: DiskThrottle, fn, *args):
    """On a writer thread: wait for the batch's data bytes, then append it."""
    throttle.wait("write", sum(len(b.data) for b in args[-1]))
    return fn(*args)


def _read_throttled(throttle: DiskThrottle, length: int | None, fn, *args):
    """On a reader thread: wait for ``length`` bytes then read; ``None``: read the index, then
    wait for its size (not known before)."""
    if length is not None:
        throttle.wait("read", length)
        return fn(*args)
    out = fn(*args)
    throttle.wait("read", len(out[0]))
    return out


SEQUENTIAL_MAX_IN_FLIGHT = 64
"""Sequential read-ahead loads queued or running per disk; a load beyond it is skipped (ignored)."""


class DiskReadAhead:
    """A disk's read-ahead (see the module docstring): the decisions (``SequentialTracks``, ``ReadPlans``)
    on the event loop, the loads on its own threads. ``on_advised(kind, outcome, nbytes)`` is called on
    the loop for each load: kind ``sequential`` or ``read_plan``; outcome ``loaded``, ``gone`` (the file
    was purged), ``missed`` (the reader passed the segment first), ``ignored`` (too many in flight) or
    ``failed``."""

    def __init__(self, name: str, *, batch_size: int, batch_number: int, read_plan_enable: bool = False,
                 read_plan_concurrency: int = 100, threads: int = 1,
                 on_advised: Callable[[str, str, int], None] | None = None):
        self.name = name
        self.sequential = SequentialTracks(batch_size, batch_number)
        self.plans = ReadPlans() if read_plan_enable else None
        self.read_plan_concurrency = read_plan_concurrency
        self.threads = threads
        self.on_advised = on_advised
        self.in_flight = {"sequential": 0, "read_plan": 0}
        self._pool: ThreadPoolExecutor | None = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"disk-ra-{self.name}")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def forget(self, app_id: str, shuffle_id: int | None) -> None:
        self.sequential.forget(app_id, shuffle_id)
        if self.plans is not None:
            self.plans.forget(app_id, shuffle_id)

    def on_read(self, local_io: LocalIO, root: str, msg: ReadData, hint: ReadAheadHint) -> None:
        """Decide (here, on the loop) and queue the loads a data read calls for."""
        key = (msg.app_id, msg.shuffle_id, msg.partition_id)
        if hint.sequential:
            load = self.sequential.on_read(key, msg.offset, hint.client)
            if load is not None:
                self._submit("sequential", SEQUENTIAL_MAX_IN_FLIGHT, local_io, root, key, load, None)
        elif self.plans is not None and hint.next_segments:
            # a frame may announce many segments: look at no more than can be loaded at once (the loop's
            # work per read stays bounded by read_plan_concurrency)
            cursor, new = self.plans.on_read(key, hint.task_attempt_id, msg.offset,
                                             hint.next_segments[:self.read_plan_concurrency])
            for load in new:
                self._submit("read_plan", self.read_plan_concurrency, local_io, root, key, load, cursor)

    def _submit(self, kind: str, limit: int, local_io: LocalIO, root: str, key: tuple[str, int, int],
                load: tuple[int, int], cursor: PlanCursor | None) -> None:
        if self.in_flight[kind] >= limit:
            self._count(kind, "ignored", load[1])
            return
        self.in_flight[kind] += 1
        fut = asyncio.get_running_loop().run_in_executor(self.pool, _advise, local_io, root, key, load, cursor)
        fut.add_done_callback(partial(self._done, kind, load[1]))

    def _done(self, kind: str, nbytes: int, fut: asyncio.Future) -> None:
        self.in_flight[kind] -= 1
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            logger.bind(disk=self.name).warning("disk {}: read-ahead of {} bytes failed: {!r}", self.name, nbytes, exc)
            self._count(kind, "failed", nbytes)
            return
        outcome, advised = fut.result()
        self._count(kind, outcome, advised if outcome == "loaded" else nbytes)

    def _count(self, kind: str, outcome: str, nbytes: int) -> None:
        if self.on_advised is not None:
            self.on_advised(kind, outcome, nbytes)


def _advise(local_io: LocalIO, root: str, key: tuple[str, int, int], load: tuple[int, int],
            cursor: PlanCursor | None) -> tuple[str, int]:
    """On a read-ahead thread: load one range unless its reader passed it meanwhile; (outcome, bytes
    asked of the kernel: the range cut at the file's end)."""
    offset, length = load
    if cursor is not None and offset < cursor.reading:
        return "missed", 0
    advised = local_io.advise_willneed(root, *key, offset, length)
    return ("gone", 0) if advised is None else ("loaded", advised)


def _read_index_checked(read, local_io: LocalIO, root: str, app_id: str, shuffle_id: int,
                        partition_id: int) -> tuple[bytes, int, str | None]:
    """On a reader thread: the index, the data file's length and what is inconsistent between them
    (None: nothing). A mismatch is looked at again with the partition's appends held off: one may
    have been half done (its data written, its index records not yet)."""
    index, data_len = read(root, app_id, shuffle_id, partition_id)
    problem = index_inconsistency(index, data_len)
    if problem is not None:
        index, data_len = local_io.read_index(root, app_id, shuffle_id, partition_id, consistent=True)
        problem = index_inconsistency(index, data_len)
    return index, data_len, problem


def _read_checked(read, local_io: LocalIO, root: str, app_id: str, shuffle_id: int, partition_id: int,
                  offset: int, length: int) -> tuple[bytes, int, int, list[tuple[IndexEntry, int]]]:
    """On a reader thread: the range's bytes, read once, and their check against the index records of
    the blocks wholly inside it (``[localfile_store] read_crc_check_enable``): (bytes, blocks checked,
    bytes checked, the records whose bytes do not match with the CRC the bytes have). The records are
    looked up first: an append writes its data before its index records, so every record found
    indexes bytes already in the file."""
    entries = local_io.index_entries_in(root, app_id, shuffle_id, partition_id, offset, length)
    data = read(root, app_id, shuffle_id, partition_id, offset, length)
    if not entries:
        return data, 0, 0, []
    return data, len(entries), sum(e.length for e in entries), check_indexed(data, offset, entries)


@dataclass(eq=False)
class DiskResources:
    """What a disk keeps across Disk actor restarts: threads, IO layer, fences (see module docstring).

    ``monitor_name`` is the registered name of the DiskMonitor to report IO failures to, looked up at each
    report (it starts after the disks; a name survives restarts); None: not reported.
    """

    name: str
    root: str
    local_io: LocalIO = LOCAL_IO
    write_threads: int = 1
    read_threads: int = 2
    io_timeout_s: float | None = None
    monitor_name: str | None = None
    throttle: DiskThrottle | None = None  # [localfile_store.io_limiter]; None: not limited
    index_check: bool = False  # index_consistency_detection_enable
    read_crc_check: bool = False  # [localfile_store] read_crc_check_enable (the server's default: on)
    on_read_checked: Callable[[str, int, int], None] | None = None  # (disk, bytes, blocks) checked on read
    on_index_inconsistent: Callable[[str], None] | None = None  # called with the problem (metrics)
    read_ahead: DiskReadAhead | None = None  # [localfile_store.read_ahead_options]; None: off
    # purged apps / shuffles -> newest fenced shuffle epoch, newest last; bounded so a
    # long-lived server does not grow
    fenced: OrderedDict[tuple[str, int | None], int] = field(default_factory=OrderedDict)
    root_ready: bool = False
    written_bytes: int = 0   # counters of the disk, not of one incarnation
    write_failures: int = 0
    # app purges whose deletion failed: tried again by the next PurgeFiles and every new incarnation,
    # forgotten when the app id registers again (``UnfenceApp``: the files would be the new app's)
    failed_purges: set[str] = field(default_factory=set)
    # entries deleted by purges on this disk: a purge step waiting behind another one is not hung
    purge_progress: RemovalProgress = field(default_factory=RemovalProgress)
    purges: set[asyncio.Task] = field(default_factory=set)  # running purges (they outlive an incarnation)
    purging: dict[tuple[str, int | None], asyncio.Task] = field(default_factory=dict)  # the newest one per key
    # the scrubber ([localfile_store] scrub_rate; riffle_actors.actors.scrub): one task per disk, started
    # by the first incarnation, findings in the server's IntegrityLedger; callbacks count it in metrics
    integrity: IntegrityLedger | None = None
    scrub: ScrubSettings | None = None
    on_scrub_checked: Callable[[str, int, int, int], None] | None = None
    on_scrub_pass: Callable[[str], None] | None = None
    scrub_task: asyncio.Task | None = None
    _writer: ThreadPoolExecutor | None = None
    _reader: ThreadPoolExecutor | None = None
    _meta: ThreadPoolExecutor | None = None

    @property
    def writer(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(self.write_threads, thread_name_prefix=f"disk-w-{self.name}")
        return self._writer

    @property
    def reader(self) -> ThreadPoolExecutor:
        if self._reader is None:
            self._reader = ThreadPoolExecutor(self.read_threads, thread_name_prefix=f"disk-r-{self.name}")
        return self._reader

    @property
    def meta(self) -> ThreadPoolExecutor:
        """The metadata log's own thread: a report never waits behind a big (or hung) spill write."""
        if self._meta is None:
            self._meta = ThreadPoolExecutor(1, thread_name_prefix=f"disk-m-{self.name}")
        return self._meta

    def close(self) -> None:
        """Stop taking work; never waits (a thread may be stuck in the kernel on a dying disk)."""
        if self.scrub_task is not None:
            self.scrub_task.cancel()
            self.scrub_task = None
        for pool in (self._writer, self._reader, self._meta):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._writer = self._reader = self._meta = None
        if self.read_ahead is not None:
            self.read_ahead.close()


@dataclass(frozen=True, slots=True)
class RetryFailedPurges:
    """Told by the timer: delete again the apps whose purge failed on this disk (usually none)."""


DiskMsg = (WriteBatch | ReadIndex | ReadData | PurgeFiles | UnfenceApp | GetDiskInfo | RetryFailedPurges
           | AppendMeta)


class DiskActor(Actor):
    expected_errors = (RiffleError,)

    def __init__(self, name: str, root: str, *, write_threads: int = 1, read_threads: int = 2,
                 resources: DiskResources | None = None):
        self.disk_name = name
        self.root = root
        # without shared resources (unit tests), this incarnation owns its threads and closes them
        self._owns_resources = resources is None
        self.res = resources or DiskResources(name, root, write_threads=write_threads, read_threads=read_threads)
        self._fenced = self.res.fenced

    async def on_start(self) -> None:
        # Once per disk, not per incarnation: a restart must not queue behind a write the previous
        # incarnation left stuck on the writer thread. On that thread all the same (a hung disk must
        # not block the event loop); a disk failing here still starts, its writes fail and the
        # monitor quarantines it (appends create the directories they need anyway).
        if self.res.failed_purges:
            self._retry_failed_purges()
        self._start_scrubber()
        if self.res.root_ready:
            return
        try:
            await self._wrap("create data path", asyncio.get_running_loop().run_in_executor(
                self.res.writer, self.res.local_io.ensure_root, self.root))
            self.res.root_ready = True
        except DiskIOError as e:
            logger.bind(disk=self.disk_name).error("disk {}: {}", self.disk_name, e)

    async def on_stop(self) -> None:
        if self._owns_resources:
            self.res.close()

    def _start_scrubber(self) -> None:
        res = self.res
        if res.scrub is None or res.integrity is None or (res.scrub_task is not None and not res.scrub_task.done()):
            return
        fenced = self._fenced
        res.scrub_task = asyncio.get_running_loop().create_task(run_scrubber(
            disk=self.disk_name, root=self.root, local_io=res.local_io, reader=lambda: res.reader,
            ledger=res.integrity, settings=res.scrub, throttle=res.throttle,
            is_fenced=lambda a, s: (a, None) in fenced or (a, s) in fenced,
            on_checked=res.on_scrub_checked, on_pass=res.on_scrub_pass), name=f"scrub:{self.disk_name}")

    def _is_fenced(self, app_id: str, shuffle_id: int, epoch: int) -> bool:
        return (app_id, None) in self._fenced or self._fenced.get((app_id, shuffle_id), -1) >= epoch

    def receive(self, msg: DiskMsg):
        loop = asyncio.get_running_loop()
        match msg:
            case WriteBatch():
                if self._is_fenced(msg.app_id, msg.shuffle_id, msg.epoch):
                    raise AppPurgedError(f"app {msg.app_id} shuffle {msg.shuffle_id} was purged")
                submit = partial(loop.run_in_executor, self.res.writer,
                                 self._throttled_write(self.res.local_io.append_batch),
                                 self.root, msg.app_id, msg.shuffle_id, msg.partition_id, msg.blocks)
                pending = self._purges_of(((msg.app_id, msg.shuffle_id),))
                if pending:  # a new incarnation's write waits for the old one's purge (not timed)
                    def write_now():
                        if self._is_fenced(msg.app_id, msg.shuffle_id, msg.epoch):  # purged again meanwhile
                            raise AppPurgedError(f"app {msg.app_id} shuffle {msg.shuffle_id} was purged")
                        return self._finish_write(msg, submit())
                    return self._after_purges(pending, write_now)
                return self._finish_write(msg, submit())
            case ReadIndex():
                read = self._throttled_read(None, self.res.local_io.read_index)
                if self.res.index_check:
                    return self._checked_index(msg, loop.run_in_executor(
                        self.res.reader, _read_index_checked, read, self.res.local_io, self.root,
                        msg.app_id, msg.shuffle_id, msg.partition_id))
                return self._wrap("read index", loop.run_in_executor(
                    self.res.reader, read, self.root, msg.app_id, msg.shuffle_id, msg.partition_id))
            case ReadData():
                if msg.read_ahead is not None and self.res.read_ahead is not None:
                    self.res.read_ahead.on_read(self.res.local_io, self.root, msg, msg.read_ahead)
                if self.res.read_crc_check:  # read once, check, serve those bytes (never sendfile)
                    return self._checked_read(msg, loop.run_in_executor(
                        self.res.reader, _read_checked, self._throttled_read(msg.length, self.res.local_io.read_data),
                        self.res.local_io, self.root, msg.app_id, msg.shuffle_id, msg.partition_id, msg.offset,
                        msg.length))
                read = self.res.local_io.open_data if msg.as_file else self.res.local_io.read_data
                return self._wrap("read data", loop.run_in_executor(
                    self.res.reader, self._throttled_read(msg.length, read), self.root, msg.app_id,
                    msg.shuffle_id, msg.partition_id, msg.offset, msg.length))
            case PurgeFiles():
                if self.res.read_ahead is not None:
                    self.res.read_ahead.forget(msg.app_id, msg.shuffle_id)
                key = (msg.app_id, msg.shuffle_id)
                self._fenced[key] = max(self._fenced.pop(key, -1), msg.epoch)
                while len(self._fenced) > _FENCE_LIMIT:
                    self._fenced.popitem(last=False)
                if self.res.failed_purges:
                    self._retry_failed_purges(skip=msg.app_id)
                if self.res.integrity is not None:  # the corrupt blocks found go with their files
                    self.res.integrity.forget_files(msg.app_id, msg.shuffle_id, self.disk_name)
                return self._purge_reply(self._submit_purge(msg.app_id, msg.shuffle_id))
            case AppendMeta(entries=entries):
                # on the metadata thread; fences are checked now (mailbox order with the purges) and
                # again on the thread before and after the write (see _append_meta)
                todo = [None if self._is_fenced(e.app_id, e.shuffle_id, e.epoch) else e for e in entries]
                append = partial(loop.run_in_executor, self.res.meta, _append_meta, self.res.local_io, self.root,
                                 self.disk_name, todo, self._is_fenced)
                pending = self._purges_of((e.app_id, e.shuffle_id) for e in todo if e is not None)
                if pending:
                    return self._after_purges(pending, lambda: self._wrap("metadata append", append()))
                return self._wrap("metadata append", append())
            case UnfenceApp(app_id=app_id):
                # late spills of the purged incarnation are dropped by the SpillDispatcher (their
                # owner is dead); writes queued after this message belong to the new incarnation
                for key in [k for k in self._fenced if k[0] == app_id]:
                    del self._fenced[key]
                self.res.failed_purges.discard(app_id)
            case RetryFailedPurges():
                if self.res.failed_purges:
                    self._retry_failed_purges()
            case GetDiskInfo(with_usage=with_usage):
                if not with_usage:
                    return DiskInfo(self.disk_name, self.root, 0, 0, self.res.written_bytes,
                                    self.res.write_failures)
                # statvfs on the reader pool: even a stat may hang on a dying disk
                return self._info(loop.run_in_executor(self.res.reader, self.res.local_io.usage, self.root))
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    def _throttled_write(self, fn):
        """``fn`` behind the disk throttle when writes are limited (``io_limiter.write_enable``)."""
        t = self.res.throttle
        return partial(_write_throttled, t, fn) if t is not None and t.write else fn

    def _throttled_read(self, length: int | None, fn):
        """``fn`` behind the disk throttle when reads are limited (``io_limiter.read_enable``)."""
        t = self.res.throttle
        return partial(_read_throttled, t, length, fn) if t is not None and t.read else fn

    def _submit_purge(self, app_id: str, shuffle_id: int | None) -> asyncio.Future:
        """Start a deletion, in steps on the writer thread. It runs whatever happens to this incarnation
        (a crash does not cancel it); an app purge that fails is kept for a retry."""
        task = asyncio.get_running_loop().create_task(_run_purge(self.res, self.root, app_id, shuffle_id),
                                                      name=f"purge:{self.disk_name}:{app_id}:{shuffle_id}")
        self.res.purges.add(task)
        task.add_done_callback(self.res.purges.discard)
        key = (app_id, shuffle_id)
        self.res.purging[key] = task
        purging = self.res.purging

        def forget(t: asyncio.Task[Any], k: tuple[str, int | None] = key) -> None:
            if purging.get(k) is t:
                del purging[k]
        task.add_done_callback(forget)
        if shuffle_id is None:
            task.add_done_callback(partial(_purge_done, self.res, app_id))
        return task

    def _purges_of(self, keys) -> set[asyncio.Task]:
        """The running purges a write for ``(app id, shuffle id)`` keys must wait for: a purge deletes in steps,
        so without this a new incarnation's files (the app or shuffle id registered again) written between
        two steps would be deleted by the next one."""
        purging = self.res.purging
        if not purging:
            return set()
        found = set()
        for app_id, shuffle_id in keys:
            for key in ((app_id, None), (app_id, shuffle_id)):
                task = purging.get(key)
                if task is not None and not task.done():
                    found.add(task)
        return found

    async def _after_purges(self, pending: set[asyncio.Task], then):
        await asyncio.wait(pending)  # their failures are reported by their own reply
        return await then()

    async def _purge_reply(self, fut: asyncio.Future) -> None:
        try:
            await asyncio.shield(fut)
        except OSError as e:  # TimeoutError included: nothing was deleted for io_timeout_s
            raise self._failed("purge", e) from e

    def _retry_failed_purges(self, skip: str | None = None) -> None:
        for app_id in sorted(self.res.failed_purges - {skip}):
            logger.bind(disk=self.disk_name, app_id=app_id).info("disk {}: retrying the purge of app {}",
                                                                 self.disk_name, app_id)
            self._submit_purge(app_id, None).add_done_callback(_consume)

    async def _timed(self, op: str, fut: asyncio.Future):
        """Await an IO future within ``io_timeout_s``; the thread itself cannot be interrupted."""
        timeout = self.res.io_timeout_s
        if timeout is None:
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            fut.add_done_callback(_consume)  # finishes late, or never: nobody waits for it any more
            raise TimeoutError(f"{op} did not finish within {timeout:g}s (disk_io_timeout_sec)") from None

    async def _finish_write(self, msg: WriteBatch, fut: asyncio.Future) -> WriteResult:
        try:
            offset, data_len = await self._timed("spill write", fut)
        except OSError as e:
            self.res.write_failures += 1
            logger.bind(disk=self.disk_name, app_id=msg.app_id).error(
                "spill of {} blocks of {}/{}/{} to disk {} failed: {}", len(msg.blocks), msg.app_id, msg.shuffle_id,
                msg.partition_id, self.disk_name, e)
            raise self._failed("spill write", e) from e
        self.res.written_bytes += data_len - offset
        return WriteResult(self.disk_name, offset, data_len)

    async def _wrap(self, op: str, fut: asyncio.Future):
        try:
            return await self._timed(op, fut)
        except OSError as e:
            raise self._failed(op, e) from e

    async def _checked_index(self, msg: ReadIndex, fut: asyncio.Future) -> tuple[bytes, int]:
        index, data_len, problem = await self._wrap("read index", fut)
        if problem is not None:
            logger.bind(disk=self.disk_name, app_id=msg.app_id).error(
                "index inconsistency (index_consistency_detection_enable): app {} shuffle {} partition {} on disk "
                "{}: {}; index {} bytes, data file {} bytes", msg.app_id, msg.shuffle_id, msg.partition_id,
                self.disk_name, problem, len(index), data_len)
            if self.res.on_index_inconsistent is not None:
                self.res.on_index_inconsistent(problem)
        return index, data_len

    async def _checked_read(self, msg: ReadData, fut: asyncio.Future) -> bytes | CorruptRange:
        data, blocks, checked, bad = await self._wrap("read data", fut)
        if self.res.on_read_checked is not None:
            self.res.on_read_checked(self.disk_name, checked, blocks)
        if not bad:
            return data
        logger.bind(disk=self.disk_name, app_id=msg.app_id).error(
            "disk {}: {} corrupt block(s) in a read of {}/{}/partition-{}.data [{}, +{}) (first: block {} at "
            "offset {}, index crc {}, bytes crc {}); the read is refused", self.disk_name, len(bad), msg.app_id,
            msg.shuffle_id, msg.partition_id, msg.offset, msg.length, bad[0][0].block_id, bad[0][0].offset,
            bad[0][0].crc, bad[0][1])
        return CorruptRange(tuple(CorruptBlock(e.offset, e.length, e.block_id, e.crc, actual, "read check")
                                  for e, actual in bad))

    async def _info(self, fut: asyncio.Future) -> DiskInfo:
        try:
            capacity, used = await asyncio.wait_for(asyncio.shield(fut), self.res.io_timeout_s or 10.0)
        except (OSError, TimeoutError):
            fut.add_done_callback(_consume)
            capacity = used = 0
        return DiskInfo(self.disk_name, self.root, capacity, used,
                        self.res.written_bytes, self.res.write_failures)

    def _failed(self, op: str, exc: BaseException) -> DiskIOError:
        err = DiskIOError(self.disk_name, op, exc)
        monitor = self.system.get(self.res.monitor_name) if self.res.monitor_name is not None else None
        # only what says something about the disk (a missing file or a bad offset does not)
        if monitor is not None and err.kind.blames_disk:
            try:
                monitor.tell_nowait(DiskIOFailed(disk=self.disk_name, kind=err.kind, op=op, detail=err.detail))
            except Exception as e:  # noqa: BLE001 - the failure still reaches the caller
                logger.bind(disk=self.disk_name).warning("could not report {} to the disk monitor: {!r}", op, e)
        return err


async def _run_purge(res: DiskResources, root: str, app_id: str, shuffle_id: int | None) -> None:
    """Delete the app's (shuffle's) files step by step; ``TimeoutError`` when a step made no progress on
    this disk within ``io_timeout_s`` (see the module docstring)."""
    loop = asyncio.get_running_loop()
    progress = res.purge_progress
    while True:
        fut = loop.run_in_executor(res.writer, partial(res.local_io.remove_app, root, app_id, shuffle_id,
                                                       max_ops=PURGE_STEP_OPS, progress=progress))
        timeout = res.io_timeout_s
        while True:
            seen = progress.ops
            try:
                done = await asyncio.wait_for(asyncio.shield(fut), timeout)
                break
            except TimeoutError:
                if progress.ops != seen:
                    continue  # deleting, only slowly (or behind another purge's step): not hung
                fut.add_done_callback(_consume)
                raise TimeoutError(f"purge deleted nothing within {timeout:g}s (disk_io_timeout_sec)") from None
        if done is not False:  # True (or None, from a LocalIO that deletes in one go): nothing left
            return


def _purge_done(res: DiskResources, app_id: str, fut: asyncio.Future) -> None:
    if fut.cancelled() or fut.exception() is not None:
        res.failed_purges.add(app_id)
    else:
        res.failed_purges.discard(app_id)


def _append_meta(local_io: LocalIO, root: str, disk: str, entries: list, is_fenced) -> tuple:
    """On the metadata thread: each entry's records (None: fenced); per entry None or its exception.

    A purge sets its fence on the event loop before its ``rmtree`` runs on the writer thread, so an
    append that finds no fence before writing but one after may have raced the ``rmtree``: it removes
    what it wrote (the file and the directories it left empty).
    """
    out: list[BaseException | None] = []
    for e in entries:
        if e is None or is_fenced(e.app_id, e.shuffle_id, e.epoch):
            out.append(AppPurgedError("the shuffle was purged; metadata not written"))
            continue
        try:
            local_io.append_meta(root, e.app_id, e.shuffle_id, e.records)
        except OSError as exc:
            out.append(DiskIOError(disk, "metadata append", exc))
            continue
        if is_fenced(e.app_id, e.shuffle_id, e.epoch):
            _remove_meta(root, e.app_id, e.shuffle_id)
            out.append(AppPurgedError("the shuffle was purged; metadata removed"))
        else:
            out.append(None)
    return tuple(out)


def _remove_meta(root: str, app_id: str, shuffle_id: int) -> None:
    path = meta_path(root, app_id, shuffle_id)
    try:
        os.unlink(path)
    except OSError:
        pass
    for d in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        try:
            os.rmdir(d)  # only if empty
        except OSError:
            break


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()

