"""Server → coordinator heartbeat: ``HeartbeatActor``, the ``HeartbeatSnapshot`` it sends and the
``CoordinatorLink`` it sends it through.

This module owns the timing, retries and bookkeeping of the shuffle server's membership in the
cluster (spec §7.1). Every ``interval_s`` (the server's ``TimerActor``, registered as ``timer_name``,
tells the actor a round is due, the first one immediately at start, so a new server is assignable at
once; missed periods are coalesced, a round still going when the next is due makes that one skip) the
actor calls ``snapshot()`` and sends the
result to EVERY coordinator of the quorum, concurrently, each through its own
``CoordinatorLink`` (opened by ``connect(target)`` when the actor starts, closed when it stops),
with a deadline of ``interval_s``. When the server passes a ``refresh`` coroutine function, each
periodic round awaits it first (bounded by half the interval), so the figures are read from the
actors at the moment they are sent and an idle server wakes once per period, not twice. A refresh
that fails or overruns is logged (rate-limited) and the round goes out with the last figures.

A coordinator that is down or slow only costs a rate-limited warning (one per coordinator per
minute, with the count of failures swallowed meanwhile) and is retried on the next tick; the
sends run in a task of their own, so nothing in the server ever waits on a coordinator. A
snapshot that cannot be built skips one round, never the loop.

Messages: ``SendHeartbeatNow`` (send a round at once, e.g. after a status change; replies
``{target: ok}``), ``AnnounceStopping`` and ``GetHeartbeatStats``.

Stopping is announced: on a graceful stop the server asks ``AnnounceStopping`` before it closes its
ports. From then on every heartbeat this actor sends says ``DECOMMISSIONED`` (whatever the snapshot
says), and one round goes out at once to every coordinator, bounded by the message's timeout. A
coordinator assigns only ACTIVE servers, so a stopping server gets no new apps during the seconds
its coordinators would otherwise wait for the heartbeat timeout. A restarted server heartbeats
ACTIVE again and is assignable at once. The flag lives in this incarnation only: a restart of the
actor while the server stops would send at most one ACTIVE round until the server's ports close.

**What survives a crash** (a permanent child of the root): nothing but the mailbox, and nothing else
needs to. The links are closed by ``on_stop`` and opened again by the next incarnation, whose first
round goes out at once, so a crash costs at most one late heartbeat (well inside the coordinator's
timeout). A ``SendHeartbeatNow`` being answered fails with ``ActorDeadError``; queued ones are
answered by the next incarnation. The counters of ``GetHeartbeatStats`` start again from zero.

It does not cover: the wire (``riffle_actors.transport.coordinator_client`` implements
``CoordinatorLink`` over gRPC and maps each snapshot field to the protobuf request), computing the
figures (``riffle_actors.admin.AdminService.heartbeat_snapshot``) or the coordinator side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from loguru import logger

from riffle_actors import __version__
from riffle_actors.log import RateLimitedLog
from riffle_actors.runtime import Actor, ActorDeadError, Cancel, Clock, ScheduleEvery, SystemClock

#: Tags every server sends: the protocol generation the 0.10 client requires, and our transport.
BASE_TAGS = ("ss_v5", "GRPC")
NETTY_TAG = "GRPC_NETTY"


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
    # block integrity totals (docs/faults.md "Integrity"), sent as displayMetrics: corrupt_blocks,
    # corrupt_reads_refused, refused_blocks, repaired_blocks
    integrity: tuple[tuple[str, int], ...] = ()

    @property
    def server_id(self) -> str:
        base = f"{self.ip}-{self.grpc_port}"
        return f"{base}-{self.netty_port}" if self.netty_port > 0 else base

    @property
    def all_tags(self) -> tuple[str, ...]:
        tags = list(BASE_TAGS) + ([NETTY_TAG] if self.netty_port > 0 else [])
        return tuple(dict.fromkeys(tags + list(self.tags)))  # ordered, no duplicates


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAck:
    """What one coordinator made of one heartbeat: ``ok``, or the reason it failed (for the log)."""

    ok: bool
    problem: str = ""


class CoordinatorLink(Protocol):
    """One coordinator of the quorum, as the heartbeat actor needs it.

    ``send_heartbeat`` reports a refusal or an unreachable coordinator as ``HeartbeatAck(ok=False)``
    (an exception counts as a failure too); ``close`` releases the connection.
    """

    async def send_heartbeat(self, snapshot: HeartbeatSnapshot, timeout_s: float) -> HeartbeatAck: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SendHeartbeatNow:
    """Send a round now; replies ``{coordinator: True/False}``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnounceStopping:
    """The server is stopping: heartbeat ``DECOMMISSIONED`` from now on, one round at once.

    Replies ``{coordinator: True/False}`` within ``timeout_s`` (a coordinator that does not answer
    in time counts as False; the stop never waits longer for it).
    """

    timeout_s: float = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GetHeartbeatStats:
    """Replies ``HeartbeatStats``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatStats:
    rounds: int
    sent_ok: int
    failed: int
    reachable: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatDue:
    """Told by the timer every interval: send a periodic round (skipped while one is under way)."""


HeartbeatMsg = SendHeartbeatNow | AnnounceStopping | GetHeartbeatStats | HeartbeatDue

#: The status a stopping server reports (Uniffle: "done draining, about to leave").
STOPPING_STATUS = "DECOMMISSIONED"


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
        connect: Callable[[str], CoordinatorLink],
        warn_every_s: float = 60.0,
        refresh: Callable[[], Awaitable[None]] | None = None,
        timer_name: str = "timer",
    ):
        """``connect(target)`` opens the link to one coordinator (``GrpcCoordinatorLink`` in the server)."""
        self.quorum = list(dict.fromkeys(quorum))
        self.interval_s = interval_s
        self.snapshot = snapshot
        self.connect = connect
        self.refresh = refresh
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._warn = RateLimitedLog(warn_every_s, monotonic=self.clock.monotonic)
        self._links: dict[str, CoordinatorLink] = {}
        self._reachable: dict[str, bool] = {}
        self.timer_name = timer_name
        self._timer_key = f"heartbeat:{id(self)}"
        self._periodic_running = False
        self.stopping = False
        self.rounds = 0
        self.sent_ok = 0
        self.failed = 0

    async def on_start(self) -> None:
        for target in self.quorum:
            self._links[target] = self.connect(target)
        if not self.quorum:
            logger.warning("no coordinator_quorum configured: this server will not be assigned by any coordinator")
            return
        timer = self.system.get(self.timer_name)
        if timer is None:
            raise RuntimeError(f"no {self.timer_name!r} actor: the heartbeat's rounds are due on the server's timer")
        self._timer_key = f"heartbeat:{self.ref.name}"
        timer.tell_nowait(ScheduleEvery(self._timer_key, self.interval_s, self.ref, HeartbeatDue(), first_delay_s=0.0))

    async def on_stop(self) -> None:
        timer = self.system.get(self.timer_name)
        if timer is not None:
            try:
                timer.tell_nowait(Cancel(self._timer_key))
            except ActorDeadError:
                pass
        links, self._links = self._links, {}
        await asyncio.gather(*(link.close() for link in links.values()), return_exceptions=True)

    def receive(self, msg: HeartbeatMsg) -> Any:
        match msg:
            case SendHeartbeatNow():
                return self._round()
            case AnnounceStopping(timeout_s=timeout_s):
                self.stopping = True
                return self._announce(timeout_s)
            case HeartbeatDue():
                if not self._periodic_running:  # the sends run in a task: the mailbox stays free
                    self._periodic_running = True
                    self.spawn(self._periodic_round())
                return None
            case GetHeartbeatStats():
                return HeartbeatStats(
                    rounds=self.rounds, sent_ok=self.sent_ok, failed=self.failed, reachable=dict(self._reachable)
                )
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    async def _periodic_round(self) -> None:
        try:
            await self._refresh()
            await self._round()
        finally:
            self._periodic_running = False

    async def _refresh(self) -> None:
        if self.refresh is None:
            return
        try:
            await asyncio.wait_for(self.refresh(), timeout=self.interval_s / 2)
        except Exception as e:  # noqa: BLE001 - the round still goes out, with the last figures
            log_now, suppressed = self._warn.should_log("refresh")
            if log_now:
                more = f" ({suppressed} more since the last warning)" if suppressed else ""
                logger.warning("could not refresh the heartbeat's figures: {!r}{}", e, more)

    async def _announce(self, timeout_s: float) -> dict[str, bool]:
        if not self._links:
            return {}
        results = await self._round(timeout_s)
        told = sorted(t for t, ok in results.items() if ok)
        missed = sorted(t for t in self._links if not results.get(t))
        if missed:
            logger.warning("announced the stop to {} of {} coordinators; not reached: {}",
                           len(told), len(self._links), ", ".join(missed))
        else:
            logger.info("announced the stop to every coordinator ({})", ", ".join(told))
        return results

    async def _round(self, timeout_s: float | None = None) -> dict[str, bool]:
        try:
            snapshot = self.snapshot()
        except Exception:  # noqa: BLE001 - a broken snapshot skips one round, never the loop
            logger.exception("cannot build the heartbeat; skipping this round")
            return {}
        if self.stopping:
            snapshot = replace(snapshot, status=STOPPING_STATUS, is_healthy=False)
        self.rounds += 1
        targets = list(self._links)
        timeout = self.interval_s if timeout_s is None else min(timeout_s, self.interval_s)
        results = await asyncio.gather(*(self._send(t, snapshot, timeout) for t in targets))
        return dict(zip(targets, results))

    async def _send(self, target: str, snapshot: HeartbeatSnapshot, timeout_s: float) -> bool:
        link = self._links.get(target)
        if link is None:
            return False
        try:
            ack = await link.send_heartbeat(snapshot, timeout_s)
            ok, problem = ack.ok, ack.problem
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
