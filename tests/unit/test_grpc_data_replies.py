"""The hand-serialized gRPC data replies decode to exactly the messages protobuf would build."""

from __future__ import annotations

import os

import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.transport.grpc_server import _serialize, _with_data


@pytest.mark.parametrize("sizes", [[1], [0, 5], [127, 128, 16383, 16384], [3 << 20, 1], []])
def test_memory_reply_with_raw_data_equals_the_protobuf_message(sizes):
    parts = [os.urandom(n) for n in sizes]
    parts = [memoryview(p) if i % 2 else p for i, p in enumerate(parts)]  # urpc-received blocks are views
    segments = [pb.ShuffleDataBlockSegment(blockId=i, offset=0, length=len(p), crc=-1, taskAttemptId=3)
                for i, p in enumerate(parts)]
    head = pb.GetMemoryShuffleDataResponse(status=0, retMsg="", shuffleDataBlockSegments=segments)
    wire = _serialize(_with_data(head, 2, parts))
    expected = pb.GetMemoryShuffleDataResponse(status=0, retMsg="", shuffleDataBlockSegments=segments,
                                               data=b"".join(bytes(p) for p in parts))
    assert pb.GetMemoryShuffleDataResponse.FromString(wire) == expected


def test_local_reply_with_raw_data_and_an_error_reply():
    data = os.urandom(200_000)
    wire = _serialize(_with_data(pb.GetLocalShuffleDataResponse(status=0, retMsg=""), 1, [data]))
    assert pb.GetLocalShuffleDataResponse.FromString(wire) == pb.GetLocalShuffleDataResponse(data=data)
    err = pb.GetLocalShuffleDataResponse(status=6, retMsg="no such app")
    assert _serialize(err) == err.SerializeToString()


@pytest.mark.parametrize("size", [100, 3 << 20])
def test_a_large_bitmap_reply_is_joined_off_the_loop(monkeypatch, size):
    """The join of a large getShuffleResult* reply (a 44 MB bitmap held the loop 70-80 ms) runs in the
    loop's executor, where ``bytes.join`` holds no GIL; a small one stays on the loop. Same bytes."""
    import asyncio
    import threading

    from riffle_actors.transport import grpc_server

    joined_in: list[int] = []
    real = grpc_server._with_data

    def recording(head, field, parts):
        joined_in.append(threading.get_ident())
        return real(head, field, parts)

    monkeypatch.setattr(grpc_server, "_with_data", recording)
    bitmap = os.urandom(size)

    async def reply():
        return threading.get_ident(), await grpc_server._bitmap_reply(
            grpc_server._BitmapReply(0, "", bitmap), pb.GetShuffleResultForMultiPartResponse)

    loop_thread, message = asyncio.run(reply())
    assert pb.GetShuffleResultForMultiPartResponse.FromString(_serialize(message)).serializedBitmap == bitmap
    assert len(joined_in) == 1
    assert (joined_in[0] != loop_thread) == (size >= grpc_server._JOIN_OFF_LOOP_BYTES)
