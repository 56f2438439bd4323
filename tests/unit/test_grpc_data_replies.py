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
