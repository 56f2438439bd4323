"""The shuffle-server registry: membership, health, exclusion and assignment bookkeeping (pure).

This module owns what the coordinator knows about each shuffle server (a ``ServerNode`` keyed
by the server id ``"<ip>-<grpcPort>[-<nettyPort>]"``) and the rules of spec §7.2:

- a heartbeat creates or refreshes the node (the caller has validated it first:
  ``validation.heartbeat_problems``); a node silent for ``heartbeat_timeout_s``
  (measured with the injected clock) is dropped by ``expire()`` (LOST). Unlike Riffle's Rust
  coordinator we do expire dead servers, and a stale node is never a candidate even before
  the next sweep;
- the reported status is the heartbeat's ``status`` field, except that ``isHealthy=false``
  makes it UNHEALTHY (what Riffle and the Java coordinator do with that field); a server that
  stops gracefully announces it with a DECOMMISSIONED heartbeat, which ends its assignments at once;
- an operator override (HTTP ``POST /api/servers/{id}/status``) can force DECOMMISSIONING;
  it survives expiry so a restarted server stays drained; DECOMMISSIONED (``riffle-ctl instance
  kill --coordinator``) takes the server out of every assignment until an operator sets ACTIVE again;
- operator tags (HTTP ``POST /api/servers/{id}/tags``) are added to the tags the server reports
  when matching ``requireTags``; they survive expiry too;
- candidates for an assignment are ACTIVE, not in the exclude list, not in the request's
  ``faultyServerIds`` and offer every required tag. When there are too few, the error says
  how many servers were dropped by which rule, and names a required tag that no server offers
  (for ``GRPC_NETTY``: servers need ``urpc_port``, or the job ``spark.rss.client.type=GRPC``).

Admission (the protocol has no server authentication, so the registry protects itself): at most
``capacity`` servers (``[server] max_servers``) and at most ``max_per_host`` ids registered from
one TCP peer address (``[server] max_servers_per_host``). A heartbeat for an id registered from
another address (``ip:grpcPort``) is refused while the registered server keeps heartbeating;
once that server has been silent for the timeout, the new address takes the id over. So a
second server cannot steal a live server's id (and its traffic). Each conflict is logged once per change, naming both addresses,
and counted in ``id_conflicts_total``; refusals raise ``HeartbeatRefused`` and are counted in
``refused`` by kind.

Pure: no IO and no logging. What an operator should read (a server registered, moved, lost or
refused, an operator's override) is returned as ``events.RegistryEvent``s (``take_events()``),
which the owning actor logs.

It does not cover: the ranking itself (``assignment.py``), protobuf (``transport.coordinator_grpc``),
the exclude-nodes file (``riffle_actors.io.exclude_file``) or timers (``actors.py`` is told
``ExpireServers`` by the composition root's ``TimerActor``).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from riffle_actors.coordinator.assignment import (
    Assignment,
    AssignmentError,
    AssignmentRequest,
    Candidate,
    assign,
)
from riffle_actors.coordinator.config import AssignmentStrategy, HostStrategy
from riffle_actors.coordinator.events import EventOutbox, RegistryEvent
from riffle_actors.runtime import Clock

#: Transport tags and the client setting that selects them; used to make "no candidate" errors actionable.
_TAG_HINTS = {
    "GRPC_NETTY": "no server runs the Netty data port: set urpc_port on the servers, "
                  "or set spark.rss.client.type=GRPC",
}


class HeartbeatRefused(Exception):
    """The registry did not take a heartbeat; ``kind``: ``id_conflict``, ``registry_full``, ``host_limit``."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


class ServerStatus(enum.IntEnum):
    """Mirror of ``rss.common.ServerStatus``."""

    ACTIVE = 0
    DECOMMISSIONING = 1
    DECOMMISSIONED = 2
    LOST = 3
    UNHEALTHY = 4
    EXCLUDED = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatDisk:
    """One entry of the heartbeat's ``storageInfo`` map."""

    mount_point: str
    media: str = "STORAGE_TYPE_UNKNOWN"
    capacity_bytes: int = 0
    used_bytes: int = 0
    status: str = "NORMAL"


