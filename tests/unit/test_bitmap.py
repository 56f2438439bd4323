"""Roaring64NavigableMap LEGACY codec: hand-made golden bytes, a pure-Python reference
implementation of the format (independent of pyroaring), round trips and garbage input."""

from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riffle_actors.protocol.bitmap import (
    MAX_ID,
    BlockIdSet,
    TaskIdFilter,
    deserialize_block_ids,
    serialize_block_ids,
)
from riffle_actors.protocol.errors import ProtocolError


def h(text: str) -> bytes:
    """Hex laid out field by field: whitespace is ignored, ``#`` starts a comment."""
    return bytes.fromhex("".join(line.split("#")[0].replace(" ", "") for line in text.splitlines()))


# ---------------------------------------------------------------------------------------
# Hand-made vectors (written from spec §3, not produced by the encoder under test)
# ---------------------------------------------------------------------------------------

EMPTY = h("00 00000000")

# spec §3.3: {1, 2, 3}
ONE_TWO_THREE = h(
    """
    00 00000001
    00000000
      3a300000 01000000   # cookie 12346, 1 container
      0000 0200           # key 0, cardinality-1 = 2
      10000000            # offset 16
      0100 0200 0300
    """
)

# {1, 2^32 + 2, 0x7fffffff << 32 | 3}: three buckets, ascending unsigned high
THREE_BUCKETS = h(
    """
    00 00000003
    00000000 3a300000 01000000 0000 0000 10000000 0100
    00000001 3a300000 01000000 0000 0000 10000000 0200
    7fffffff 3a300000 01000000 0000 0000 10000000 0300
    """
)
THREE_BUCKETS_IDS = {1, (1 << 32) | 2, (0x7FFFFFFF << 32) | 3}

# Portable bitmap with cookie 12347 and ONE container (n < 4: no offset table): run [10..20]
RUN_10_20 = h(
    """
    3b300000            # cookie 12347, n-1 = 0
    01                  # run flags: container 0 is a run container
    0000 0a00           # key 0, cardinality-1 = 10
    0100 0a00 0a00      # 1 run: start 10, length-1 = 10
    """
)

# Cookie 12347 with FOUR containers: the offset table is present (n >= 4)
RUNS_WITH_OFFSETS = h(
    """
    3b300300            # cookie 12347, n-1 = 3
    05                  # run flags: containers 0 and 2 are runs
    0000 0a00  0100 0000  0200 6300  0300 0100     # keys 0..3, cardinality-1
    25000000 2b000000 2d000000 33000000            # offsets 37, 43, 45, 51
    0100 0a00 0a00      # key 0: run [10..20]
    0500                # key 1: array {5}
    0100 0000 6300      # key 2: run [0..99]
    0100 0200           # key 3: array {1, 2}
    """
)
RUNS_WITH_OFFSETS_LOWS = (
    set(range(10, 21)) | {65536 + 5} | set(range(131072, 131172)) | {196608 + 1, 196608 + 2}
)

# Both run bitmaps in one legacy map: the 55-byte bitmap must be sized from its header
# for the second bucket (high 3) to be found at all.
RUN_MAP = h("00 00000002 00000000") + RUNS_WITH_OFFSETS + h("00000003") + RUN_10_20
RUN_MAP_IDS = RUNS_WITH_OFFSETS_LOWS | {(3 << 32) | v for v in range(10, 21)}

# A bitset container: the 5000 even numbers 0..9998 in key 0 of high 5
EVENS_BITMAP = (
    h("3a300000 01000000 0000 8713 10000000")  # cardinality-1 = 4999 > 4095 -> 8 KiB bitset
    + b"\x55" * 1250  # bits 0, 2, 4, ... 9998
    + bytes(8192 - 1250)
)
EVENS_MAP = h("00 00000001 00000005") + EVENS_BITMAP
EVENS_IDS = {(5 << 32) | v for v in range(0, 10000, 2)}


# ---------------------------------------------------------------------------------------
# A pure-Python reference of the format (spec §3.1/§3.2), for property tests
# ---------------------------------------------------------------------------------------


def ref_decode(buf: bytes) -> set[int]:
    if not buf:
        return set()
    count = int.from_bytes(buf[1:5], "big", signed=True)
    pos, buckets = 5, {}
    for _ in range(count):
        high = int.from_bytes(buf[pos : pos + 4], "big")
        lows, pos = _ref_decode_portable(buf, pos + 4)
        buckets[high] = lows
    assert pos == len(buf)
    return {(high << 32) | low for high, lows in buckets.items() for low in lows}


