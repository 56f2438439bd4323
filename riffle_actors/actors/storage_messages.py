"""Messages, replies and errors of the storage domain: Disk actors, the DiskMonitor, disk-health news.

This module owns the contract between the actors that use local disks and the actors that own
them, so that no storage actor imports another one for its messages (before, ``disk`` imported
``disk_monitor``, which imported ``spill``, which imported ``disk``: an import cycle).

- To a ``DiskActor`` (``riffle_actors.actors.disk``): ``WriteBatch`` (replies ``WriteResult``),
  ``ReadIndex``, ``ReadData`` (replies bytes, a ``DataFile`` or ``CorruptRange``), ``PurgeFiles``, ``UnfenceApp``, ``GetDiskInfo`` (replies ``DiskInfo``),
  ``AppendMeta`` (replies one error or None per entry).
  Failures: ``DiskIOError`` (classified by ``IOErrorKind``), ``AppPurgedError``.
- To the ``DiskMonitorActor`` (``riffle_actors.actors.disk_monitor``): ``RunProbeRound``,
  ``DiskIOFailed``, ``DiskIOSucceeded``, ``GetProbeStats`` (replies ``ProbeStats``).
- From the DiskMonitor to its subscribers (the SpillDispatcher): ``DiskHealthChanged``.

Every message is a frozen, slotted dataclass. It does not cover: the spill jobs of one partition
(``riffle_actors.actors.spill``: ``SpillJob``, ``SpillCompleted``), which belong to the app domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from riffle_actors.errors import RiffleError, StatusCode
from riffle_actors.io.local import IOErrorKind, classify
from riffle_actors.records import Block
from riffle_actors.state.integrity import CorruptBlock
from riffle_actors.state.read_ahead import ClientReadAhead


# ---------------------------------------------------------------------------- errors
class DiskIOError(RiffleError):
    """An IO failure on a disk; ``kind`` is an ``IOErrorKind`` (ENOSPC / EIO / EROFS / TIMEOUT / OTHER)."""

    status = StatusCode.INTERNAL_ERROR

    def __init__(self, disk: str, op: str, exc: BaseException):
        self.disk = disk
        self.op = op
        self.kind: IOErrorKind = classify(exc)
        self.detail = str(exc) or type(exc).__name__
        super().__init__(f"disk {disk}: {op} failed ({self.kind.value}): {self.detail}")


class AppPurgedError(RiffleError):
    """A write for an app or shuffle this disk already purged; the data is not wanted any more."""


# ---------------------------------------------------------------------------- Disk actor
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
class ReadAheadHint:
    """What a data read tells the disk's read-ahead (``riffle_actors.state.read_ahead``): the app asked
    for it (``client``), the partition is read whole and in order (``sequential``), or the client's
    next segments (urpc V3) of reader ``task_attempt_id``."""

    client: ClientReadAhead
    sequential: bool = False
    task_attempt_id: int = 0
    next_segments: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadData:
    """Read a range of a data file; with ``as_file`` the reply is a ``DataFile`` (an open descriptor
    the asker owns and closes, for ``sendfile``) instead of the bytes (or the bytes all the same, where
    reads bypass the page cache, or where the read CRC check is on: the bytes checked are the bytes
    served). With the check on, a range holding a corrupt block replies ``CorruptRange`` instead.
    ``read_ahead``: None, or what the disk's read-ahead may use."""

    app_id: str
    shuffle_id: int
    partition_id: int
    offset: int
    length: int
    as_file: bool = False
    read_ahead: ReadAheadHint | None = None


@dataclass(frozen=True, slots=True)
class CorruptRange:
    """The reply to a ``ReadData`` whose bytes the read CRC check (``[localfile_store]
    read_crc_check_enable``) found corrupt: the blocks of the range whose bytes do not match their
    index record's CRC, in file order. Nothing of the range is served."""

    blocks: tuple[CorruptBlock, ...]


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
class MetaEntry:
    """Records for one shuffle's metadata log (``riffle_actors.protocol.shuffle_meta``): (kind, body) each."""

    app_id: str
    shuffle_id: int
    epoch: int
    records: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class AppendMeta:
    """Append metadata records (a batch of several shuffles' entries) on the disk's writer thread, after
    the writes and purges queued before it. Replies a tuple with, per entry, None (written) or the
    exception (``AppPurgedError`` for a fenced shuffle, ``DiskIOError``)."""

    entries: tuple[MetaEntry, ...]


@dataclass(frozen=True, slots=True)
class UnfenceApp:
    """The app id was registered again after a purge: its new data must be written, not dropped."""

    app_id: str


@dataclass(frozen=True, slots=True)
class GetDiskInfo:
    """Counters (and, with ``with_usage``, the file system's capacity via statvfs on the reader pool)."""

    with_usage: bool = True


@dataclass(frozen=True, slots=True)
class DiskInfo:
    name: str
    root: str
    capacity: int
    used: int
    written_bytes: int
    write_failures: int


# ---------------------------------------------------------------------------- DiskMonitor actor
@dataclass(frozen=True, slots=True)
class RunProbeRound:
    """Probe every disk now; the ask answers ``{disk: ProbeResult | None}`` (None = no verdict)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskIOFailed:
    """A real operation failed on a disk with a kind that says something about the disk
    (``IOErrorKind.blames_disk``)."""

    disk: str
    kind: IOErrorKind
    op: str    # "spill write", "read index", ...
    detail: str = ""


@dataclass(frozen=True, slots=True)
class DiskIOSucceeded:
    disk: str


@dataclass(frozen=True, slots=True)
class GetProbeStats:
    pass


@dataclass(frozen=True, slots=True)
class ProbeStats:
    rounds: int
    fleet_running: bool  # probe worker processes exist
    fleet_starts: int  # probe worker processes started by this incarnation (first ones and replacements)
    worker_pids: dict[str, int]
    killed_pids: tuple[int, ...]


# ---------------------------------------------------------------------------- news
@dataclass(frozen=True, slots=True)
class DiskHealthChanged:
    """A disk's verdict changed (told by the DiskMonitor to its subscribers)."""

    disk: str
    healthy: bool
    reason: str
