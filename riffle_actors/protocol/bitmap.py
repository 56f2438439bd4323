"""Block-id and task-id sets in Java ``Roaring64NavigableMap`` LEGACY serialization.

This module owns the bytes of every 64-bit id bitmap on the wire (spec §3):
``GetShuffleResult*Response.serializedBitmap`` (server → client),
``GetMemoryShuffleDataRequest.serializedExpectedTaskIdsBitmap`` (client → server) and
``StartSortMergeRequest.uniqueBlocksBitmap``. The Java side is RoaringBitmap 0.9.15's
``Roaring64NavigableMap.serialize(DataOutput)`` in its default LEGACY mode, called by
``RssUtils.serializeBitMap`` / ``deserializeBitMap``; Riffle speaks it through croaring's
``Treemap`` with the ``JvmLegacy`` codec.

Legacy layout (outer part big-endian, inner part little-endian)::

    u8      signedLongs flag (we write 0x00; readers accept any value)
    i32 BE  bucket count N
    N x     i32 BE high (upper 32 bits of the ids in the bucket)
            32-bit RoaringBitmap, portable format (cookie 12346 or 12347), low 32 bits

There is no length prefix per bucket: the size of each inner bitmap is derived from its
own header (``_portable_size``). Zero-length bytes mean "empty set" (the Java client
short-circuits them; the Java server answers them for "never reported").

In memory a ``BlockIdSet`` is one ``pyroaring.BitMap64`` (CRoaring's 64-bit roaring).
Measured against a ``dict[high -> BitMap]`` it wins on the hot path, ``update`` of a few
thousand ids, because the whole batch goes to C in one call with no per-id grouping in
Python. Conversion to and from the wire only rewrites bucket headers: CRoaring's own
64-bit portable format is ``u64 LE count`` then ``(u32 LE high, 32-bit portable bitmap)``
per bucket, so the inner bitmaps are copied byte for byte and never re-encoded.

For shuffles with millions of ids, the work stays bounded per call whatever the ids' layout:
``id_array`` checks a batch of ids in C (``BlockIdSet.update_and_count`` then adds it with one
``add_many``, counting the new ids by membership, never with the set's O(containers) ``len``), and
``union_serialize_steps`` merges and encodes sets in steps of at most ``STEP_IDS`` ids, also
inside one set (chunked reads, ``_LegacyWriter``), so that a caller on the event loop can pause
between steps (``riffle_actors.state.app_state``). ``BlockIdSet.serialize`` stays the one-shot
reference the steps are tested against. ``TaskIdFilter`` loads a client's bitmap in pieces of at
most ``_FILTER_PIECE_BUCKETS`` buckets.

Ids are non-negative Java longs, i.e. ``0 <= id < 2**63``; anything else is rejected
with ``ProtocolError`` (field ``block_id`` on input, ``bitmap.bucket[i].high`` on decode).
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Generator, Iterable, Iterator, Sequence, Sized
from itertools import filterfalse, islice

from pyroaring import BitMap, BitMap64

from riffle_actors.protocol.errors import ProtocolError

__all__ = [
    "MAX_ID",
    "STEP_IDS",
    "BlockIdSet",
    "BlockIdSetMap",
    "TaskIdFilter",
    "deserialize_block_ids",
    "id_array",
    "release_steps",
    "serialize_block_ids",
    "union_serialize_steps",
]

Buffer = bytes | bytearray | memoryview

MAX_ID = (1 << 63) - 1
"""Largest id a set may hold: ``Long.MAX_VALUE`` (ids are non-negative Java longs)."""

_LEGACY_HEAD = struct.Struct(">Bi")  # signedLongs flag, bucket count
_BE_U32 = struct.Struct(">I")
_LE_U16 = struct.Struct("<H")
_LE_U32 = struct.Struct("<I")
_LE_U64 = struct.Struct("<Q")

_EMPTY_LEGACY = b"\x00\x00\x00\x00\x00"  # what Java writes for an empty map

# RoaringFormatSpec constants (identical in Java RoaringBitmap, CRoaring and pyroaring).
_COOKIE_NO_RUN = 12346  # u32 cookie, then u32 container count, offsets always present
_COOKIE_RUN = 12347  # low 16 bits; high 16 bits = container count - 1; run-flag bitset
_NO_OFFSET_THRESHOLD = 4  # cookie 12347 carries an offset table only when n >= 4
_MAX_CONTAINERS = 1 << 16
_ARRAY_MAX_CARD_M1 = 4095  # an array container holds at most 4096 values; more = 8 KiB bitset
_MIN_BUCKET_BYTES = 4 + 8  # high + the smallest portable bitmap (cookie 12346, n = 0)
_MAX_HIGH = 0x7FFFFFFF  # highs above hold ids >= 2**63, i.e. negative Java longs

_SMALL_BATCH = 16  # update(): below this, validate in Python and skip the temporary bitmap
_BYTES_BELOW_16 = bytes(range(16))  # high byte of cardinality-1 < 16 <=> array container
_BYTES_BELOW_128 = bytes(range(128))  # most significant byte of a u64 < 0x80 <=> the id is < 2**63
_MSB_INDEX = 7 if sys.byteorder == "little" else 0  # of each 8-byte item of an array('Q')


# --------------------------------------------------------------------------------------
# 32-bit portable format: size of one bitmap from its header
# --------------------------------------------------------------------------------------


def _plain_containers_bytes(table: bytes, start: int, stop: int) -> int:
    """Bytes of the array/bitset containers ``start:stop``: ``2 * min(cardinality, 4096)`` each.

    ``table`` is the key/cardinality table (``u16 key, u16 cardinality-1`` per container).
    The low and high bytes of the cardinality column are summed separately with C-level
    slicing, so a bucket with thousands of containers costs microseconds.
    """
    card_lo = table[4 * start + 2 : 4 * stop : 4]
    card_hi = table[4 * start + 3 : 4 * stop : 4]
    if card_hi.translate(None, _BYTES_BELOW_16):  # some cardinality-1 >= 4096: 8 KiB bitsets
        return 2 * sum(min(lo | hi << 8, _ARRAY_MAX_CARD_M1) + 1 for lo, hi in zip(card_lo, card_hi))
    return 2 * (sum(card_lo) + (sum(card_hi) << 8) + (stop - start))


def _portable_size(mv: memoryview, pos: int, end: int, field: str) -> int:
    """Byte size of the portable 32-bit RoaringBitmap at ``mv[pos:]`` (must end by ``end``).

    Walks the header like Java's ``RoaringBitmap.deserialize(DataInput)``: the offset
    table is skipped, never trusted, because Java readers ignore it too. Array and
    bitset container sizes follow from the cardinality column (summed in C); only run
    containers need a look at their own 2-byte run count. Every read is bounds-checked,
    and the work is bounded by the container count (at most 65536), so garbage input
    ends in ``ProtocolError``, never in another exception or a long loop.
    """
    if pos + 4 > end:
        raise ProtocolError.truncated(f"{field}.cookie", 4, end - pos)
    cookie: int = _LE_U32.unpack_from(mv, pos)[0]
    p: int = pos + 4
    run_flags: bytes | None
    if cookie == _COOKIE_NO_RUN:
        if p + 4 > end:
            raise ProtocolError.truncated(f"{field}.container_count", 4, end - p)
        n: int = _LE_U32.unpack_from(mv, p)[0]
        p += 4
        if n > _MAX_CONTAINERS:
            raise ProtocolError(f"{field}.container_count", f"{n} exceeds {_MAX_CONTAINERS}")
        run_flags = None
        has_offsets = True
    elif cookie & 0xFFFF == _COOKIE_RUN:
        n = (cookie >> 16) + 1
        flag_bytes = (n + 7) >> 3
        if p + flag_bytes > end:
            raise ProtocolError.truncated(f"{field}.run_flags", flag_bytes, end - p)
        run_flags = bytes(mv[p : p + flag_bytes])
        p += flag_bytes
        has_offsets = n >= _NO_OFFSET_THRESHOLD
    else:
        raise ProtocolError(f"{field}.cookie", f"{cookie:#010x} is neither 12346 nor 12347")

    table = p
    header_tables = 8 * n if has_offsets else 4 * n  # key/cardinality (+ offsets)
    if p + header_tables > end:
        raise ProtocolError.truncated(f"{field}.key_table", header_tables, end - p)
    p += header_tables
    if n == 0:
        return p - pos

    cards = mv[table : table + 4 * n].tobytes()
    if not run_flags or not any(run_flags):
        p += _plain_containers_bytes(cards, 0, n)
    else:
        done = 0  # containers before this index are accounted for
        for byte_index, flags in enumerate(run_flags):
            while flags:
                lowest = flags & -flags
                flags ^= lowest
                run_container = (byte_index << 3) + lowest.bit_length() - 1
                if run_container >= n:  # padding bits of the last flag byte
                    break
                p += _plain_containers_bytes(cards, done, run_container)
                if p + 2 > end:
                    raise ProtocolError.truncated(f"{field}.container[{run_container}].run_count", 2, end - p)
                runs: int = _LE_U16.unpack_from(mv, p)[0]
                p += 2 + 4 * runs
                done = run_container + 1
        p += _plain_containers_bytes(cards, done, n)
    if p > end:
        raise ProtocolError.truncated(f"{field}.containers", p - pos, end - pos)
    return p - pos


# --------------------------------------------------------------------------------------
# 64-bit legacy format
# --------------------------------------------------------------------------------------


def _byte_view(buf: Buffer) -> memoryview:
    """A contiguous 1-D byte view of ``buf`` (a strided view is copied: ``struct`` cannot read it)."""
    mv = memoryview(buf)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _parse_legacy(mv: memoryview) -> dict[int, tuple[int, int, int]]:
    """Bucket boundaries of a non-empty legacy buffer: ``high -> (index, start, stop)``."""
    end = len(mv)
    if end < 5:
        raise ProtocolError.truncated("bitmap.bucket_count", 5, end)
    _signed_longs, count = _LEGACY_HEAD.unpack_from(mv)
    if count < 0:
        raise ProtocolError("bitmap.bucket_count", f"negative ({count})")
    if count > (end - 5) // _MIN_BUCKET_BYTES:
        raise ProtocolError.truncated("bitmap.buckets", count * _MIN_BUCKET_BYTES, end - 5)
    buckets: dict[int, tuple[int, int, int]] = {}
    pos = 5
    for i in range(count):
        if pos + 4 > end:
            raise ProtocolError.truncated(f"bitmap.bucket[{i}].high", 4, end - pos)
        (high,) = _BE_U32.unpack_from(mv, pos)
        if high > _MAX_HIGH:
            raise ProtocolError(
                f"bitmap.bucket[{i}].high", f"{high:#x} would hold ids >= 2**63 (negative longs)"
            )
        start = pos + 4
        pos = start + _portable_size(mv, start, end, f"bitmap.bucket[{i}]")
        # A repeated high replaces the earlier bucket, like Java's TreeMap.put in
        # Roaring64NavigableMap.deserialize. The replaced bucket never reaches CRoaring, so it is
        # validated here: malformed bytes are refused wherever they sit (Java never repeats a high).
        replaced = buckets.get(high)
        if replaced is not None:
            _check_bucket(mv, *replaced)
        buckets[high] = (i, start, pos)
    if pos != end:
        raise ProtocolError("bitmap", f"{end - pos} trailing bytes after {count} buckets")
    return buckets


def _check_bucket(mv: memoryview, i: int, start: int, stop: int) -> None:
    """Raise ``ProtocolError`` if pyroaring rejects the containers of bucket ``i``."""
    try:
        BitMap.deserialize(bytes(mv[start:stop]))
    except ValueError as exc:
        raise ProtocolError(f"bitmap.bucket[{i}].containers", str(exc)) from None


def _invalid_bucket(
    mv: memoryview, buckets: dict[int, tuple[int, int, int]], exc: Exception
) -> ProtocolError:
    """Name the first bucket whose containers pyroaring rejects (slow path, errors only)."""
    for i, start, stop in sorted(buckets.values()):
        try:
            BitMap.deserialize(bytes(mv[start:stop]))
        except ValueError as bucket_exc:
            return ProtocolError(f"bitmap.bucket[{i}].containers", str(bucket_exc))
    return ProtocolError("bitmap.containers", str(exc))


def _bitmap64_from_buckets(mv: memoryview, buckets: dict[int, tuple[int, int, int]]) -> BitMap64:
    """Re-frame the buckets as CRoaring's 64-bit portable format and load it in C."""
    if not buckets:
        return BitMap64()
    parts: list[bytes | memoryview] = [_LE_U64.pack(len(buckets))]
    for high in sorted(buckets):  # CRoaring requires strictly ascending highs
        _i, start, stop = buckets[high]
        parts.append(_LE_U32.pack(high))
        parts.append(mv[start:stop])
    try:
        return BitMap64.deserialize(b"".join(parts))
    except ValueError as exc:  # pyroaring validates the containers (sorted, in range)
        raise _invalid_bucket(mv, buckets, exc) from None


