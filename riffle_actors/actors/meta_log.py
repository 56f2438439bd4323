"""ShuffleMetaLog: batches the shuffle metadata records of every app and hands them to the Disk actors.

One object per server, used on the event loop by the AppActors (registrations, reported block
ids) and PartitionActors (segment records). It is not an actor: ``append`` only queues the
record and returns a future; per disk, at most one ``AppendMeta`` is in flight, carrying every
record queued since the previous one (the records of one loop turn, or of the time a write took,
go to disk in one job on the disk's metadata thread, never behind a spill). The future resolves
once the record is written (to the page cache: a killed process loses nothing acknowledged after
that; a power loss may, nothing here calls fsync), or fails when no disk could take it, or with
``AppPurgedError`` when the shuffle was purged first.

Which disk: every record of an app goes to the app's *home* disk, so one file per shuffle holds
its registration, reports and segment list. ``home`` picks it on first use by hashing the app id
over the disks that take data (the ``DiskHealthBoard``); a recovered app keeps the home its logs
were found on (``set_home``). When a write fails on the home disk (EIO, EROFS, ENOSPC, a timeout,
the disk actor restarting), the app moves to another disk: the registrations of its shuffles
(kept in memory for this) and every id it reported so far (asked from the AppActor, ``attach``) are
written there first, then the failed records, so the new file is complete on its own; a restart
merges the logs of every disk.

When every disk failed a record, it is *parked* and tried again on the injected clock (a pause
of 0.05 s doubling up to 1 s) for up to ``meta_write_retry_timeout_sec`` after its first failure:
a disk that is read-only, full or failing for a few seconds costs the request time, not a failed
registerShuffle or reportShuffleResult (the 0.9.2 client does not retry either on an error
status). Only after that does the record's future fail (the client gets an error; nothing is
acknowledged before it is written). The copies a move writes (registrations, reported ids) are
never parked: they are rebuilt from memory, before the parked record, when it is tried again.

See also: ``riffle_actors.protocol.shuffle_meta`` (record format), ``riffle_actors.io.meta_store``
(the file), ``riffle_actors.actors.disk`` (``AppendMeta``), ``riffle_actors.recovery``.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Sequence

from loguru import logger

from riffle_actors.actors.storage_messages import AppendMeta, AppPurgedError, MetaEntry
from riffle_actors.errors import InternalError
from riffle_actors.log import RateLimitedLog
from riffle_actors.protocol.shuffle_meta import BLOCK_IDS, REGISTER
from riffle_actors.runtime import ActorDeadError, ActorRef, Cancellable, Clock, SystemClock
from riffle_actors.state.disk_health import DiskHealthBoard

RETRY_FIRST_PAUSE_S = 0.05
RETRY_MAX_PAUSE_S = 1.0


class _Pending:
    __slots__ = ("app_id", "body", "copy", "deadline", "epoch", "future", "kind", "retries", "shuffle_id", "tried")

    def __init__(self, app_id: str, shuffle_id: int, epoch: int, kind: int, body: bytes,
                 future: asyncio.Future[None] | None, tried: tuple[str, ...] = (), copy: bool = False) -> None:
        self.app_id = app_id
        self.shuffle_id = shuffle_id
        self.epoch = epoch
        self.kind = kind
        self.body = body
        self.future = future
        self.tried = tried  # disks that failed this record (this round)
        self.copy = copy  # written by a move (rebuilt from memory), never parked
        self.deadline: float | None = None  # set when it is parked the first time
        self.retries = 0  # rounds over every disk that failed it


class _DiskQueue:
    __slots__ = ("items", "task")

    def __init__(self) -> None:
        self.items: list[_Pending] = []
        self.task: asyncio.Task[None] | None = None


class ShuffleMetaLog:
    """See the module docstring."""

    def __init__(self, disks: Sequence[tuple[str, ActorRef]], health: DiskHealthBoard | None = None, *,
                 clock: Clock | None = None, retry_timeout_s: float = 30.0) -> None:
        self.disk_names = [name for name, _ in disks]
        self.clock = clock or SystemClock()
        self.retry_timeout_s = retry_timeout_s  # meta_write_retry_timeout_sec
        self.disks = dict(disks)
        self.health = health
        self._queues: dict[str, _DiskQueue] = {name: _DiskQueue() for name in self.disk_names}
        self._homes: dict[str, str] = {}
        # (app, shuffle) -> (epoch, registration bodies): written again on a new home disk
        self._registrations: dict[tuple[str, int], tuple[int, list[bytes]]] = {}
        # app -> what it reported so far, as BLOCK_IDS bodies per (shuffle, epoch): written on a new home too
        self._reported: dict[str, Callable[[], list[tuple[int, int, bytes]]]] = {}
        self.records_written = 0
        self.write_failures = 0
        self.moves = 0
        self.retries = 0  # parked records tried again
        self.retry_failures = 0  # records failed after meta_write_retry_timeout_sec
        self._parked: dict[_Pending, Cancellable] = {}
        self._incomplete: set[str] = set()  # apps whose move copies were dropped: rebuilt at the next retry
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._park_log = RateLimitedLog(10.0, monotonic=self.clock.monotonic)

    # ------------------------------------------------------------- homes
    def home(self, app_id: str) -> str:
        disk = self._homes.get(app_id)
        if disk is None:
            disk = self._homes[app_id] = self._pick(app_id, ())
        return disk

    def set_home(self, app_id: str, disk: str) -> None:
        if disk in self.disks:
            self._homes[app_id] = disk

    def _pick(self, app_id: str, exclude: Sequence[str]) -> str:
        names = [n for n in self.disk_names if n not in exclude] or list(self.disk_names)
        if self.health is not None:
            names = [n for n in names if self.health.placeable(n)] or names
        return names[zlib.crc32(app_id.encode()) % len(names)]

    def remember_registration(self, app_id: str, shuffle_id: int, epoch: int, body: bytes) -> None:
        """A registration already on disk (a recovered shuffle): written again if the app moves."""
        self._registrations[(app_id, shuffle_id)] = (epoch, [body])

    def attach(self, app_id: str, reported: Callable[[], list[tuple[int, int, bytes]]]) -> None:
        """``reported()``: the app's reported ids, as ``(shuffle id, epoch, BLOCK_IDS body)``, for a move."""
        self._reported[app_id] = reported

    def forget_shuffle(self, app_id: str, shuffle_id: int) -> None:
        self._registrations.pop((app_id, shuffle_id), None)
        self._drop_parked(lambda it: it.app_id == app_id and it.shuffle_id == shuffle_id)

    def forget_app(self, app_id: str) -> None:
        self._homes.pop(app_id, None)
        self._reported.pop(app_id, None)
        self._incomplete.discard(app_id)
        for key in [k for k in self._registrations if k[0] == app_id]:
            del self._registrations[key]
        self._drop_parked(lambda it: it.app_id == app_id)

    def _drop_parked(self, match: Callable[[_Pending], bool]) -> None:
        """Parked records of a purged app or shuffle: not tried again, their futures fail as purged."""
        for item in [it for it in self._parked if match(it)]:
            self._parked.pop(item).cancel()
            _settle(item.future, AppPurgedError(f"app {item.app_id} shuffle {item.shuffle_id} was purged"))
        if not self._parked:
            self._wake_drain()

    # ------------------------------------------------------------- records
    def append(self, app_id: str, shuffle_id: int, epoch: int, kind: int, body: bytes,
               *, wait: bool = True) -> asyncio.Future[None] | None:
        """Queue one record on the app's home disk; a future of its write when ``wait`` (else failures
        are only logged)."""
        if kind == REGISTER:
            known = self._registrations.get((app_id, shuffle_id))
            if known is None or known[0] != epoch:
                self._registrations[(app_id, shuffle_id)] = (epoch, [body])
            else:
                known[1].append(body)
        fut = asyncio.get_running_loop().create_future() if wait else None
        self._queue(self.home(app_id), _Pending(app_id, shuffle_id, epoch, kind, body, fut))
        return fut

    def _queue(self, disk: str, item: _Pending) -> None:
        q = self._queues[disk]
        q.items.append(item)
        if q.task is None:
            q.task = asyncio.get_running_loop().create_task(self._flush(disk, q), name=f"meta-log:{disk}")

    @property
    def parked(self) -> int:
        """Records waiting to be tried again (every disk failed them)."""
        return len(self._parked)

    async def drain(self) -> None:
        """Wait until every record queued so far is written (or failed), parked ones included."""
        while True:
            tasks = [q.task for q in self._queues.values() if q.task is not None]
            if tasks:
                await asyncio.wait(tasks)
            elif self._parked:
                waiter = asyncio.get_running_loop().create_future()
                self._drain_waiters.append(waiter)
                await waiter
            else:
                return

    async def _flush(self, disk: str, q: _DiskQueue) -> None:
        try:
            await asyncio.sleep(0)  # let the records of this loop turn join the batch
            while q.items:
                items, q.items = q.items, []
                entries, where = _merge(items)
                try:
                    per_entry = await self.disks[disk].ask(AppendMeta(entries))
                    results = [per_entry[i] for i in where]
                except ActorDeadError:
                    results = [InternalError(f"disk {disk} restarted during a metadata write")] * len(items)
                except Exception as e:  # noqa: BLE001 - every record gets the failure
                    results = [e] * len(items)
                failed: list[_Pending] = []
                for item, err in zip(items, results, strict=True):
                    if err is None:
                        self.records_written += 1
                        _settle(item.future, None)
                    elif isinstance(err, AppPurgedError):
                        _settle(item.future, err)
                    else:
                        self.write_failures += 1
                        item.tried = (*item.tried, disk)
                        failed.append(item)
                if failed:
                    self._move(disk, failed, results[items.index(failed[0])])
        finally:
            q.task = None

    def _move(self, disk: str, failed: list[_Pending], err: BaseException | None) -> None:
        """Records that failed on ``disk``: their apps move to another disk (registrations first)."""
        moved: set[str] = set()
        for item in failed:
            if len(item.tried) >= len(self.disk_names):
                self._park(item, err)
                continue
            app_id = item.app_id
            if self._homes.get(app_id, disk) == disk and app_id not in moved:
                new = self._pick(app_id, item.tried)
                self._homes[app_id] = new
                moved.add(app_id)
                self.moves += 1
                logger.bind(app_id=app_id).warning(
                    "metadata of app {} moves from disk {} to {}: {}", app_id, disk, new, err)
                for (a, sid), (epoch, bodies) in list(self._registrations.items()):
                    if a == app_id:
                        for body in bodies:
                            self._queue(new, _Pending(a, sid, epoch, REGISTER, body, None, item.tried, copy=True))
                # and every id reported so far: the old disk may be gone at the next restart
                self._queue_reported(app_id, new, item.tried)
            target = self._homes[app_id]
            if target in item.tried:
                target = self._pick(app_id, item.tried)
            self._queue(target, item)

    def _queue_reported(self, app_id: str, disk: str, tried: tuple[str, ...]) -> None:
        reported = self._reported.get(app_id)
        for sid, epoch, body in reported() if reported is not None else ():
            self._queue(disk, _Pending(app_id, sid, epoch, BLOCK_IDS, body, None, tried, copy=True))

    # ------------------------------------------------------------- every disk failed: park, retry
    def _park(self, item: _Pending, err: BaseException | None) -> None:
        """``item`` failed on every disk: try it again after a pause, until ``retry_timeout_s`` passed."""
        if item.copy:  # rebuilt from memory before the app's next parked record is tried again
            self._incomplete.add(item.app_id)
            return
        now = self.clock.monotonic()
        if item.deadline is None:
            item.deadline = now + self.retry_timeout_s
        if now >= item.deadline:
            self.retry_failures += 1
            logger.bind(app_id=item.app_id).error(
                "metadata record of app {} shuffle {} could not be written on any disk within "
                "meta_write_retry_timeout_sec={}s: {}", item.app_id, item.shuffle_id, self.retry_timeout_s, err)
            _settle(item.future, InternalError(
                f"no disk could take the shuffle metadata (tried for meta_write_retry_timeout_sec="
                f"{self.retry_timeout_s:g}s): {err}"))
            return
        log, suppressed = self._park_log.should_log("park")
        if log:
            logger.bind(app_id=item.app_id).warning(
                "metadata record of app {} shuffle {}: no disk takes it ({}); tried again for up to "
                "meta_write_retry_timeout_sec={}s{}", item.app_id, item.shuffle_id, err, self.retry_timeout_s,
                f" ({suppressed} more records since the last line)" if suppressed else "")
        pause = min(RETRY_MAX_PAUSE_S, RETRY_FIRST_PAUSE_S * (2 ** min(item.retries, 16)), item.deadline - now)
        item.retries += 1
        self._parked[item] = self.clock.call_at(now + pause, lambda: self._unpark(item))

    def _unpark(self, item: _Pending) -> None:
        if self._parked.pop(item, None) is None:
            return
        self.retries += 1
        item.tried = ()
        app_id = item.app_id
        home = self.home(app_id)
        if app_id in self._incomplete:  # the copies of its last move were dropped: write them first
            self._incomplete.discard(app_id)
            for (a, sid), (epoch, bodies) in list(self._registrations.items()):
                if a == app_id:
                    for body in bodies:
                        self._queue(home, _Pending(a, sid, epoch, REGISTER, body, None, copy=True))
            self._queue_reported(app_id, home, ())
        self._queue(home, item)
        self._wake_drain()

    def _wake_drain(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


def _settle(fut: asyncio.Future[None] | None, err: BaseException | None) -> None:
    if fut is None:
        if err is not None and not isinstance(err, AppPurgedError):
            logger.warning("metadata record not written: {}", err)
        return
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)


def _merge(items: list[_Pending]) -> tuple[tuple[MetaEntry, ...], list[int]]:
    """Consecutive records of one shuffle become one entry (one file open for all); and, per record,
    the index of the entry that carries it."""
    groups: list[tuple[_Pending, list[tuple[int, bytes]]]] = []
    where: list[int] = []
    for it in items:
        last = groups[-1][0] if groups else None
        if last is not None and (last.app_id, last.shuffle_id, last.epoch) == (it.app_id, it.shuffle_id, it.epoch):
            groups[-1][1].append((it.kind, it.body))
        else:
            groups.append((it, [(it.kind, it.body)]))
        where.append(len(groups) - 1)
    return tuple(MetaEntry(g.app_id, g.shuffle_id, g.epoch, tuple(r)) for g, r in groups), where
