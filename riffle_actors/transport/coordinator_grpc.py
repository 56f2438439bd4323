"""The gRPC adapter of ``rss.common.CoordinatorServer`` (spec §1.3, §7.4): decode, call the service, encode.

Thin on purpose, like the shuffle server's servicer: each handler decodes its request into typed
values, calls one method of ``CoordinatorService`` (``riffle_actors.coordinator.service``) and
encodes the answer; a ``RiffleError`` becomes the response's ``(status, retMsg)`` and an
unexpected exception INTERNAL_ERROR (logged) in ``transport.rpc_answer``, the wrapper the shuffle
server's gRPC and urpc adapters use too. Answers:

| RPC | answer |
|---|---|
| heartbeat | SUCCESS, the server is (re-)registered; INVALID_REQUEST + why if malformed; ACCESS_DENIED + why if refused |
| getShuffleAssignments | SUCCESS + a range per partition with ``dataReplica`` servers; INVALID_REQUEST + why out of bounds; INTERNAL_ERROR + why too few servers |
| registerApplicationInfo / appHeartbeat | SUCCESS; the app is recorded / kept alive; INVALID_REQUEST for a bad app id; ACCESS_DENIED when ``[app] max_apps`` are live |
| fetchClientConf / fetchClientConfV2 | SUCCESS + the ``[client_conf]`` items (0.10 drivers fail to start without V2) |
| fetchRemoteStorage | SUCCESS + ``[remote_storage]`` (empty path unless configured) |
| accessCluster | SUCCESS + a fresh uuid |
| checkServiceAvailable | SUCCESS, available = some server can take partitions |
| getShuffleServerList / getShuffleServerNum | every registered server / their number |
| reportClientOperation | SUCCESS (logged) |
| getShuffleDataStorageInfo | gRPC UNIMPLEMENTED (no client calls it) |

Every call is counted by method in ``CoordinatorCounters.rpc_calls`` (shown by ``/api/health``
and ``/metrics``). A heartbeat is validated here
(``validation.heartbeat_problems``) before it is decoded: a malformed one reaches the service as
a ``MalformedHeartbeat``, which refuses it.

The assignment answer is serialized by ``encode_assignments`` in slices (a million ranges must not
hold the event loop), so that handler returns bytes; ``add_coordinator_servicer`` registers the
servicer with a serializer that passes bytes through (the generated registration would not).

It does not cover: the decisions (``CoordinatorService``) or the HTTP API (``coordinator_http``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
from google.protobuf.message_factory import GetMessageClass

from riffle_actors.coordinator.assignment import Assignment, AssignmentRequest
from riffle_actors.coordinator.cluster import INTEGRITY_KEYS, HeartbeatDisk, ServerHeartbeat, ServerStatus
from riffle_actors.coordinator.metrics import CoordinatorCounters
from riffle_actors.coordinator.service import CoordinatorService
from riffle_actors.coordinator.validation import MalformedHeartbeat, heartbeat_problems, parse_ip, peer_host
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from riffle_actors.transport.decode import wire_status
from riffle_actors.transport.rpc_answer import answer


def _enum_name(enum: Any, value: int, default: str) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:  # a value a newer peer knows and we do not
        return default


def decode_heartbeat(req: pb.ShuffleServerHeartBeatRequest) -> ServerHeartbeat:
    """``ShuffleServerHeartBeatRequest`` → ``ServerHeartbeat`` (spec §1.7); validate it first.

    The IP is stored in its canonical form; a netty/jetty port of 0 or -1 ("none") becomes 0.
    """
    sid = req.serverId
    status = ServerStatus.ACTIVE
    if req.HasField("status"):
        try:
            status = ServerStatus(req.status)
        except ValueError:
            status = ServerStatus.UNHEALTHY  # a status we do not know: do not place data there
    disks = tuple(
        HeartbeatDisk(
            mount_point=info.mountPoint or mount,
            media=_enum_name(pb.StorageInfo.StorageMedia, info.storageMedia, "STORAGE_TYPE_UNKNOWN"),
            capacity_bytes=info.capacity,
            used_bytes=info.usedBytes,
            status=_enum_name(pb.StorageInfo.StorageStatus, info.status, "STORAGE_STATUS_UNKNOWN"),
        )
        for mount, info in sorted(req.storageInfo.items())
    )
    addr = parse_ip(sid.ip)
    ip = str(addr) if addr is not None else sid.ip
    return ServerHeartbeat(
        id=sid.id or f"{ip}-{sid.port}",
        ip=ip,
        grpc_port=sid.port,
        netty_port=max(sid.netty_port, 0),
        http_port=max(sid.jetty_port, 0),
        tags=frozenset(req.tags),
        used_memory=req.usedMemory,
        pre_allocated_memory=req.preAllocatedMemory,
        available_memory=req.availableMemory,
        event_num_in_flush=req.eventNumInFlush,
        status=status,
        is_healthy=req.isHealthy.value if req.HasField("isHealthy") else None,
        disks=disks,
        version=req.version,
        git_commit_id=req.gitCommitId,
        start_time_ms=req.startTimeMs,
        app_ids=tuple(a.appId for a in req.applicationInfo),
        integrity=_integrity(req.displayMetrics),
    )


def _integrity(metrics) -> tuple[tuple[str, int], ...]:
    """The known integrity counts of a heartbeat's displayMetrics (other entries, and values that are not
    small non-negative integers, are ignored)."""
    out = []
    for key in INTEGRITY_KEYS:
        raw = metrics.get(key)
        if raw is not None and len(raw) <= 19 and raw.isdigit():
            out.append((key, int(raw)))
    return tuple(out)


def decode_heartbeat_request(req: pb.ShuffleServerHeartBeatRequest) -> ServerHeartbeat | MalformedHeartbeat:
    """The typed heartbeat, or what is wrong with it (``validation.heartbeat_problems``)."""
    problems = heartbeat_problems(req)
    if problems:
        return MalformedHeartbeat(server_id=req.serverId.id, problems=tuple(problems))
    return decode_heartbeat(req)


def encode_server_id(hb: ServerHeartbeat) -> pb.ShuffleServerId:
    """A ``ShuffleServerId`` exactly as the server heartbeated it (clients connect to ip:port)."""
    return pb.ShuffleServerId(id=hb.id, ip=hb.ip, port=hb.grpc_port, netty_port=hb.netty_port,
                              jetty_port=hb.http_port)


#: Ranges encoded between two looks at the clock, and the time after which the loop gets a turn.
ENCODE_STEP = 256
ENCODE_TURN_S = 0.005


def _varint(n: int) -> bytes:
    """A protobuf varint (``n`` >= 0)."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]
