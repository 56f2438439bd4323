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

Every function blocks; run them on a Disk actor's threads or another worker thread, never on the
event loop.
"""

from __future__ import annotations

import functools
import operator
import os
import re
import shutil
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.ids import parse_id_dirname
from riffle_actors.protocol.index import INDEX_RECORD_SIZE
from riffle_actors.protocol.shuffle_meta import FILE_HEADER, LogContents, MetaFormatError, decode_log, frame

META_FILE = "shuffle.meta"
_PARTITION_RE = re.compile(r"^partition-(\d+)\.(data|index)$")


def meta_path(root: str, app_id: str, shuffle_id: int) -> str:
    return os.path.join(root, app_id, str(shuffle_id), META_FILE)


def append_meta(root: str, app_id: str, shuffle_id: int, records: Sequence[tuple[int, bytes]]) -> int:
    """Append ``(kind, body)`` records to the shuffle's log; returns the bytes written."""
    path = meta_path(root, app_id, shuffle_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        payload = b"".join(frame(kind, body) for kind, body in records)
        if size == 0:
            payload = FILE_HEADER + payload
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
    meta_problem: str = ""  # an unusable log (bad magic or version, unreadable)
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


def _truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _scan_meta(path: str, shuffle: ScannedShuffle) -> None:
    try:
        with open(path, "rb") as f:
            buf = f.read()
            shuffle.meta_mtime_ns = os.fstat(f.fileno()).st_mtime_ns
    except OSError as e:
        shuffle.meta_problem = f"cannot read {path}: {e}"
        return
    try:
        contents = decode_log(buf)
    except MetaFormatError as e:
        shuffle.meta_problem = f"{path}: {e}"
        return
    if contents.valid_length < len(buf):
        _truncate(path, contents.valid_length)
        shuffle.repaired.append(f"{path}: {contents.problem}; truncated {len(buf) - contents.valid_length} bytes")
    shuffle.meta = contents


_CHUNK = 1024  # index records decoded per struct call


@functools.lru_cache(maxsize=64)
def _records(n: int) -> struct.Struct:
    return struct.Struct(">" + "qiiqqq" * n)


def _scan_partition(index_path: str, data_path: str) -> ScannedPartition:
    with open(index_path, "rb") as f:
        index = f.read()
    try:
        data_len = os.stat(data_path).st_size
    except FileNotFoundError:
        data_len = 0
    repaired: list[str] = []
    whole = len(index) - len(index) % INDEX_RECORD_SIZE
    if whole < len(index):
        repaired.append(f"{index_path}: torn last index record, truncated {len(index) - whole} bytes")
    n = whole // INDEX_RECORD_SIZE
    # one C call for every record: (offset, length, uncompress length, crc, block id, task attempt id) * n
    values: list[int] = []
    for first in range(0, n, _CHUNK):
        values.extend(_records(min(_CHUNK, n - first)).unpack_from(index, first * INDEX_RECORD_SIZE))
    offsets, lengths = values[0::6], values[1::6]
    ends = list(map(operator.add, offsets, lengths))
    good = n
    if n and (max(ends) > data_len or min(offsets) < 0 or min(lengths) < 0 or min(values[4::6]) < 0):
        good = next(i for i in range(n) if offsets[i] < 0 or lengths[i] < 0 or ends[i] > data_len
                    or values[6 * i + 4] < 0)
        repaired.append(f"{index_path}: index record {good} points past the data file "
                        f"({offsets[good]}+{lengths[good]} > {data_len}); it and later ones cut")
    ids = array("Q", values[4:6 * good:6])
    end = max(ends[:good], default=0)
    if good * INDEX_RECORD_SIZE < len(index):
        _truncate(index_path, good * INDEX_RECORD_SIZE)
    if data_len > end and os.path.exists(data_path):
        _truncate(data_path, end)
        repaired.append(f"{data_path}: {data_len - end} bytes after the last indexed block cut")
    return ScannedPartition(ids, end, good, repaired)


def _scan_shuffle(path: str, shuffle_id: int) -> ScannedShuffle:
    shuffle = ScannedShuffle(shuffle_id, path)
    names = os.listdir(path)
    index_ids = set()
    data_ids = set()
    for name in names:
        if name == META_FILE:
            _scan_meta(os.path.join(path, name), shuffle)
            continue
        m = _PARTITION_RE.match(name)
        if m is None:
            continue
        (index_ids if m.group(2) == "index" else data_ids).add(int(m.group(1)))
    for pid in sorted(index_ids):
        base = os.path.join(path, f"partition-{pid}")
        part = _scan_partition(base + ".index", base + ".data")
        shuffle.repaired.extend(part.repaired)
        part.repaired = []
        shuffle.partitions[pid] = part
    for pid in sorted(data_ids - index_ids):  # data written, its index never was: nothing readable
        data_path = os.path.join(path, f"partition-{pid}.data")
        size = os.path.getsize(data_path)
        os.unlink(data_path)
        shuffle.repaired.append(f"{data_path}: {size} bytes without any index record removed")
    return shuffle


def scan_root(root: str) -> DiskScan:
    """Scan (and repair) one data path; see the module docstring."""
    scan = DiskScan(root)
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return scan
    except OSError as e:
        scan.error = f"cannot list {root}: {e}"
        return scan
    for app_id in entries:
        app_path = os.path.join(root, app_id)
        if app_id.startswith(".") or not os.path.isdir(app_path) or os.path.islink(app_path):
            continue  # probe files and the like
        app = ScannedApp(app_id, app_path)
        for name in sorted(os.listdir(app_path)):
            sub = os.path.join(app_path, name)
            try:
                shuffle_id = parse_id_dirname(name)
            except ProtocolError:
                shuffle_id = None
            if shuffle_id is None or not os.path.isdir(sub) or os.path.islink(sub):
                app.stray.append(sub)
                continue
            try:
                app.shuffles[shuffle_id] = _scan_shuffle(sub, shuffle_id)
            except OSError as e:
                app.shuffles[shuffle_id] = ScannedShuffle(shuffle_id, sub, meta_problem=f"cannot scan {sub}: {e}")
        scan.apps[app_id] = app
    return scan


def remove_tree(path: str) -> None:
    """Delete a directory or file the recovery decided to remove."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