def _ref_decode_portable(buf: bytes, pos: int) -> tuple[list[int], int]:
    def u16(p: int) -> int:
        return int.from_bytes(buf[p : p + 2], "little")

    cookie = int.from_bytes(buf[pos : pos + 4], "little")
    p = pos + 4
    if cookie == 12346:
        n = int.from_bytes(buf[p : p + 4], "little")
        p += 4
        is_run = [False] * n
        has_offsets = True
    else:
        assert cookie & 0xFFFF == 12347
        n = (cookie >> 16) + 1
        flags = buf[p : p + (n + 7) // 8]
        p += (n + 7) // 8
        is_run = [bool(flags[i // 8] >> (i % 8) & 1) for i in range(n)]
        has_offsets = n >= 4
    keys = [u16(p + 4 * i) for i in range(n)]
    cards = [u16(p + 4 * i + 2) + 1 for i in range(n)]
    p += 4 * n + (4 * n if has_offsets else 0)
    lows: list[int] = []
    for i in range(n):
        base = keys[i] << 16
        if is_run[i]:
            runs = u16(p)
            for r in range(runs):
                start, length_m1 = u16(p + 2 + 4 * r), u16(p + 4 + 4 * r)
                lows.extend(range(base + start, base + start + length_m1 + 1))
            p += 2 + 4 * runs
        elif cards[i] <= 4096:
            lows.extend(base + u16(p + 2 * j) for j in range(cards[i]))
            p += 2 * cards[i]
        else:
            words = int.from_bytes(buf[p : p + 8192], "little")
            lows.extend(base + b for b in range(65536) if words >> b & 1)
            p += 8192
    return lows, p


def ref_encode(ids: set[int]) -> bytes:
    """Java's output for a set: cookie 12346 (no run containers), buckets ascending."""
    buckets: dict[int, list[int]] = {}
    for v in sorted(ids):
        buckets.setdefault(v >> 32, []).append(v & 0xFFFFFFFF)
    out = bytearray(b"\x00") + len(buckets).to_bytes(4, "big")
    for high, lows in buckets.items():
        containers: dict[int, list[int]] = {}
        for low in lows:
            containers.setdefault(low >> 16, []).append(low & 0xFFFF)
        n = len(containers)
        header = bytearray((12346).to_bytes(4, "little") + n.to_bytes(4, "little"))
        bodies = []
        for key, values in containers.items():
            header += key.to_bytes(2, "little") + (len(values) - 1).to_bytes(2, "little")
            if len(values) <= 4096:
                bodies.append(b"".join(v.to_bytes(2, "little") for v in values))
            else:
                bodies.append(sum(1 << v for v in values).to_bytes(8192, "little"))
        offset = len(header) + 4 * n
        for body in bodies:
            header += offset.to_bytes(4, "little")
            offset += len(body)
        out += high.to_bytes(4, "big") + header + b"".join(bodies)
    return bytes(out)


def test_reference_codec_agrees_with_the_hand_made_vectors() -> None:
    assert ref_encode({1, 2, 3}) == ONE_TWO_THREE
    assert ref_encode(THREE_BUCKETS_IDS) == THREE_BUCKETS
    assert ref_encode(EVENS_IDS) == EVENS_MAP
    assert ref_decode(RUN_MAP) == RUN_MAP_IDS
    assert ref_encode(set()) == EMPTY


# ---------------------------------------------------------------------------------------
# Golden bytes
# ---------------------------------------------------------------------------------------


def test_empty_set_serializes_to_flag_and_zero_count() -> None:
    assert BlockIdSet().serialize() == EMPTY
    assert len(BlockIdSet.deserialize(EMPTY)) == 0


def test_zero_length_bytes_are_the_empty_set() -> None:
    assert len(BlockIdSet.deserialize(b"")) == 0
    assert len(deserialize_block_ids(memoryview(b""))) == 0


def test_one_two_three_matches_the_spec_vector() -> None:
    assert len(ONE_TWO_THREE) == 31
    assert BlockIdSet([3, 1, 2]).serialize() == ONE_TWO_THREE
    assert serialize_block_ids([1, 2, 3]) == ONE_TWO_THREE
    assert list(BlockIdSet.deserialize(ONE_TWO_THREE)) == [1, 2, 3]


def test_buckets_are_written_in_ascending_high_order() -> None:
    ids = BlockIdSet()
    for value in sorted(THREE_BUCKETS_IDS, reverse=True):
        ids.add(value)
    assert ids.serialize() == THREE_BUCKETS
    assert set(BlockIdSet.deserialize(THREE_BUCKETS)) == THREE_BUCKETS_IDS


def test_decoder_does_not_rely_on_bucket_order() -> None:
    descending = h(
        """
        00 00000002
        00000001 3a300000 01000000 0000 0000 10000000 0700
        00000000 3a300000 01000000 0000 0000 10000000 0500
        """
    )
    assert list(BlockIdSet.deserialize(descending)) == [5, (1 << 32) | 7]


def test_a_repeated_high_replaces_the_earlier_bucket_like_java_treemap_put() -> None:
    repeated = h(
        """
        00 00000002
        00000000 3a300000 01000000 0000 0000 10000000 0700
        00000000 3a300000 01000000 0000 0000 10000000 0500
        """
    )
    assert list(BlockIdSet.deserialize(repeated)) == [5]


def test_a_replaced_bucket_must_still_be_well_formed() -> None:
    # found by tests/fuzz (block_id_set, against its reference decoder): the bucket a repeated
    # high replaced never reached CRoaring, so its unsorted array container was accepted
    bad_then_good = h(
        """
        00 00000002
        00000000 3a300000 01000000 0000 0100 10000000 0200 0100   # array [2, 1]: not sorted
        00000000 3a300000 01000000 0000 0000 10000000 0500
        """
    )
    for decode in (BlockIdSet.deserialize, TaskIdFilter.from_bytes):
        with pytest.raises(ProtocolError) as info:
            decode(bad_then_good)
        assert info.value.field == "bitmap.bucket[0].containers"
    fuzzed = bytes.fromhex(  # the fuzzer's input: buckets with highs 0 (invalid), 0 and 2048
        "0000000003000000003a3000000200000000000100c0010100180000001c00000001000200000100"
        "00000000003a3000000200000000000100c0010100180000001c0000000100020001000200000008"
        "003a3000000200000000000100c0010100180000001c0000000100020001000200"
    )
    with pytest.raises(ProtocolError, match="not strictly increasing"):
        BlockIdSet.deserialize(fuzzed)


def test_a_nonzero_signed_longs_flag_is_accepted() -> None:
    assert list(BlockIdSet.deserialize(b"\x01" + ONE_TWO_THREE[1:])) == [1, 2, 3]


def test_run_container_with_cookie_12347_decodes() -> None:
    buf = h("00 00000001 00000002") + RUN_10_20
    assert list(BlockIdSet.deserialize(buf)) == [(2 << 32) | v for v in range(10, 21)]


def test_run_cookie_with_four_containers_has_an_offset_table() -> None:
    decoded = BlockIdSet.deserialize(RUN_MAP)
    assert set(decoded) == RUN_MAP_IDS
    assert len(decoded) == len(RUN_MAP_IDS)


def test_hand_made_bitset_container_decodes() -> None:
    decoded = BlockIdSet.deserialize(EVENS_MAP + b"")
    assert len(decoded) == 5000
    assert set(decoded) == EVENS_IDS


def test_bitset_container_round_trips_with_java_bytes() -> None:
    ids = BlockIdSet(sorted(EVENS_IDS))
    encoded = ids.serialize()
    assert encoded == EVENS_MAP
    assert BlockIdSet.deserialize(encoded) == ids


def test_bitset_bucket_followed_by_another_bucket_is_sized_from_its_header() -> None:
    buf = h("00 00000002 00000005") + EVENS_BITMAP + h("00000006") + RUN_10_20
    expected = EVENS_IDS | {(6 << 32) | v for v in range(10, 21)}
    assert set(BlockIdSet.deserialize(buf)) == expected


def test_empty_inner_bitmap_is_accepted() -> None:
    buf = h("00 00000002 00000004 3a300000 00000000") + ONE_TWO_THREE[5:]
    assert list(BlockIdSet.deserialize(buf)) == [1, 2, 3]


def test_decoder_accepts_bytearray_and_memoryview() -> None:
    assert set(BlockIdSet.deserialize(bytearray(THREE_BUCKETS))) == THREE_BUCKETS_IDS
    padded = memoryview(b"xx" + THREE_BUCKETS + b"yy")[2:-2]
    assert set(BlockIdSet.deserialize(padded)) == THREE_BUCKETS_IDS


def test_decoders_accept_a_strided_memoryview() -> None:
    # found by tests/fuzz (block_id_set, task_id_filter) on b"\0\0\0\0\0": a 1-D byte view with a
    # step skipped the copy and struct raised BufferError ("underlying buffer is not C-contiguous")
    interleaved = bytearray(2 * len(THREE_BUCKETS))
    interleaved[::2] = THREE_BUCKETS
    strided = memoryview(interleaved)[::2]
    assert not strided.c_contiguous
    assert set(BlockIdSet.deserialize(strided)) == THREE_BUCKETS_IDS
    task_filter = TaskIdFilter.from_bytes(strided)
    assert task_filter is not None and set(task_filter) == THREE_BUCKETS_IDS
    assert len(BlockIdSet.deserialize(memoryview(bytearray(10))[::2])) == 0
    with pytest.raises(ProtocolError):
        BlockIdSet.deserialize(memoryview(bytearray(12))[::2])


# ---------------------------------------------------------------------------------------
# Garbage and truncation
# ---------------------------------------------------------------------------------------

VALID_VECTORS = [EMPTY, ONE_TWO_THREE, THREE_BUCKETS, RUN_MAP]


@pytest.mark.parametrize("vector", VALID_VECTORS + [EVENS_MAP], ids=range(5))
def test_every_truncation_raises_protocol_error(vector: bytes) -> None:
    step = 1 if len(vector) < 1000 else 7
    for cut in range(1, len(vector), step):
        with pytest.raises(ProtocolError):
            BlockIdSet.deserialize(vector[:cut])
        with pytest.raises(ProtocolError):
            TaskIdFilter.from_bytes(vector[:cut])


def test_truncated_bucket_names_the_field() -> None:
    with pytest.raises(ProtocolError) as info:
        BlockIdSet.deserialize(ONE_TWO_THREE[:-1])
    assert info.value.field == "bitmap.bucket[0].containers"
    assert "requires" in str(info.value)


def test_wrong_cookie_raises_protocol_error() -> None:
    bad = ONE_TWO_THREE[:9] + h("3c300000") + ONE_TWO_THREE[13:]
    with pytest.raises(ProtocolError) as info:
        BlockIdSet.deserialize(bad)
    assert info.value.field == "bitmap.bucket[0].cookie"
    assert isinstance(info.value, ValueError)


def test_trailing_bytes_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="trailing"):
        BlockIdSet.deserialize(ONE_TWO_THREE + b"\x00")


@pytest.mark.parametrize(
    "buf, field",
    [
        (h("00 ffffffff"), "bitmap.bucket_count"),
        (h("00 7fffffff 00000000"), "bitmap.buckets"),
        (h("00 0000"), "bitmap.bucket_count"),
        (h("00 00000001 80000000 3a300000 00000000"), "bitmap.bucket[0].high"),
        (h("00 00000001 00000000 3a300000 01000100 0000"), "bitmap.bucket[0].container_count"),
    ],
)
def test_bad_headers_name_their_field(buf: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        BlockIdSet.deserialize(buf)
    assert info.value.field == field


def test_unsorted_array_container_is_rejected() -> None:
    bad = ONE_TWO_THREE[:-6] + h("0300 0200 0100")
    with pytest.raises(ProtocolError) as info:
        BlockIdSet.deserialize(bad)
    assert info.value.field == "bitmap.bucket[0].containers"
    multi = THREE_BUCKETS[:-2] + h("0300")  # still valid
    assert len(BlockIdSet.deserialize(multi)) == 3
    bad_second = h("00 00000002 00000000") + ONE_TWO_THREE[9:] + h("00000001") + bad[9:]
    with pytest.raises(ProtocolError) as info:
        BlockIdSet.deserialize(bad_second)
    assert info.value.field == "bitmap.bucket[1].containers"


def test_protocol_error_pickles_with_its_field() -> None:
    err = pickle.loads(pickle.dumps(ProtocolError("bitmap.cookie", "bad")))
    assert (err.field, err.detail, str(err)) == ("bitmap.cookie", "bad", "bitmap.cookie: bad")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=120))
def test_random_bytes_decode_or_raise_protocol_error(buf: bytes) -> None:
    for candidate in (buf, b"\x00" + buf, ONE_TWO_THREE[:5] + buf):
        try:
            decoded = BlockIdSet.deserialize(candidate)
        except ProtocolError:
            continue
        assert all(0 <= v <= MAX_ID for v in decoded)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(VALID_VECTORS[1:]),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=255),
)
def test_corrupted_vectors_decode_or_raise_protocol_error(vector: bytes, where: int, byte: int) -> None:
    pos = where % len(vector)
    corrupted = vector[:pos] + bytes([byte]) + vector[pos + 1 :]
    try:
        decoded = BlockIdSet.deserialize(corrupted)
    except ProtocolError:
        return
    assert set(decoded) == ref_decode(corrupted)


