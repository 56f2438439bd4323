"""Blocking local-file operations of one disk: append a spill batch, read index and data, purge.

This module owns the on-disk layout of a data path and the write-ordering rules of spec §5:
block bytes are appended to the data file first (one ``writev``), then the matching 40-byte
index records (one write); if either step fails both files are truncated back to their
previous length, so a failed spill never leaves a torn index record that would misalign
every later one. Every function here blocks and must run on the owning DiskActor's threads.
Appends to one partition are serialized (a striped lock on its path): with several writer
threads per disk (``disk_write_threads``), two batches of one partition would otherwise read
the same starting offset and misplace index records (or, with O_DIRECT, overwrite each other).

Layout (private to the server, Riffle's): ``<root>/<app_id>/<shuffle_id>/partition-<p>.{data,index}``.

Direct IO (``direct_io_append_enable``, Riffle's key and default): block bytes are copied into a
page-aligned staging buffer (an anonymous ``mmap``, one per writer thread, ``DIRECT_STAGING_BYTES``)
and written with ``O_DIRECT`` in ``DIRECT_ALIGN``-aligned pieces at aligned file offsets, so the
spill bypasses the page cache (no dirty pages, no writeback work). The file's unaligned tail
(less than ``DIRECT_ALIGN`` bytes, from the previous append) is read back and rewritten in front of
the new bytes; the last piece is padded with zeros to the alignment and the file is then cut back
to its exact length (``ftruncate``), so readers and the index see exactly the bytes appended,
at exactly the offsets the index records. Index records stay buffered (as in Riffle).
A file system that refuses ``O_DIRECT`` (``EINVAL`` at open or write: ramfs, tmpfs before Linux
6.6, some FUSE/overlay mounts) gets buffered appends from then on; the reason is logged once
per data path and reported by ``direct_io_refused``.

Direct reads (``direct_io_read_enable``, Riffle README's key): ``read_data(direct=True)`` opens the
data file with ``O_DIRECT`` and reads the range's ``DIRECT_ALIGN``-aligned cover into a page-aligned
buffer (a reader thread's own, ``DIRECT_READ_BYTES``; a larger range gets one of its own for that read),
then copies the range out. The file's last block is not padded on disk (appends cut it back), so the
cover's tail is a short read at the end of the file: accepted when it holds the whole range. The page
cache is neither read nor filled. ``sendfile`` cannot bypass the page cache, so with direct reads
``open_data(direct=True)`` answers the bytes instead of an open file (as in Riffle, where direct reads
take precedence over sendfile). A file system that refuses ``O_DIRECT`` at open (``EINVAL``) gets
buffered reads from then on, logged once per data path and reported by ``direct_read_refused``; so
does a data path whose appends fell back (Riffle reads directly only where appends are direct).

Read-ahead (``[localfile_store.read_ahead_options]``, Riffle's): ``advise_willneed`` asks the kernel
to read a range of a data file into the page cache (``posix_fadvise(POSIX_FADV_WILLNEED)``, as Riffle
does); it holds no bytes of ours and returns once the reads are queued. Which ranges, and when, is
``riffle_actors.state.read_ahead``'s decision.

Read CRC check (``[localfile_store] read_crc_check_enable``): ``index_entries_in`` gives the index
records of the blocks wholly inside a range being read (a binary search over the index file, not a
read of all of it), so the Disk actor can check the bytes it read against them before it serves them.

A read whose range reaches past the end of the data file is the client's mistake, not the
disk's: ``read_data`` / ``open_data`` raise ``InvalidRequestError`` (INVALID_REQUEST, naming the
partition and the file's length, never the path), which the disk does not count as a failure.

Nothing below a data path is trusted (``riffle_actors.io.safe_fs``): the app and shuffle
directories are opened relative to the data path's descriptor with ``O_NOFOLLOW``, the partition
files with ``O_NOFOLLOW | O_NONBLOCK`` and an ``fstat`` check, so a symlinked directory or file, a
FIFO or a device is refused (``ELOOP`` / ``ENXIO``, which do not blame the disk) instead of having
a client's bytes written to, or read from, something outside the data path. A purge deletes in
bounded steps (``remove_app``'s ``max_ops``) and never follows a symlink.

See also: ``riffle_actors.protocol.index`` (record codec), ``riffle_actors.actors.disk``.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from loguru import logger

from riffle_actors.errors import InvalidRequestError
from riffle_actors.io.safe_fs import (
    DIRECTORY,
    REGULAR,
    RemovalProgress,
    list_dir,
    open_dir,
    open_file,
    open_root,
    open_subdir,
    remove_below,
)
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.ids import check_app_id, parse_id_dirname
from riffle_actors.protocol.index import INDEX_RECORD_SIZE, IndexEntry, build_index, decode_index
from riffle_actors.records import Block

_IOV_MAX = 1024

DIRECT_ALIGN = 4096
"""File offsets, lengths and buffer addresses of O_DIRECT writes are multiples of this."""
DIRECT_STAGING_BYTES = 8 << 20
"""Size of a writer thread's aligned staging buffer (a spill larger than this is written in pieces)."""
_ZEROS = bytes(DIRECT_ALIGN)
_APPEND_LOCKS = tuple(threading.Lock() for _ in range(64))  # striped by partition path
_O_DIRECT = getattr(os, "O_DIRECT", 0)

