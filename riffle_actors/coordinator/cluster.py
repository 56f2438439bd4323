"""The shuffle-server registry: membership, health, exclusion and assignment bookkeeping (pure).

This module owns what the coordinator knows about each shuffle server (a ``ServerNode`` keyed
by the server id ``"<ip>-<grpcPort>[-<nettyPort>]"``) and the rules of spec §7.2:

- a heartbeat creates or refreshes the node; a node silent for ``heartbeat_timeout_s``
  (measured with the injected clock) is dropped by ``expire()`` (LOST). Unlike Riffle's Rust
  coordinator we do expire dead servers, and a stale node is never a candidate even before
  the next sweep;
- the reported status is the heartbeat's ``status`` field, except that ``isHealthy=false``
  makes it UNHEALTHY (what Riffle and the Java coordinator do with that field);
- an operator override (HTTP ``POST /api/servers/{id}/status``) can force DECOMMISSIONING;
  it survives expiry so a restarted server stays drained;
- candidates for an assignment are ACTIVE, not in the exclude list, not in the request's
  ``faultyServerIds`` and offer every required tag. When there are too few, the error says
  how many servers were dropped by which rule, and names a required tag that no server offers
  (for ``GRPC_NETTY``: tells the user to set ``spark.rss.client.type=GRPC``).

``ExcludeFile`` reads the operator exclude list (one server id a line, ``#`` comments) and
re-reads it only when its mtime changes.

It does not cover: the ranking itself (``assignment.py``), protobuf (``service.py``) or
timers (``actors.py`` drives ``expire()`` and ``ExcludeFile.poll()``).
"""

from __future__ import annotations

import enum
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from loguru import logger

from riffle_actors.clock import Clock
from riffle_actors.coordinator.assignment import (
    Assignment,
    AssignmentError,
    AssignmentRequest,
    Candidate,
    assign,
)
from riffle_actors.coordinator.config import AssignmentStrategy, HostStrategy

#: Transport tags and the client setting that selects them; used to make "no candidate" errors actionable.
_TAG_HINTS = {
    "GRPC_NETTY": "our servers do not speak Netty yet; set spark.rss.client.type=GRPC",
}


class ServerStatus(enum.IntEnum):
    """Mirror of ``rss.common.ServerStatus``."""

    ACTIVE = 0
    DECOMMISSIONING = 1
    DECOMMISSIONED = 2
    LOST = 3
    UNHEALTHY = 4
    EXCLUDED = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskInfo:
    """One entry of the heartbeat's ``storageInfo`` map."""

    mount_point: str
    media: str = "STORAGE_TYPE_UNKNOWN"
    capacity_bytes: int = 0
    used_bytes: int = 0
    status: str = "NORMAL"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerHeartbeat:
    """A decoded ``ShuffleServerHeartBeatRequest`` (spec §1.7)."""

    id: str
    ip: str
    grpc_port: int
    netty_port: int = 0
    http_port: int = 0
    tags: frozenset[str] = frozenset()
    used_memory: int = 0
    pre_allocated_memory: int = 0
    available_memory: int = 0
    event_num_in_flush: int = 0
    status: ServerStatus = ServerStatus.ACTIVE
    is_healthy: bool | None = None
    disks: tuple[DiskInfo, ...] = ()
    version: str = ""
    git_commit_id: str = ""
    start_time_ms: int = 0
    app_ids: tuple[str, ...] = ()

    @property
    def reported_status(self) -> ServerStatus:
        """The status the server claims: ``isHealthy=false`` wins over the status field."""
        if self.is_healthy is False and self.status is ServerStatus.ACTIVE:
            return ServerStatus.UNHEALTHY
        return self.status


@dataclass(slots=True, kw_only=True)
class ServerNode:
    """A registered server: its latest heartbeat plus what the coordinator tracks about it."""

    heartbeat: ServerHeartbeat
    registered_epoch_ms: int
    last_heartbeat_monotonic: float
    last_heartbeat_epoch_ms: int
    assigned_partitions: int = 0  # since the last heartbeat (its memory figures predate them)
    total_assigned_partitions: int = 0

    @property
    def id(self) -> str:
        return self.heartbeat.id


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerView:
    """An immutable snapshot of a node as the HTTP API and the gRPC list RPCs show it."""

    node: ServerHeartbeat
    status: ServerStatus
    operator_status: ServerStatus | None
    excluded: bool
    registered_epoch_ms: int
    last_heartbeat_epoch_ms: int
    assigned_partitions: int
    total_assigned_partitions: int


