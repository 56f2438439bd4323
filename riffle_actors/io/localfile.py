"""Blocking local-file operations of one disk: append a spill batch, read index and data, purge.

This module owns the on-disk layout of a data path and the write-ordering rules of spec §5:
block bytes are appended to the data file first (one ``writev``), then the matching 40-byte
index records (one write); if either step fails both files are truncated back to their
previous length, so a failed spill never leaves a torn index record that would misalign
every later one. Every function here blocks and must run on the owning DiskActor's threads.

Layout (private to the server, Riffle's): ``<root>/<app_id>/<shuffle_id>/partition-<p>.{data,index}``.

See also: ``riffle_actors.protocol.index`` (record codec), ``riffle_actors.actors.disk``.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from riffle_actors.protocol.index import INDEX_RECORD_SIZE, build_index
from riffle_actors.records import Block

_IOV_MAX = 1024


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
                 blocks: Sequence[Block], fsync: bool = False) -> tuple[int, int]:
    """Append ``blocks`` to the partition's data file, then their index records.

    Returns ``(data_offset_of_first_block, data_file_length_after)``.
    """
    data_path, index_path = partition_paths(root, app_id, shuffle_id, partition_id)
    os.makedirs(os.path.dirname(data_path), exist_ok=True)
    data_fd = os.open(data_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        index_fd = os.open(index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            base = os.fstat(data_fd).st_size
            index_base = os.fstat(index_fd).st_size
            if index_base % INDEX_RECORD_SIZE:
                # an earlier crash left a torn record; cut it so new records stay aligned
                os.ftruncate(index_fd, index_base - index_base % INDEX_RECORD_SIZE)
                index_base -= index_base % INDEX_RECORD_SIZE
            index_bytes, data_len = build_index(blocks, base)
            try:
                _write_all(data_fd, [b.data for b in blocks])
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


def read_index(root: str, app_id: str, shuffle_id: int, partition_id: int) -> tuple[bytes, int]:
    """The whole index (cut to whole records) and the data file length; empty when absent."""
    data_path, index_path = partition_paths(root, app_id, shuffle_id, partition_id)
    try:
        with open(index_path, "rb") as f:
            index = f.read()
    except FileNotFoundError:
        return b"", 0
    index = index[: len(index) - len(index) % INDEX_RECORD_SIZE]
    try:
        data_len = os.stat(data_path).st_size
    except FileNotFoundError:
        return b"", 0
    return index, data_len


def read_data(root: str, app_id: str, shuffle_id: int, partition_id: int, offset: int, length: int) -> bytes:
    """Exactly ``length`` bytes at ``offset`` of the data file, or ``OSError``."""
    data_path, _ = partition_paths(root, app_id, shuffle_id, partition_id)
    fd = os.open(data_path, os.O_RDONLY)
    try:
        parts = []
        got = 0
        while got < length:
            chunk = os.pread(fd, length - got, offset + got)
            if not chunk:
                raise OSError(errno.ENODATA, f"data file {data_path} ends before offset {offset + length}")
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def remove_app(root: str, app_id: str, shuffle_id: int | None = None) -> None:
    path = os.path.join(root, app_id) if shuffle_id is None else partition_dir(root, app_id, shuffle_id)
    shutil.rmtree(path, ignore_errors=True)


def usage(root: str) -> tuple[int, int]:
    """(capacity bytes, used bytes) of the file system holding ``root``."""
    st = shutil.disk_usage(root)
    return st.total, st.total - st.free


def ensure_root(root: str) -> None:
    Path(root).mkdir(parents=True, exist_ok=True)
