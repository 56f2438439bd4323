"""The ``LocalIO`` protocol: the blocking operations a Disk actor runs, as one injectable object.

A Disk actor never calls ``riffle_actors.io.localfile`` directly: it calls the ``LocalIO``
object it was built with. Production uses ``LOCAL_IO`` (a ``RealLocalIO``, which delegates
to ``localfile``); fault tests hand the server a ``riffle_actors.io.faults.FaultyLocalIO``
wrapped around it, so an EIO, an ENOSPC or a hang is injected at the exact seam where the
kernel would produce it, without monkeypatching anything.

This module also owns the classification of IO failures by errno (``classify``), used by the
Disk actors, the health probe and the disk monitor alike: ``errno.ENOSPC`` and
``errno.EDQUOT`` -> ``ENOSPC``, ``EIO`` -> ``EIO``, ``EROFS`` -> ``EROFS``, a ``TimeoutError``
-> ``TIMEOUT``, anything else -> ``OTHER`` (never substrings of messages), and which kinds count
for disk health (``IOErrorKind.blames_disk``, ``IOErrorKind.quarantines_at_once``).

Every method blocks; call them only on the threads a Disk actor owns.

See also: ``riffle_actors.io.localfile`` (the implementation), ``riffle_actors.io.faults``,
``riffle_actors.io.probe`` (the out-of-process health probe).
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Sequence
from typing import Protocol

from riffle_actors.io import localfile, meta_store
from riffle_actors.io.safe_fs import RemovalProgress
from riffle_actors.protocol.index import IndexEntry
from riffle_actors.records import Block


class IOErrorKind(enum.StrEnum):
    """Why an IO operation on a disk failed; drives quarantine decisions and operator messages."""

    ENOSPC = "ENOSPC"      # the file system is full (or a quota is)
    EIO = "EIO"            # the device reported an error
    EROFS = "EROFS"        # the file system is (or was remounted) read-only
    TIMEOUT = "TIMEOUT"    # the operation did not finish in time (a dying disk blocks in the kernel)
    CORRUPT = "CORRUPT"    # the probe read back other bytes than it wrote
    OTHER = "OTHER"        # any other errno or exception

    @property
    def blames_disk(self) -> bool:
        """Does a failure of this kind say something about the disk (a missing file or a bad offset
        does not)? Only these are reported to the disk monitor."""
        return self in _BLAMES_DISK

    @property
    def quarantines_at_once(self) -> bool:
        """Does one failure of this kind take the disk out of service (it cannot take data now)?
        Other kinds quarantine after ``disk_failures_to_quarantine`` in a row (an EIO may be one bad
        sector)."""
        return self in _AT_ONCE


# The one place that says which kinds count for disk health (the Disk actors, the DiskMonitor and
# the DiskHealthBoard all ask these two sets through the properties above).
_BLAMES_DISK = frozenset({IOErrorKind.ENOSPC, IOErrorKind.EIO, IOErrorKind.EROFS, IOErrorKind.TIMEOUT,
                          IOErrorKind.CORRUPT})
_AT_ONCE = frozenset({IOErrorKind.ENOSPC, IOErrorKind.EROFS, IOErrorKind.TIMEOUT, IOErrorKind.CORRUPT})


_ERRNO_KIND = {errno.ENOSPC: IOErrorKind.ENOSPC, errno.EDQUOT: IOErrorKind.ENOSPC, errno.EIO: IOErrorKind.EIO,
               errno.EROFS: IOErrorKind.EROFS}


def classify(exc: BaseException) -> IOErrorKind:
    """The ``IOErrorKind`` of an exception raised by an IO operation."""
    if isinstance(exc, TimeoutError):
        return IOErrorKind.TIMEOUT
    if isinstance(exc, OSError):
        return _ERRNO_KIND.get(exc.errno or 0, IOErrorKind.OTHER)
    return IOErrorKind.OTHER


class LocalIO(Protocol):
    """The blocking file operations of one data path (see ``riffle_actors.io.localfile``)."""

    def ensure_root(self, root: str) -> None: ...

    def append_batch(self, root: str, app_id: str, shuffle_id: int, partition_id: int,
                     blocks: Sequence[Block]) -> tuple[int, int]:
        """Append data then index records; ``(offset of the first block, data file length after)``."""
        ...

    def read_index(self, root: str, app_id: str, shuffle_id: int, partition_id: int, *,
                   consistent: bool = False) -> tuple[bytes, int]:
        """The index (whole records) and the data file's length; ``consistent``: both read while no append
        of the partition is half done (``localfile.read_index``)."""
        ...

    def read_data(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                  length: int) -> bytes: ...

    def open_data(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                  length: int) -> localfile.DataFile | bytes:
        """The data file opened at the range (for ``sendfile``); the caller closes the descriptor. Where
        reads bypass the page cache (``direct_io_read_enable``), the range's bytes instead."""
        ...

    def index_entries_in(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                         length: int) -> list[IndexEntry]:
        """The index records of the blocks wholly inside the range, in file order (the read CRC check;
        ``localfile.index_entries_in``)."""
        ...

    def advise_willneed(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                        length: int) -> int | None:
        """Read-ahead: ask the kernel to load the range (cut at the file's end) into the page cache; the
        bytes asked for, None if the file is gone."""
        ...

    def remove_app(self, root: str, app_id: str, shuffle_id: int | None = None, *, max_ops: int | None = None,
                   progress: RemovalProgress | None = None) -> bool:
        """Delete the app's (or shuffle's) files, at most ``max_ops`` entries per call, each counted in
        ``progress``; True when nothing is left (``riffle_actors.io.safe_fs.remove_below``)."""
        ...

    def append_meta(self, root: str, app_id: str, shuffle_id: int, records: Sequence[tuple[int, bytes]]) -> int:
        """Append ``(kind, body)`` records to the shuffle's metadata log (``riffle_actors.io.meta_store``)."""
        ...

    def usage(self, root: str) -> tuple[int, int]:
        """``(capacity bytes, used bytes)`` of the file system holding ``root``."""
        ...

    def list_partitions(self, root: str) -> list[tuple[str, int, int]]:
        """``(app id, shuffle id, partition id)`` of every partition index below ``root`` (the scrubber's walk)."""
        ...


