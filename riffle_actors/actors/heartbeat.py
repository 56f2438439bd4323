"""Server → coordinator heartbeat: ``HeartbeatActor`` and the ``HeartbeatSnapshot`` it sends.

This module owns the shuffle server's membership in the cluster (spec §7.1). Every
``interval_s`` (the first one immediately at start, so a new server is assignable at once) the
actor calls ``snapshot()`` and sends one ``ShuffleServerHeartBeatRequest`` to EVERY coordinator
of the quorum, concurrently, over one long-lived grpc.aio channel per coordinator, with a
deadline of ``interval_s``. The fields:

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

A coordinator that is down or slow only costs a rate-limited warning (one per coordinator per
minute, with the count of failures swallowed meanwhile) and is retried on the next tick; the
sends run in a task of their own, so nothing in the server ever waits on a coordinator.

Messages: ``SendHeartbeatNow`` (send a round at once, e.g. after a status change; replies
``{target: ok}``) and ``GetHeartbeatStats``.

This is the one actor that is itself a gRPC client, hence the protobuf import here (like
Riffle's ``heartbeat.rs``). It does not cover: computing the figures (the caller's
``snapshot`` does) or the coordinator side (``riffle_actors.coordinator``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from loguru import logger

from riffle_actors import __version__
from riffle_actors.runtime import Actor
from riffle_actors.runtime.clock import Clock, SystemClock
from riffle_actors.log import RateLimitedLog
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc

#: Tags every server sends: the protocol generation the 0.10 client requires, and our transport.
BASE_TAGS = ("ss_v5", "GRPC")
NETTY_TAG = "GRPC_NETTY"
_DISK_STATUSES = ("NORMAL", "UNHEALTHY", "OVERUSED")


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskSnapshot:
    """One data path as the coordinator sees it."""

    path: str
    capacity_bytes: int = 0
    used_bytes: int = 0
    status: str = "NORMAL"  # NORMAL | UNHEALTHY | OVERUSED
    media: str = "HDD"  # StorageInfo.StorageMedia name


@dataclass(frozen=True, slots=True, kw_only=True)
class AppSnapshot:
    """One live application (``ApplicationInfo``, 0.10+, informational)."""

    app_id: str
    partition_num: int = 0
    memory_bytes: int = 0
    local_file_num: int = 0
    local_total_bytes: int = 0
    total_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatSnapshot:
    """Everything one heartbeat reports; built by the server's ``snapshot()`` callable each tick."""

    ip: str
    grpc_port: int
    http_port: int = 0
    netty_port: int = 0
    tags: tuple[str, ...] = ()  # operator tags; BASE_TAGS are always added
    used_memory: int = 0
    pre_allocated_memory: int = 0
    available_memory: int = 0
    event_num_in_flush: int = 0
    status: str = "ACTIVE"  # a rss.common.ServerStatus name
    is_healthy: bool = True
    disks: tuple[DiskSnapshot, ...] = ()
    version: str = __version__
    git_commit_id: str = ""
    start_time_ms: int = 0
    apps: tuple[AppSnapshot, ...] = ()

    @property
    def server_id(self) -> str:
        base = f"{self.ip}-{self.grpc_port}"
        return f"{base}-{self.netty_port}" if self.netty_port > 0 else base

    @property
    def all_tags(self) -> tuple[str, ...]:
        tags = list(BASE_TAGS) + ([NETTY_TAG] if self.netty_port > 0 else [])
        return tuple(dict.fromkeys(tags + list(self.tags)))  # ordered, no duplicates


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
    req.isHealthy.value = healthy  # BoolValue: present even when False (Riffle does the same)
    for d in s.disks:
        req.storageInfo[d.path].CopyFrom(
            pb.StorageInfo(
                mountPoint=d.path,
                storageMedia=pb.StorageInfo.StorageMedia.Value(d.media),
                capacity=d.capacity_bytes,
                usedBytes=d.used_bytes,
                status=pb.StorageInfo.StorageStatus.Value(d.status if d.status in _DISK_STATUSES else "UNHEALTHY"),
            )
        )
    return req


