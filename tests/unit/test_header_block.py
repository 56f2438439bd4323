"""``protocol.header_block.HeaderDecoder`` decodes what ``hpack.Decoder`` decodes, and refuses what it refuses.

Properties, each over sequences of blocks on one connection (so the dynamic table carries state):
header lists encoded by ``hpack.Encoder`` (Huffman or not, never-indexed fields, table size changes
that emit size updates, entries larger than the table) decode to the same lists as ``hpack.Decoder``
gives; arbitrary and damaged bytes either decode alike in both or are refused by both. Bounds: a
size update above the table size we announced, a header list above the limit, indexes out of range.
"""

from __future__ import annotations

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riffle_actors.protocol.header_block import HeaderBlockError, HeaderDecoder, HeaderListTooLarge

names = st.sampled_from([b":path", b":method", b"content-type", b"grpc-timeout", b"user-agent", b"te",
                         b"authorization", b"x-custom"]) | st.binary(min_size=1, max_size=20).map(bytes.lower)
values = st.binary(max_size=60) | st.sampled_from([b"POST", b"application/grpc", b"trailers", b"59999m"])
header = st.tuples(names, values, st.booleans())  # (name, value, sensitive)
blocks = st.lists(st.tuples(st.lists(header, max_size=8), st.booleans(), st.sampled_from([None, 0, 100, 4096])),
                  min_size=1, max_size=6)


def _encode(encoder: hpack.Encoder, fields, huffman: bool) -> bytes:
    return encoder.encode([hpack.NeverIndexedHeaderTuple(n, v) if s else (n, v) for n, v, s in fields],
                          huffman=huffman)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks)
def test_what_hpack_encodes_decodes_alike(sequence) -> None:
    encoder, theirs, ours = hpack.Encoder(), hpack.Decoder(), HeaderDecoder()
    for fields, huffman, table_size in sequence:
        if table_size is not None:
            encoder.header_table_size = table_size  # the next block starts with a size update
        block = _encode(encoder, fields, huffman)
        assert ours.decode(block) == [(bytes(n), bytes(v)) for n, v in theirs.decode(block, raw=True)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks, st.data())
def test_damaged_blocks_are_decoded_alike_or_refused_by_both(sequence, data) -> None:
    encoder, theirs, ours = hpack.Encoder(), hpack.Decoder(), HeaderDecoder()
    for fields, huffman, _ in sequence:
        block = bytearray(_encode(encoder, fields, huffman))
        if block and data.draw(st.booleans()):
            block[data.draw(st.integers(0, len(block) - 1))] = data.draw(st.integers(0, 255))
            block = block[:data.draw(st.integers(0, len(block)))]
        try:
            expected = [(bytes(n), bytes(v)) for n, v in theirs.decode(bytes(block), raw=True)]
        except (hpack.HPACKError, ValueError, IndexError):
            with pytest.raises(HeaderBlockError):
                ours.decode(bytes(block))
            return  # the connection would end here (COMPRESSION_ERROR)
        assert ours.decode(bytes(block)) == expected


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=4))
def test_arbitrary_bytes_are_decoded_alike_or_refused_by_both(raw_blocks) -> None:
    theirs, ours = hpack.Decoder(), HeaderDecoder()
    for block in raw_blocks:
        try:
            expected = [(bytes(n), bytes(v)) for n, v in theirs.decode(block, raw=True)]
        except (hpack.HPACKError, ValueError, IndexError):
            with pytest.raises(HeaderBlockError):
                ours.decode(block)
            return
        assert ours.decode(block) == expected


def test_bounds() -> None:
    ours = HeaderDecoder(max_table_size=4096, max_header_list_size=200)
    with pytest.raises(HeaderBlockError, match="above the 4096"):
        ours.decode(b"\x3f\xe2\x1f")  # a size update to 4097 (5-bit prefix: 31 + 4066)
    with pytest.raises(HeaderBlockError, match="index 0"):
        HeaderDecoder().decode(b"\x80")
    with pytest.raises(HeaderBlockError, match="out of range"):
        HeaderDecoder().decode(b"\xbe")  # index 62: the dynamic table is empty
    big = hpack.Encoder().encode([(b"x-a", b"v" * 100), (b"x-b", b"v" * 100)])
    with pytest.raises(HeaderListTooLarge):
        ours.decode(big)
    with pytest.raises(HeaderBlockError, match="above 2\\^32"):
        HeaderDecoder().decode(b"\xff" + b"\xff" * 5 + b"\x01")
