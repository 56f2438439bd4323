"""The Netty frame codec (riffle_actors.protocol.urpc) against hand-built frames and round trips (spec §6)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.protocol import urpc
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.records import Block, BlockBatch

T = urpc.MessageType


def hx(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", "").replace("|", ""))


def split(frame: bytes) -> tuple[urpc.FrameHeader, bytes]:
    h = urpc.decode_header(frame)
    assert len(frame) == urpc.HEADER_SIZE + h.frame_len
    return h, frame[urpc.HEADER_SIZE:]


# ---------------------------------------------------------------------------- the spec's worked frames (§6.6)
INDEX_REQUEST = hx("00000021 04 00000000 | 0000000000000001 00000005 6170705f31 00000000 00000003 00000001 0000000a")
RPC_SUCCESS = hx("00000010 00 00000000 | 0000000000000001 00000000 00000000")
MEMORY_REQUEST = hx("00000031 06 00000000 | 0000000000000002 00000005 6170705f31 00000000 00000003 "
                    "ffffffffffffffff 00e00000 0000018bcfe56800 ffffffff")


def test_worked_index_request_decodes_and_encodes_byte_exact() -> None:
    h, body = split(INDEX_REQUEST)
    assert (h.msg_len, h.type, h.body_len) == (0x21, 4, 0)
    assert urpc.decode_request(h.type, body, h.msg_len) == urpc.GetLocalShuffleIndex(1, "app_1", 0, 3, 1, 10)
    assert urpc.encode_get_local_index(1, "app_1", 0, 3, 1, 10) == INDEX_REQUEST


def test_worked_memory_request_without_filter() -> None:
    h, body = split(MEMORY_REQUEST)
    req = urpc.decode_request(h.type, body, h.msg_len)
    assert req == urpc.GetMemoryShuffleData(2, "app_1", 0, 3, -1, 14 << 20, 0x18BCFE56800, None)
    assert urpc.encode_get_memory_data(2, "app_1", 0, 3, -1, 14 << 20, 0x18BCFE56800) == MEMORY_REQUEST


def test_worked_rpc_response_and_v1_index_response() -> None:
    assert urpc.encode_rpc_response(1, 0, "") == RPC_SUCCESS
    index = bytes(range(40))
    head = urpc.encode_index_response(1, 0, "", 100, len(index))
    assert head == hx("00000018 0e 00000028 | 0000000000000001 00000000 00000000 0000000000000064")
    h, rest = split(head + index)
    r = urpc.decode_response(h.type, rest, h.msg_len)
    assert (r.request_id, r.status, r.data_file_len, bytes(r.body)) == (1, 0, 100, index)


def test_response_types_follow_the_request_types() -> None:
    assert urpc.RESPONSE_TYPE == {3: 0, 4: 14, 5: 15, 24: 15, 25: 15, 6: 16, 21: 22}


# ---------------------------------------------------------------------------- a send frame built by hand
def hand_built_send() -> bytes:
    """SendShuffleData as ShuffleServerGrpcNettyClient writes it: 1 partition, 2 blocks, 1 replica server each."""

    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack(">i", len(b)) + b

    server = s("10.0.0.1-19999-17000") + s("10.0.0.1") + struct.pack(">ii", 19999, 17000)
    msg = struct.pack(">q", 77) + s("app_1") + struct.pack(">iq", 2, 5) + struct.pack(">i", 1)
    msg += struct.pack(">ii", 9, 2)  # partition 9, two blocks
    for block_id, data in ((1001, b"hello"), (1002, b"")):
        msg += struct.pack(">iqiiqq", 9, block_id, len(data), 2, 0xFFFFFFFF, 4242)
        msg += struct.pack(">i", len(data)) + data
        msg += struct.pack(">i", 1) + server
        msg += struct.pack(">iq", 2 * len(data), 123456)  # uncompressLength, freeMemory
    msg += struct.pack(">q", 1_700_000_000_000)
    return struct.pack(">ibi", len(msg), 3, 0) + msg


def test_hand_built_send_decodes_with_blocks_as_slices_of_the_frame() -> None:
    frame = hand_built_send()
    h, body = split(frame)
    view = memoryview(body)
    req = urpc.decode_request(h.type, view, h.msg_len)
    assert (req.request_id, req.app_id, req.shuffle_id, req.require_buffer_id, req.timestamp) == (
        77, "app_1", 2, 5, 1_700_000_000_000)
    (batch,) = req.partitions
    pid, blocks = batch.partition_id, list(batch.blocks())
    assert pid == 9 and batch.data_bytes == 5
    assert [(b.block_id, b.length, b.uncompress_length, b.crc, b.task_attempt_id, bytes(b.data)) for b in blocks] == [
        (1001, 5, 10, 0xFFFFFFFF, 4242, b"hello"), (1002, 0, 0, 0xFFFFFFFF, 4242, b"")]
    assert isinstance(blocks[0].data, memoryview) and blocks[0].data.obj is body  # zero copy


def test_detach_partitions_gives_each_partition_a_buffer_of_its_own_so_the_frame_can_be_reused() -> None:
    frame = bytearray(b"aaaaBBBBBBcc")

    def batch(pid: int, *spans: tuple[int, int, int]) -> BlockBatch:
        return BlockBatch.of(pid, [Block(bid, end - start, end - start, 0, 7, memoryview(frame)[start:end])
                                   for bid, start, end in spans])

    one = (batch(3, (1, 0, 4)),)
    (alone,) = urpc.detach_partitions(one)
    assert alone.datas[0].obj is not frame  # even one partition is copied: the receive buffer is reused
    two = (batch(3, (1, 0, 4), (2, 10, 12)), batch(4, (3, 4, 10)))
    detached = urpc.detach_partitions(two)
    assert [(p.partition_id, [(b.block_id, bytes(b.data)) for b in p.blocks()]) for p in detached] == [
        (3, [(1, b"aaaa"), (2, b"cc")]), (4, [(3, b"BBBBBB")])]
    owners = [{id(d.obj) for d in p.datas} for p in detached]
    assert all(len(o) == 1 for o in owners) and owners[0] != owners[1]  # one buffer per partition
    assert [len(p.datas[0].obj) for p in detached] == [6, 6]  # each exactly its payload bytes
    assert all(d.obj is not frame for p in detached for d in p.datas)  # the frame is not pinned
    del one, two
    frame.append(0)  # no export of the frame is left (a bytearray with exports cannot be resized)
    frame[:] = b"x" * len(frame)  # the frame's memory may be reused: the blocks keep their bytes
    assert bytes(detached[1].datas[0]) == b"BBBBBB" and bytes(alone.datas[0]) == b"aaaa"


def test_our_send_encoder_matches_the_hand_built_layout_and_message_size() -> None:
    frame = hand_built_send()
    h, body = split(frame)
    req = urpc.decode_request(h.type, body, h.msg_len)
    again = urpc.encode_send_shuffle_data(77, "app_1", 2, 5, req.partitions, 1_700_000_000_000)
    h2, body2 = split(again)
    assert urpc.decode_request(h2.type, body2, h2.msg_len) == req
    # one replica server entry of our encoder is 4+15 + 4+9 + 8 bytes, the hand-built one 4+20 + 4+8 + 8
    assert h2.msg_len == h.msg_len - 2 * (5 - 1)
    assert urpc.send_message_size("app_1", req.partitions) == h2.msg_len


# ---------------------------------------------------------------------------- bad bytes
@pytest.mark.parametrize("header, field", [
    (struct.pack(">ibi", -1, 3, 0), "frame.msgLen"),
    (struct.pack(">ibi", 10, 3, -5), "frame.bodyLen"),
    (struct.pack(">ibi", 0, 3, 0), "frame"),
])
def test_bad_headers_raise_protocol_error(header: bytes, field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        urpc.decode_header(header)


def test_truncated_and_inconsistent_requests_raise_protocol_error_only() -> None:
    _, body = split(hand_built_send())
    fields = set()
    for cut in range(len(body)):
        with pytest.raises(ProtocolError) as err:
            urpc.decode_request(3, body[:cut], cut)
        assert err.value.field.startswith("send."), err.value  # a field of the send, whatever the cut
        fields.add(err.value.field)
    # each part of the last block is named when it is the one cut short (the replica server list included;
    # a cut before it fails the block count's check first, and its data is empty)
    for part in ("", ".serverCount", ".server[0].id", ".server[0].host", ".server[0].ports", ".uncompressLength"):
        assert "send.partition[0].block[1]" + part in fields, (part, sorted(fields))
    with pytest.raises(ProtocolError, match="frame.msgLen"):
        urpc.decode_request(3, body, len(body) + 1)
    with pytest.raises(ProtocolError, match="frame.type"):
        urpc.decode_request(7, body, len(body))


def test_huge_counts_are_refused_before_any_loop() -> None:
    msg = struct.pack(">q", 1) + struct.pack(">i", 1) + b"a" + struct.pack(">iqi", 0, 0, 2_000_000_000)
    with pytest.raises(ProtocolError, match="cannot fit"):
        urpc.decode_request(3, msg, len(msg))
    msg = struct.pack(">q", 1) + struct.pack(">i", 1) + b"a" + struct.pack(">iqi", 0, 0, -1)
    with pytest.raises(ProtocolError, match="negative"):
        urpc.decode_request(3, msg, len(msg))


def test_invalid_utf8_app_id_is_a_protocol_error() -> None:
    msg = struct.pack(">q", 1) + struct.pack(">i", 2) + b"\xff\xfe" + struct.pack(">iiii", 0, 0, 1, 1)
    with pytest.raises(ProtocolError, match="UTF-8"):
        urpc.decode_request(4, msg, len(msg))


def test_null_app_id_reads_as_empty() -> None:
    msg = struct.pack(">q", 1) + struct.pack(">i", -1) + struct.pack(">iiii", 0, 0, 1, 1)
    assert urpc.decode_request(4, msg, len(msg)).app_id == ""


# ---------------------------------------------------------------------------- round trips
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
app_ids = st.text(max_size=40)
blocks = st.builds(lambda bid, crc, task, unc, data: Block(bid, len(data), unc, crc, task, data),
                   i64, i64, i64, i32, st.binary(max_size=64))
partitions = st.lists(st.tuples(i32, st.lists(blocks, max_size=4).map(tuple)), max_size=4).map(tuple)


def roundtrip(frame: bytes):
    h, body = split(frame)
    return urpc.decode_request(h.type, body, h.msg_len)


def plain(req):
    if isinstance(req, urpc.SendShuffleData):
        return req._replace(partitions=tuple((p.partition_id, tuple(b._replace(data=bytes(b.data))
                                                                    for b in p.blocks()))
                                             for p in req.partitions))
    return req


@settings(max_examples=150, deadline=None)
@given(i64, app_ids, i32, i64, partitions, i64, st.integers(0, 3))
def test_send_round_trip(rid, app, shuffle, ticket, parts, ts, servers) -> None:
    req = roundtrip(urpc.encode_send_shuffle_data(rid, app, shuffle, ticket, parts, ts, servers=servers))
    assert plain(req) == urpc.SendShuffleData(rid, app, shuffle, ticket, parts, ts)


@settings(max_examples=150, deadline=None)
@given(i64, app_ids, i32, i32, i64, i32, i64, st.one_of(st.none(), st.binary(max_size=50)))
def test_memory_round_trip(rid, app, shuffle, part, last, rbs, ts, bitmap) -> None:
    req = roundtrip(urpc.encode_get_memory_data(rid, app, shuffle, part, last, rbs, ts, bitmap))
    assert req == urpc.GetMemoryShuffleData(rid, app, shuffle, part, last, rbs, ts, bitmap)


@settings(max_examples=150, deadline=None)
@given(i64, app_ids, i32, i32, i64, i32, st.one_of(st.none(), i32),
       st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=5)), i64)
def test_local_data_round_trip_v1_v2_v3(rid, app, shuffle, part, offset, length, sid, segs, task) -> None:
    frame = urpc.encode_get_local_data(rid, app, shuffle, part, offset, length, partition_num_per_range=1,
                                       partition_num=7, timestamp=5, storage_id=sid, next_segments=segs,
                                       task_attempt_id=task)
    req = roundtrip(frame)
    want = urpc.GetLocalShuffleData(rid, app, shuffle, part, 1, 7, offset, length, 5)
    if sid is not None:
        want = want._replace(storage_id=sid)
        assert frame[4] == (25 if segs is not None else 24)
        if segs is not None:
            want = want._replace(next_segments=tuple(segs), task_attempt_id=task)
    else:
        assert frame[4] == 5
    assert req == want


@settings(max_examples=100, deadline=None)
@given(i64, i32, st.text(max_size=30), st.lists(blocks, max_size=5), st.booleans())
def test_memory_and_index_responses_round_trip(rid, status, msg, bl, v2) -> None:
    head = urpc.encode_memory_response(rid, status, msg, bl)
    h, rest = split(head + b"".join(bytes(b.data) for b in bl))
    r = urpc.decode_response(h.type, rest, h.msg_len)
    assert (r.type, r.request_id, r.status, r.ret_msg) == (16, rid, status, msg)
    assert [(s[0], s[2], s[3], s[4], s[5]) for s in r.segments] == [
        (b.block_id, len(b.data), b.uncompress_length, b.crc, b.task_attempt_id) for b in bl]
    assert [bytes(r.body[s[1]:s[1] + s[2]]) for s in r.segments] == [bytes(b.data) for b in bl]
    ids = [3, 1] if v2 else None
    head = urpc.encode_index_response(rid, status, msg, 99, 80, ids)
    h, rest = split(head + bytes(80))
    r = urpc.decode_response(h.type, rest, h.msg_len)
    assert (r.type, r.data_file_len, r.storage_ids, len(r.body)) == (23 if v2 else 14, 99, tuple(ids or ()), 80)
