"""The 40-byte big-endian index record of a partition's data file (spec §5.2).

This module owns the only on-disk format that travels to clients:
``getLocalShuffleIndex`` returns the index file verbatim, and the Uniffle client (and
HDFS readers) parse it with ``FileBasedShuffleSegment.SEGMENT_SIZE = 40``. One record
per block, in data-file order::

    offset            i64 BE   byte offset of the block in the data file
    length            i32 BE   len(data)
    uncompressLength  i32 BE
    crc               i64 BE   unsigned CRC-32 of the (compressed) bytes, passed through
    blockId           i64 BE
    taskAttemptId     i64 BE

Same layout as Java ``LocalFileWriter.writeIndex`` / ``HadoopFileWriter.writeIndex`` and
Riffle ``index_codec.rs`` (``INDEX_BLOCK_SIZE = 40``). Encoding packs a whole batch with
one ``struct`` call; decoding tolerates a torn tail (truncates to a multiple of 40), as
every reader must.

``shift_offsets`` rewrites the offset field of every record of an index by one constant (the base of a
data file in a partition's *virtual* data file, ``riffle_actors.service``): one ``array`` pass in C,
no Python code per record.

``scan_index`` is the restart recovery's reading of an index found on disk (which may hold
anything): the block ids of the leading records that are sane (offset, length and block id not
negative, the block inside the data file), where the data they index ends, and what is wrong
with the rest (a torn tail, or the first record that points outside the data file). Memory is
8 bytes per good record plus one 1024-record batch, whatever the input.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from functools import lru_cache, partial
from itertools import chain
from typing import NamedTuple, Protocol

from riffle_actors.protocol.errors import ProtocolError

__all__ = [
    "INDEX_RECORD",
    "INDEX_RECORD_SIZE",
    "IndexEntry",
    "IndexScan",
    "build_index",
    "decode_index",
    "encode_index",
    "index_inconsistency",
    "scan_index",
    "shift_offsets",
]

INDEX_RECORD = struct.Struct(">qiiqqq")
INDEX_RECORD_SIZE = INDEX_RECORD.size  # 40
_RECORD_FORMAT = "qiiqqq"
_FIELDS = ("offset", "length", "uncompress_length", "crc", "block_id", "task_attempt_id")
_FIELD_LIMITS = (63, 31, 31, 63, 63, 63)  # signed bit widths of >qiiqqq


class IndexEntry(NamedTuple):
    """One decoded index record."""

    offset: int
    length: int
    uncompress_length: int
    crc: int
    block_id: int
    task_attempt_id: int


class IndexedBlock(Protocol):
    """What ``build_index`` reads from a block (``riffle_actors.records.Block`` fits)."""

    @property
    def block_id(self) -> int: ...
    @property
    def uncompress_length(self) -> int: ...
    @property
    def crc(self) -> int: ...
    @property
    def task_attempt_id(self) -> int: ...
    @property
    def data(self) -> bytes | memoryview: ...


_new_entry = partial(tuple.__new__, IndexEntry)  # C-level constructor, no arity check


@lru_cache(maxsize=64)
def _batch_struct(n: int) -> struct.Struct:
    """A ``Struct`` for ``n`` consecutive records, so a batch packs in one C call."""
    return struct.Struct(">" + _RECORD_FORMAT * n)


def _pack_records(values: list[int], n: int) -> bytes:
    if n == 1:
        return INDEX_RECORD.pack(*values)
    return _batch_struct(n).pack(*values)


def _bad_value(values: list[int]) -> ProtocolError:
    """Name the first field of a batch that does not fit ``>qiiqqq`` (error path only)."""
    for i, value in enumerate(values):
        bits = _FIELD_LIMITS[i % 6]
        field = f"index[{i // 6}].{_FIELDS[i % 6]}"
        if not isinstance(value, int):
            return ProtocolError(field, f"{value!r} is not an int")
        if not -(1 << bits) <= value < (1 << bits):
            return ProtocolError(field, f"{value} does not fit a signed {bits + 1}-bit field")
    return ProtocolError("index", "record does not fit >qiiqqq")


def encode_index(entries: Iterable[IndexEntry | tuple[int, int, int, int, int, int]]) -> bytes:
    """Concatenated 40-byte records of ``entries`` (``IndexEntry`` or plain 6-tuples)."""
    if not isinstance(entries, Sequence):
        entries = list(entries)
    n = len(entries)
    if n == 0:
        return b""
    values = list(chain.from_iterable(entries))
    if len(values) != 6 * n:
        raise ProtocolError("index", f"{len(values)} values for {n} records; each needs 6")
    try:
        return _pack_records(values, n)
    except struct.error:
        raise _bad_value(values) from None


def build_index(blocks: Sequence[IndexedBlock], start_offset: int) -> tuple[bytes, int]:
    """Index records for ``blocks`` appended at ``start_offset`` of the data file.

    Returns ``(records, data_len)``: the concatenated records, with offsets running from
    ``start_offset`` in block order, and the total payload length, i.e. how many bytes
    the caller appends to the data file (``b"".join(b.data for b in blocks)``).

    ``length`` and the offsets come from ``len(block.data)``, the bytes that actually
    land in the data file, not from the block's declared ``length``: an index that
    disagrees with its data file would corrupt every later read of the partition.
    """
    values: list[int] = []
    offset = start_offset
    for block in blocks:
        length = len(block.data)
        values += (
            offset,
            length,
            block.uncompress_length,
            block.crc,
            block.block_id,
            block.task_attempt_id,
        )
        offset += length
    n = len(values) // 6
    if n == 0:
        return b"", 0
    try:
        records = _pack_records(values, n)
    except struct.error:
        raise _bad_value(values) from None
    return records, offset - start_offset


def decode_index(buf: bytes | bytearray | memoryview) -> list[IndexEntry]:
    """All complete records of ``buf``; a torn tail (``len % 40`` bytes) is ignored."""
    mv = memoryview(buf)
    if not mv.c_contiguous:  # a strided view: neither cast() nor iter_unpack() can read it
        mv = memoryview(mv.tobytes())
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    whole = len(mv) - len(mv) % INDEX_RECORD_SIZE
    if whole == 0:
        return []
    return list(map(_new_entry, INDEX_RECORD.iter_unpack(mv[:whole])))


class IndexScan(NamedTuple):
    """What ``scan_index`` found: keep ``records`` whole records (the index is cut to
    ``records * INDEX_RECORD_SIZE`` bytes) indexing ``data_end`` bytes of the data file."""

    block_ids: array[int]  # array('Q'): the block id of every kept record, in record order
    records: int
    data_end: int  # the largest offset + length of a kept record (0 when none)
    torn_bytes: int  # bytes of a torn last record (len % 40)
    bad_record: int  # index of the first record cut for pointing outside the data file, or -1
    problem: str  # what was cut, as text ("" when nothing)


_SCAN_BATCH = 1024


def scan_index(buf: bytes | bytearray | memoryview, data_len: int) -> IndexScan:
    """The sane leading records of an index found on disk next to a ``data_len``-byte data file."""
    mv = memoryview(buf)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    n, torn = divmod(len(mv), INDEX_RECORD_SIZE)
    ids = array("q")
    end = 0
    bad = -1
    problem = ""
    for first in range(0, n, _SCAN_BATCH):
        k = min(_SCAN_BATCH, n - first)
        values = _batch_struct(k).unpack_from(mv, first * INDEX_RECORD_SIZE)
        offsets, lengths, block_ids = values[0::6], values[1::6], values[4::6]
        ends = [o + ln for o, ln in zip(offsets, lengths)]
        if min(offsets) >= 0 and min(lengths) >= 0 and min(block_ids) >= 0 and max(ends) <= data_len:
            ids.extend(block_ids)
            end = max(end, max(ends))
            continue
        i = next(j for j in range(k) if offsets[j] < 0 or lengths[j] < 0 or block_ids[j] < 0
                 or ends[j] > data_len)
        ids.extend(block_ids[:i])
        if i:
            end = max(end, max(ends[:i]))
        bad = first + i
        problem = (f"index record {bad} points outside the data file ({offsets[i]}+{lengths[i]}, block id "
                   f"{block_ids[i]}, data file {data_len} bytes); it and later ones cut")
        break
    kept = bad if bad >= 0 else n
    if torn and bad < 0:
        problem = f"torn last index record, truncated {torn} bytes"
    unsigned = array("Q")
    unsigned.frombytes(ids.tobytes())  # every kept id is >= 0: the same bits
    return IndexScan(unsigned, kept, end, torn, bad, problem)


def index_inconsistency(index: bytes | bytearray | memoryview, data_len: int) -> str | None:
    """What is wrong between a served index and its data file, or None (Riffle's
    ``index_consistency_detection_enable`` check, ``localfile.rs detect_index_inconsistency``).

    As Riffle: the last record's ``offset + length`` must equal the data file's length (every byte
    of the data file is indexed, and nothing indexed lies past its end). A torn tail (a length that
    is not a multiple of 40) is reported too. Only the last record is decoded: constant work, and
    no value read from the file is used for anything but this comparison. An empty index is
    consistent with an empty data file only."""
    size = len(index)
    if size % INDEX_RECORD_SIZE:
        return f"the index is {size} bytes, not a whole number of {INDEX_RECORD_SIZE}-byte records"
    if size == 0:
        return None if data_len == 0 else f"no index record for the {data_len} bytes of the data file"
    offset, length, _u, _c, block_id, _t = INDEX_RECORD.unpack_from(index, size - INDEX_RECORD_SIZE)
    if offset < 0 or length < 0:
        return f"the last index record (block {block_id}) has offset {offset} and length {length}"
    if offset + length != data_len:
        return (f"the last index record (block {block_id}) ends at {offset + length}, the data file "
                f"holds {data_len} bytes")
    return None


def shift_offsets(index: bytes | bytearray | memoryview, delta: int) -> bytes:
    """``index`` (whole records; a torn tail is dropped) with ``delta`` added to every record's offset.

    The 40-byte record is five 8-byte words (``length`` and ``uncompressLength`` share the second),
    the offset being the first: one ``array('q')`` of the words, byte-swapped to native order, its
    every fifth word replaced at once (``map`` of a builtin: no bytecode per record)."""
    whole = len(index) - len(index) % INDEX_RECORD_SIZE
    words = array("q")
    words.frombytes(memoryview(index)[:whole])
    if delta == 0:
        return words.tobytes()
    swap = sys.byteorder == "little"
    if swap:
        words.byteswap()
    words[0::5] = array("q", map(delta.__add__, words[0::5]))
    if swap:
        words.byteswap()
    return words.tobytes()
