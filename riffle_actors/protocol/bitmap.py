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

For shuffles with millions of ids, two helpers keep the work bounded and cheap: ``id_array``
checks a batch of ids in C (``BlockIdSet.update`` then adds it with one ``add_many``), and
``union_serialize_steps`` unions many sets pairwise, one C call per step, so that a caller on
the event loop can pause between steps (``riffle_actors.state.app_state``).

Ids are non-negative Java longs, i.e. ``0 <= id < 2**63``; anything else is rejected
with ``ProtocolError`` (field ``block_id`` on input, ``bitmap.bucket[i].high`` on decode).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Generator, Iterable, Iterator, Sequence, Sized

from pyroaring import BitMap, BitMap64

from riffle_actors.protocol.errors import ProtocolError

__all__ = [
    "MAX_ID",
    "BlockIdSet",
    "TaskIdFilter",
    "deserialize_block_ids",
    "id_array",
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

    __slots__ = ("_bitmap",)

    def __init__(self, ids: Iterable[int] | None = None) -> None:
        self._bitmap = BitMap64()
        if ids is not None:
            self.update(ids)

    # -- mutation ---------------------------------------------------------------------

    def add(self, block_id: int) -> None:
        if not 0 <= block_id <= MAX_ID:
            raise ProtocolError("block_id", f"{block_id} is outside [0, 2**63)")
        self._bitmap.add(block_id)

    def update(self, block_ids: Iterable[int]) -> None:
        """Add every id; all-or-nothing: on a bad id nothing is added."""
        if isinstance(block_ids, BlockIdSet):
            self._bitmap |= block_ids._bitmap
            return
        if type(block_ids) is _IdArray:  # from id_array: checked already
            self._bitmap.update(block_ids)  # add_many: per id, not per container of this set
            return
        if type(block_ids) is array and block_ids.typecode == "Q":
            _check_below_2_63(block_ids)  # C integers: only the upper bound is left to check
            self._bitmap.update(block_ids)
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

    def update_and_count(self, block_ids: Iterable[int]) -> int:
        """``update``, returning how many of the ids were not in the set yet."""
        before = len(self._bitmap)
        self.update(block_ids)
        return len(self._bitmap) - before

    def union_update(self, other: BlockIdSet | Iterable[int]) -> None:
        if isinstance(other, BlockIdSet):
            self._bitmap |= other._bitmap
        else:
            self.update(other)

    def discard_many(self, block_ids: Iterable[int]) -> None:
        """Remove the ids that are present; absent or out-of-range ids are ignored."""
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
        clone = BlockIdSet.__new__(BlockIdSet)
        clone._bitmap = self._bitmap.copy()
        return clone

    # -- queries ----------------------------------------------------------------------

    def __contains__(self, block_id: object) -> bool:
        try:
            return block_id in self._bitmap  # type: ignore[operator]
        except (OverflowError, TypeError):  # negative, >= 2**64 or not an int
            return False

    def __len__(self) -> int:
        return len(self._bitmap)

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
        n = len(self._bitmap)
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
        result = cls.__new__(cls)
        mv = _byte_view(buf)
        if not len(mv):
            result._bitmap = BitMap64()
            return result
        result._bitmap = _bitmap64_from_buckets(mv, _parse_legacy(mv))
        return result


class TaskIdFilter:
    """Membership test for ``serializedExpectedTaskIdsBitmap`` (task attempt ids).

    Built by ``from_bytes``. When every id is below 2**32 (always, in practice) it holds
    a 32-bit ``BitMap``, whose lookup is the cheapest; ids outside the stored range are
    simply not members.
    """

    __slots__ = ("_bitmap",)

    def __init__(self, bitmap: BitMap | BitMap64) -> None:
        self._bitmap = bitmap

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
        return cls(_bitmap64_from_buckets(mv, buckets))

    def __contains__(self, task_attempt_id: object) -> bool:
        try:
            return task_attempt_id in self._bitmap  # type: ignore[operator]
        except (OverflowError, TypeError):  # out of the stored range, or not an int
            return False

    def __len__(self) -> int:
        return len(self._bitmap)

    def __iter__(self) -> Iterator[int]:
        return iter(self._bitmap.to_array())

    def __repr__(self) -> str:
        return f"TaskIdFilter(<{len(self._bitmap)} task attempt ids>)"


def serialize_block_ids(block_ids: Iterable[int]) -> bytes:
    """LEGACY bytes of any iterable of ids (or of a ``BlockIdSet``)."""
    if isinstance(block_ids, BlockIdSet):
        return block_ids.serialize()
    return BlockIdSet(block_ids).serialize()


def deserialize_block_ids(buf: Buffer) -> BlockIdSet:
    """Parse LEGACY bytes (zero-length = empty set) into a ``BlockIdSet``."""
    return BlockIdSet.deserialize(buf)


class _IdArray(array):
    """An ``array('Q')`` made by ``id_array``: every id is known to be below 2**63."""

    __slots__ = ()


def _check_below_2_63(ids: array) -> None:
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


def id_array(block_ids: Iterable[int]) -> array:
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


def union_serialize_steps(sets: Sequence[BlockIdSet]) -> Generator[None, None, bytes]:
    """LEGACY bytes of the union of ``sets``, computed one C call per step.

    A generator: each ``next()`` does one pairwise union (the last one serializes), and the
    ``StopIteration`` value is the bytes. A caller that must stay responsive (an actor on the
    event loop) gives the loop a turn between steps; running it to the end in one go gives the
    plain result.

    Why pairwise: folding the sets one by one into an accumulator (``acc |= s``) costs
    O(containers of acc) per set, because CRoaring's 64-bit in-place OR walks both operands.
    20000 partitions of 100 ids took ~5 s that way. Merging as a balanced tree touches each
    container once per level: O(total · log n), and the biggest step is the union of the two
    halves. The bytes are the same as the fold's: a union of array and bitset containers is
    canonical (array up to 4096 values, bitset above), and reports build no run containers.

    The inputs are never modified, but they are read when their step comes: an id a set held
    when the call started is in the result; one added to it meanwhile may be too.
    """
    level = [s._bitmap for s in sets]
    while len(level) > 1:
        paired = []
        for i in range(1, len(level), 2):
            paired.append(level[i - 1] | level[i])
            yield
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    if not level:
        return _EMPTY_LEGACY
    yield  # serializing the result is a step of its own
    result = BlockIdSet.__new__(BlockIdSet)
    result._bitmap = level[0]  # possibly one of the inputs: only read here
    return result.serialize()
