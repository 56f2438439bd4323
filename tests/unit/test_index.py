"""40-byte index record codec: the spec §5.2 golden vector, offsets, torn tails."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.index import (
    INDEX_RECORD_SIZE,
    IndexEntry,
    build_index,
    decode_index,
    encode_index,
)
from riffle_actors.records import Block

# spec §5.2: offset 0, length 100, uncompress 200, crc 0x12345678,
# blockId 0x0000140000c00009 (seq 5, partition 3, task 9 in layout 21/20/22), task 9
SPEC_RECORD = bytes.fromhex(
    "0000000000000000"  # offset
    "00000064"  # length 100
    "000000c8"  # uncompressLength 200
    "0000000012345678"  # crc
    "0000140000c00009"  # blockId
    "0000000000000009"  # taskAttemptId
)
SPEC_ENTRY = IndexEntry(0, 100, 200, 0x12345678, 0x0000140000C00009, 9)


def test_record_size_is_40() -> None:
    assert INDEX_RECORD_SIZE == 40 == len(SPEC_RECORD)


def test_spec_vector_encodes_and_decodes() -> None:
    assert encode_index([SPEC_ENTRY]) == SPEC_RECORD
    assert encode_index([tuple(SPEC_ENTRY)]) == SPEC_RECORD
    assert decode_index(SPEC_RECORD) == [SPEC_ENTRY]
    decoded = decode_index(SPEC_RECORD)[0]
    assert isinstance(decoded, IndexEntry)
    assert decoded.block_id == 0x0000140000C00009 and decoded.crc == 0x12345678


def test_build_index_of_the_spec_block() -> None:
    block = Block(0x0000140000C00009, 100, 200, 0x12345678, 9, b"x" * 100)
    records, data_len = build_index([block], 0)
    assert records == SPEC_RECORD
    assert data_len == 100


def test_offsets_accumulate_from_the_start_offset() -> None:
    blocks = [
        Block(block_id=i, length=n, uncompress_length=2 * n, crc=i, task_attempt_id=7, data=b"a" * n)
        for i, n in enumerate([10, 0, 33, 5])
    ]
    records, data_len = build_index(blocks, 1000)
    assert data_len == 48
    entries = decode_index(records)
    assert [e.offset for e in entries] == [1000, 1010, 1010, 1043]
    assert [e.length for e in entries] == [10, 0, 33, 5]
    assert [e.uncompress_length for e in entries] == [20, 0, 66, 10]
    assert [e.block_id for e in entries] == [0, 1, 2, 3]
    assert all(e.task_attempt_id == 7 for e in entries)


def test_build_index_takes_lengths_from_the_data_actually_written() -> None:
    # the index must agree with the data file even if a block's declared length lies
    block = Block(1, 999, 5, 0, 2, b"abc")
    records, data_len = build_index([block], 0)
    assert data_len == 3
    assert decode_index(records)[0].length == 3


def test_build_index_accepts_any_object_with_the_block_attributes() -> None:
    class Spilled:
        def __init__(self, data: bytes) -> None:
            self.block_id, self.length, self.uncompress_length = 4, len(data), 8
            self.crc, self.task_attempt_id, self.data = 0xFFFFFFFF, 3, memoryview(data)

    records, data_len = build_index([Spilled(b"1234"), Spilled(b"56")], 5)
    assert data_len == 6
    assert decode_index(records) == [
        IndexEntry(5, 4, 8, 0xFFFFFFFF, 4, 3),
        IndexEntry(9, 2, 8, 0xFFFFFFFF, 4, 3),
    ]


def test_empty_inputs() -> None:
    assert build_index([], 123) == (b"", 0)
    assert encode_index([]) == b""
    assert decode_index(b"") == []


@pytest.mark.parametrize("tail", range(1, 40))
def test_a_torn_tail_is_truncated_to_whole_records(tail: int) -> None:
    two = SPEC_RECORD + encode_index([SPEC_ENTRY._replace(offset=100)])
    assert decode_index(two + two[:tail]) == [SPEC_ENTRY, SPEC_ENTRY._replace(offset=100)]
    assert decode_index(SPEC_RECORD[:tail]) == []


def test_decode_accepts_memoryview_and_bytearray() -> None:
    assert decode_index(bytearray(SPEC_RECORD)) == [SPEC_ENTRY]
    assert decode_index(memoryview(b"zz" + SPEC_RECORD)[2:]) == [SPEC_ENTRY]


def test_decode_accepts_a_strided_memoryview() -> None:
    # found by tests/fuzz (decode_index) on the spec record: a view with a step raised BufferError
    interleaved = bytearray(2 * (len(SPEC_RECORD) + 3))
    interleaved[::2] = SPEC_RECORD + b"abc"
    strided = memoryview(interleaved)[::2]
    assert not strided.c_contiguous
    assert decode_index(strided) == [SPEC_ENTRY]


def test_values_that_do_not_fit_name_the_record_and_field() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_index([SPEC_ENTRY, SPEC_ENTRY._replace(uncompress_length=1 << 31)])
    assert info.value.field == "index[1].uncompress_length"
    with pytest.raises(ProtocolError) as info:
        build_index([Block(1 << 63, 1, 1, 0, 0, b"x")], 0)
    assert info.value.field == "index[0].block_id"
    with pytest.raises(ProtocolError):
        encode_index([(1, 2, 3)])


def test_large_batches_pack_in_one_go() -> None:
    entries = [IndexEntry(i * 10, 10, 20, i, i << 22, i) for i in range(5000)]
    assert decode_index(encode_index(entries)) == entries
    assert decode_index(encode_index(iter(entries[:3]))) == entries[:3]


int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
int32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
entries_st = st.lists(st.builds(IndexEntry, int64, int32, int32, int64, int64, int64), max_size=80)


@settings(max_examples=200, deadline=None)
@given(entries_st)
def test_encode_decode_round_trip(entries: list[IndexEntry]) -> None:
    encoded = encode_index(entries)
    assert len(encoded) == 40 * len(entries)
    assert decode_index(encoded) == entries


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=50), st.integers(min_value=0, max_value=1 << 40))
def test_build_index_offsets_tile_the_data(payloads: list[bytes], start: int) -> None:
    blocks = [Block(i, len(p), len(p) * 2, 0, 1, p) for i, p in enumerate(payloads)]
    records, data_len = build_index(blocks, start)
    data = b"".join(payloads)
    assert data_len == len(data)
    position = start
    for entry, payload in zip(decode_index(records), payloads, strict=True):
        assert entry.offset == position
        assert data[entry.offset - start : entry.offset - start + entry.length] == payload
        position += entry.length


def test_shift_offsets_moves_only_the_offset_field_of_every_record() -> None:
    from riffle_actors.protocol.index import decode_index, encode_index, shift_offsets

    entries = [(i * 100, 100, 120, 2**40 + i, 7 << 33 | i, 3) for i in range(1000)]
    raw = encode_index(entries)
    shifted = decode_index(shift_offsets(raw + b"\x01\x02", 1 << 35))  # a torn tail is dropped
    assert shifted == [(o + (1 << 35), *rest) for o, *rest in entries]
    assert shift_offsets(raw, 0) == raw