#: the block integrity counts a server heartbeats in displayMetrics (``riffle_actors.state.integrity``)
INTEGRITY_KEYS = ("corrupt_blocks", "corrupt_reads_refused", "refused_blocks", "repaired_blocks")


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
    disks: tuple[HeartbeatDisk, ...] = ()
    version: str = ""
    git_commit_id: str = ""
    start_time_ms: int = 0
    app_ids: tuple[str, ...] = ()
    # the server's block integrity totals (displayMetrics; riffle_actors.state.integrity)
    integrity: tuple[tuple[str, int], ...] = ()

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
    peer_host: str | None = None  # the TCP peer the last heartbeat came from (None when unknown)
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
    peer_host: str | None = None
    operator_tags: frozenset[str] = frozenset()  # tags an operator added (``set_operator_tags``)
    heartbeat_age_s: float = 0.0  # seconds since the last heartbeat (injected clock)

    @property
    def tags(self) -> frozenset[str]:
        """The tags assignments match: the server's own plus the operator's."""
        return self.node.tags | self.operator_tags


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryStats:
    """The registry's admission counters (``/api/health``, ``/metrics``)."""

    registered: int
    max_servers: int  # [server] max_servers
    lost_total: int
    id_conflicts_total: int
    refused: dict[str, int]  # refused heartbeats by kind, sorted


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
        capacity: int = 10_000,
        max_per_host: int = 0,
    ):
        self.clock = clock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.strategy = strategy
        self.host_strategy = host_strategy
        self.max_servers = max_servers  # per assignment
        self.capacity = capacity  # registered servers
        self.max_per_host = max_per_host  # 0 = no limit
        self._nodes: dict[str, ServerNode] = {}
        self._per_host: Counter[str] = Counter()
        self._excluded: frozenset[str] = frozenset()
        self._overrides: dict[str, ServerStatus] = {}
        self._operator_tags: dict[str, frozenset[str]] = {}
        self._cursor = 0
        self.lost_total = 0
        self.id_conflicts_total = 0
        self.refused: Counter[str] = Counter()
        self._conflicts: dict[str, tuple[str, int]] = {}  # id -> the refused address last logged
        self._full_logged = False
        self._host_limit_logged: set[str] = set()
        self.outbox = EventOutbox()  # what an operator should read in the log; the actor logs it

    def take_events(self) -> list[RegistryEvent]:
        """What happened since the last call (``events.RegistryEvent``), for the owner to log."""
        return self.outbox.take_events()

    # ------------------------------------------------------------------ membership

    def heartbeat(self, hb: ServerHeartbeat, *, peer_host: str | None = None) -> bool:
        """Record a heartbeat; returns True when the server is new (or came back after expiry).

        ``peer_host`` is the address the heartbeat came from (for ``max_per_host`` and the
        logs). Raises ``HeartbeatRefused`` when the admission rules (module docstring) say no.
        """
        now_m, now_ms = self.clock.monotonic(), _epoch_ms(self.clock)
        node = self._nodes.get(hb.id)
        if node is not None and _address(node.heartbeat) != _address(hb):
            if not self._is_stale(node):
                self._refuse_conflict(node, hb, peer_host)
            self.outbox.warning(
                "moved", f"server {hb.id} moved from {_show_address(node.heartbeat)} to {_show_address(hb)} "
                f"(peer {peer_host}): the old address was silent for {self.heartbeat_timeout_s}s")
            self._remove(hb.id)
            node = None
        if node is None:
            self._admit(hb, peer_host)
            self._add(ServerNode(
                heartbeat=hb, registered_epoch_ms=now_ms, last_heartbeat_monotonic=now_m,
                last_heartbeat_epoch_ms=now_ms, peer_host=peer_host,
            ))
            self.outbox.info("registered", f"server {hb.id} registered ({_show_address(hb)}, tags "
                                           f"{sorted(hb.tags)}, from {peer_host})")
            return True
        if node.heartbeat.reported_status is not hb.reported_status:
            if hb.reported_status is ServerStatus.DECOMMISSIONED:
                self.outbox.info("status", f"server {hb.id} announced that it is stopping: no new assignments")
            else:
                self.outbox.info("status", f"server {hb.id} reports {hb.reported_status.name}")
        if node.peer_host != peer_host:
            self._count_host(node.peer_host, -1)
            self._count_host(peer_host, +1)
            node.peer_host = peer_host
        node.heartbeat = hb
        node.last_heartbeat_monotonic, node.last_heartbeat_epoch_ms = now_m, now_ms
        node.assigned_partitions = 0  # fresh memory figures already reflect earlier assignments
        return False

    def _refuse_conflict(self, node: ServerNode, hb: ServerHeartbeat, peer_host: str | None) -> None:
        self.refused["id_conflict"] += 1
        held, claimed = _show_address(node.heartbeat), _show_address(hb)
        if self._conflicts.get(hb.id) != _address(hb):
            self._conflicts[hb.id] = _address(hb)
            self.id_conflicts_total += 1
            self.outbox.warning(
                "id_conflict", f"server id conflict: {hb.id} is registered from {held} (peer {node.peer_host}) "
                f"and a heartbeat from {claimed} (peer {peer_host}) claims it too; the second one is refused "
                f"while the first keeps heartbeating")
        age = self.clock.monotonic() - node.last_heartbeat_monotonic
        raise HeartbeatRefused(
            "id_conflict",
            f"server id {hb.id} is registered from {held} (last heartbeat {age:.0f}s ago), not {claimed}: "
            f"give each server its own id; the id is released after {self.heartbeat_timeout_s:g}s of silence",
        )

    def _admit(self, hb: ServerHeartbeat, peer_host: str | None) -> None:
        if len(self._nodes) >= self.capacity:
            self.refused["registry_full"] += 1
            if not self._full_logged:
                self._full_logged = True
                self.outbox.warning(
                    "registry_full", f"server registry full ({len(self._nodes)} servers, [server] max_servers): "
                    f"new server ids are refused, first {hb.id} from {_show_address(hb)} (peer {peer_host})")
            raise HeartbeatRefused(
                "registry_full",
                f"the coordinator's registry is full ({len(self._nodes)} servers, [server] max_servers); "
                f"server {hb.id} is not registered",
            )
        self._full_logged = False
        if self.max_per_host and peer_host is not None and self._per_host[peer_host] >= self.max_per_host:
            self.refused["host_limit"] += 1
            if peer_host not in self._host_limit_logged:
                self._host_limit_logged.add(peer_host)
                self.outbox.warning(
                    "host_limit", f"{self._per_host[peer_host]} server ids are registered from {peer_host} "
                    f"([server] max_servers_per_host): refusing new ids from it, first {hb.id}")
            raise HeartbeatRefused(
                "host_limit",
                f"{self._per_host[peer_host]} server ids are already registered from {peer_host} "
                f"([server] max_servers_per_host); server {hb.id} is not registered",
            )

    def _add(self, node: ServerNode) -> None:
        self._nodes[node.id] = node
        self._count_host(node.peer_host, +1)

    def _remove(self, server_id: str) -> None:
        node = self._nodes.pop(server_id)
        self._count_host(node.peer_host, -1)
        self._conflicts.pop(server_id, None)

    def _count_host(self, host: str | None, delta: int) -> None:
        if host is None:
            return
        self._per_host[host] += delta
        if self._per_host[host] <= 0:
            del self._per_host[host]
        if delta < 0:
            self._host_limit_logged.discard(host)

    def stats(self) -> RegistryStats:
        """Admission counters for ``/api/health``."""
        return RegistryStats(registered=len(self._nodes), max_servers=self.capacity, lost_total=self.lost_total,
                             id_conflicts_total=self.id_conflicts_total, refused=dict(sorted(self.refused.items())))

    def expire(self) -> list[str]:
        """Drop servers silent for longer than the timeout; returns their ids."""
        deadline = self.clock.monotonic() - self.heartbeat_timeout_s
        lost = [sid for sid, n in self._nodes.items() if n.last_heartbeat_monotonic < deadline]
        for sid in lost:
            self._remove(sid)
            self.outbox.warning("lost", f"server {sid} lost: no heartbeat for {self.heartbeat_timeout_s}s")
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
            self.outbox.info("excluded", f"exclude list now {len(new)} server(s): {sorted(new)}")
        self._excluded = new

    def set_operator_status(self, server_id: str, status: ServerStatus) -> None:
        """DECOMMISSIONING drains a server, DECOMMISSIONED takes it out (``riffle-ctl instance kill --coordinator``);
        ACTIVE removes the override (the server's own report counts)."""
        if status is ServerStatus.ACTIVE:
            self._overrides.pop(server_id, None)
        elif status in (ServerStatus.DECOMMISSIONING, ServerStatus.DECOMMISSIONED):
            self._overrides[server_id] = status
        else:
            raise ValueError(f"operator status must be ACTIVE, DECOMMISSIONING or DECOMMISSIONED, not {status.name}")
        self.outbox.info("operator_status", f"operator set server {server_id} to {status.name}")

    def set_operator_tags(self, server_id: str, *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> None:
        """Add or remove operator tags of a server (they survive expiry, like status overrides).

        A tag the server reports itself cannot be removed here (raises ``ValueError``): it would
        come back with the next heartbeat.
        """
        add, remove = frozenset(add), frozenset(remove)
        node = self._nodes.get(server_id)
        own = node.heartbeat.tags if node is not None else frozenset()
        if remove & own:
            raise ValueError(f"tag(s) {sorted(remove & own)} are reported by server {server_id} itself "
                             f"(its config's tags); only tags added by an operator can be removed")
        tags = (self._operator_tags.get(server_id, frozenset()) | add) - remove
        if tags:
            self._operator_tags[server_id] = tags
        else:
            self._operator_tags.pop(server_id, None)
        self.outbox.info("operator_tags", f"operator tags of server {server_id} now {sorted(tags)}")

    def tags_of(self, node: ServerNode) -> frozenset[str]:
        """The tags an assignment matches: the heartbeat's plus the operator's."""
        extra = self._operator_tags.get(node.id)
        return node.heartbeat.tags | extra if extra else node.heartbeat.tags

    def status_of(self, node: ServerNode) -> ServerStatus:
        """Effective status: operator override, then exclusion, then what the server reports.

        One exception: a server under a DECOMMISSIONING override that announces its stop
        (DECOMMISSIONED: its decommission ended, or it was killed) shows DECOMMISSIONED."""
        override = self._overrides.get(node.id)
        if override is ServerStatus.DECOMMISSIONING and node.heartbeat.reported_status is ServerStatus.DECOMMISSIONED:
            return ServerStatus.DECOMMISSIONED
        if override is not None:
            return override
        if node.id in self._excluded:
            return ServerStatus.EXCLUDED
        if self._is_stale(node):
            return ServerStatus.LOST
        return node.heartbeat.reported_status

    def views(self) -> list[ServerView]:
        """Every registered server, sorted by id."""
        now = self.clock.monotonic()
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
                peer_host=n.peer_host,
                operator_tags=self._operator_tags.get(n.id, frozenset()),
                heartbeat_age_s=max(0.0, now - n.last_heartbeat_monotonic),
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
            elif not tags <= self.tags_of(node):
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
        offered = set().union(*(self.tags_of(n) for n in self._nodes.values())) if self._nodes else set()
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


def _address(hb: ServerHeartbeat) -> tuple[str, int]:
    """Where clients reach a server: what must not change under one id while it is alive."""
    return hb.ip, hb.grpc_port


def _show_address(hb: ServerHeartbeat) -> str:
    return f"[{hb.ip}]:{hb.grpc_port}" if ":" in hb.ip else f"{hb.ip}:{hb.grpc_port}"