_RANGES_TAG = b"\x12"  # GetShuffleAssignmentsResponse.assignments = 2, length-delimited
_START_TAG, _END_TAG, _SERVER_TAG = b"\x08", b"\x10", b"\x1a"  # PartitionRangeAssignment fields 1, 2, 3


async def encode_assignments(assignment: Assignment, servers: dict[str, ServerHeartbeat]) -> bytes:
    """The ``assignments`` field (2) of a ``GetShuffleAssignmentsResponse``, serialized.

    Written straight from the ``RangePlan`` (no message object per range): each distinct replica
    list's ``server`` fields are serialized once by protobuf, then every range is two varints
    and that suffix, exactly the bytes protobuf writes (``tests/unit/test_coordinator_encoding.py``
    compares them). Every ``ENCODE_TURN_S`` (checked each ``ENCODE_STEP`` ranges) the loop gets a
    turn, so a million ranges never hold it; only the bytes stay in memory (about 50 per range and
    replica), joined once at the end.
    """
    ids = {sid: encode_server_id(hb).SerializeToString() for sid, hb in servers.items()}
    plan = assignment.ranges
    suffixes = [b"".join(_SERVER_TAG + _varint(len(ids[s])) + ids[s] for s in replica_set)
                for replica_set in plan.replica_sets]
    period, per_range, total = len(suffixes), plan.per_range, plan.partition_num
    n_ranges = len(plan)
    chunks: list[bytes] = []
    out = bytearray()
    turn = time.perf_counter()
    for first in range(0, n_ranges, ENCODE_STEP):
        for i in range(first, min(first + ENCODE_STEP, n_ranges)):
            start = i * per_range
            end = min(start + per_range, total) - 1
            body = ((_START_TAG + _varint(start) if start else b"") + (_END_TAG + _varint(end) if end else b"")
                    + suffixes[i % period])
            out += _RANGES_TAG
            out += _varint(len(body))
            out += body
        if time.perf_counter() - turn >= ENCODE_TURN_S and first + ENCODE_STEP < n_ranges:
            chunks.append(bytes(out))
            out = bytearray()
            await asyncio.sleep(0)
            turn = time.perf_counter()
    chunks.append(bytes(out))
    if len(chunks) == 1:
        return chunks[0]
    # one copy of the whole answer (100 MB at the default bounds with 3 replicas): bytes.join does
    # the memcpy without the GIL, so in a thread it does not hold the loop
    return await asyncio.to_thread(b"".join, chunks)


def _serialize(message: Any) -> bytes:
    """Response serializer: a message, or bytes a handler already serialized (``getShuffleAssignments``)."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_coordinator_servicer(servicer: CoordinatorServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` for every method of ``rss.common.CoordinatorServer``, like the generated
    ``add_CoordinatorServerServicer_to_server`` but with ``_serialize`` (handlers may answer bytes)."""
    service = pb.DESCRIPTOR.services_by_name["CoordinatorServer"]
    handlers = {
        m.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name),
            request_deserializer=GetMessageClass(m.input_type).FromString,
            response_serializer=_serialize,
        )
        for m in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


