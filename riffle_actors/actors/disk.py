"""DiskActor: one per entry of ``data_paths``; owns every file under its root and its threads.

It serialises appends on one writer thread (so a partition's index records stay in
data-file order, spec §5.4) and serves index/data reads on a small reader pool, never on
the event loop. Purges run on the writer thread too, after every write accepted before
them, and fence the purged app/shuffle so a late spill cannot recreate its files. A shuffle
fence covers the purged incarnations only (writes carry the shuffle's ``epoch``), so a shuffle
id registered again is written normally; an app id registered again is unfenced (``UnfenceApp``).

Replies are "reply later" futures: the mailbox keeps flowing while the threads work.
Failures surface as ``DiskIOError`` (an ``OSError`` classified by errno, naming the disk);
the SpillDispatcher decides what to do with a failed write, readers get a clear status.

See also: ``riffle_actors.io.localfile`` (the blocking operations), ``riffle_actors.actors.spill``.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from loguru import logger

from riffle_actors.actors import Actor
from riffle_actors.errors import RiffleError, StatusCode
from riffle_actors.io import localfile
from riffle_actors.records import Block


class DiskIOError(RiffleError):
    """An IO failure on a disk; ``kind`` is ENOSPC / EIO / EROFS / TIMEOUT / OTHER."""

    status = StatusCode.INTERNAL_ERROR

    def __init__(self, disk: str, op: str, exc: BaseException):
        self.disk = disk
        self.kind = classify(exc)
        super().__init__(f"disk {disk}: {op} failed ({self.kind}): {exc}")


class AppPurgedError(RiffleError):
    """A write for an app or shuffle this disk already purged; the data is not wanted any more."""


def classify(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "TIMEOUT"
    if isinstance(exc, OSError):
        return {errno.ENOSPC: "ENOSPC", errno.EIO: "EIO", errno.EROFS: "EROFS", errno.EDQUOT: "ENOSPC"}.get(
            exc.errno or 0, "OTHER")
    return "OTHER"


# ---------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True, kw_only=True)
class WriteBatch:
    app_id: str
    shuffle_id: int
    partition_id: int
    blocks: tuple[Block, ...]
    epoch: int = 0  # incarnation of the shuffle; see PurgeFiles


@dataclass(frozen=True, slots=True)
class WriteResult:
    disk: str
    offset: int
    data_file_len: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadIndex:
    app_id: str
    shuffle_id: int
    partition_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadData:
    app_id: str
    shuffle_id: int
    partition_id: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeFiles:
    """Delete an app's (or one shuffle's) files and fence them against late writes.

    A shuffle fence covers the incarnations up to ``epoch``: a shuffle id registered again later
    writes with a higher epoch and is not fenced.
    """

    app_id: str
    shuffle_id: int | None = None
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class UnfenceApp:
    """The app id was registered again after a purge: its new data must be written, not dropped."""

    app_id: str


@dataclass(frozen=True, slots=True)
class GetDiskInfo:
    pass


@dataclass(frozen=True, slots=True)
class DiskInfo:
    name: str
    root: str
    capacity: int
    used: int
    healthy: bool
    written_bytes: int
    write_failures: int


DiskMsg = WriteBatch | ReadIndex | ReadData | PurgeFiles | UnfenceApp | GetDiskInfo

_FENCE_LIMIT = 10_000


class DiskActor(Actor):
    expected_errors = (RiffleError,)

    def __init__(self, name: str, root: str, *, write_threads: int = 1, read_threads: int = 2):
        self.disk_name = name
        self.root = root
        self.write_threads = write_threads
        self.read_threads = read_threads
        self._writer: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None
        # purged apps / shuffles -> newest fenced shuffle epoch, newest last; bounded so a
        # long-lived server does not grow
        self._fenced: OrderedDict[tuple[str, int | None], int] = OrderedDict()
        self.written_bytes = 0
        self.write_failures = 0
        self.healthy = True

    async def on_start(self) -> None:
        localfile.ensure_root(self.root)
        self._writer = ThreadPoolExecutor(self.write_threads, thread_name_prefix=f"disk-w-{self.disk_name}")
        self._reader = ThreadPoolExecutor(self.read_threads, thread_name_prefix=f"disk-r-{self.disk_name}")

    async def on_stop(self) -> None:
        for pool in (self._writer, self._reader):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=False)
        self._writer = self._reader = None

    def _is_fenced(self, app_id: str, shuffle_id: int, epoch: int) -> bool:
        return (app_id, None) in self._fenced or self._fenced.get((app_id, shuffle_id), -1) >= epoch

    def receive(self, msg: DiskMsg):
        loop = asyncio.get_running_loop()
        match msg:
            case WriteBatch():
                if self._is_fenced(msg.app_id, msg.shuffle_id, msg.epoch):
                    raise AppPurgedError(f"app {msg.app_id} shuffle {msg.shuffle_id} was purged")
                return self._finish_write(msg, loop.run_in_executor(
                    self._writer, localfile.append_batch, self.root, msg.app_id, msg.shuffle_id,
                    msg.partition_id, msg.blocks))
            case ReadIndex():
                return self._wrap("read index", loop.run_in_executor(
                    self._reader, localfile.read_index, self.root, msg.app_id, msg.shuffle_id, msg.partition_id))
            case ReadData():
                return self._wrap("read data", loop.run_in_executor(
                    self._reader, localfile.read_data, self.root, msg.app_id, msg.shuffle_id,
                    msg.partition_id, msg.offset, msg.length))
            case PurgeFiles():
                key = (msg.app_id, msg.shuffle_id)
                self._fenced[key] = max(self._fenced.pop(key, -1), msg.epoch)
                while len(self._fenced) > _FENCE_LIMIT:
                    self._fenced.popitem(last=False)
                return self._wrap("purge", loop.run_in_executor(
                    self._writer, localfile.remove_app, self.root, msg.app_id, msg.shuffle_id))
            case UnfenceApp(app_id=app_id):
                # late spills of the purged incarnation are dropped by the SpillDispatcher (their
                # owner is dead); writes queued after this message belong to the new incarnation
                for key in [k for k in self._fenced if k[0] == app_id]:
                    del self._fenced[key]
            case GetDiskInfo():
                try:
                    capacity, used = localfile.usage(self.root)
                except OSError:
                    capacity = used = 0
                return DiskInfo(self.disk_name, self.root, capacity, used, self.healthy,
                                self.written_bytes, self.write_failures)
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    async def _finish_write(self, msg: WriteBatch, fut: asyncio.Future) -> WriteResult:
        try:
            offset, data_len = await fut
        except OSError as e:
            self.write_failures += 1
            logger.bind(disk=self.disk_name, app_id=msg.app_id).error(
                "spill of {} blocks of {}/{}/{} failed: {}", len(msg.blocks), msg.app_id, msg.shuffle_id,
                msg.partition_id, e)
            raise DiskIOError(self.disk_name, "write", e) from e
        self.written_bytes += data_len - offset
        return WriteResult(self.disk_name, offset, data_len)

    async def _wrap(self, op: str, fut: asyncio.Future):
        try:
            return await fut
        except OSError as e:
            raise DiskIOError(self.disk_name, op, e) from e


def disk_name_of(index: int, root: str) -> str:
    """Stable display name of a data path: its position and its folder name."""
    return f"{index}:{os.path.basename(os.path.normpath(root)) or root}"