@dataclass(slots=True)
class _Rejections:
    excluded: int = 0
    faulty: int = 0
    stale: int = 0
    not_active: Counter[str] = field(default_factory=Counter)
    missing_tags: int = 0


class ClusterRegistry:
    """All known shuffle servers, keyed by server id. Time comes from the injected clock."""

    def __init__(
        self,
        *,
        clock: Clock,
        heartbeat_timeout_s: float,
        strategy: AssignmentStrategy = AssignmentStrategy.PARTITION_BALANCE,
        host_strategy: HostStrategy = HostStrategy.PREFER_DIFF,
        max_servers: int = 9,
    ):
        self.clock = clock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.strategy = strategy
        self.host_strategy = host_strategy
        self.max_servers = max_servers
        self._nodes: dict[str, ServerNode] = {}
        self._excluded: frozenset[str] = frozenset()
        self._overrides: dict[str, ServerStatus] = {}
        self._cursor = 0
        self.lost_total = 0

    # ------------------------------------------------------------------ membership

    def heartbeat(self, hb: ServerHeartbeat) -> bool:
        """Record a heartbeat; returns True when the server is new (or came back after expiry)."""
        now_m, now_ms = self.clock.monotonic(), _epoch_ms(self.clock)
        node = self._nodes.get(hb.id)
        if node is None:
            self._nodes[hb.id] = ServerNode(
                heartbeat=hb, registered_epoch_ms=now_ms, last_heartbeat_monotonic=now_m, last_heartbeat_epoch_ms=now_ms
            )
            logger.info("server {} registered ({}:{}, tags {})", hb.id, hb.ip, hb.grpc_port, sorted(hb.tags))
            return True
        if node.heartbeat.reported_status is not hb.reported_status:
            logger.info("server {} reports {}", hb.id, hb.reported_status.name)
        node.heartbeat = hb
        node.last_heartbeat_monotonic, node.last_heartbeat_epoch_ms = now_m, now_ms
        node.assigned_partitions = 0  # fresh memory figures already reflect earlier assignments
        return False

    def expire(self) -> list[str]:
        """Drop servers silent for longer than the timeout; returns their ids."""
        deadline = self.clock.monotonic() - self.heartbeat_timeout_s
        lost = [sid for sid, n in self._nodes.items() if n.last_heartbeat_monotonic < deadline]
        for sid in lost:
            del self._nodes[sid]
            logger.warning("server {} lost: no heartbeat for {}s", sid, self.heartbeat_timeout_s)
        self.lost_total += len(lost)
        return lost

    def _is_stale(self, node: ServerNode) -> bool:
        return node.last_heartbeat_monotonic < self.clock.monotonic() - self.heartbeat_timeout_s

    def get(self, server_id: str) -> ServerNode | None:
        return self._nodes.get(server_id)

    def __len__(self) -> int:
        return len(self._nodes)

    # ------------------------------------------------------------------ operator controls

    @property
    def excluded(self) -> frozenset[str]:
        return self._excluded

    def set_excluded(self, server_ids: Iterable[str]) -> None:
        """Replace the operator exclude list (ids need not be registered)."""
        new = frozenset(server_ids)
        if new != self._excluded:
            logger.info("exclude list now {} server(s): {}", len(new), sorted(new))
        self._excluded = new

    def set_operator_status(self, server_id: str, status: ServerStatus) -> None:
        """DECOMMISSIONING drains a server; ACTIVE removes the override (the server's own report counts)."""
        if status is ServerStatus.ACTIVE:
            self._overrides.pop(server_id, None)
        elif status is ServerStatus.DECOMMISSIONING:
            self._overrides[server_id] = status
        else:
            raise ValueError(f"operator status must be ACTIVE or DECOMMISSIONING, not {status.name}")
        logger.info("operator set server {} to {}", server_id, status.name)

    def status_of(self, node: ServerNode) -> ServerStatus:
        """Effective status: operator override, then exclusion, then what the server reports."""
        override = self._overrides.get(node.id)
        if override is not None:
            return override
        if node.id in self._excluded:
            return ServerStatus.EXCLUDED
        if self._is_stale(node):
            return ServerStatus.LOST
        return node.heartbeat.reported_status

    def views(self) -> list[ServerView]:
        """Every registered server, sorted by id."""
        return [
            ServerView(
                node=n.heartbeat,
                status=self.status_of(n),
                operator_status=self._overrides.get(n.id),
                excluded=n.id in self._excluded,
                registered_epoch_ms=n.registered_epoch_ms,
                last_heartbeat_epoch_ms=n.last_heartbeat_epoch_ms,
                assigned_partitions=n.assigned_partitions,
                total_assigned_partitions=n.total_assigned_partitions,
            )
            for n in sorted(self._nodes.values(), key=lambda n: n.id)
        ]

    # ------------------------------------------------------------------ assignment

    def candidates(self, require_tags: Iterable[str] = (), faulty_ids: Iterable[str] = ()) -> list[ServerNode]:
        """Servers eligible for new partitions, sorted by id."""
        return self._filter(frozenset(require_tags), frozenset(faulty_ids))[0]

    def _filter(self, tags: frozenset[str], faulty: frozenset[str]) -> tuple[list[ServerNode], _Rejections]:
        out: list[ServerNode] = []
        why = _Rejections()
        for node in sorted(self._nodes.values(), key=lambda n: n.id):
            status = self.status_of(node)
            if node.id in self._excluded:
                why.excluded += 1
            elif node.id in faulty:
                why.faulty += 1
            elif status is ServerStatus.LOST:
                why.stale += 1
            elif status is not ServerStatus.ACTIVE:
                why.not_active[status.name] += 1
            elif not tags <= node.heartbeat.tags:
                why.missing_tags += 1
            else:
                out.append(node)
        return out, why

    def assign(
        self,
        request: AssignmentRequest,
        *,
        require_tags: Iterable[str] = (),
        faulty_ids: Iterable[str] = (),
    ) -> tuple[Assignment, dict[str, ServerHeartbeat]]:
        """Choose servers for a shuffle and count the partitions they received.

        Returns the assignment and the heartbeat record of every server it uses. Raises
        ``AssignmentError`` with a message that explains which servers were ruled out and why.
        """
        tags = frozenset(require_tags)
        nodes, why = self._filter(tags, frozenset(faulty_ids))
        cands = [
            Candidate(
                id=n.id,
                host=n.heartbeat.ip,
                available_memory=n.heartbeat.available_memory,
                assigned_partitions=n.assigned_partitions,
            )
            for n in nodes
        ]
        try:
            result = assign(
                request,
                cands,
                strategy=self.strategy,
                host_strategy=self.host_strategy,
                max_servers=self.max_servers,
                cursor=self._cursor,
            )
        except AssignmentError as e:
            raise AssignmentError(f"{e}; {self._explain(tags, why)}") from None
        self._cursor = result.next_cursor
        for sid, count in result.partitions_per_server.items():
            node = self._nodes[sid]
            node.assigned_partitions += count
            node.total_assigned_partitions += count
        return result, {sid: self._nodes[sid].heartbeat for sid in result.partitions_per_server}

    def _explain(self, tags: frozenset[str], why: _Rejections) -> str:
        offered = set().union(*(n.heartbeat.tags for n in self._nodes.values())) if self._nodes else set()
        parts = []
        for tag in sorted(tags - offered):  # the most actionable reason first
            hint = _TAG_HINTS.get(tag)
            parts.append(f"no server offers {tag}" + (f" ({hint})" if hint else ""))
        parts += [f"{len(self._nodes)} server(s) registered", f"requireTags={sorted(tags)}"]
        if why.missing_tags:
            parts.append(f"{why.missing_tags} lack a required tag")
        if why.excluded:
            parts.append(f"{why.excluded} excluded by the operator")
        if why.faulty:
            parts.append(f"{why.faulty} listed in faultyServerIds")
        if why.stale:
            parts.append(f"{why.stale} not heartbeating")
        for status, count in sorted(why.not_active.items()):
            parts.append(f"{count} {status}")
        return ", ".join(parts)


def _epoch_ms(clock: Clock) -> int:
    return int(clock.time() * 1000)


class ExcludeFile:
    """The operator's exclude-nodes file, re-read only when its mtime (or existence) changes."""

    _MISSING = (-1, -1, -1)

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) last read; None = never polled

    def poll(self) -> frozenset[str] | None:
        """The new set of excluded ids when the file changed since the last call, else None.

        A missing file means "nobody excluded"; an unreadable one keeps the previous list.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._stamp == self._MISSING:
                return None
            self._stamp = self._MISSING
            logger.warning("exclude_nodes_file {} does not exist: no server excluded", self.path)
            return frozenset()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                ids = parse_exclude_list(f.read())
        except OSError as e:
            logger.warning("cannot read exclude_nodes_file {}: {}", self.path, e)
            return None
        self._stamp = stamp
        return ids


def parse_exclude_list(text: str) -> frozenset[str]:
    """One server id a line; blank lines and ``#`` comments ignored."""
    ids = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return frozenset(i for i in ids if i)
