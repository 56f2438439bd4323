"""Blocking file operations of the shuffle metadata log and the start-up scan of a data path.

This module owns ``<root>/<app_id>/<shuffle_id>/shuffle.meta`` (the record format is
``riffle_actors.protocol.shuffle_meta``) and what a restarted server finds under a data path:

- ``append_meta`` appends framed records to one shuffle's log (the file header first when the
  file is new); on a failed write the file is truncated back, so no torn record is left by a
  live server. It runs on the owning Disk actor's writer thread, after the spills and purges
  queued before it (a purge's ``rmtree`` and a late append can never interleave).
- ``scan_root`` reads every app / shuffle directory under a data path: the metadata log (a torn
  or corrupt tail is truncated to the last whole record), each partition's index (a torn last
  record is truncated, records pointing past the end of the data file are cut) and data file
  (bytes after the last indexed block are cut: a crash between the data and the index write),
  and the block ids each index holds. It repairs files but deletes nothing: what to remove is
  decided by ``riffle_actors.state.recovery`` and done by ``remove_tree``.

Nothing under a data path is trusted (``riffle_actors.io.safe_fs``): the scan lists directories
through descriptors, never follows a symlink, opens only regular files (``O_NOFOLLOW |
O_NONBLOCK`` and an ``fstat`` check, so a FIFO or a device is never read) and reads no
``shuffle.meta`` or index larger than ``max_file_bytes`` (``localfile_store.recovery_file_max_size``).
Whatever else it finds (a symlink, a FIFO, a device, a directory or file with a name the server
never writes) is **foreign**: listed in ``DiskScan.foreign`` with what it is, and left alone.
A log holding a checksummed record that does not parse (``LogContents.corrupt``: a block id above
2^63 - 1, say) makes the shuffle unusable; it is not truncated. ``remove_tree`` deletes only below
a data path, through descriptors, never through a symlink.

Every function blocks; run them on a Disk actor's threads or another worker thread, never on the
event loop.
"""

from __future__ import annotations

import errno
import os
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from riffle_actors.io.safe_fs import (
    DIRECTORY,
    REGULAR,
    list_dir,
    open_dir,
    open_file,
    open_root,
    open_subdir,
    read_file,
    remove_below,
)
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.ids import check_app_id, parse_id_dirname
from riffle_actors.protocol.index import INDEX_RECORD_SIZE, scan_index
from riffle_actors.protocol.shuffle_meta import FILE_HEADER, LogContents, MetaFormatError, decode_log, frame

META_FILE = "shuffle.meta"
_PARTITION_RE = re.compile(r"partition-([0-9]+)\.(data|index)", re.ASCII)
DEFAULT_MAX_FILE_BYTES = 1 << 30
"""Default of ``localfile_store.recovery_file_max_size``: the largest log or index a scan reads."""
FOREIGN_KEPT = 1000
"""Foreign entries a scan lists one by one (more are only counted)."""


def meta_path(root: str, app_id: str, shuffle_id: int) -> str:
    return os.path.join(root, app_id, str(shuffle_id), META_FILE)


