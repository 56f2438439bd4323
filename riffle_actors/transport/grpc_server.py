"""The gRPC adapter of ``rss.common.ShuffleServer``: decode, call ShuffleService, encode.

Thin on purpose: no status decisions live here; an exception becomes ``(status, retMsg)`` in
``transport.rpc_answer`` (the wrapper all three RPC adapters share, over ``errors.to_status``). Every handler answers with its typed response
and a status code; an unexpected exception becomes INTERNAL_ERROR with the reason and is
logged, so one bad request never takes the server down. Requests are limited to
``grpc_max_message_size`` (64 MiB by default; gRPC refuses a larger one from its length prefix,
before buffering it); replies may be up to 1 GiB (spec §1.1).

A send is handed over as one ``records.BlockBatch`` per partition (its ``Block`` records made in one
pass over the repeated field); block payloads stay the ``bytes`` objects protobuf produced, never a
copy of the data.

Data replies (getLocalShuffleData, getMemoryShuffleData) are serialized by hand: the message
without its ``data`` field is serialized by protobuf and the ``data`` field is appended as raw
bytes in the same ``join`` that gathers the block payloads (protobuf readers accept fields in any
order), so the payload is copied once instead of into the message, again into its serialized
form (and, for memory reads, a third time by a join). On 14 MiB replies this saves about 1-2 s of
CPU per GB read (``scripts/bench_ingest.py``; figures in docs/performance.md).

Read replies are bounded (``riffle_actors.transport.reply_budget``): a read reserves its expected
reply size in its connection's budget (``grpc_max_reply_bytes_per_connection``) and the server's
(``max_reply_bytes``, shared with urpc) before it reads, waits up to ``reply_wait_timeout_sec``
(then NO_BUFFER), and keeps the bytes until gRPC has sent the reply, so a client that never grants
HTTP/2 window cannot make the process grow. ``grpc_max_concurrent_streams`` bounds the RPCs open
on one connection.

Two engines serve the port (``grpc_engine``): ``LOOP``, the default, is ``transport.grpc_loop`` (our
HTTP/2 on the event loop, fed by ``loop_methods``); ``GRPCIO`` is grpc.aio (fed by ``service_handler``).
The servicer is the same; it uses only ``context.peer()``, ``invocation_metadata()`` and ``write()``.

See also: ``riffle_actors.service`` (the use cases), ``riffle_actors.transport.decode`` (wire
fields into domain values).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc

from riffle_actors.errors import StatusCode
from riffle_actors.metrics import Metrics
from riffle_actors.protocol.blockid import BlockIdLayout
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from riffle_actors.records import Block, BlockBatch
from riffle_actors.service import ShuffleService
from riffle_actors.transport.decode import decode_layout, decode_task_filter, wire_status
from riffle_actors.transport.grpc_loop import LoopGrpcServer, LoopMethod
from riffle_actors.transport.listen import bind_grpc
from riffle_actors.transport.reply_budget import ReplyBudget
from riffle_actors.transport.rpc_answer import answer, failure_status

MAX_SEND_MESSAGE_BYTES = 1 << 30  # replies are bounded by what the server holds and by the read cap

R = TypeVar("R")  # what a response maker builds


def grpc_options(max_receive_bytes: int, max_concurrent_streams: int = 100) -> list[tuple[str, int]]:
    """Server options: requests above ``max_receive_bytes`` are refused by gRPC (RESOURCE_EXHAUSTED)
    from their length prefix, before their body is buffered; at most ``max_concurrent_streams`` RPCs
    open per connection (HTTP/2 SETTINGS; the client queues more); ``SO_REUSEPORT`` off, so a
    second server on the same port fails instead of sharing it."""
    return [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
        ("grpc.max_concurrent_streams", max_concurrent_streams),
        ("grpc.so_reuseport", 0),
    ]

# Read replies are counted in the reply budgets until gRPC has sent them: these methods are served as
# unary-stream handlers that write their one reply themselves, since a unary handler's reply is
# queued by gRPC after the handler returned, out of sight (awaiting ``context.write`` returns once
# the message went out under the client's HTTP/2 window). On the wire a one-message server stream
# is the same as a unary reply (HEADERS, one DATA message, trailers): a unary client reads it as such.
_STREAMED_REPLIES = frozenset({"getLocalShuffleData", "getMemoryShuffleData", "getLocalShuffleIndex"})
# A reply waiting for the client's window is in memory twice on GRPCIO: the serialized bytes this process
# wrote (kept by the awaiting write) and gRPC core's copy of them (its byte buffer); the budgets count both.
# LOOP sends from the serialized bytes themselves (one copy); it is counted the same, to be safe.
REPLY_COPIES = 2

_LOCAL_ORDER = pb.DataDistribution.Value("LOCAL_ORDER")
_SERVICE = "rss.common.ShuffleServer"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Serialized:
    """A reply already in wire form (``response_serializer`` passes ``wire`` through)."""

    __slots__ = ("wire",)

    def __init__(self, wire: bytes):
        self.wire = wire


def _with_data(head: Any, field: int, parts: list[bytes]) -> _Serialized:
    """``head`` (a message without its bytes field ``field``) serialized, then that field made of ``parts``."""
    size = sum(len(p) for p in parts)
    return _Serialized(b"".join([head.SerializeToString(), _varint(field << 3 | 2), _varint(size), *parts]))


class _BitmapReply:
    """The fields of a getShuffleResult* reply, before ``_bitmap_reply`` puts them on the wire."""

    __slots__ = ("retMsg", "serializedBitmap", "status")

    def __init__(self, status: int, retMsg: str, serializedBitmap: bytes = b""):
        self.status, self.retMsg, self.serializedBitmap = status, retMsg, serializedBitmap


_JOIN_OFF_LOOP_BYTES = 1 << 20  # bytes.join releases the GIL from 1 MiB on (CPython >= 3.9)


class _Unjoined:
    """A reply ``_with_data`` is still to put together; ``await joined()`` does it. The join is the one
    copy of the data left before grpc's own: from ``_JOIN_OFF_LOOP_BYTES`` on it runs in the loop's
    default executor, where it holds no GIL, so the loop goes on meanwhile (on the loop it held it
    70-80 ms for a 44 MB bitmap under load; a read reply may be 64 MB)."""

    __slots__ = ("field", "head", "parts")

    def __init__(self, head: object, field: int, parts: list):
        self.head, self.field, self.parts = head, field, parts

    async def joined(self) -> _Serialized:
        if sum(len(p) for p in self.parts) < _JOIN_OFF_LOOP_BYTES:
            return _with_data(self.head, self.field, self.parts)
        return await asyncio.get_running_loop().run_in_executor(None, _with_data, self.head, self.field, self.parts)


async def _bitmap_reply(reply: _BitmapReply, make: Callable[..., object]) -> object:
    """The reply with its bitmap (field 3) appended as it is: a 2M-id bitmap of one-id buckets is 44 MB,
    and every copy of it costs the loop ~50 ms (the message constructor and ``SerializeToString`` made two;
    the join left is done by ``_Unjoined``)."""
    head = make(status=reply.status, retMsg=reply.retMsg)
    return await _Unjoined(head, 3, [reply.serializedBitmap]).joined() if reply.serializedBitmap else head


def _serialize(message: Any) -> bytes:
    return message.wire if type(message) is _Serialized else message.SerializeToString()


def _wire_size(message: Any) -> int:
    return len(message.wire) if type(message) is _Serialized else message.ByteSize()


def service_handler(servicer: object) -> grpc.GenericRpcHandler:
    """Every method of ``rss.common.ShuffleServer`` the servicer has, with protobuf (de)serializers, except
    that a ``_Serialized`` reply is sent as it is."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["ShuffleServer"].methods:
        request = getattr(pb, method.input_type.name)
        make = (grpc.unary_stream_rpc_method_handler if method.name in _STREAMED_REPLIES
                else grpc.unary_unary_rpc_method_handler)
        handlers[method.name] = make(
            getattr(servicer, method.name), request_deserializer=request.FromString, response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(_SERVICE, handlers)


def loop_methods(servicer: object, internal: object | None = None) -> dict[str, LoopMethod]:
    """``service_handler``'s table for the LOOP engine (``transport.grpc_loop``), with ShuffleServerInternal's
    methods when ``internal`` is given; a method the servicer does not implement is left out (UNIMPLEMENTED)."""
    table = {}
    for service, impl, base, serialize in (
            ("ShuffleServer", servicer, pb_grpc.ShuffleServerServicer, _serialize),
            ("ShuffleServerInternal", internal, pb_grpc.ShuffleServerInternalServicer, _serialize)):
        if impl is None:
            continue
        for method in pb.DESCRIPTOR.services_by_name[service].methods:
            if getattr(type(impl), method.name, None) is getattr(base, method.name):
                continue
            request = getattr(pb, method.input_type.name)
            table[f"/rss.common.{service}/{method.name}"] = LoopMethod(
                request.FromString, getattr(impl, method.name), serialize,
                streamed=service == "ShuffleServer" and method.name in _STREAMED_REPLIES)
    return table


def _batch(sd) -> BlockBatch:
    """One ShuffleData of a sendShuffleData: its blocks as records, in one pass over the repeated field
    (the batch makes columns only if something reads them)."""
    return BlockBatch.of(sd.partitionId, [Block(b.blockId, b.length, b.uncompressLength, b.crc, b.taskAttemptId,
                                                b.data) for b in sd.block])


def _layout(layout: pb.BlockIdLayout) -> BlockIdLayout | None:
    return decode_layout((layout.sequenceNoBits, layout.partitionIdBits, layout.taskAttemptIdBits))


class ShuffleServerServicer(pb_grpc.ShuffleServerServicer):
    def __init__(self, service: ShuffleService, metrics: Metrics, *, replies: ReplyBudget | None = None,
                 max_reply_bytes_per_connection: int = 64 << 20):
        self.service = service
        self.metrics = metrics
        self.replies = replies if replies is not None else ReplyBudget(1 << 30, 10.0)
        self.max_reply_bytes_per_connection = max_reply_bytes_per_connection
        self._connections: dict[str, tuple[ReplyBudget, int]] = {}  # peer -> (its reply bytes, reads running)

    def _connection_budget(self, peer: str) -> ReplyBudget:
        """The reply budget of one connection, shared by its reads running now (dropped after the last)."""
        budget, users = self._connections.get(peer, (None, 0))
        if budget is None:
            budget = ReplyBudget(self.max_reply_bytes_per_connection, self.replies.wait_timeout_s,
                                 key="grpc_max_reply_bytes_per_connection", scope="this connection")
        self._connections[peer] = (budget, users + 1)
        return budget

    def _connection_done(self, peer: str) -> None:
        budget, users = self._connections[peer]
        if users > 1:
            self._connections[peer] = (budget, users - 1)
        else:
            del self._connections[peer]

    async def _read(self, context, want: int, rpc: str, make: Callable[..., object],
                    body: Callable[[], Awaitable[dict]], app_id: str) -> None:
        """A read RPC: reserve ``want`` reply bytes (connection, then server) before ``body`` reads, answer
        NO_BUFFER if they stay taken for reply_wait_timeout_sec, and hold them until the reply was sent."""
        peer = context.peer()
        conn = self._connection_budget(peer)
        held = 0
        want *= REPLY_COPIES

        async def reserved_body() -> dict:
            nonlocal held
            if want:
                await conn.acquire_or_refuse(want)
                try:
                    await self.replies.acquire_or_refuse(want)
                except BaseException:
                    conn.release(want)
                    raise
                held = want
            return await body()

        try:
            reply = await self._call(rpc, make, reserved_body, app_id)
            if type(reply) is _Unjoined:
                reply = await reply.joined()
            size = _wire_size(reply) * REPLY_COPIES
            if size > held:
                conn.take(size - held)
                self.replies.take(size - held)
            else:
                conn.release(held - size)
                self.replies.release(held - size)
            held = size
            await context.write(reply)
        finally:
            conn.release(held)
            self.replies.release(held)
            self._connection_done(peer)

    def _call(self, rpc: str, make: Callable[..., R], body: Callable[[], Awaitable[dict[str, Any]]],
              app_id: str = "") -> Coroutine[Any, Any, R]:
        """``rpc_answer.answer``: run ``body`` and build ``make(status=..., retMsg=..., **fields)``,
        counted and timed by ``Metrics.on_rpc`` (answer's coroutine itself: no extra frame)."""
        return answer(rpc, make, body, app_id, recorder=self.metrics)

    def _failed(self, rpc: str, e: Exception, started: float, app_id: str) -> tuple[int, str]:
        """The hot RPCs' error path (``_call``'s, without its closures on the success path): log, count
        and return ``(status, retMsg)``."""
        status, msg = failure_status(rpc, e, app_id)
        self.metrics.on_rpc(rpc, status.name, started, app_id)
        return int(status), msg

    # ------------------------------------------------------------- writes
    async def registerShuffle(self, request, context):
        async def body():
            ranges = [(r.start, r.end) for r in request.partitionRanges]
            await self.service.register_shuffle(
                request.appId, request.shuffleId, ranges,
                local_order=request.shuffleDataDistribution == _LOCAL_ORDER,
                user=request.user, properties=dict(request.properties),
                remote_storage=(request.remoteStorage.path,
                                tuple((c.key, c.value) for c in request.remoteStorage.remoteStorageConf)))
            return {}
        return await self._call("registerShuffle", pb.ShuffleRegisterResponse, body, request.appId)

    # requireBuffer and sendShuffleData run once per send: written out (no closures, no coroutine of
    # _call's) as _call would run them
    async def requireBuffer(self, request, context):
        started = time.perf_counter()
        try:
            grant = await self.service.grant_buffer(request.appId, request.shuffleId, request.requireSize,
                                                    tuple(request.partitionIds))
        except Exception as e:  # noqa: BLE001 - a bad request must never kill the server
            status, msg = self._failed("requireBuffer", e, started, request.appId)
            return pb.RequireBufferResponse(status=wire_status(status), retMsg=msg, requireBufferId=-1)
        self.metrics.on_rpc("requireBuffer", "SUCCESS", started, request.appId)
        # Riffle's partition split: the client (0.10+) reassigns these partitions to other servers
        return pb.RequireBufferResponse(status=wire_status(StatusCode.SUCCESS), retMsg="", requireBufferId=grant.ticket_id,
                                        needSplitPartitionIds=grant.split_partition_ids)

    async def sendShuffleData(self, request, context):
        started = time.perf_counter()
        try:
            partitions = tuple(_batch(sd) for sd in request.shuffleData)
            await self.service.send_data(request.appId, request.shuffleId, request.requireBufferId, partitions)
        except Exception as e:  # noqa: BLE001 - a bad request must never kill the server
            status, msg = self._failed("sendShuffleData", e, started, request.appId)
            return pb.SendShuffleDataResponse(status=wire_status(status), retMsg=msg)
        self.metrics.on_rpc("sendShuffleData", "SUCCESS", started, request.appId)
        return pb.SendShuffleDataResponse(status=wire_status(StatusCode.SUCCESS), retMsg="")

    async def reportShuffleResult(self, request, context):
        async def body():
            # Lazy, and the repeated fields as they are: the AppActor reads them in time slices.
            # Up front, 20000 partitions cost ~20 ms and 2M ids as Python ints ~0.15 s of the loop.
            p2b = ((p.partitionId, p.blockIds) for p in request.partitionToBlockIds)
            await self.service.report_shuffle_result(request.appId, request.shuffleId, request.taskAttemptId, p2b)
            return {}
        return await self._call("reportShuffleResult", pb.ReportShuffleResultResponse, body, request.appId)

    async def commitShuffleTask(self, request, context):
        async def body():
            return {"commitCount": await self.service.commit_shuffle_task(request.appId, request.shuffleId)}
        return await self._call("commitShuffleTask", pb.ShuffleCommitResponse, body, request.appId)

    async def finishShuffle(self, request, context):
        async def body():
            await self.service.finish_shuffle(request.appId, request.shuffleId)
            return {}
        return await self._call("finishShuffle", pb.FinishShuffleResponse, body, request.appId)

    # ------------------------------------------------------------- reads
    async def getShuffleResult(self, request, context):
        async def body():
            bitmap = await self.service.get_shuffle_result(
                request.appId, request.shuffleId, [request.partitionId], _layout(request.blockIdLayout))
            return {"serializedBitmap": bitmap}
        return await _bitmap_reply(await self._call("getShuffleResult", _BitmapReply, body, request.appId),
                             pb.GetShuffleResultResponse)

    async def getShuffleResultForMultiPart(self, request, context):
        async def body():
            bitmap = await self.service.get_shuffle_result(
                request.appId, request.shuffleId, list(request.partitions), _layout(request.blockIdLayout))
            return {"serializedBitmap": bitmap}
        return await _bitmap_reply(await self._call("getShuffleResultForMultiPart", _BitmapReply, body, request.appId),
                             pb.GetShuffleResultForMultiPartResponse)

    def _read_cap(self, n: int) -> int:
        return min(max(1, n), self.service.max_read_length)

    async def getMemoryShuffleData(self, request, context):
        async def body():
            bitmap = request.serializedExpectedTaskIdsBitmap if request.HasField(
                "serializedExpectedTaskIdsBitmap") else None
            blocks = await self.service.get_memory_data(
                request.appId, request.shuffleId, request.partitionId, request.lastBlockId,
                request.readBufferSize, await decode_task_filter(bitmap))
            segments = []
            offset = 0
            for b in blocks:
                n = len(b.data)
                segments.append(pb.ShuffleDataBlockSegment(
                    blockId=b.block_id, offset=offset, length=n, uncompressLength=b.uncompress_length,
                    crc=b.crc, taskAttemptId=b.task_attempt_id))
                offset += n
            return {"shuffleDataBlockSegments": segments, "data": [b.data for b in blocks]}

        def make(status, retMsg, shuffleDataBlockSegments=(), data=()):
            head = pb.GetMemoryShuffleDataResponse(status=status, retMsg=retMsg,
                                                   shuffleDataBlockSegments=shuffleDataBlockSegments)
            return _Unjoined(head, 2, list(data)) if data else head
        await self._read(context, self._read_cap(request.readBufferSize), "getMemoryShuffleData", make, body,
                         request.appId)

    async def getLocalShuffleIndex(self, request, context):
        async def body():
            index, data_len, storage_ids = await self.service.get_local_index(
                request.appId, request.shuffleId, request.partitionId)
            return {"indexData": index, "dataFileLen": data_len, "storageIds": storage_ids}
        await self._read(context, 0, "getLocalShuffleIndex", pb.GetLocalShuffleIndexResponse, body, request.appId)

    async def getLocalShuffleData(self, request, context):
        async def body():
            data = await self.service.get_local_data(
                request.appId, request.shuffleId, request.partitionId, request.storageId,
                request.offset, request.length)
            return {"data": data}

        def make(status, retMsg, data=b""):
            head = pb.GetLocalShuffleDataResponse(status=status, retMsg=retMsg)
            return _Unjoined(head, 1, [data]) if data else head
        want = self._read_cap(request.length) if 0 < request.length <= self.service.max_read_length else 0
        await self._read(context, want, "getLocalShuffleData", make, body, request.appId)

    # ------------------------------------------------------------- lifecycle
    async def appHeartbeat(self, request, context):
        async def body():
            await self.service.app_heartbeat(request.appId)
            return {}
        return await self._call("appHeartbeat", pb.AppHeartBeatResponse, body, request.appId)

    async def unregisterShuffle(self, request, context):
        async def body():
            await self.service.unregister_shuffle(request.appId, request.shuffleId)
            return {}
        return await self._call("unregisterShuffle", pb.ShuffleUnregisterResponse, body, request.appId)

    async def unregisterShuffleByAppId(self, request, context):
        async def body():
            await self.service.unregister_app(request.appId)
            return {}
        return await self._call("unregisterShuffleByAppId", pb.ShuffleUnregisterByAppIdResponse, body,
                                request.appId)

    async def startSortMerge(self, request, context):
        async def body():
            await self.service.remote_merge(request.appId, request.shuffleId, request.partitionId)
            return {}
        return await self._call("startSortMerge", pb.StartSortMergeResponse, body, request.appId)

    async def getSortedShuffleData(self, request, context):
        async def body():
            await self.service.remote_merge(request.appId, request.shuffleId, request.partitionId)
            return {}
        return await self._call("getSortedShuffleData", pb.GetSortedShuffleDataResponse, body, request.appId)


async def start_grpc_server(servicer: ShuffleServerServicer, host: str, port: int,
                            max_receive_bytes: int, *,
                            internal: pb_grpc.ShuffleServerInternalServicer | None = None,
                            max_concurrent_streams: int = 100,
                            loop_config: dict[str, Any] | None = None,
                            ) -> tuple[grpc.aio.Server | LoopGrpcServer, int]:
    """Start the gRPC port on exactly ``host:port``; returns the server and the bound port (0 = any free port).

    ``loop_config`` None: grpc.aio (``grpc_engine = "GRPCIO"``); otherwise the LOOP engine
    (``transport.grpc_loop``) with these limits (``LoopGrpcServer``'s keyword arguments). Both have
    ``await stop(grace)``. ``internal``: the ``ShuffleServerInternal`` service (decommission) served on
    the same port, as upstream."""
    if loop_config is not None:
        refused = servicer.metrics.rpc_total
        loop_server = LoopGrpcServer(loop_methods(servicer, internal), max_message_bytes=max_receive_bytes,
                                     max_concurrent_streams=max_concurrent_streams,
                                     on_refused=lambda what: refused.labels(what, "REFUSED").inc(), **loop_config)
        return loop_server, await loop_server.start(host, port)
    server = grpc.aio.server(options=grpc_options(max_receive_bytes, max_concurrent_streams))
    server.add_generic_rpc_handlers((service_handler(servicer),))
    if internal is not None:
        pb_grpc.add_ShuffleServerInternalServicer_to_server(internal, server)
    bound = bind_grpc(server, what="gRPC", keys="grpc_port / grpc_bind_address", host=host, port=port)
    await server.start()
    return server, bound
