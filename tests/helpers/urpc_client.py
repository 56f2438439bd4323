"""A Uniffle ``GRPC_NETTY`` client for tests: control over gRPC, data over the urpc port (spec §6).

- ``UrpcConnection``: one TCP connection speaking Netty frames. Requests are pipelined (several in
  flight at once) and replies are matched by ``requestId``; ``request(frame)`` returns the decoded
  ``Response``, ``send_raw(bytes)`` writes anything (garbage for error-path tests), ``closed``
  says whether the server hung up.
- ``UrpcStub``: the four data RPCs with the gRPC stub's signatures (protobuf request in, protobuf
  response out) translated to frames, so ``UniffleClient``'s writer and reader logic (retries,
  index segmentation, crc checks) runs unchanged over urpc.
- ``UrpcClient``: a ``UniffleClient`` whose data RPCs go over urpc and whose requireBuffer size
  includes the send's message size, as ``ShuffleServerGrpcNettyClient`` does (spec §2.2).

See also: ``tests.helpers.client``, ``riffle_actors.protocol.urpc``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from riffle_actors.protocol import urpc
from riffle_actors.protocol.proto import uniffle_pb2
from riffle_actors.records import Block
from tests.helpers.client import BlockSpec, UniffleClient, require_size


class UrpcConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.pending: dict[int, asyncio.Future] = {}
        self.unmatched: list[urpc.Response] = []  # replies whose requestId nobody waits for
        self.closed = asyncio.Event()
        self._ids = itertools.count(1)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, host: str, port: int) -> UrpcConnection:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    def next_id(self) -> int:
        return next(self._ids)

    async def _read_loop(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(urpc.HEADER_SIZE)
                h = urpc.decode_header(head)
                frame = await self.reader.readexactly(h.frame_len)
                resp = urpc.decode_response(h.type, frame, h.msg_len)
                fut = self.pending.pop(resp.request_id, None)
                if fut is None or fut.done():
                    self.unmatched.append(resp)
                else:
                    fut.set_result(resp)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("urpc connection closed by the server"))
            self.pending.clear()

    async def request(self, frame: bytes, request_id: int, timeout: float = 30.0) -> urpc.Response:
        fut = asyncio.get_running_loop().create_future()
        self.pending[request_id] = fut
        self.writer.write(frame)
        await self.writer.drain()
        return await asyncio.wait_for(fut, timeout)

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


def _blocks_of(request: Any) -> list[tuple[int, list[Block]]]:
    return [(sd.partitionId, [Block(b.blockId, b.length, b.uncompressLength, b.crc, b.taskAttemptId, b.data)
                              for b in sd.block]) for sd in request.shuffleData]


class UrpcStub:
    """gRPC-stub-shaped access to the urpc data RPCs (requests and responses are protobuf objects)."""

    def __init__(self, grpc_stub: Any, conn: UrpcConnection, pb: Any = uniffle_pb2):
        self.grpc = grpc_stub
        self.conn = conn
        self.pb = pb
        self.index_types: list[int] = []  # response types of index replies (14 or 23)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grpc, name)  # control RPCs stay on gRPC

    async def sendShuffleData(self, request: Any) -> Any:
        rid = self.conn.next_id()
        frame = urpc.encode_send_shuffle_data(rid, request.appId, request.shuffleId, request.requireBufferId,
                                              _blocks_of(request), 0)
        r = await self.conn.request(frame, rid)
        assert r.type == urpc.MessageType.RPC_RESPONSE, r.type
        return self.pb.SendShuffleDataResponse(status=r.status, retMsg=r.ret_msg)

    async def getMemoryShuffleData(self, request: Any) -> Any:
        rid = self.conn.next_id()
        bitmap = request.serializedExpectedTaskIdsBitmap if request.serializedExpectedTaskIdsBitmap else None
        frame = urpc.encode_get_memory_data(rid, request.appId, request.shuffleId, request.partitionId,
                                            request.lastBlockId, request.readBufferSize, 0, bitmap)
        r = await self.conn.request(frame, rid)
        assert r.type == urpc.MessageType.GET_MEMORY_SHUFFLE_DATA_RESPONSE, r.type
        segs = [self.pb.ShuffleDataBlockSegment(blockId=s[0], offset=s[1], length=s[2], uncompressLength=s[3],
                                                crc=s[4], taskAttemptId=s[5]) for s in r.segments]
        return self.pb.GetMemoryShuffleDataResponse(status=r.status, retMsg=r.ret_msg, data=bytes(r.body),
                                                    shuffleDataBlockSegments=segs)

    async def getLocalShuffleIndex(self, request: Any) -> Any:
        rid = self.conn.next_id()
        frame = urpc.encode_get_local_index(rid, request.appId, request.shuffleId, request.partitionId,
                                            request.partitionNumPerRange, request.partitionNum)
        r = await self.conn.request(frame, rid)
        self.index_types.append(r.type)
        assert r.type in (urpc.MessageType.GET_LOCAL_SHUFFLE_INDEX_RESPONSE,
                          urpc.MessageType.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE), r.type
        return self.pb.GetLocalShuffleIndexResponse(status=r.status, retMsg=r.ret_msg, indexData=bytes(r.body),
                                                    dataFileLen=r.data_file_len, storageIds=list(r.storage_ids))

    async def getLocalShuffleData(self, request: Any) -> Any:
        rid = self.conn.next_id()
        sid = request.storageId
        frame = urpc.encode_get_local_data(rid, request.appId, request.shuffleId, request.partitionId,
                                           request.offset, request.length,
                                           partition_num_per_range=request.partitionNumPerRange,
                                           partition_num=request.partitionNum,
                                           storage_id=None if sid < 0 else sid)
        r = await self.conn.request(frame, rid)
        assert r.type == urpc.MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE, r.type
        return self.pb.GetLocalShuffleDataResponse(status=r.status, retMsg=r.ret_msg, data=bytes(r.body))


class UrpcClient(UniffleClient):
    """``UniffleClient`` with data over urpc (``GRPC_NETTY``); ``await connect()`` before use."""

    def __init__(self, target: str, urpc_port: int, **kw: Any):
        super().__init__(target, **kw)
        self.urpc_host = target.rpartition(":")[0]
        self.urpc_port = urpc_port
        self.conn: UrpcConnection | None = None

    async def connect(self) -> UrpcClient:
        self.conn = await UrpcConnection.open(self.urpc_host, self.urpc_port)
        self.stub = UrpcStub(self.stub, self.conn, self.pb)
        return self

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        await super().close()

    def send_require_size(self, app_id: str, shuffle_id: int, blocks: Sequence[BlockSpec]) -> int:
        by_partition: dict[int, list[Block]] = {}
        for b in blocks:
            by_partition.setdefault(b.partition_id, []).append(
                Block(b.block_id, len(b.data), b.uncompress_length, b.crc, b.task_attempt_id, b.data))
        return require_size(blocks) + urpc.send_message_size(app_id, list(by_partition.items()))