# ---------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------

SPARK = (21, 20, 22)


def _spark_block_id(seq: int, partition: int, task: int) -> int:
    _s, p, t = SPARK
    return (seq << (p + t)) | (partition << t) | task


any_ids = st.sets(st.integers(min_value=0, max_value=MAX_ID), max_size=200)
small_ids = st.sets(st.integers(min_value=0, max_value=300_000), max_size=3000)
block_ids = st.lists(
    st.builds(
        _spark_block_id,
        st.integers(0, 40),
        st.integers(0, (1 << 20) - 1),
        st.integers(0, (1 << 22) - 1),
    ),
    max_size=300,
).map(set)
few_highs = st.lists(
    st.tuples(st.sampled_from([0, 1, 7, 0x7FFFFFFF]), st.integers(0, 0xFFFFFFFF)), max_size=300
).map(lambda pairs: {(hi << 32) | lo for hi, lo in pairs})
id_sets = st.one_of(any_ids, small_ids, block_ids, few_highs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(id_sets)
def test_random_sets_round_trip_and_match_the_reference(ids: set[int]) -> None:
    block_set = BlockIdSet(list(ids))
    encoded = block_set.serialize()
    assert ref_decode(encoded) == ids
    assert encoded == ref_encode(ids)  # no run containers: byte-identical to Java's
    decoded = BlockIdSet.deserialize(encoded)
    assert decoded == block_set
    assert list(decoded) == sorted(ids)
    assert len(decoded) == len(ids)
    assert set(BlockIdSet.deserialize(ref_encode(ids))) == ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 3, 0x7FFFFFFF]),
            st.integers(0, 0xFFFFFFFF - 300_000),
            st.integers(1, 300_000),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_dense_ranges_with_run_containers_round_trip(ranges: list[tuple[int, int, int]]) -> None:
    ids = BlockIdSet()
    expected: set[int] = set()
    for high, start, length in ranges:
        lo = (high << 32) | start
        values = range(lo, lo + length)
        ids.update(values)  # CRoaring builds run containers from a range
        expected.update(values)
    encoded = ids.serialize()
    assert ref_decode(encoded) == expected
    assert BlockIdSet.deserialize(encoded) == ids


