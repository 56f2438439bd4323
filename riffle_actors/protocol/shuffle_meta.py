"""The shuffle metadata log: a versioned, checksummed, append-only record format (ours, not Uniffle's).

A restarted server rebuilds a shuffle from its ``shuffle.meta`` file (written by
``riffle_actors.io.meta_store`` on the app's home disk, next to the shuffle's partition files).
This module owns the byte format only; it has no file IO.

File layout, all integers little-endian::

    header   magic b"RSHM" | u16 version (1) | u16 flags (0)                       8 bytes
    record   u32 body length | u32 CRC-32 of (kind byte + body) | u8 kind | body   9 + n bytes

Record kinds (body layouts; ``str`` is u32 byte length + UTF-8):

- ``REGISTER`` (1): one registerShuffle: u8 flags (bit 0: LOCAL_ORDER data distribution),
  u32 range count, (i32 start, i32 end) per inclusive partition range, str user,
  str remote storage path ("" when none), u32 property count, (str key, str value) per property.
  A shuffle registered several times (one call per range set) has several; they add up.
- ``BLOCK_IDS`` (2): one reportShuffleResult: u32 partition count, then per partition
  i32 partition id, u32 id count, u64 block id per id.
- ``SEGMENT`` (3): a partition got files on one more disk: i32 partition id, str disk (its data
  path). The order of these records is the order of the partition's segments across disks.

Reading (``decode_log``) stops at the first record that is torn (its header or body runs past
the end: a crash in the middle of an append) or whose checksum does not match; everything
before it is returned, with ``valid_length`` (where a writer must truncate the file before
appending again) and the problem as text. A record of a kind this version does not know
(written by a newer one) is skipped and counted. A file with another magic or a version this
code does not read is unusable as a whole (``MetaFormatError``).

A record whose checksum matches but whose body does not parse, or holds a value no writer
produces (a block id above 2^63 - 1, a negative partition id), also stops the
read, and marks the log ``corrupt``: that is not a torn append but damage (or a forgery), so a
reader must not truncate it away and carry on as if the shuffle were whole.

Nothing here is pickled; the codec builds and parses bytes with ``struct`` only.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "BLOCK_IDS",
    "FILE_HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_RECORD_BYTES",
    "REGISTER",
    "SEGMENT",
    "VERSION",
    "BlockIdsRecord",
    "LogContents",
    "MetaFormatError",
    "RegisterRecord",
    "SegmentRecord",
    "decode_log",
    "encode_block_ids",
    "encode_block_ids_steps",
    "encode_register",
    "encode_segment",
    "frame",
]

MAGIC = b"RSHM"
VERSION = 1
_FILE_HEADER = struct.Struct("<4sHH")
HEADER_SIZE = _FILE_HEADER.size  # 8
FILE_HEADER = _FILE_HEADER.pack(MAGIC, VERSION, 0)
_RECORD_HEADER = struct.Struct("<IIB")
RECORD_HEADER_SIZE = _RECORD_HEADER.size  # 9
MAX_RECORD_BYTES = 1 << 30  # a length above this is garbage, not a record

REGISTER = 1
BLOCK_IDS = 2
SEGMENT = 3

_U32 = struct.Struct("<I")
_I32_PAIR = struct.Struct("<ii")
_PART_HEADER = struct.Struct("<iI")
_LITTLE = sys.byteorder == "little"


class MetaFormatError(ValueError):
    """The file is not a metadata log this code can read (magic or version)."""


@dataclass(frozen=True, slots=True)
class RegisterRecord:
    ranges: tuple[tuple[int, int], ...]
    local_order: bool = False
    user: str = ""
    remote_storage: str = ""
    properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class BlockIdsRecord:
    """One report: (partition id, ids as ``array('Q')``) per partition."""

    parts: tuple[tuple[int, array[int]], ...]


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    partition_id: int
    disk: str


Record = RegisterRecord | BlockIdsRecord | SegmentRecord


@dataclass(slots=True)
class LogContents:
    """What ``decode_log`` read: the whole records, where they end, and what stopped it (if anything)."""

    records: list[Record] = field(default_factory=list)
    valid_length: int = 0  # bytes of header + whole, checked records
    problem: str = ""  # "" when the file ended cleanly after its last record
    unknown_records: int = 0  # well-formed records of kinds this version does not know
    corrupt: bool = False  # a checksummed record did not parse or held out-of-range values


# ---------------------------------------------------------------------------- encoding
def _str(value: str) -> bytes:
    raw = value.encode()
    return _U32.pack(len(raw)) + raw


def encode_register(ranges: Iterable[tuple[int, int]], *, local_order: bool = False, user: str = "",
                    remote_storage: str = "", properties: Iterable[tuple[str, str]] = ()) -> bytes:
    ranges = tuple(ranges)
    props = tuple(properties)
    parts = [bytes([1 if local_order else 0]), _U32.pack(len(ranges))]
    parts.extend(_I32_PAIR.pack(start, end) for start, end in ranges)
    parts.append(_str(user))
    parts.append(_str(remote_storage))
    parts.append(_U32.pack(len(props)))
    for key, value in props:
        parts.append(_str(key))
        parts.append(_str(value))
    return b"".join(parts)


def encode_block_ids(parts: Sequence[tuple[int, array[int] | Sequence[int]]]) -> bytes:
    """A report's body; each id list is an ``array('Q')`` (copied in C) or any sequence of ints."""
    steps = encode_block_ids_steps(parts)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        body: bytes = done.value
        return body


_STEP_PARTS = 256  # encode_block_ids_steps: partitions per step (~2-3 us each) ...
_STEP_IDS = 1 << 16  # ... or ids (~1 ns each, copied in C)