DIRECT_READ_BYTES = 8 << 20
"""Size of a reader thread's aligned buffer of direct reads (a larger range gets its own, for that read)."""

_staging = threading.local()
_refused: dict[str, str] = {}  # data path -> why O_DIRECT is not used there
_refused_lock = threading.Lock()
_read_refused: dict[str, str] = {}  # data path -> why reads there do not use O_DIRECT


class _DirectRefused(Exception):
    """The file system refused O_DIRECT; nothing of this append is left behind."""


def direct_io_refused(root: str) -> str | None:
    """Why appends under ``root`` fell back to buffered IO, or None (direct IO in use, or not tried)."""
    return _refused.get(root)


def direct_read_refused(root: str) -> str | None:
    """Why direct reads under ``root`` fell back to buffered IO, or None (in use, or not tried)."""
    return _read_refused.get(root) or _refused.get(root)


def partition_dir(root: str, app_id: str, shuffle_id: int) -> str:
    return os.path.join(root, app_id, str(shuffle_id))


def partition_paths(root: str, app_id: str, shuffle_id: int, partition_id: int) -> tuple[str, str]:
    base = os.path.join(root, app_id, str(shuffle_id), f"partition-{partition_id}")
    return base + ".data", base + ".index"


def _write_all(fd: int, buffers: Sequence[bytes | memoryview]) -> None:
    """``writev`` every buffer completely (handles short writes and IOV_MAX)."""
    pending = [memoryview(b) for b in buffers if len(b)]
    while pending:
        chunk = pending[:_IOV_MAX]
        written = os.writev(fd, chunk)
        if written <= 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        # drop fully written buffers, slice a partially written one
        i = 0
        while i < len(chunk) and written >= len(chunk[i]):
            written -= len(chunk[i])
            i += 1
        if i < len(chunk) and written:
            chunk[i] = chunk[i][written:]
        pending = chunk[i:] + pending[len(chunk):]


def append_batch(root: str, app_id: str, shuffle_id: int, partition_id: int,
                 blocks: Sequence[Block], fsync: bool = False, direct: bool = False) -> tuple[int, int]:
    """Append ``blocks`` to the partition's data file, then their index records.

    ``direct``: write the data with O_DIRECT (see the module docstring), falling back to buffered
    IO for good on a data path whose file system refuses it.
    Returns ``(data_offset_of_first_block, data_file_length_after)``.
    """
    data_path, _ = partition_paths(root, app_id, shuffle_id, partition_id)
    dir_fd = open_dir(root, (app_id, str(shuffle_id)), create=True)
    try:
        return _append_in(dir_fd, root, data_path, partition_id, blocks, fsync, direct)
    finally:
        os.close(dir_fd)


def _append_in(dir_fd: int, root: str, data_path: str, partition_id: int, blocks: Sequence[Block], fsync: bool,
               direct: bool) -> tuple[int, int]:
    files = _Files(dir_fd, data_path, f"partition-{partition_id}.data", f"partition-{partition_id}.index")
    if direct and _O_DIRECT and root not in _refused:
        try:
            return _append(files, blocks, fsync, direct=True)
        except _DirectRefused as e:
            with _refused_lock:
                first = root not in _refused
                _refused[root] = str(e)
            if first:
                logger.bind(disk=root).warning(
                    "data path {}: the file system refuses O_DIRECT ({}); spills there use buffered IO", root, e)
    return _append(files, blocks, fsync, direct=False)