def append_meta(root: str, app_id: str, shuffle_id: int, records: Sequence[tuple[int, bytes]],
                max_bytes: int | None = None) -> int:
    """Append ``(kind, body)`` records to the shuffle's log; returns the bytes written.

    ``max_bytes``: refuse (``EFBIG``) an append that would grow the log past it, since a restart
    would not read such a log (``recovery_file_max_size``)."""
    dir_fd = open_dir(root, (app_id, str(shuffle_id)), create=True)
    try:
        fd = open_file(dir_fd, META_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    finally:
        os.close(dir_fd)
    try:
        size = os.fstat(fd).st_size
        payload = b"".join(frame(kind, body) for kind, body in records)
        if size == 0:
            payload = FILE_HEADER + payload
        if max_bytes is not None and size + len(payload) > max_bytes:
            raise OSError(errno.EFBIG, f"{meta_path(root, app_id, shuffle_id)} would grow past {max_bytes} bytes "
                                       f"(localfile_store.recovery_file_max_size)")
        try:
            view = memoryview(payload)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except BaseException:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
        return len(payload)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- the scan
@dataclass(slots=True)
class ScannedPartition:
    """One partition's files on one disk, after repair."""

    block_ids: array  # array('Q') of every block id its index records name
    data_bytes: int  # indexed bytes of the data file
    index_records: int
    repaired: list[str] = field(default_factory=list)  # what was truncated, as text


@dataclass(slots=True)
class ScannedShuffle:
    shuffle_id: int
    path: str
    meta: LogContents | None = None  # None: no log on this disk
    meta_problem: str = ""  # an unusable log (bad magic or version, unreadable, corrupt, too large)
    meta_mtime_ns: int = 0  # when the log was last written (the newest one is the app's current home)
    partitions: dict[int, ScannedPartition] = field(default_factory=dict)
    repaired: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ScannedApp:
    app_id: str
    path: str
    shuffles: dict[int, ScannedShuffle] = field(default_factory=dict)
    stray: list[str] = field(default_factory=list)  # entries that are not shuffle directories


@dataclass(slots=True)
class DiskScan:
    root: str
    apps: dict[str, ScannedApp] = field(default_factory=dict)
    error: str = ""  # the data path could not be listed
    foreign: list[str] = field(default_factory=list)  # "path: what it is", the first FOREIGN_KEPT
    foreign_total: int = 0

    def add_foreign(self, path: str, what: str) -> None:
        self.foreign_total += 1
        if len(self.foreign) < FOREIGN_KEPT:
            self.foreign.append(f"{path}: {what}")


def _truncate(dir_fd: int, name: str, size: int) -> None:
    fd = open_file(dir_fd, name, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _scan_meta(dir_fd: int, path: str, shuffle: ScannedShuffle, max_bytes: int) -> None:
    try:
        buf, st = read_file(dir_fd, META_FILE, max_bytes)
    except OSError as e:
        why = (e.strerror or str(e)) if e.errno in (errno.EFBIG, errno.ENXIO) else str(e)
        if e.errno == errno.EFBIG:
            why += " (localfile_store.recovery_file_max_size)"
        shuffle.meta_problem = f"cannot read {path}: {why}"
        return
    shuffle.meta_mtime_ns = st.st_mtime_ns
    try:
        contents = decode_log(buf)
    except MetaFormatError as e:
        shuffle.meta_problem = f"{path}: {e}"
        return
    if contents.corrupt:
        shuffle.meta_problem = f"{path}: corrupt: {contents.problem}"
        return
    if contents.valid_length < len(buf):
        _truncate(dir_fd, META_FILE, contents.valid_length)
        shuffle.repaired.append(f"{path}: {contents.problem}; truncated {len(buf) - contents.valid_length} bytes")
    shuffle.meta = contents


def _scan_partition(dir_fd: int, base: str, pid: int, has_data: bool, max_bytes: int) -> ScannedPartition:
    index_name, data_name = f"partition-{pid}.index", f"partition-{pid}.data"
    index, _ = read_file(dir_fd, index_name, max_bytes)
    data_len = 0
    if has_data:
        fd = open_file(dir_fd, data_name, os.O_RDONLY)
        try:
            data_len = os.fstat(fd).st_size
        finally:
            os.close(fd)
    found = scan_index(index, data_len)
    repaired: list[str] = []
    index_path, data_path = os.path.join(base, index_name), os.path.join(base, data_name)
    if found.problem:
        repaired.append(f"{index_path}: {found.problem}")
    if found.records * INDEX_RECORD_SIZE < len(index):
        _truncate(dir_fd, index_name, found.records * INDEX_RECORD_SIZE)
    if data_len > found.data_end:
        _truncate(dir_fd, data_name, found.data_end)
        repaired.append(f"{data_path}: {data_len - found.data_end} bytes after the last indexed block cut")
    return ScannedPartition(found.block_ids, found.data_end, found.records, repaired)


def _scan_shuffle(scan: DiskScan, parent_fd: int, name: str, path: str, shuffle_id: int,
                  max_bytes: int) -> ScannedShuffle:
    shuffle = ScannedShuffle(shuffle_id, path)
    dir_fd = open_subdir(parent_fd, name)
    try:
        index_ids: set[int] = set()
        data_ids: set[int] = set()
        skipped: set[int] = set()  # a partition with a file that is not a regular file: not touched
        for entry, kind in list_dir(dir_fd):
            sub = os.path.join(path, entry)
            if entry == META_FILE and kind == REGULAR:
                _scan_meta(dir_fd, sub, shuffle, max_bytes)
                continue
            m = _PARTITION_RE.fullmatch(entry)
            pid = None
            if m is not None:
                try:
                    pid = parse_id_dirname(m.group(1), "partition file")
                except ProtocolError:
                    pid = None
            if entry == META_FILE:  # a symlink, FIFO, device... named like the log: never opened
                shuffle.meta_problem = f"{sub} is a {kind}, not a regular file; not read"
                scan.add_foreign(sub, f"a {kind}, not a regular file; not read")
                continue
            if pid is None:
                scan.add_foreign(sub, f"a {kind} the server does not write; left alone")
                continue
            if kind != REGULAR:
                scan.add_foreign(sub, f"a {kind}, not a regular file; partition {pid} left alone")
                skipped.add(pid)
                continue
            assert m is not None  # pid is set only for a name that matched
            (index_ids if m.group(2) == "index" else data_ids).add(pid)
        index_ids -= skipped
        data_ids -= skipped
        for pid in sorted(index_ids):
            try:
                part = _scan_partition(dir_fd, path, pid, pid in data_ids, max_bytes)
            except OSError as e:
                scan.add_foreign(os.path.join(path, f"partition-{pid}.index"), f"not read: {e}; partition skipped")
                continue
            shuffle.repaired.extend(part.repaired)
            part.repaired = []
            shuffle.partitions[pid] = part
        for pid in sorted(data_ids - index_ids):  # data written, its index never was: nothing readable
            data_name = f"partition-{pid}.data"
            st = os.stat(data_name, dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(data_name, dir_fd=dir_fd)
            shuffle.repaired.append(f"{os.path.join(path, data_name)}: {st.st_size} bytes without any index "
                                    f"record removed")
    finally:
        os.close(dir_fd)
    return shuffle


def _scan_app(scan: DiskScan, root_fd: int, app_id: str, app_path: str, max_bytes: int) -> ScannedApp | None:
    app_fd = open_subdir(root_fd, app_id)
    try:
        app = ScannedApp(app_id, app_path)
        for name, kind in list_dir(app_fd):
            sub = os.path.join(app_path, name)
            try:
                shuffle_id = parse_id_dirname(name)
            except ProtocolError:
                shuffle_id = None
            if shuffle_id is None or kind != DIRECTORY:
                app.stray.append(sub)
                scan.add_foreign(sub, f"a {kind} that is not a shuffle directory; left alone")
                continue
            try:
                app.shuffles[shuffle_id] = _scan_shuffle(scan, app_fd, name, sub, shuffle_id, max_bytes)
            except OSError as e:
                app.shuffles[shuffle_id] = ScannedShuffle(shuffle_id, sub, meta_problem=f"cannot scan {sub}: {e}")
    finally:
        os.close(app_fd)
    if not app.shuffles:  # nothing the server writes (lost+found, an operator's directory): not an app
        scan.add_foreign(app_path, "a directory without shuffle directories; left alone")
        return None
    return app


def scan_root(root: str, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> DiskScan:
    """Scan (and repair) one data path; see the module docstring."""
    scan = DiskScan(root)
    try:
        root_fd = open_root(root)
    except FileNotFoundError:
        return scan
    except OSError as e:
        scan.error = f"cannot open {root}: {e}"
        return scan
    try:
        try:
            entries = list_dir(root_fd)
        except OSError as e:
            scan.error = f"cannot list {root}: {e}"
            return scan
        for app_id, kind in entries:
            if app_id.startswith("."):
                continue  # the lock file, probe files and the like
            app_path = os.path.join(root, app_id)
            if kind != DIRECTORY:
                scan.add_foreign(app_path, f"a {kind} in the data path; left alone")
                continue
            try:
                check_app_id(app_id)
            except ProtocolError as e:
                scan.add_foreign(app_path, f"not an app directory ({e}); left alone")
                continue
            try:
                app = _scan_app(scan, root_fd, app_id, app_path, max_file_bytes)
            except OSError as e:
                scan.add_foreign(app_path, f"cannot scan: {e}; left alone")
                continue
            if app is not None:
                scan.apps[app_id] = app
    finally:
        os.close(root_fd)
    return scan


def remove_tree(root: str, path: str) -> None:
    """Delete ``path`` (a directory or file the recovery decided to remove), which must lie below the data
    path ``root``; never through a symlink (``riffle_actors.io.safe_fs.remove_below``)."""
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if rel.startswith("..") or os.path.isabs(rel) or rel == "." or ".." in parts:
        raise OSError(errno.EINVAL, f"{path} is not below the data path {root}; not removed")
    remove_below(root, parts)