@settings(max_examples=100, deadline=None)
@given(id_sets, st.sets(st.integers(min_value=0, max_value=0xFFFFFFFF), max_size=50))
def test_task_id_filter_matches_set_membership(ids: set[int], probes: set[int]) -> None:
    task_filter = TaskIdFilter.from_bytes(serialize_block_ids(ids))
    assert task_filter is not None
    assert len(task_filter) == len(ids)
    for probe in probes | set(list(ids)[:50]) | {-1, 1 << 63, 1 << 64}:
        assert (probe in task_filter) == (probe in ids)


# ---------------------------------------------------------------------------------------
# BlockIdSet API
# ---------------------------------------------------------------------------------------


def test_update_accepts_lists_generators_ranges_and_sets() -> None:
    ids = BlockIdSet()
    ids.update([5, 1])
    ids.update(v for v in (9, 1 << 40))
    ids.update(range(100, 103))
    ids.update({7})
    ids.update(BlockIdSet([3]))
    assert list(ids) == [1, 3, 5, 7, 9, 100, 101, 102, 1 << 40]


def test_update_is_all_or_nothing_on_a_bad_id() -> None:
    ids = BlockIdSet([1])
    big = list(range(10, 100))  # past the small-batch path: one temporary bitmap
    for bad in ([2, -1, 3], [2, 1 << 63, 3], [2, "x"], [*big, -1], [*big, 1 << 63], [*big, "x"]):
        with pytest.raises(ProtocolError) as info:
            ids.update(bad)
        assert info.value.field == "block_id"
    assert list(ids) == [1]