class RealLocalIO:
    """``LocalIO`` backed by the real file system (``riffle_actors.io.localfile``).

    ``direct_io``: spill appends use O_DIRECT where the file system allows it
    (``localfile_store.direct_io_append_enable``; see ``localfile``). ``direct_read``: data reads use
    O_DIRECT there too (``direct_io_read_enable``; only with ``direct_io``, as in Riffle), and
    ``open_data`` answers bytes (no ``sendfile``). ``meta_max_bytes``: a metadata
    log append that would grow the log past it fails with ``EFBIG``
    (``localfile_store.recovery_file_max_size``: a restart would not read it)."""

    def __init__(self, direct_io: bool = False, meta_max_bytes: int | None = None, direct_read: bool = False):
        self.direct_io = direct_io
        self.direct_read = direct_read and direct_io
        self.meta_max_bytes = meta_max_bytes  # localfile_store.recovery_file_max_size

    def ensure_root(self, root: str) -> None:
        localfile.ensure_root(root)

    def append_batch(self, root: str, app_id: str, shuffle_id: int, partition_id: int,
                     blocks: Sequence[Block]) -> tuple[int, int]:
        return localfile.append_batch(root, app_id, shuffle_id, partition_id, blocks, direct=self.direct_io)

    def read_index(self, root: str, app_id: str, shuffle_id: int, partition_id: int, *,
                   consistent: bool = False) -> tuple[bytes, int]:
        return localfile.read_index(root, app_id, shuffle_id, partition_id, consistent=consistent)

    def read_data(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                  length: int) -> bytes:
        return localfile.read_data(root, app_id, shuffle_id, partition_id, offset, length, direct=self.direct_read)

    def open_data(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                  length: int) -> localfile.DataFile | bytes:
        return localfile.open_data(root, app_id, shuffle_id, partition_id, offset, length, direct=self.direct_read)

    def index_entries_in(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                         length: int) -> list[IndexEntry]:
        return localfile.index_entries_in(root, app_id, shuffle_id, partition_id, offset, length)

    def advise_willneed(self, root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                        length: int) -> int | None:
        return localfile.advise_willneed(root, app_id, shuffle_id, partition_id, offset, length)

    def remove_app(self, root: str, app_id: str, shuffle_id: int | None = None, *, max_ops: int | None = None,
                   progress: RemovalProgress | None = None) -> bool:
        return localfile.remove_app(root, app_id, shuffle_id, max_ops=max_ops, progress=progress)

    def append_meta(self, root: str, app_id: str, shuffle_id: int, records: Sequence[tuple[int, bytes]]) -> int:
        return meta_store.append_meta(root, app_id, shuffle_id, records, self.meta_max_bytes)

    def usage(self, root: str) -> tuple[int, int]:
        return localfile.usage(root)

    def list_partitions(self, root: str) -> list[tuple[str, int, int]]:
        return localfile.list_partitions(root)


LOCAL_IO: LocalIO = RealLocalIO()
"""A buffered-IO ``LocalIO``; stateless, shareable (the server builds its own from the config)."""
