"""The shuffle server's gRPC client of a coordinator: a ``HeartbeatSnapshot`` in, a ``HeartbeatAck`` out.

This module owns the protobuf side of the server's membership in the cluster (spec §7.1): building
one ``ShuffleServerHeartBeatRequest`` from a typed ``HeartbeatSnapshot`` (``encode_heartbeat``)
and sending it over one long-lived HTTP/2 connection per coordinator (``GrpcCoordinatorLink``, the
``CoordinatorLink`` the ``HeartbeatActor`` is given; the calls are plain gRPC, made by
``riffle_actors.transport.grpc_unary`` on the event loop instead of grpc.aio's threads, which cost an
idle server most of its CPU). The fields:

| request field | from the snapshot |
|---|---|
| serverId.id | ``"<ip>-<grpc_port>"`` (``"-<netty_port>"`` appended when netty_port > 0, as Uniffle does) |
| serverId.ip / port / jetty_port / netty_port | ``ip`` / ``grpc_port`` / ``http_port`` / ``netty_port`` (0 = none) |
| tags | ``ss_v5``, ``GRPC`` (+ ``GRPC_NETTY`` when netty_port > 0) + ``tags`` |
| usedMemory / preAllocatedMemory / availableMemory | same-named byte counts |
| eventNumInFlush | ``event_num_in_flush`` |
| status / isHealthy | ``status`` (a ``ServerStatus`` name) / ``is_healthy`` (sent as False unless ACTIVE) |
| storageInfo | one entry per data path: mountPoint = path, capacity, usedBytes, status NORMAL/UNHEALTHY/OVERUSED |
| version / gitCommitId / startTimeMs | ``version`` / ``git_commit_id`` / ``start_time_ms`` |
| applicationInfo | one per live app in ``apps`` |
| displayMetrics | ``integrity``: the server's block integrity totals (``corrupt_blocks``, ``repaired_blocks``, ...) |

A failed call (the coordinator is down, slow, or answers a non-SUCCESS status) is an ack with
``ok=False`` and the reason; nothing here retries, logs or keeps time (the actor does).

It does not cover: when heartbeats are sent and what happens on failure
(``riffle_actors.actors.heartbeat``), computing the figures (``riffle_actors.admin``) or the
coordinator side (``riffle_actors.transport.coordinator_grpc``).
"""

from __future__ import annotations

from riffle_actors.actors.heartbeat import HeartbeatAck, HeartbeatSnapshot
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.transport.grpc_unary import UnaryCallError, UnaryChannel

HEARTBEAT_PATH = "/rss.common.CoordinatorServer/heartbeat"

_DISK_STATUSES = ("NORMAL", "UNHEALTHY", "OVERUSED")


def encode_heartbeat(s: HeartbeatSnapshot) -> pb.ShuffleServerHeartBeatRequest:
    """``HeartbeatSnapshot`` → ``ShuffleServerHeartBeatRequest`` (see the module docstring's table)."""
    healthy = s.is_healthy and s.status == "ACTIVE"
    req = pb.ShuffleServerHeartBeatRequest(
        serverId=pb.ShuffleServerId(
            id=s.server_id, ip=s.ip, port=s.grpc_port, netty_port=max(s.netty_port, 0), jetty_port=s.http_port
        ),
        usedMemory=s.used_memory,
        preAllocatedMemory=s.pre_allocated_memory,
        availableMemory=s.available_memory,
        eventNumInFlush=s.event_num_in_flush,
        tags=list(s.all_tags),
        status=pb.ServerStatus.Value(s.status),
        version=s.version,
        gitCommitId=s.git_commit_id,
        startTimeMs=s.start_time_ms,
        applicationInfo=[
            pb.ApplicationInfo(
                appId=a.app_id,
                partitionNum=a.partition_num,
                memorySize=a.memory_bytes,
                localFileNum=a.local_file_num,
                localTotalSize=a.local_total_bytes,
                totalSize=a.total_bytes,
            )
            for a in s.apps
        ],
    )
    for key, value in s.integrity:
        req.displayMetrics[key] = str(value)
    req.isHealthy.value = healthy  # BoolValue: present even when False (Riffle does the same)
    for d in s.disks:
        req.storageInfo[d.path].CopyFrom(
            pb.StorageInfo(
                mountPoint=d.path,
                storageMedia=pb.StorageInfo.StorageMedia.Value(d.media),
                capacity=d.capacity_bytes,
                usedBytes=d.used_bytes,
                status=pb.StorageInfo.StorageStatus.Value(
                    d.status if d.status in _DISK_STATUSES else "UNHEALTHY"),
            )
        )
    return req


class GrpcCoordinatorLink:
    """One coordinator over one HTTP/2 connection (opened at the first heartbeat, closed by ``close()``)."""

    def __init__(self, target: str):
        self.target = target
        self._channel = UnaryChannel(target)

    async def send_heartbeat(self, snapshot: HeartbeatSnapshot, timeout_s: float) -> HeartbeatAck:
        request = encode_heartbeat(snapshot).SerializeToString()
        try:
            answer = await self._channel.call(HEARTBEAT_PATH, request, timeout_s)
            resp = pb.ShuffleServerHeartBeatResponse.FromString(answer)
        except UnaryCallError as e:
            return HeartbeatAck(ok=False, problem=f"{e.code}: {e.details}")
        except Exception as e:  # noqa: BLE001 - a malformed answer (protobuf DecodeError) is a failed heartbeat
            return HeartbeatAck(ok=False, problem=f"malformed answer: {e!r}")
        if resp.status == pb.SUCCESS:
            return HeartbeatAck(ok=True)
        return HeartbeatAck(ok=False, problem=f"status {pb.StatusCode.Name(resp.status)}: {resp.retMsg}")

    async def close(self) -> None:
        await self._channel.close()