class BlockIdSet:
    """A mutable set of non-negative int64 ids with Java-compatible serialization.

    Iteration is ascending. Mutators accept any iterable of ints (lists, arrays,
    protobuf repeated fields); batches are handed to CRoaring in one call. Ids must be
    ``int`` (pyroaring would truncate a float rather than reject it).
    """

    __slots__ = ("_bitmap", "_containers", "_len")

    def __init__(self, ids: Iterable[int] | None = None) -> None:
        self._bitmap = BitMap64()
        self._len = 0  # cached cardinality, -1 = unknown (CRoaring's 64-bit len walks every container)
        self._containers = 0  # an upper bound on the 2**16-value containers (see ``_chunks``)
        if ids is not None:
            self.update(ids)

    @classmethod
    def _wrap(cls, bitmap: BitMap64, containers: int, length: int = -1) -> BlockIdSet:
        result = cls.__new__(cls)
        result._bitmap = bitmap
        result._len = length
        result._containers = containers
        return result

    # -- mutation ---------------------------------------------------------------------

    def add(self, block_id: int) -> None:
        if not 0 <= block_id <= MAX_ID:
            raise ProtocolError("block_id", f"{block_id} is outside [0, 2**63)")
        if self._len >= 0 and block_id not in self._bitmap:
            self._len += 1
        self._bitmap.add(block_id)
        self._containers += 1

    def update(self, block_ids: Iterable[int]) -> None:
        """Add every id; all-or-nothing: on a bad id nothing is added."""
        if isinstance(block_ids, BlockIdSet):
            self._bitmap |= block_ids._bitmap
            self._len = -1
            self._containers += block_ids._containers
            return
        if type(block_ids) is _IdArray:  # from id_array: checked already
            self._bitmap.update(block_ids)  # add_many: per id, not per container of this set
            self._len = -1
            self._containers += len(block_ids)
            return
        if type(block_ids) is array and block_ids.typecode == "Q":
            _check_below_2_63(block_ids)  # C integers: only the upper bound is left to check
            self._bitmap.update(block_ids)
            self._len = -1
            self._containers += len(block_ids)
            return
        if isinstance(block_ids, Sized) and len(block_ids) <= _SMALL_BATCH:
            # One task's report is a handful of ids: a range check in Python plus one
            # C call beats building a temporary bitmap (~0.5 us vs ~1 us for 2 ids).
            try:
                for block_id in block_ids:
                    if not 0 <= block_id <= MAX_ID:
                        raise ProtocolError("block_id", f"{block_id} is outside [0, 2**63)")
                self._bitmap.update(block_ids)
            except TypeError as exc:
                raise ProtocolError("block_id", f"not an int: {exc}") from None
            self._len = -1
            self._containers += len(block_ids)
            return
        try:
            batch = BitMap64(block_ids, optimize=False)
        except OverflowError:
            raise ProtocolError("block_id", "negative id in batch") from None
        except TypeError as exc:
            raise ProtocolError("block_id", f"not an int: {exc}") from None
        if batch and batch.max() > MAX_ID:
            raise ProtocolError("block_id", f"{batch.max()} is outside [0, 2**63)")
        self._bitmap |= batch
        self._len = -1
        self._containers += len(batch)

    def update_and_count(self, block_ids: Iterable[int]) -> int:
        """``update``, returning how many of the ids were not in the set yet.

        The cost is the batch's, never the set's: CRoaring's 64-bit ``len`` and in-place OR walk
        every container of the set (~11 ms and ~50 ms at 2M containers, the layout of a hot
        partition whose ids all differ in their high 32 bits). The ids not yet present are found
        by membership tests (~0.5 us each; a batch bitmap plus ``intersection_cardinality`` cost
        twice that), the batch is added with ``add_many``, and the set's cardinality and a bound on
        its containers are kept up to date from the batch.
        """
        if isinstance(block_ids, BlockIdSet):
            before = len(self)
            self.update(block_ids)
            return len(self) - before
        if type(block_ids) is not _IdArray:
            block_ids = id_array(block_ids)
        if not block_ids:
            return 0
        bitmap = self._bitmap
        if bitmap:
            missing = list(filterfalse(bitmap.__contains__, block_ids))
            new = len(missing) if len(missing) <= 1 else len(set(missing))
        else:
            new = len(set(block_ids))
        bitmap.update(block_ids)
        if self._len < 0:
            self._len = len(bitmap)  # once, after a mutator that lost count
        else:
            self._len += new
        self._containers += new  # a new id adds at most one container
        return new

    def union_update(self, other: BlockIdSet | Iterable[int]) -> None:
        self.update(other)

    def discard_many(self, block_ids: Iterable[int]) -> None:
        """Remove the ids that are present; absent or out-of-range ids are ignored."""
        self._len = -1  # the container bound stays valid: removing never adds a container
        if isinstance(block_ids, BlockIdSet):
            self._bitmap -= block_ids._bitmap
            return
        if not isinstance(block_ids, (list, tuple, array, range)):
            block_ids = list(block_ids)
        try:
            batch = BitMap64(block_ids, optimize=False)
        except OverflowError:
            batch = BitMap64([i for i in block_ids if 0 <= i <= MAX_ID], optimize=False)
        self._bitmap -= batch

    def copy(self) -> BlockIdSet:
        return BlockIdSet._wrap(self._bitmap.copy(), self._containers, self._len)

    # -- queries ----------------------------------------------------------------------

    def __contains__(self, block_id: object) -> bool:
        try:
            return block_id in self._bitmap  # type: ignore[operator]
        except (OverflowError, TypeError):  # negative, >= 2**64 or not an int
            return False

    def __len__(self) -> int:
        if self._len < 0:
            self._len = len(self._bitmap)
        return self._len

    def __bool__(self) -> bool:
        return bool(self._bitmap)

    def __iter__(self) -> Iterator[int]:
        # A snapshot (8 bytes per id, filled in C): ascending, and safe against mutation.
        return iter(self._bitmap.to_array())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockIdSet):
            return bool(self._bitmap == other._bitmap)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        n = len(self)
        if n <= 8:
            return f"BlockIdSet({list(self)})"
        return f"BlockIdSet(<{n} ids, {self._bitmap.min()}..{self._bitmap.max()}>)"

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        return deserialize_block_ids, (self.serialize(),)

    # -- wire -------------------------------------------------------------------------

    def serialize(self) -> bytes:
        """Java ``Roaring64NavigableMap`` LEGACY bytes; buckets ascend by high."""
        raw = self._bitmap.serialize()
        (count,) = _LE_U64.unpack_from(raw)
        if count == 0:
            return _EMPTY_LEGACY
        head = _LEGACY_HEAD.pack(0, count)
        mv = memoryview(raw)
        if count == 1:  # the common case: the bitmap is the rest of the buffer
            return b"".join((head, raw[11:7:-1], mv[12:]))
        parts: list[bytes | memoryview] = [head]
        end = len(raw)
        pos = 8
        for _ in range(count):
            start = pos + 4
            stop = start + _portable_size(mv, start, end, "bitmap")
            parts.append(raw[start - 1 : pos - 1 : -1])  # u32 LE high -> BE
            parts.append(mv[start:stop])
            pos = stop
        return b"".join(parts)

    @classmethod
    def deserialize(cls, buf: Buffer) -> BlockIdSet:
        """Parse LEGACY bytes; zero-length bytes are the empty set.

        Accepts both portable cookies (12346, and 12347 with run containers, with or
        without the offset table). Truncated, trailing or malformed bytes raise
        ``ProtocolError`` naming the field.
        """
        mv = _byte_view(buf)
        if not len(mv):
            return cls()
        # a container takes at least 6 bytes of the input (key/cardinality entry and one value)
        return cls._wrap(_bitmap64_from_buckets(mv, _parse_legacy(mv)), len(mv) // 6 + 1)


_FILTER_PIECE_BUCKETS = 1024  # buckets of a client bitmap loaded by one C call at most ...
_FILTER_PIECE_BYTES = 256 << 10  # ... and input bytes (~1-2 ms of CRoaring either way)


class TaskIdFilter:
    """Membership test for ``serializedExpectedTaskIdsBitmap`` (task attempt ids).

    Built by ``from_bytes``. When every id is below 2**32 (always, in practice) it holds
    a 32-bit ``BitMap``, whose lookup is the cheapest; ids outside the stored range are
    simply not members. Any other bitmap is loaded as *pieces*: runs of consecutive buckets of
    at most ``_FILTER_PIECE_BUCKETS`` buckets or ``_FILTER_PIECE_BYTES``, one ``BitMap64`` each,
    so no single C call (which holds the GIL) grows with a client's bitmap: 8 MiB of one-id
    buckets (~380k of them) would otherwise be one ~0.5 s call. A lookup bisects the pieces.
    """

    __slots__ = ("_pieces", "_starts")

    def __init__(self, bitmap: BitMap | BitMap64, pieces: Sequence[tuple[int, BitMap64]] = ()) -> None:
        self._pieces: list[BitMap | BitMap64] = [bitmap] if not pieces else [p for _s, p in pieces]
        self._starts: list[int] = [0] if not pieces else [start for start, _p in pieces]

    @classmethod
    def from_bytes(cls, buf: Buffer) -> TaskIdFilter | None:
        """``None`` for zero-length bytes (no filter), else a filter (possibly empty)."""
        mv = _byte_view(buf)
        if not len(mv):
            return None
        buckets = _parse_legacy(mv)
        if buckets.keys() <= {0}:
            bitmap: BitMap | BitMap64 = BitMap()
            if buckets:
                _i, start, stop = buckets[0]
                try:
                    bitmap = BitMap.deserialize(bytes(mv[start:stop]))
                except ValueError as exc:
                    raise ProtocolError("bitmap.bucket[0].containers", str(exc)) from None
            return cls(bitmap)
        pieces: list[tuple[int, BitMap64]] = []
        piece: dict[int, tuple[int, int, int]] = {}
        size = 0
        for high in sorted(buckets):
            bucket = buckets[high]
            if piece and (len(piece) >= _FILTER_PIECE_BUCKETS or size >= _FILTER_PIECE_BYTES):
                pieces.append((min(piece) << 32, _bitmap64_from_buckets(mv, piece)))
                piece, size = {}, 0
            piece[high] = bucket
            size += bucket[2] - bucket[1]
        pieces.append((min(piece) << 32, _bitmap64_from_buckets(mv, piece)))
        return cls(pieces[0][1], pieces)

    def _piece(self, task_attempt_id: int) -> BitMap | BitMap64 | None:
        if len(self._pieces) == 1:
            return self._pieces[0]
        i = bisect_right(self._starts, task_attempt_id) - 1
        return self._pieces[i] if i >= 0 else None

    def __contains__(self, task_attempt_id: object) -> bool:
        try:
            piece = self._piece(task_attempt_id)  # type: ignore[arg-type]
            return piece is not None and task_attempt_id in piece  # type: ignore[operator]
        except (OverflowError, TypeError):  # out of the stored range, or not an int
            return False

    def __len__(self) -> int:
        return sum(len(p) for p in self._pieces)

    def __iter__(self) -> Iterator[int]:
        for piece in self._pieces:
            yield from piece.to_array()

    def __repr__(self) -> str:
        return f"TaskIdFilter(<{len(self)} task attempt ids>)"


def serialize_block_ids(block_ids: Iterable[int]) -> bytes:
    """LEGACY bytes of any iterable of ids (or of a ``BlockIdSet``)."""
    if isinstance(block_ids, BlockIdSet):
        return block_ids.serialize()
    return BlockIdSet(block_ids).serialize()


def deserialize_block_ids(buf: Buffer) -> BlockIdSet:
    """Parse LEGACY bytes (zero-length = empty set) into a ``BlockIdSet``."""
    return BlockIdSet.deserialize(buf)


class BlockIdSetMap:
    """``partition id -> BlockIdSet`` that keeps no object per set for the cyclic GC to scan.

    What a shuffle's reported ids live in (``riffle_actors.state.app_state``): one shuffle may have
    up to 1M reported partitions, and a GC-tracked object per partition (a ``BlockIdSet`` is one:
    ``__slots__`` objects are tracked) made every full collection walk them all: 17-205 ms at 200k
    partitions, up to 350 ms at 1M, with the event loop stopped. Here a partition is a
    ``pyroaring.BitMap64`` (a C object, not tracked) in a dict of ints to them (which CPython
    leaves untracked while it holds only untracked values), and the cached counts of
    ``BlockIdSet`` (cardinality, -1 = unknown, and the container bound) are two ``array('q')``
    columns indexed by a slot per partition (another untracked dict). ``gc.get_referents`` of the
    map, whatever its size, is a handful of objects (``scripts/bench_loop_lag.py --gc``).

    Reading: ``map[pid]``, ``get``, ``items``, ``values`` and ``views`` give ``BlockIdSet`` *views*
    made on access: they share the partition's bitmap (ids added later show through) and carry
    the counts of that moment. A view is for reading; a set changed through it must be stored
    back (``map[pid] = view``), else the map's counts go stale. Writing: ``update_and_count``
    (a report's batch), ``update_ids``, ``add_empty``, ``map[pid] = set`` (the map takes the set's
    bitmap, which the set then shares), ``update`` (another map or dict), ``popitem``.
    """

    __slots__ = ("_bitmaps", "_containers", "_lens", "_slots")

    def __init__(self) -> None:
        self._bitmaps: dict[int, BitMap64] = {}
        self._slots: dict[int, int] = {}  # partition id -> index into the two count columns
        self._lens = array("q")  # cardinality, -1 = unknown
        self._containers = array("q")  # a bound on the set's containers (``BlockIdSet._containers``)

    def _view(self, partition_id: int, bitmap: BitMap64) -> BlockIdSet:
        slot = self._slots[partition_id]
        return BlockIdSet._wrap(bitmap, self._containers[slot], self._lens[slot])

    def _store(self, partition_id: int, ids: BlockIdSet) -> None:
        slot = self._slots.get(partition_id)
        if slot is None:
            slot = self._slots[partition_id] = len(self._lens)
            self._lens.append(ids._len)
            self._containers.append(ids._containers)
        else:
            self._lens[slot] = ids._len
            self._containers[slot] = ids._containers
        self._bitmaps[partition_id] = ids._bitmap

    # -- mapping, read side -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._bitmaps)

    def __bool__(self) -> bool:
        return bool(self._bitmaps)

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self._bitmaps

    def __iter__(self) -> Iterator[int]:
        return iter(self._bitmaps)

    def keys(self) -> Iterable[int]:
        return self._bitmaps.keys()

    def __getitem__(self, partition_id: int) -> BlockIdSet:
        return self._view(partition_id, self._bitmaps[partition_id])

    def get(self, partition_id: int, default: BlockIdSet | None = None) -> BlockIdSet | None:
        bitmap = self._bitmaps.get(partition_id)
        return default if bitmap is None else self._view(partition_id, bitmap)

    def items(self) -> Iterator[tuple[int, BlockIdSet]]:
        bitmaps = self._bitmaps
        for partition_id in list(bitmaps):  # a snapshot of the keys (ints, no tuple each): safe against changes
            bitmap = bitmaps.get(partition_id)
            if bitmap is not None:
                yield partition_id, self._view(partition_id, bitmap)

    def values(self) -> Iterator[BlockIdSet]:
        for item in self.items():
            yield item[1]

    def has_ids(self, partition_id: int) -> bool:
        """Whether the partition has a set with at least one id (no view made)."""
        bitmap = self._bitmaps.get(partition_id)
        return bitmap is not None and bool(bitmap)

    def views(self, partition_ids: Sequence[int]) -> Sequence[BlockIdSet]:
        """The sets of ``partition_ids`` (each one present) as a sequence whose items are made when read
        (for ``union_serialize_steps``: no view outlives its step, and its counts are current)."""
        return _Views(self, partition_ids)

    def id_count(self) -> int:
        """Ids over all partitions (a count still unknown is computed once and cached)."""
        lens = self._lens
        if min(lens, default=0) >= 0:
            return sum(lens)
        total = 0
        for partition_id, bitmap in self._bitmaps.items():
            slot = self._slots[partition_id]
            if lens[slot] < 0:
                lens[slot] = len(bitmap)
            total += lens[slot]
        return total

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockIdSetMap):
            return self._bitmaps == other._bitmaps
        if isinstance(other, dict):
            return self._bitmaps.keys() == other.keys() and all(self[p] == ids for p, ids in other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"BlockIdSetMap(<{len(self)} partitions>)"

    # -- mapping, write side ------------------------------------------------------------

    def __setitem__(self, partition_id: int, ids: BlockIdSet) -> None:
        self._store(partition_id, ids)

    def add_empty(self, partition_id: int) -> None:
        """Make the partition's set (empty) if it has none."""
        if partition_id not in self._bitmaps:
            self._store(partition_id, BlockIdSet())

    def update_and_count(self, partition_id: int, block_ids: Iterable[int]) -> int:
        """``BlockIdSet.update_and_count`` on the partition's set (made if missing): the ids that were new."""
        ids = self.get(partition_id)
        if ids is None:
            ids = BlockIdSet()
        new = ids.update_and_count(block_ids)
        self._store(partition_id, ids)
        return new

    def update_ids(self, partition_id: int, block_ids: Iterable[int]) -> None:
        """``BlockIdSet.update`` on the partition's set (made if missing)."""
        ids = self.get(partition_id)
        if ids is None:
            ids = BlockIdSet()
        ids.update(block_ids)
        self._store(partition_id, ids)

    def update(self, other: BlockIdSetMap | dict[int, BlockIdSet]) -> None:
        """Add every set of ``other``: a partition new here takes ``other``'s set, else the union."""
        for partition_id, ids in other.items():
            mine = self.get(partition_id)
            if mine is None:
                self._store(partition_id, ids)
            else:
                mine.update(ids)
                self._store(partition_id, mine)

    def popitem(self) -> tuple[int, BlockIdSet]:
        """Remove one partition; its set (the map's count columns keep their dead slot until the map goes)."""
        partition_id, bitmap = self._bitmaps.popitem()
        ids = self._view(partition_id, bitmap)
        slot = self._slots.pop(partition_id)
        self._lens[slot] = self._containers[slot] = 0  # a dead slot counts nothing
        return partition_id, ids


class _Views(Sequence[BlockIdSet]):
    """``BlockIdSetMap.views``: the sets of some partitions, each view made when it is read."""

    __slots__ = ("_map", "_partition_ids")

    def __init__(self, sets: BlockIdSetMap, partition_ids: Sequence[int]) -> None:
        self._map = sets
        self._partition_ids = partition_ids

    def __len__(self) -> int:
        return len(self._partition_ids)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return _Views(self._map, self._partition_ids[index])
        return self._map[self._partition_ids[index]]

    def __iter__(self) -> Iterator[BlockIdSet]:
        sets = self._map
        for partition_id in self._partition_ids:
            yield sets[partition_id]


class _IdArray(array):  # type: ignore[type-arg]  # array[int] is not subscriptable at run time (3.11)
    """An ``array('Q')`` made by ``id_array``: every id is known to be below 2**63."""

    __slots__ = ()


def _check_below_2_63(ids: array[int]) -> None:
    """``ProtocolError`` unless every id of the ``array('Q')`` is below 2**63.

    A long array is checked on the most significant byte of each id, with C-level slicing
    (~3 ns per id against ~30 for ``max``, which makes a Python int of every id).
    """
    if len(ids) <= 64:
        bad = bool(ids) and max(ids) > MAX_ID
    else:
        bad = bool(bytes(memoryview(ids).cast("B")[_MSB_INDEX::8]).translate(None, _BYTES_BELOW_128))
    if bad:
        raise ProtocolError("block_id", f"{max(ids)} is outside [0, 2**63)")


def id_array(block_ids: Iterable[int]) -> array[int]:
    """``block_ids`` as ``array('Q')``, each checked to be an int in ``[0, 2**63)`` (else ``ProtocolError``).

    The conversion runs in C and already rejects floats, negative ids and ids >= 2**64; the
    upper bound is checked on the bytes. ``BlockIdSet.update`` adds such an array with one
    ``add_many``, without the temporary bitmap or the checks other iterables go through. A
    list is the fastest input (a protobuf repeated field is best sliced into one first).
    """
    try:
        ids = _IdArray("Q", block_ids)
    except OverflowError as exc:
        raise ProtocolError("block_id", f"outside [0, 2**63): {exc}") from None
    except TypeError as exc:
        raise ProtocolError("block_id", f"not an int: {exc}") from None
    _check_below_2_63(ids)
    return ids


# --------------------------------------------------------------------------------------
# Sliced encoding: bounded work per step, whatever the layout
# --------------------------------------------------------------------------------------

STEP_IDS = 1024
"""Ids one step of ``union_serialize_steps`` handles at most (extracted, added or encoded).

The slowest layout is one id per high word (a hot partition under Uniffle's block-id layout):
every id is then a bucket of its own, ~0.5-1 us of C (CRoaring's 64-bit tree) and ~2 us of
Python each, so a step stays below ~2-3 ms; with dense ids a step is ~5-15 us. A busy lane's
step is what another app's RPC waits for at each of its 4-5 loop turns (on top of the 1 ms
slice), so the bound counts about five times in a heartbeat's latency: measured in CPU time per
step (p99), 1024 against 2048 ids took a report of 400k ids 0.9 against 2.1 ms (distinct highs),
2.6 against 5.5 ms (equal highs), 0.5 against 1.0 ms (10-id partitions), their shuffle results
0.6-1.4 against 0.9-3.0 ms, for 0-20 % more CPU in all."""

_WHOLE_ARRAY_IDS = 1 << 22  # ``to_array`` in one C call (~3 ns an id) only up to this many ids
_WHOLE_ARRAY_CONTAINERS = 4096  # ... and this many containers (a sparse container costs ~0.3 us)
_LITTLE = sys.byteorder == "little"

# One bucket holding one id: high (BE), cookie 12346, 1 container, key, cardinality - 1 = 0,
# offset 16 (8 header + 4 key/cardinality + 4 offset bytes), the low 16 bits.
_SINGLETON = b"\0\0\0\0" + struct.pack("<IIHHI", _COOKIE_NO_RUN, 1, 0, 0, 16) + b"\0\0"
_SINGLETON_FIELDS = ((0, 7), (1, 6), (2, 5), (3, 4), (12, 2), (13, 3), (20, 0), (21, 1))
"""(byte of a singleton bucket, byte of the little-endian id it comes from)."""


def _u32_column(raw: bytes, n: int, first_byte: int) -> array[int]:
    """``array('I')`` of bytes ``first_byte .. first_byte + 3`` of each 8-byte little-endian id."""
    column = bytearray(4 * n)
    for j in range(4):
        column[j::4] = raw[first_byte + j :: 8]
    words = array("I")
    words.frombytes(column)
    if not _LITTLE:
        words.byteswap()
    return words


def _singleton_buckets(raw: bytes, n: int) -> bytes:
    """``n`` buckets of one id each, from the little-endian ids ``raw`` (one per high): C slicing only."""
    out = bytearray(_SINGLETON * n)
    size = len(_SINGLETON)
    for at, byte in _SINGLETON_FIELDS:
        out[at::size] = raw[byte::8]
    return bytes(out)


class _LegacyWriter:
    """LEGACY bytes of ascending, distinct ids given a chunk at a time (``feed``), then ``finish``.

    Equal to ``BlockIdSet.serialize()`` of the same ids (array and bitset containers, no run
    containers: what a set built from reports holds). Per chunk, the high and low words are cut
    out as columns with C-level slicing; a chunk within one high goes to the open bucket in one
    call, a chunk of one id per high is written by ``_singleton_buckets`` without a Python loop,
    and a mixed one costs ~2 us per high. The last bucket of a chunk stays open for the next.
    """

    __slots__ = ("_buckets", "_high", "_lows", "_parts")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._buckets = 0
        self._high = -1
        self._lows: BitMap | None = None

    def feed(self, ids: array[int]) -> None:
        """Add the ``array('Q')`` ``ids``: ascending, distinct, above every id fed before."""
        n = len(ids)
        if not n:
            return
        if _LITTLE:
            raw = ids.tobytes()
        else:
            swapped = array("Q", ids)
            swapped.byteswap()
            raw = swapped.tobytes()
        highs = _u32_column(raw, n, 4)
        lows = _u32_column(raw, n, 0)
        last = highs[-1]
        pos = 0
        if highs[0] == self._high:  # continues the open bucket
            assert self._lows is not None
            if last == self._high:
                self._lows.update(lows)
                return
            pos = bisect_right(highs, self._high)
            self._lows.update(lows[:pos])
        out: list[bytes] = []
        if self._lows is not None:
            out += (_BE_U32.pack(self._high), self._lows.serialize())
            self._buckets += 1
        tail = bisect_left(highs, last, pos)  # the last high's ids: the new open bucket
        if tail > pos:
            closed = tail - pos
            groups = BitMap(highs[pos:tail], optimize=False)
            if len(groups) == closed:
                out.append(_singleton_buckets(raw[8 * pos : 8 * tail], closed))
            else:
                i = pos
                for high in groups:
                    j = bisect_right(highs, high, i, tail)
                    out += (_BE_U32.pack(high), BitMap(lows[i:j], optimize=False).serialize())
                    i = j
            self._buckets += len(groups)
        self._high = last
        self._lows = BitMap(lows[tail:] if tail else lows, optimize=False)
        self._parts.append(b"".join(out))

    def finish(self) -> bytes:
        if self._lows is not None:
            self._parts.append(_BE_U32.pack(self._high) + self._lows.serialize())
            self._buckets += 1
            self._lows = None
        if not self._buckets:
            return _EMPTY_LEGACY
        self._parts.insert(0, _LEGACY_HEAD.pack(0, self._buckets))
        return b"".join(self._parts)


def _id_chunks(ids: BlockIdSet) -> Iterator[array[int]]:
    """The ids of the set, ascending, as ``array('Q')`` chunks of at most ``STEP_IDS``.

    Each ``next()`` costs O(``STEP_IDS``) whatever the layout. A set known to have few containers
    is listed with one ``to_array`` (cheap: its cost is per id, ~3 ns); any other is read through a
    fresh iterator from the last id on, so no iterator lives across steps.
    """
    bitmap = ids._bitmap
    if not bitmap:
        return
    if ids._containers <= _WHOLE_ARRAY_CONTAINERS and len(ids) <= _WHOLE_ARRAY_IDS:
        listed = bitmap.to_array()
        if len(listed) <= STEP_IDS:
            yield listed
            return
        for start in range(0, len(listed), STEP_IDS):
            yield listed[start : start + STEP_IDS]
        return
    start = 0
    while True:
        chunk = array("Q", islice(bitmap.iter_equal_or_larger(start), STEP_IDS))
        if chunk:
            yield chunk
        if len(chunk) < STEP_IDS:
            return
        start = chunk[-1] + 1


def release_steps(sets: dict[int, BlockIdSet] | BlockIdSetMap) -> Generator[None, None, None]:
    """Empty ``sets`` (popping its entries) in steps of at most ``STEP_IDS`` containers freed.

    Dropping a set frees all its containers in one C call: one 2M-id partition of one-id buckets
    took ~0.2 s, the 200k partitions of 10 ids of the tiny-partitions layout ~0.8 s for the dict.
    A set of many containers is emptied chunk by chunk (``remove_range`` of each chunk's span).
    """
    work = 0
    while sets:
        _, ids = sets.popitem()
        if ids._containers > STEP_IDS:
            bitmap = ids._bitmap
            for chunk in _id_chunks(ids):
                bitmap.remove_range(chunk[0], chunk[-1] + 1)
                yield
        work += min(ids._containers, STEP_IDS) + 16
        del ids
        if work >= STEP_IDS:
            work = 0
            yield


def union_serialize_steps(sets: Sequence[BlockIdSet]) -> Generator[None, None, bytes]:
    """LEGACY bytes of the union of ``sets`` (equal to ``serialize()`` of the union), in steps.

    A generator: each ``next()`` extracts, adds or encodes at most ``STEP_IDS`` ids (one id per
    high word is the costliest layout: ~5 ms a step), and the ``StopIteration`` value is the
    bytes. A caller that must stay responsive (an actor on the event loop) gives the loop a turn
    between steps; running it to the end in one go gives the plain result.

    Why not C unions and ``serialize``: CRoaring's 64-bit set is a tree of 2**16-value containers,
    and its unions, ``len``, ``serialize`` and ``to_array`` each walk every container in one call.
    With 2M ids of distinct high words (2M containers) one union took ~0.5 s, one serialize ~2.4 s
    plus ~10 s of re-framing in Python. Here the ids are read in bounded chunks (``_id_chunks``),
    several sets are merged by adding those chunks to a fresh set (``add_many``: per id, not per
    container), and ``_LegacyWriter`` encodes the chunks column-wise.

    The inputs are never modified, but they are read when their step comes: an id a set held
    when the call started is in the result; one added to it meanwhile may be too. The union of
    several sets is emptied chunk by chunk as it is encoded (``remove_range`` of each chunk's
    span): dropping it whole would free every container in one call (2M one-id containers, the
    tiny-partitions layout: ~0.8 s).
    """
    if len(sets) == 1:
        source = sets[0]
    else:
        union = BitMap64()
        containers = 0
        pending = array("Q")
        work = 0
        for ids in sets:
            work += 16  # a set's own overhead, in ids
            if ids:
                containers += ids._containers
                for chunk in _id_chunks(ids):
                    pending.extend(chunk)
                    work += len(chunk)
                    if len(pending) >= STEP_IDS:
                        union.update(pending)
                        pending = array("Q")
                    if work >= STEP_IDS:
                        work = 0
                        yield
            elif work >= STEP_IDS:
                work = 0
                yield
        union.update(pending)
        source = BlockIdSet._wrap(union, containers)
    own = len(sets) != 1  # a union made here (sets[0] may be a view made on access: no identity test)
    writer = _LegacyWriter()
    for chunk in _id_chunks(source):
        yield
        writer.feed(chunk)
        if own:  # the union is emptied as it is written: freeing it whole is one C call per container
            source._bitmap.remove_range(chunk[0], chunk[-1] + 1)
    yield  # joining the bytes (~10 ms for 44 MB) is a step of its own
    return writer.finish()