class _Files(NamedTuple):
    """A partition's two files: their directory's descriptor, the data file's path (for messages and
    the append lock) and the two names inside the directory."""

    dir_fd: int
    data_path: str
    data: str
    index: str  # type: ignore[assignment]  # a field named like tuple.index


def _staging_buffer() -> mmap.mmap:
    buf = getattr(_staging, "buf", None)
    if buf is None:
        buf = _staging.buf = mmap.mmap(-1, DIRECT_STAGING_BYTES)  # anonymous: page-aligned
    return buf


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[written:]
        offset += written


def _write_direct(files: _Files, data_fd: int, base: int, blocks: Sequence[Block]) -> None:
    """Write ``blocks`` at ``base`` through the aligned staging buffer (``data_fd`` has O_DIRECT)."""
    pos = base - base % DIRECT_ALIGN
    fill = base - pos
    buf = _staging_buffer()
    view = memoryview(buf)
    try:
        if fill:
            # the unaligned tail of the previous append is rewritten in front of the new bytes
            read_fd = open_file(files.dir_fd, files.data, os.O_RDONLY)
            try:
                if os.preadv(read_fd, [view[:fill]], pos) != fill:
                    raise OSError(errno.EIO, f"data file {files.data_path} shrank under its writer")
            finally:
                os.close(read_fd)
        cap = len(view)
        for b in blocks:
            data = b.data
            if type(data) is memoryview and (data.format != "B" or data.ndim != 1):
                data = data.cast("B")
            n = len(data)
            if n < cap - fill:  # the common case: the whole block fits, one copy, no slicing of it
                view[fill:fill + n] = data
                fill += n
                continue
            src = memoryview(data)
            off = 0
            while off < n:
                take = min(n - off, cap - fill)
                view[fill:fill + take] = src[off:off + take]
                fill += take
                off += take
                if fill == cap:
                    _pwrite_all(data_fd, view, pos)
                    pos += cap
                    fill = 0
        if fill:
            padded = -(-fill // DIRECT_ALIGN) * DIRECT_ALIGN
            view[fill:padded] = _ZEROS[: padded - fill]
            _pwrite_all(data_fd, view[:padded], pos)
            if padded != fill:
                os.ftruncate(data_fd, pos + fill)  # the padding is not data
    finally:
        view.release()


def _append(files: _Files, blocks: Sequence[Block], fsync: bool, direct: bool) -> tuple[int, int]:
    with _APPEND_LOCKS[hash(files.data_path) % len(_APPEND_LOCKS)]:
        return _append_locked(files, blocks, fsync, direct)


def _append_locked(files: _Files, blocks: Sequence[Block], fsync: bool, direct: bool) -> tuple[int, int]:
    if direct:
        try:
            data_fd = open_file(files.dir_fd, files.data, os.O_WRONLY | os.O_CREAT | _O_DIRECT)
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise _DirectRefused(f"open with O_DIRECT: {e.strerror}") from e
            raise
    else:
        data_fd = open_file(files.dir_fd, files.data, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        index_fd = open_file(files.dir_fd, files.index, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            base = os.fstat(data_fd).st_size
            index_base = os.fstat(index_fd).st_size
            if index_base % INDEX_RECORD_SIZE:
                # an earlier crash left a torn record; cut it so new records stay aligned
                os.ftruncate(index_fd, index_base - index_base % INDEX_RECORD_SIZE)
                index_base -= index_base % INDEX_RECORD_SIZE
            index_bytes, data_len = build_index(blocks, base)
            try:
                if not direct:
                    _write_all(data_fd, [b.data for b in blocks])
                elif data_len:
                    try:
                        _write_direct(files, data_fd, base, blocks)
                    except OSError as e:
                        if e.errno != errno.EINVAL:
                            raise
                        raise _DirectRefused(f"O_DIRECT write: {e.strerror}") from e
                _write_all(index_fd, [index_bytes])
                if fsync:
                    os.fdatasync(data_fd)
                    os.fdatasync(index_fd)
            except BaseException:
                # leave no torn record behind: roll both files back (best effort)
                for fd, size in ((index_fd, index_base), (data_fd, base)):
                    try:
                        os.ftruncate(fd, size)
                    except OSError:
                        pass
                raise
            return base, base + data_len
        finally:
            os.close(index_fd)
    finally:
        os.close(data_fd)


def _open_partition_dir(root: str, app_id: str, shuffle_id: int) -> int | None:
    """The shuffle's directory (never through a symlink), or None when it does not exist."""
    try:
        return open_dir(root, (app_id, str(shuffle_id)))
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_index(root: str, app_id: str, shuffle_id: int, partition_id: int, *,
               consistent: bool = False) -> tuple[bytes, int]:
    """The whole index (cut to whole records) and the data file length; empty when absent.

    ``consistent``: read both while holding the partition's append lock, so no append is half done
    (its data written, its index records not yet; or, with O_DIRECT, its padding not yet cut): what
    ``index_consistency_detection_enable`` compares. Without it an index read never waits for a spill."""
    if consistent:
        data_path, _ = partition_paths(root, app_id, shuffle_id, partition_id)
        with _APPEND_LOCKS[hash(data_path) % len(_APPEND_LOCKS)]:
            return _read_index(root, app_id, shuffle_id, partition_id)
    return _read_index(root, app_id, shuffle_id, partition_id)


def _read_index(root: str, app_id: str, shuffle_id: int, partition_id: int) -> tuple[bytes, int]:
    dir_fd = _open_partition_dir(root, app_id, shuffle_id)
    if dir_fd is None:
        return b"", 0
    try:
        try:
            fd = open_file(dir_fd, f"partition-{partition_id}.index", os.O_RDONLY)
        except FileNotFoundError:
            return b"", 0
        try:
            size = os.fstat(fd).st_size
            chunks, got = [], 0
            while got < size:
                chunk = os.pread(fd, min(size - got, 1 << 30), got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            index = b"".join(chunks)
        finally:
            os.close(fd)
        index = index[: len(index) - len(index) % INDEX_RECORD_SIZE]
        try:
            fd = open_file(dir_fd, f"partition-{partition_id}.data", os.O_RDONLY)
        except FileNotFoundError:
            return b"", 0
        try:
            data_len = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return index, data_len
    finally:
        os.close(dir_fd)


class _DataFd(NamedTuple):
    fd: int
    direct: bool  # opened with O_DIRECT


def _open_data_file(root: str, app_id: str, shuffle_id: int, partition_id: int, direct: bool = False) -> _DataFd:
    dir_fd = _open_partition_dir(root, app_id, shuffle_id)
    if dir_fd is None:
        data_path, _ = partition_paths(root, app_id, shuffle_id, partition_id)
        raise FileNotFoundError(errno.ENOENT, f"no such file {data_path}")
    name = f"partition-{partition_id}.data"
    try:
        if direct and _O_DIRECT and root not in _read_refused and root not in _refused:
            try:
                return _DataFd(open_file(dir_fd, name, os.O_RDONLY | _O_DIRECT), True)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                _refuse_direct_reads(root, f"open with O_DIRECT: {e.strerror}")
        return _DataFd(open_file(dir_fd, name, os.O_RDONLY), False)
    finally:
        os.close(dir_fd)


def _refuse_direct_reads(root: str, why: str) -> None:
    with _refused_lock:
        first = root not in _read_refused
        _read_refused[root] = why
    if first:
        logger.bind(disk=root).warning(
            "data path {}: the file system refuses O_DIRECT ({}); reads there use buffered IO "
            "(direct_io_read_enable)", root, why)


def _check_range(fd: int, partition_id: int, offset: int, length: int) -> None:
    size = os.fstat(fd).st_size
    if offset + length > size:
        raise InvalidRequestError(f"offset {offset} + length {length} reaches past the end of the data file of "
                                  f"partition {partition_id} ({size} bytes)")


def read_data(root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int, length: int,
              direct: bool = False) -> bytes:
    """Exactly ``length`` bytes at ``offset`` of the data file; ``InvalidRequestError`` past its end, or ``OSError``.

    ``direct``: read with O_DIRECT (see the module docstring), buffered where the file system refuses it."""
    data_path, _ = partition_paths(root, app_id, shuffle_id, partition_id)
    fd = _open_data_file(root, app_id, shuffle_id, partition_id, direct=direct)
    is_direct = direct and fd.direct
    try:
        _check_range(fd.fd, partition_id, offset, length)
        if is_direct:
            return _pread_direct(fd.fd, data_path, offset, length)
        parts = []
        got = 0
        while got < length:
            chunk = os.pread(fd.fd, length - got, offset + got)
            if not chunk:
                raise OSError(errno.ENODATA, f"data file {data_path} ends before offset {offset + length}")
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd.fd)


def _read_buffer(size: int) -> tuple[mmap.mmap, bool]:
    """A page-aligned buffer of at least ``size`` bytes and whether it is the thread's own (kept)."""
    if size > DIRECT_READ_BYTES:
        return mmap.mmap(-1, size), False
    buf = getattr(_staging, "rbuf", None)
    if buf is None:
        buf = _staging.rbuf = mmap.mmap(-1, DIRECT_READ_BYTES)
    return buf, True


def _pread_direct(fd: int, data_path: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of ``fd`` (opened with O_DIRECT): the aligned cover of the range is
    read into an aligned buffer; a short read is only accepted at the end of the file, once it covers
    the range (the file's last block is not padded on disk)."""
    start = offset - offset % DIRECT_ALIGN
    end = offset + length
    cover = -(-end // DIRECT_ALIGN) * DIRECT_ALIGN - start
    buf, kept = _read_buffer(cover)
    view = memoryview(buf)
    try:
        got = 0
        while start + got < end:
            n = os.preadv(fd, [view[got:cover]], start + got)
            if n <= 0:
                raise OSError(errno.ENODATA, f"data file {data_path} ends before offset {end}")
            got += n
            if start + got < end and got % DIRECT_ALIGN:
                # a short read that is not at an aligned point cannot be continued with O_DIRECT
                raise OSError(errno.EIO, f"short direct read of {data_path} at {start + got} (before {end})")
        return bytes(view[offset - start:end - start])
    finally:
        view.release()
        if not kept:
            buf.close()


def advise_willneed(root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                    length: int) -> int | None:
    """Ask the kernel to read ``length`` bytes at ``offset`` of the data file into the page cache
    (``POSIX_FADV_WILLNEED``, read-ahead), cut at the file's end; the bytes asked for, or None when
    the file is gone (purged meanwhile)."""
    try:
        fd = _open_data_file(root, app_id, shuffle_id, partition_id).fd
    except FileNotFoundError:
        return None
    try:
        length = max(0, min(length, os.fstat(fd).st_size - offset))
        if length:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        return length
    finally:
        os.close(fd)


_RANGE_SCAN_RECORDS = 4096  # index records read per pread when collecting a range's records


def index_entries_in(root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                     length: int) -> list[IndexEntry]:
    """The index records of the blocks lying wholly inside ``[offset, offset + length)`` of the data file
    (what the read CRC check checks), in file order; empty when the index is absent.

    Records are in data-file order (appends to a partition are serialized, each at the data file's
    end), so the first record at or after ``offset`` is found by a binary search over the index file
    (one 8-byte ``pread`` per step, ~log2(records)); then records are read in pieces of
    ``_RANGE_SCAN_RECORDS`` until one starts at or past the range's end. The cost is in the records
    of the range, not of the file. A block cut by either edge of the range is not returned (it is not
    whole in the bytes read). Should the file not be in order (never written so), records are missed,
    never invented: each one returned is a record of the file."""
    end = offset + length
    dir_fd = _open_partition_dir(root, app_id, shuffle_id)
    if dir_fd is None:
        return []
    try:
        try:
            fd = open_file(dir_fd, f"partition-{partition_id}.index", os.O_RDONLY)
        except FileNotFoundError:
            return []
    finally:
        os.close(dir_fd)
    try:
        n = os.fstat(fd).st_size // INDEX_RECORD_SIZE
        lo, hi = 0, n
        while lo < hi:  # the first record whose offset is >= offset
            mid = (lo + hi) // 2
            raw = os.pread(fd, 8, mid * INDEX_RECORD_SIZE)
            if len(raw) < 8:
                hi = mid  # the file shrank (cut by recovery): search below
                continue
            if int.from_bytes(raw, "big", signed=True) < offset:
                lo = mid + 1
            else:
                hi = mid
        out: list[IndexEntry] = []
        i = lo
        while i < n:
            want = min(_RANGE_SCAN_RECORDS, n - i)
            raw = os.pread(fd, want * INDEX_RECORD_SIZE, i * INDEX_RECORD_SIZE)
            got = decode_index(raw)
            if not got:
                break
            for e in got:
                if e.offset >= end:
                    return out
                if e.offset >= offset and e.length >= 0 and e.offset + e.length <= end:
                    out.append(e)
            i += len(got)
        return out
    finally:
        os.close(fd)


class DataFile(NamedTuple):
    """An open data file holding ``length`` bytes at ``offset``; the receiver closes ``fd``."""

    fd: int
    offset: int
    length: int


def open_data(root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int, length: int,
              direct: bool = False) -> DataFile | bytes:
    """The data file opened for reading ``length`` bytes at ``offset`` (checked to be there;
    ``InvalidRequestError`` past its end), or ``OSError``. ``direct``: where reads use O_DIRECT, the
    range's bytes instead (``sendfile`` would go through the page cache)."""
    if direct and _O_DIRECT and root not in _read_refused and root not in _refused:
        return read_data(root, app_id, shuffle_id, partition_id, offset, length, direct=True)
    fd = _open_data_file(root, app_id, shuffle_id, partition_id).fd
    try:
        _check_range(fd, partition_id, offset, length)
    except BaseException:
        os.close(fd)
        raise
    return DataFile(fd, offset, length)


PURGE_STEP_OPS = 500
"""Entries a purge deletes per step on the writer thread (``remove_app``'s ``max_ops``): spills queued
behind a purge of a huge app wait for one step, not for the whole deletion."""


def remove_app(root: str, app_id: str, shuffle_id: int | None = None, *, max_ops: int | None = None,
               progress: RemovalProgress | None = None) -> bool:
    """Delete an app's (or one shuffle's) directory below ``root``, never through a symlink; at most
    ``max_ops`` entries per call (None: all). True when it is gone, False when more calls are needed."""
    parts = (app_id,) if shuffle_id is None else (app_id, str(shuffle_id))
    return remove_below(root, parts, max_ops=max_ops, progress=progress)


def list_partitions(root: str, max_entries: int = 1_000_000) -> list[tuple[str, int, int]]:
    """``(app id, shuffle id, partition id)`` of every partition index file below ``root`` (at most
    ``max_entries``), sorted; what the scrubber walks. Never follows a symlink (``safe_fs``): only
    directories and regular files with the names the server writes count, anything else is skipped."""
    out: list[tuple[str, int, int]] = []
    try:
        root_fd = open_root(root)
    except FileNotFoundError:
        return out
    try:
        for app_id, kind in list_dir(root_fd):
            if kind != DIRECTORY or app_id.startswith("."):
                continue
            try:
                check_app_id(app_id)
            except ProtocolError:
                continue
            try:
                app_fd = open_subdir(root_fd, app_id)
            except OSError:
                continue  # gone meanwhile (purged), or replaced by something else
            try:
                for name, skind in list_dir(app_fd):
                    try:
                        shuffle_id = parse_id_dirname(name)
                    except ProtocolError:
                        continue
                    if skind != DIRECTORY:
                        continue
                    try:
                        sfd = open_subdir(app_fd, name)
                    except OSError:
                        continue
                    try:
                        for fname, fkind in list_dir(sfd):
                            if fkind != REGULAR or not fname.startswith("partition-") or not fname.endswith(".index"):
                                continue
                            try:
                                pid = parse_id_dirname(fname[len("partition-"):-len(".index")], "partition file")
                            except ProtocolError:
                                continue
                            out.append((app_id, shuffle_id, pid))
                            if len(out) >= max_entries:
                                return sorted(out)
                    finally:
                        os.close(sfd)
            finally:
                os.close(app_fd)
    finally:
        os.close(root_fd)
    return sorted(out)


def usage(root: str) -> tuple[int, int]:
    """(capacity bytes, used bytes) of the file system holding ``root``."""
    st = shutil.disk_usage(root)
    return st.total, st.total - st.free


def ensure_root(root: str) -> None:
    Path(root).mkdir(parents=True, exist_ok=True)
