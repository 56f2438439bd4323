"""The grpc.aio ``rss.common.CoordinatorServer`` servicer (spec §1.3, §7.4).

This module owns the protobuf side of the coordinator: it decodes each request, asks the
state actors (``ClusterActor``, ``AppRegistryActor``) and encodes the reply. Behaviour per RPC:

| RPC | answer |
|---|---|
| heartbeat | SUCCESS, the server is (re-)registered; INVALID_REQUEST + why if malformed; ACCESS_DENIED + why if refused |
| getShuffleAssignments | SUCCESS + a range per partition with ``dataReplica`` servers, or INTERNAL_ERROR + why |
| registerApplicationInfo / appHeartbeat | SUCCESS; the app is recorded / kept alive |
| fetchClientConf / fetchClientConfV2 | SUCCESS + the ``[client_conf]`` items (0.10 drivers fail to start without V2) |
| fetchRemoteStorage | SUCCESS + ``[remote_storage]`` (empty path unless configured) |
| accessCluster | SUCCESS + a fresh uuid |
| checkServiceAvailable | SUCCESS, available = some server can take partitions |
| getShuffleServerList / getShuffleServerNum | every registered server / their number |
| reportClientOperation | SUCCESS (logged) |
| getShuffleDataStorageInfo | gRPC UNIMPLEMENTED (no client calls it) |

Every call is counted in ``rpc_calls`` and every refused heartbeat in ``heartbeats_refused`` (by
kind: ``invalid``, ``source_not_allowed``, ``id_conflict``, ``registry_full``, ``host_limit``), both
exposed by ``/api/health``. A refusal is logged with the peer address (repeats of the same one
are logged at the 1st, 10th, 100th, ... occurrence).

A heartbeat is checked in this order: ``validation.heartbeat_problems`` (malformed: INVALID_REQUEST),
``validation.source_problem`` (outside ``[server] allowed_networks``: ACCESS_DENIED), then the
registry's admission rules (id conflict, ``max_servers``, ``max_servers_per_host``: ACCESS_DENIED).
Only a heartbeat that passes all three reaches the registry.

It does not cover: the state rules (``cluster.py``, ``apps.py``, ``assignment.py``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import grpc
from loguru import logger

from riffle_actors.runtime import ActorRef
from riffle_actors.coordinator import actors as msgs
from riffle_actors.coordinator.assignment import AssignmentError, AssignmentRequest
from riffle_actors.coordinator.cluster import DiskInfo, HeartbeatRefused, ServerHeartbeat, ServerStatus
from riffle_actors.coordinator.config import CoordinatorConfig
from riffle_actors.coordinator.validation import (
    RepeatFilter,
    heartbeat_problems,
    parse_ip,
    parse_networks,
    peer_host,
    reject_message,
    show,
    source_problem,
)
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc

SUCCESS = pb.SUCCESS
INTERNAL_ERROR = pb.INTERNAL_ERROR


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
        DiskInfo(
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
    )


def encode_server_id(hb: ServerHeartbeat) -> pb.ShuffleServerId:
    """A ``ShuffleServerId`` exactly as the server heartbeated it (clients connect to ip:port)."""
    return pb.ShuffleServerId(id=hb.id, ip=hb.ip, port=hb.grpc_port, netty_port=hb.netty_port, jetty_port=hb.http_port)


class CoordinatorService(pb_grpc.CoordinatorServerServicer):
    """See the module docstring."""

    def __init__(self, cfg: CoordinatorConfig, *, cluster_ref: ActorRef, apps_ref: ActorRef):
        self.cluster_ref = cluster_ref
        self.apps_ref = apps_ref
        self._client_conf = [pb.ClientConfItem(key=k, value=v) for k, v in cfg.client_conf.items()]
        self._remote_storage = pb.RemoteStorage(
            path=cfg.remote_storage.path,
            remoteStorageConf=[pb.RemoteStorageConfItem(key=k, value=v) for k, v in cfg.remote_storage.conf.items()],
        )
        self._networks = parse_networks(cfg.server.allowed_networks)
        self.rpc_calls: Counter[str] = Counter()
        self.heartbeats_refused: Counter[str] = Counter()
        self._refusal_log = RepeatFilter()

    # ---------------------------------------------------------------- shuffle servers

    async def heartbeat(self, request: pb.ShuffleServerHeartBeatRequest, context: Any) -> Any:
        self.rpc_calls["heartbeat"] += 1
        peer = peer_host(context.peer()) if context is not None else None
        problems = heartbeat_problems(request)
        if problems:
            message = reject_message(problems)
            return self._refuse("invalid", pb.INVALID_REQUEST, message, peer, request.serverId.id)
        source = source_problem(peer, request.serverId.ip, self._networks)
        if source is not None:
            return self._refuse("source_not_allowed", pb.ACCESS_DENIED, source, peer, request.serverId.id)
        hb = decode_heartbeat(request)
        try:
            await self.cluster_ref.ask(msgs.Heartbeat(heartbeat=hb, peer_host=peer))
        except HeartbeatRefused as e:
            # the registry logs its refusals itself (once per change)
            self.heartbeats_refused[e.kind] += 1
            return pb.ShuffleServerHeartBeatResponse(status=pb.ACCESS_DENIED, retMsg=str(e))
        return pb.ShuffleServerHeartBeatResponse(status=SUCCESS, retMsg="")

    def _refuse(self, kind: str, status: int, message: str, peer: str | None, server_id: str) -> Any:
        self.heartbeats_refused[kind] += 1
        count = self._refusal_log.hit((kind, peer, message))
        if count is not None:
            seen = f" (seen {count} times)" if count > 1 else ""
            who = peer or "an unknown peer"
            logger.warning("refused heartbeat from {} (serverId.id {}): {}{}", who, show(server_id), message, seen)
        return pb.ShuffleServerHeartBeatResponse(status=status, retMsg=message)

    async def getShuffleServerList(self, request: Any, context: Any) -> Any:
        self.rpc_calls["getShuffleServerList"] += 1
        views = await self.cluster_ref.ask(msgs.ListServers())
        return pb.GetShuffleServerListResponse(servers=[encode_server_id(v.node) for v in views])

    async def getShuffleServerNum(self, request: Any, context: Any) -> Any:
        self.rpc_calls["getShuffleServerNum"] += 1
        views = await self.cluster_ref.ask(msgs.ListServers())
        return pb.GetShuffleServerNumResponse(num=len(views))

    async def checkServiceAvailable(self, request: Any, context: Any) -> Any:
        self.rpc_calls["checkServiceAvailable"] += 1
        n = await self.cluster_ref.ask(msgs.CountCandidates())
        return pb.CheckServiceAvailableResponse(status=SUCCESS, available=n > 0)

    # ---------------------------------------------------------------- drivers

    async def getShuffleAssignments(self, request: pb.GetShuffleServerRequest, context: Any) -> Any:
        self.rpc_calls["getShuffleAssignments"] += 1
        app_id, shuffle_id = request.applicationId, request.shuffleId
        assignment_request = AssignmentRequest(
            partition_num=request.partitionNum,
            partitions_per_range=request.partitionNumPerRange or 1,
            replica=request.dataReplica or 1,  # proto3 default 0 = not set
            server_number=request.assignmentShuffleServerNumber,
        )
        try:
            assignment, servers = await self.cluster_ref.ask(
                msgs.AssignShuffle(
                    request=assignment_request,
                    require_tags=tuple(request.requireTags),
                    faulty_ids=tuple(request.faultyServerIds),
                )
            )
        except AssignmentError as e:
            logger.warning("no assignment for app {} shuffle {}: {}", app_id, shuffle_id, e)
            return pb.GetShuffleAssignmentsResponse(status=INTERNAL_ERROR, retMsg=str(e))
        ids = {sid: encode_server_id(hb) for sid, hb in servers.items()}
        ranges = [
            pb.PartitionRangeAssignment(startPartition=r.start, endPartition=r.end, server=[ids[s] for s in r.server_ids])
            for r in assignment.ranges
        ]
        if app_id:
            await self.apps_ref.tell(
                msgs.RecordAssignment(app_id=app_id, partitions=request.partitionNum, server_ids=tuple(sorted(servers)))
            )
        logger.info(
            "app {} shuffle {}: {} partition(s) x{} on {}",
            app_id, shuffle_id, request.partitionNum, assignment_request.replica, sorted(servers),
        )
        return pb.GetShuffleAssignmentsResponse(status=SUCCESS, assignments=ranges, retMsg="")

    async def registerApplicationInfo(self, request: pb.ApplicationInfoRequest, context: Any) -> Any:
        self.rpc_calls["registerApplicationInfo"] += 1
        if not request.appId:
            return pb.ApplicationInfoResponse(status=pb.INVALID_REQUEST, retMsg="appId is empty")
        await self.apps_ref.tell(
            msgs.RegisterApp(
                app_id=request.appId, user=request.user, version=request.version, git_commit_id=request.gitCommitId
            )
        )
        return pb.ApplicationInfoResponse(status=SUCCESS, retMsg="")

    async def appHeartbeat(self, request: pb.AppHeartBeatRequest, context: Any) -> Any:
        self.rpc_calls["appHeartbeat"] += 1
        if request.appId:
            await self.apps_ref.tell(msgs.AppHeartbeat(app_id=request.appId))
        return pb.AppHeartBeatResponse(status=SUCCESS, retMsg="")

    async def fetchClientConf(self, request: Any, context: Any) -> Any:
        self.rpc_calls["fetchClientConf"] += 1
        return pb.FetchClientConfResponse(status=SUCCESS, retMsg="", clientConf=self._client_conf)

    async def fetchClientConfV2(self, request: pb.FetchClientConfRequest, context: Any) -> Any:
        # MUST exist: a 0.10 driver cannot start when this RPC fails (spec §7.4).
        self.rpc_calls["fetchClientConfV2"] += 1
        return pb.FetchClientConfResponse(status=SUCCESS, retMsg="", clientConf=self._client_conf)

    async def fetchRemoteStorage(self, request: pb.FetchRemoteStorageRequest, context: Any) -> Any:
        self.rpc_calls["fetchRemoteStorage"] += 1
        return pb.FetchRemoteStorageResponse(status=SUCCESS, remoteStorage=self._remote_storage)

    async def accessCluster(self, request: pb.AccessClusterRequest, context: Any) -> Any:
        self.rpc_calls["accessCluster"] += 1
        return pb.AccessClusterResponse(status=SUCCESS, retMsg="", uuid=uuid.uuid4().hex)

    async def reportClientOperation(self, request: pb.ReportShuffleClientOpRequest, context: Any) -> Any:
        self.rpc_calls["reportClientOperation"] += 1
        logger.info(
            "client {}:{} reports {!r} on server {}",
            request.clientHost, request.clientPort, request.operation, request.server.id,
        )
        return pb.ReportShuffleClientOpResponse(status=SUCCESS, retMsg="")

    async def getShuffleDataStorageInfo(self, request: Any, context: Any) -> Any:
        self.rpc_calls["getShuffleDataStorageInfo"] += 1
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "getShuffleDataStorageInfo is not supported")