def test_add_rejects_ids_outside_int64() -> None:
    ids = BlockIdSet()
    ids.add(MAX_ID)
    ids.add(0)
    for bad in (-1, MAX_ID + 1):
        with pytest.raises(ProtocolError):
            ids.add(bad)
    assert list(ids) == [0, MAX_ID]
    assert BlockIdSet.deserialize(ids.serialize()) == ids


def test_contains_is_false_for_values_no_set_can_hold() -> None:
    ids = BlockIdSet([1, 2 << 40])
    assert 1 in ids and (2 << 40) in ids
    assert 3 not in ids
    assert -1 not in ids
    assert (1 << 64) not in ids
    assert "1" not in ids


def test_union_update_and_discard_many() -> None:
    a = BlockIdSet([1, 2, 3])
    a.union_update(BlockIdSet([3, 4, 1 << 33]))
    a.union_update([5])
    assert list(a) == [1, 2, 3, 4, 5, 1 << 33]
    a.discard_many([2, 99, -5, 1 << 33])
    assert list(a) == [1, 3, 4, 5]
    a.discard_many(v for v in (1,))
    a.discard_many(BlockIdSet([3]))
    assert list(a) == [4, 5]
    # a bucket emptied by discards is not serialized
    b = BlockIdSet([1, 1 << 33])
    b.discard_many([1 << 33])
    assert b.serialize() == ref_encode({1})