@dataclass(frozen=True, slots=True, kw_only=True)
class SendHeartbeatNow:
    """Send a round now; replies ``{coordinator: True/False}``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetHeartbeatStats:
    """Replies ``HeartbeatStats``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatStats:
    rounds: int
    sent_ok: int
    failed: int
    reachable: dict[str, bool] = field(default_factory=dict)


HeartbeatMsg = SendHeartbeatNow | GetHeartbeatStats


class HeartbeatActor(Actor):
    """See the module docstring."""

    default_name = "heartbeat"

    def __init__(
        self,
        quorum: list[str],
        interval_s: float,
        snapshot: Callable[[], HeartbeatSnapshot],
        clock: Clock | None = None,
        *,
        warn_every_s: float = 60.0,
    ):
        self.quorum = list(dict.fromkeys(quorum))
        self.interval_s = interval_s
        self.snapshot = snapshot
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._warn = RateLimitedLog(warn_every_s, monotonic=self.clock.monotonic)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.CoordinatorServerStub] = {}
        self._reachable: dict[str, bool] = {}
        self.rounds = 0
        self.sent_ok = 0
        self.failed = 0

    async def on_start(self) -> None:
        for target in self.quorum:
            channel = grpc.aio.insecure_channel(target)
            self._channels[target] = channel
            self._stubs[target] = pb_grpc.CoordinatorServerStub(channel)
        if not self.quorum:
            logger.warning("no coordinator_quorum configured: this server will not be assigned by any coordinator")
            return
        self.spawn(self._loop())

    async def on_stop(self) -> None:
        channels, self._channels, self._stubs = self._channels, {}, {}
        await asyncio.gather(*(c.close(grace=None) for c in channels.values()), return_exceptions=True)

    def receive(self, msg: HeartbeatMsg) -> Any:
        match msg:
            case SendHeartbeatNow():
                return self._round()
            case GetHeartbeatStats():
                return HeartbeatStats(
                    rounds=self.rounds, sent_ok=self.sent_ok, failed=self.failed, reachable=dict(self._reachable)
                )
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    async def _loop(self) -> None:
        while True:
            next_at = self.clock.monotonic() + self.interval_s
            await self._round()
            await self.clock.sleep(max(0.0, next_at - self.clock.monotonic()))

    async def _round(self) -> dict[str, bool]:
        try:
            request = encode_heartbeat(self.snapshot())
        except Exception:  # noqa: BLE001 - a broken snapshot skips one round, never the loop
            logger.exception("cannot build the heartbeat; skipping this round")
            return {}
        self.rounds += 1
        targets = list(self._stubs)
        results = await asyncio.gather(*(self._send(t, request) for t in targets))
        return dict(zip(targets, results))

    async def _send(self, target: str, request: pb.ShuffleServerHeartBeatRequest) -> bool:
        stub = self._stubs.get(target)
        if stub is None:
            return False
        try:
            resp = await stub.heartbeat(request, timeout=self.interval_s)
            ok = bool(resp.status == pb.SUCCESS)
            problem = "" if ok else f"status {pb.StatusCode.Name(resp.status)}: {resp.retMsg}"
        except grpc.aio.AioRpcError as e:
            ok, problem = False, f"{e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001 - never let one coordinator break the loop
            ok, problem = False, repr(e)
        if ok:
            self.sent_ok += 1
            if self._reachable.get(target) is False:
                logger.info("coordinator {} reachable again", target)
            self._warn.reset(target)
        else:
            self.failed += 1
            log_now, suppressed = self._warn.should_log(target)
            if log_now:
                more = f" ({suppressed} more failures since the last warning)" if suppressed else ""
                logger.warning("heartbeat to coordinator {} failed: {}{}", target, problem, more)
        self._reachable[target] = ok
        return ok