class CoordinatorServicer(pb_grpc.CoordinatorServerServicer):
    """See the module docstring."""

    def __init__(self, service: CoordinatorService, counters: CoordinatorCounters):
        self.service = service
        self.counters = counters
        self._client_conf = [pb.ClientConfItem(key=k, value=v) for k, v in service.client_conf]
        self._remote_storage = pb.RemoteStorage(
            path=service.remote_storage_path,
            remoteStorageConf=[pb.RemoteStorageConfItem(key=k, value=v)
                               for k, v in service.remote_storage_conf],
        )

    def _call(self, rpc: str, make: Callable[..., Any],
              body: Callable[[], Awaitable[dict[str, Any]]]) -> Coroutine[Any, Any, Any]:
        """``rpc_answer.answer``: run ``body`` and build ``make(status=..., retMsg=..., **fields)``."""
        return answer(rpc, make, body, recorder=self.counters)

    def _count(self, rpc: str) -> None:
        """An RPC without a status field in its answer (counted as answered)."""
        self.counters.on_rpc(rpc, "SUCCESS", time.perf_counter())

    # ---------------------------------------------------------------- shuffle servers

    async def heartbeat(self, request: pb.ShuffleServerHeartBeatRequest, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            peer = peer_host(context.peer()) if context is not None else None
            await self.service.server_heartbeat(decode_heartbeat_request(request), peer)
            return {}
        return await self._call("heartbeat", pb.ShuffleServerHeartBeatResponse, body)

    async def getShuffleServerList(self, request: Any, context: Any) -> Any:
        self._count("getShuffleServerList")
        views = await self.service.list_servers()
        return pb.GetShuffleServerListResponse(servers=[encode_server_id(v.node) for v in views])

    async def getShuffleServerNum(self, request: Any, context: Any) -> Any:
        self._count("getShuffleServerNum")
        return pb.GetShuffleServerNumResponse(num=len(await self.service.list_servers()))

    async def checkServiceAvailable(self, request: Any, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            return {"available": await self.service.service_available()}

        def make(status: int, retMsg: str, **fields: Any) -> Any:  # the response has no retMsg
            return pb.CheckServiceAvailableResponse(status=wire_status(status), **fields)
        return await self._call("checkServiceAvailable", make, body)

    # ---------------------------------------------------------------- drivers

    async def getShuffleAssignments(self, request: pb.GetShuffleServerRequest, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            assignment, servers = await self.service.assign_shuffle(
                request.applicationId, request.shuffleId,
                AssignmentRequest(
                    partition_num=request.partitionNum,
                    partitions_per_range=request.partitionNumPerRange or 1,  # proto3 default 0 = not set
                    replica=request.dataReplica or 1,
                    server_number=request.assignmentShuffleServerNumber,
                ),
                require_tags=tuple(request.requireTags), faulty_ids=tuple(request.faultyServerIds))
            return {"encoded": await encode_assignments(assignment, servers)}

        def make(status: int, retMsg: str, encoded: bytes = b"") -> bytes:
            head = pb.GetShuffleAssignmentsResponse(status=wire_status(status), retMsg=retMsg).SerializeToString()
            return head + encoded  # fields 1 and 3, then the repeated field 2: a valid message in any order
        return await self._call("getShuffleAssignments", make, body)

    async def registerApplicationInfo(self, request: pb.ApplicationInfoRequest, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            await self.service.register_app(request.appId, user=request.user, version=request.version,
                                            git_commit_id=request.gitCommitId)
            return {}
        return await self._call("registerApplicationInfo", pb.ApplicationInfoResponse, body)

    async def appHeartbeat(self, request: pb.AppHeartBeatRequest, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            await self.service.app_heartbeat(request.appId)
            return {}
        return await self._call("appHeartbeat", pb.AppHeartBeatResponse, body)

    async def fetchClientConf(self, request: Any, context: Any) -> Any:
        self._count("fetchClientConf")
        return pb.FetchClientConfResponse(status=pb.SUCCESS, retMsg="", clientConf=self._client_conf)

    async def fetchClientConfV2(self, request: pb.FetchClientConfRequest, context: Any) -> Any:
        # MUST exist: a 0.10 driver cannot start when this RPC fails (spec §7.4).
        self._count("fetchClientConfV2")
        return pb.FetchClientConfResponse(status=pb.SUCCESS, retMsg="", clientConf=self._client_conf)

    async def fetchRemoteStorage(self, request: pb.FetchRemoteStorageRequest, context: Any) -> Any:
        self._count("fetchRemoteStorage")
        return pb.FetchRemoteStorageResponse(status=pb.SUCCESS, remoteStorage=self._remote_storage)

    async def accessCluster(self, request: pb.AccessClusterRequest, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            return {"uuid": self.service.access_cluster()}
        return await self._call("accessCluster", pb.AccessClusterResponse, body)

    async def reportClientOperation(self, request: pb.ReportShuffleClientOpRequest, context: Any) -> Any:
        async def body() -> dict[str, Any]:
            self.service.client_operation(request.clientHost, request.clientPort, request.operation,
                                          request.server.id)
            return {}
        return await self._call("reportClientOperation", pb.ReportShuffleClientOpResponse, body)

    async def getShuffleDataStorageInfo(self, request: Any, context: Any) -> Any:
        self._count("getShuffleDataStorageInfo")
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "getShuffleDataStorageInfo is not supported")