def test_copy_is_independent() -> None:
    a = BlockIdSet([1, 2])
    b = a.copy()
    b.add(3)
    a.discard_many([1])
    assert list(a) == [2]
    assert list(b) == [1, 2, 3]


def test_iteration_is_ascending_and_a_snapshot() -> None:
    a = BlockIdSet([1 << 50, 7, 1 << 33, 0])
    seen = []
    for value in a:
        seen.append(value)
        a.add(value + 1)
    assert seen == [0, 7, 1 << 33, 1 << 50]


def test_block_id_set_pickles_via_the_wire_format() -> None:
    a = BlockIdSet([1, 1 << 40])
    assert pickle.loads(pickle.dumps(a)) == a
    assert a != BlockIdSet([1])
    assert (a == [1, 1 << 40]) is False
    assert "BlockIdSet" in repr(a) and "BlockIdSet" in repr(BlockIdSet(range(100)))


# ---------------------------------------------------------------------------------------
# TaskIdFilter
# ---------------------------------------------------------------------------------------


def test_task_id_filter_is_none_for_zero_length_bytes() -> None:
    assert TaskIdFilter.from_bytes(b"") is None
    assert TaskIdFilter.from_bytes(memoryview(b"")) is None


def test_task_id_filter_of_an_empty_map_matches_nothing() -> None:
    task_filter = TaskIdFilter.from_bytes(EMPTY)
    assert task_filter is not None
    assert 0 not in task_filter and len(task_filter) == 0


def test_task_id_filter_membership_in_one_and_many_buckets() -> None:
    low = TaskIdFilter.from_bytes(ONE_TWO_THREE)
    assert low is not None
    assert [v for v in (0, 1, 2, 3, 4, 1 << 32 | 1, -1) if v in low] == [1, 2, 3]
    many = TaskIdFilter.from_bytes(THREE_BUCKETS)
    assert many is not None
    assert all(v in many for v in THREE_BUCKETS_IDS)
    assert 2 not in many and -1 not in many and (1 << 64) not in many
    assert sorted(many) == sorted(THREE_BUCKETS_IDS)


def test_task_id_filter_rejects_garbage() -> None:
    with pytest.raises(ProtocolError):
        TaskIdFilter.from_bytes(ONE_TWO_THREE[:-1])
    with pytest.raises(ProtocolError):
        TaskIdFilter.from_bytes(ONE_TWO_THREE[:-6] + h("0300 0200 0100"))


def test_struct_layout_of_the_outer_header_is_big_endian() -> None:
    # guard against accidentally writing the CRoaring 64-bit portable header (LE u64)
    encoded = BlockIdSet([(0x01020304 << 32) | 9]).serialize()
    assert struct.unpack_from(">BiI", encoded) == (0, 1, 0x01020304)