def encode_block_ids_steps(parts: Sequence[tuple[int, array[int] | Sequence[int]]]) -> Generator[None, None, bytes]:
    """``encode_block_ids`` in steps of at most ``_STEP_PARTS`` partitions or ``_STEP_IDS`` ids (the
    body is the ``StopIteration`` value): a report of 200k partitions costs ~0.5 s to encode, which
    an actor on the event loop runs a slice at a time."""
    out = [_U32.pack(len(parts))]
    work = 0
    for partition_id, ids in parts:
        if not (type(ids) is array and ids.typecode == "Q"):
            ids = array("Q", ids)
        if not _LITTLE:
            ids = array("Q", ids)
            ids.byteswap()
        out.append(_PART_HEADER.pack(partition_id, len(ids)))
        out.append(ids.tobytes())
        work += len(ids) + _STEP_IDS // _STEP_PARTS
        if work >= _STEP_IDS:
            work = 0
            yield
    yield  # the join: one copy of the body
    return b"".join(out)


def encode_segment(partition_id: int, disk: str) -> bytes:
    return struct.pack("<i", partition_id) + _str(disk)


def frame(kind: int, body: bytes) -> bytes:
    """One record as it goes into the file."""
    kind_byte = bytes([kind])
    crc = zlib.crc32(body, zlib.crc32(kind_byte))
    return _RECORD_HEADER.pack(len(body), crc, kind) + body


# ---------------------------------------------------------------------------- decoding
class _Reader:
    __slots__ = ("mv", "pos")

    def __init__(self, mv: memoryview) -> None:
        self.mv = mv
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.mv):
            raise ValueError("body ends early")
        out = self.mv[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def str(self) -> str:
        return bytes(self.take(self.u32())).decode()

    def done(self) -> None:
        if self.pos != len(self.mv):
            raise ValueError(f"{len(self.mv) - self.pos} bytes after the body")


_MAX_BLOCK_ID = (1 << 63) - 1  # block ids are Java longs >= 0 (riffle_actors.protocol.bitmap.MAX_ID)


def _decode_register(r: _Reader) -> RegisterRecord:
    flags = r.take(1)[0]
    n = r.u32()
    ranges = tuple(_I32_PAIR.unpack(r.take(8)) for _ in range(n))
    user = r.str()
    remote = r.str()
    props = tuple((r.str(), r.str()) for _ in range(r.u32()))
    r.done()
    return RegisterRecord(ranges, bool(flags & 1), user, remote, props)


def _decode_block_ids(r: _Reader) -> BlockIdsRecord:
    parts = []
    for _ in range(r.u32()):
        pid, count = _PART_HEADER.unpack(r.take(8))
        ids = array("Q")
        ids.frombytes(r.take(8 * count))
        if not _LITTLE:
            ids.byteswap()
        if pid < 0:
            raise ValueError(f"partition id {pid} is negative")
        if count and max(ids) > _MAX_BLOCK_ID:
            raise ValueError(f"block id {max(ids)} of partition {pid} is above 2^63 - 1")
        parts.append((pid, ids))
    r.done()
    return BlockIdsRecord(tuple(parts))


def _decode_segment(r: _Reader) -> SegmentRecord:
    (pid,) = struct.unpack("<i", r.take(4))
    disk = r.str()
    r.done()
    if pid < 0:
        raise ValueError(f"partition id {pid} is negative")
    return SegmentRecord(pid, disk)


_DECODERS: dict[int, Callable[[_Reader], Record]] = {REGISTER: _decode_register, BLOCK_IDS: _decode_block_ids, SEGMENT: _decode_segment}


def check_header(buf: bytes | bytearray | memoryview) -> None:
    """``MetaFormatError`` unless ``buf`` starts with a header this code reads."""
    if len(buf) < HEADER_SIZE:
        raise MetaFormatError(f"file header torn ({len(buf)} of {HEADER_SIZE} bytes)")
    magic, version, _flags = _FILE_HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise MetaFormatError(f"not a shuffle metadata log (magic {bytes(magic)!r})")
    if version != VERSION:
        raise MetaFormatError(f"metadata log version {version} is not supported (this server reads {VERSION})")


def decode_log(buf: bytes | bytearray | memoryview) -> LogContents:
    """Every whole, checked record of a metadata log; see the module docstring for what stops it."""
    mv = memoryview(buf)
    if not mv.c_contiguous:  # a strided view: struct cannot read it
        mv = memoryview(mv.tobytes())
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    check_header(mv)
    out = LogContents(valid_length=HEADER_SIZE)
    pos = HEADER_SIZE
    end = len(mv)
    while pos < end:
        if end - pos < RECORD_HEADER_SIZE:
            out.problem = f"torn record header at offset {pos} ({end - pos} bytes)"
            break
        length, crc, kind = _RECORD_HEADER.unpack_from(mv, pos)
        if length > MAX_RECORD_BYTES:
            out.problem = f"record length {length} at offset {pos} is not plausible"
            break
        body_start = pos + RECORD_HEADER_SIZE
        if body_start + length > end:
            out.problem = f"torn record at offset {pos} ({end - body_start} of {length} body bytes)"
            break
        body = mv[body_start:body_start + length]
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            out.problem = f"checksum mismatch in the record at offset {pos}"
            break
        decoder = _DECODERS.get(kind)
        if decoder is None:
            out.unknown_records += 1
        else:
            try:
                out.records.append(decoder(_Reader(body)))
            except (ValueError, UnicodeDecodeError, struct.error) as e:
                out.problem = f"record at offset {pos} (kind {kind}) does not parse: {e}"
                out.corrupt = True
                break
        pos = body_start + length
        out.valid_length = pos
    return out
