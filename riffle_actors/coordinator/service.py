"""CoordinatorService: the transport-agnostic use cases of ``riffle-coordinator``.

Both adapters call it and nothing else: the gRPC ``CoordinatorServer`` servicer
(``riffle_actors.transport.coordinator_grpc``) and the HTTP JSON API
(``riffle_actors.transport.coordinator_http``). It takes decoded, typed values and asks the
state actors (``ClusterActor``, ``AppRegistryActor``); expected failures are ``RiffleError``
subclasses whose wire status is mapped in one place (``riffle_actors.errors.to_status``), as on
the shuffle server:

| use case | failure -> status |
|---|---|
| ``server_heartbeat`` | malformed -> INVALID_REQUEST; outside ``allowed_networks``, or refused -> ACCESS_DENIED |
| ``assign_shuffle`` | malformed or out of bounds (``validation.assignment_problem``: app id, ``max_partitions_per_assignment``, ``max_data_replica``, ...) -> INVALID_REQUEST naming the key; too few candidates -> INTERNAL_ERROR naming why |
| ``register_app`` / ``app_heartbeat`` | bad app id or fields (``validation.app_request_problem``) -> INVALID_REQUEST; a new app while ``[app] max_apps`` are live -> ACCESS_DENIED naming the key |

A heartbeat is checked in this order: malformed (the adapter hands a ``MalformedHeartbeat`` built
by ``validation.heartbeat_problems``), ``validation.source_problem`` (outside ``[server]
allowed_networks``), then the registry's admission rules (id conflict, ``max_servers``,
``max_servers_per_host``). Only a heartbeat that passes all three reaches the registry. Every
refusal is counted in ``heartbeats_refused`` by kind (``invalid``, ``source_not_allowed``,
``id_conflict``, ``registry_full``, ``host_limit``; shown by ``/api/health``); the first two are
logged here with the peer address (repeats of the same one at the 1st, 10th, 100th, ...
occurrence), the registry logs its own.

Operator actions: ``set_server_status`` (an override) and, for DECOMMISSIONING / ACTIVE, the
server's own ``ShuffleServerInternal.decommission`` / ``cancelDecommission`` through the injected
``tell_server`` (as upstream's coordinator does; the composition root hands in the transport's
call): ``decommission`` answers a ``StatusChange`` with the view and what the server said
(``ServerTold``). The queries behind Uniffle's REST routes (``nodes``, ``status_summary``,
``find_apps``, ``user_totals``, ``apps_by_registration``) answer typed views the adapter encodes.

Counters (refusals, assignments) go into the ``CoordinatorCounters`` handed in
(``coordinator.metrics``), read by ``coordinator.admin`` for ``/api/health`` and ``/metrics``.

It does not cover: protobuf or JSON (the adapters), health, metrics and the coordinator's own
description (``admin.py``), the state rules (``cluster.py``, ``apps.py``, ``assignment.py``) or
wiring (``riffle_actors.coordinator_server``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from loguru import logger

from riffle_actors.coordinator import actors as msgs
from riffle_actors.coordinator.apps import AppRegistryFull, AppStats, AppView
from riffle_actors.coordinator.assignment import Assignment, AssignmentError, AssignmentRequest
from riffle_actors.coordinator.cluster import HeartbeatRefused, ServerHeartbeat, ServerStatus, ServerView
from riffle_actors.coordinator.config import CoordinatorConfig
from riffle_actors.coordinator.metrics import CoordinatorCounters
from riffle_actors.coordinator.validation import (
    AppFilter,
    MalformedHeartbeat,
    RepeatFilter,
    app_request_problem,
    assignment_problem,
    parse_networks,
    show,
    source_problem,
)
from riffle_actors.errors import AccessDeniedError, InternalError, InvalidRequestError
from riffle_actors.runtime import ActorRef

#: ``tell_server(view, "decommission" | "cancelDecommission") -> (ok, message)``: the server's own call.
TellServer = Callable[[ServerView, str], Awaitable[tuple[bool, str]]]

#: Apps matched between two turns of the event loop (``find_apps``).
MATCH_SLICE = 1000

_TELL_ACTIONS = {ServerStatus.DECOMMISSIONING: "decommission", ServerStatus.ACTIVE: "cancelDecommission"}


@dataclass(frozen=True, slots=True)
class ServerTold:
    """What a server answered when the coordinator told it about a decommission or its cancellation."""

    action: str  # "decommission" or "cancelDecommission"
    ok: bool
    message: str


@dataclass(frozen=True, slots=True)
class StatusChange:
    """An operator's status override and, when the server was told, its answer."""

    view: ServerView
    told: ServerTold | None = None


class CoordinatorService:
    """See the module docstring."""

    def __init__(self, cfg: CoordinatorConfig, *, cluster_ref: ActorRef, apps_ref: ActorRef,
                 counters: CoordinatorCounters | None = None, tell_server: TellServer | None = None):
        self.cluster_ref = cluster_ref
        self.apps_ref = apps_ref
        self.client_conf: tuple[tuple[str, str], ...] = tuple(cfg.client_conf.items())
        self.remote_storage_path: str = cfg.remote_storage.path
        self.remote_storage_conf: tuple[tuple[str, str], ...] = tuple(cfg.remote_storage.conf.items())
        self._networks = parse_networks(cfg.server.allowed_networks)
        self.max_partitions_per_assignment = cfg.max_partitions_per_assignment
        self.max_data_replica = cfg.max_data_replica
        self.counters = counters if counters is not None else CoordinatorCounters()
        self.tell_server = tell_server
        self._refusal_log = RepeatFilter()

    # ---------------------------------------------------------------- shuffle servers
    async def server_heartbeat(self, beat: ServerHeartbeat | MalformedHeartbeat, peer: str | None) -> None:
        """(Re-)register a server; raises ``InvalidRequestError`` / ``AccessDeniedError`` with the reason."""
        if isinstance(beat, MalformedHeartbeat):
            message = beat.message
            self._log_refusal("invalid", message, peer, beat.server_id)
            raise InvalidRequestError(message)
        source = source_problem(peer, beat.ip, self._networks)
        if source is not None:
            self._log_refusal("source_not_allowed", source, peer, beat.id)
            raise AccessDeniedError(source)
        try:
            await self.cluster_ref.ask(msgs.RecordHeartbeat(heartbeat=beat, peer_host=peer))
        except HeartbeatRefused as e:
            self.counters.heartbeats_refused[e.kind] += 1  # the registry logs its refusals itself (once per change)
            raise AccessDeniedError(str(e)) from None

    def _log_refusal(self, kind: str, message: str, peer: str | None, server_id: str) -> None:
        self.counters.heartbeats_refused[kind] += 1
        count = self._refusal_log.hit((kind, peer, message))
        if count is not None:
            seen = f" (seen {count} times)" if count > 1 else ""
            who = peer or "an unknown peer"
            logger.warning("refused heartbeat from {} (serverId.id {}): {}{}", who, show(server_id), message,
                           seen)

    async def list_servers(self) -> list[ServerView]:
        """Every registered server, by id."""
        views: list[ServerView] = await self.cluster_ref.ask(msgs.ListServers())
        return views

    async def server(self, server_id: str) -> ServerView | None:
        return next((v for v in await self.list_servers() if v.node.id == server_id), None)

    async def service_available(self) -> bool:
        """Can some server take new partitions?"""
        n: int = await self.cluster_ref.ask(msgs.CountCandidates())
        return n > 0

    async def set_server_status(self, server_id: str, status: ServerStatus) -> ServerView:
        """Operator override: DECOMMISSIONING, DECOMMISSIONED, or ACTIVE to clear it. Raises ``InvalidRequestError``
        for another status and ``msgs.UnknownServerError`` for an unknown id."""
        if status not in (ServerStatus.ACTIVE, ServerStatus.DECOMMISSIONING, ServerStatus.DECOMMISSIONED):
            raise InvalidRequestError(f"status must be ACTIVE, DECOMMISSIONING or DECOMMISSIONED, not {status.name}")
        view: ServerView = await self.cluster_ref.ask(
            msgs.SetServerStatus(server_id=server_id, status=status))
        return view

    async def set_server_tags(self, server_id: str, *, add: Sequence[str] = (),
                              remove: Sequence[str] = ()) -> ServerView:
        """Operator tags: added to what the server reports. Raises ``InvalidRequestError`` for an empty
        tag or a tag the server reports itself, ``msgs.UnknownServerError`` for an unknown id."""
        for tag in (*add, *remove):
            if not isinstance(tag, str) or not tag.strip() or tag != tag.strip() or len(tag) > 128:
                raise InvalidRequestError(f"tag {tag!r} must be a non-empty string without surrounding "
                                          f"spaces, at most 128 characters")
        try:
            view: ServerView = await self.cluster_ref.ask(
                msgs.SetServerTags(server_id=server_id, add=tuple(add), remove=tuple(remove)))
        except ValueError as e:  # a tag the server reports itself
            raise InvalidRequestError(str(e)) from None
        return view

    async def decommission(self, server_id: str, status: ServerStatus) -> StatusChange:
        """``set_server_status``, then tell the server itself about a DECOMMISSIONING or its cancellation
        (ACTIVE) when a ``tell_server`` is wired; the view is read again after the server answered (its
        heartbeat may have come meanwhile). Raises as ``set_server_status``."""
        view = await self.set_server_status(server_id, status)
        told = await self._tell(view, status)
        if told is not None:
            view = await self.server(server_id) or view
        return StatusChange(view, told)

    async def decommission_many(self, server_ids: Sequence[str], status: ServerStatus) -> list[StatusChange]:
        """``set_server_status`` for each id in order (the first failure raises; the ones before it
        stay set, as upstream), then every server told at once."""
        views = [await self.set_server_status(sid, status) for sid in server_ids]
        answers = await asyncio.gather(*(self._tell(v, status) for v in views))
        return [StatusChange(v, told) for v, told in zip(views, answers)]

    async def _tell(self, view: ServerView, status: ServerStatus) -> ServerTold | None:
        action = _TELL_ACTIONS.get(status)
        if self.tell_server is None or action is None:
            return None
        try:
            ok, message = await self.tell_server(view, action)
        except Exception as e:  # noqa: BLE001 - the override stands; the answer says what failed
            ok, message = False, repr(e)
        return ServerTold(action, ok, message)

    async def app_stats(self) -> AppStats:
        stats: AppStats = await self.apps_ref.ask(msgs.GetAppStats())
        return stats

    # ---------------------------------------------------------------- drivers
    async def assign_shuffle(self, app_id: str, shuffle_id: int, request: AssignmentRequest, *,
                             require_tags: Sequence[str] = (), faulty_ids: Sequence[str] = (),
                             ) -> tuple[Assignment, dict[str, ServerHeartbeat]]:
        """Servers for each partition range of a shuffle; raises ``InvalidRequestError`` for a request out of
        bounds and ``InternalError`` naming why there are too few servers. The app (when named) is credited."""
        problem = assignment_problem(
            app_id, shuffle_id, partition_num=request.partition_num, per_range=request.partitions_per_range,
            replica=request.replica, require_tags=require_tags, faulty_ids=faulty_ids,
            max_partitions=self.max_partitions_per_assignment, max_replica=self.max_data_replica)
        if problem is not None:
            self._refuse("assignment_invalid", f"getShuffleAssignments: {problem}")
            raise InvalidRequestError(problem)
        try:
            assignment, servers = await self.cluster_ref.ask(msgs.AssignShuffle(
                request=request, require_tags=tuple(require_tags), faulty_ids=tuple(faulty_ids)))
        except AssignmentError as e:
            self.counters.assignment_failures_total += 1
            logger.warning("no assignment for app {} shuffle {}: {}", app_id, shuffle_id, e)
            raise InternalError(str(e)) from None
        self.counters.assignments_total += 1
        self.counters.assigned_partitions_total += request.partition_num * request.replica
        if app_id:
            await self.apps_ref.tell(msgs.RecordAssignment(app_id=app_id, partitions=request.partition_num,
                                                           server_ids=tuple(sorted(servers))))
        logger.info("app {} shuffle {}: {} partition(s) x{} on {}",
                    app_id, shuffle_id, request.partition_num, request.replica, sorted(servers))
        return assignment, servers

    async def register_app(self, app_id: str, *, user: str = "", version: str = "",
                           git_commit_id: str = "") -> None:
        """``registerApplicationInfo``; raises ``InvalidRequestError`` or ``AccessDeniedError`` (registry full)."""
        problem = app_request_problem(app_id, user=user, version=version, git_commit_id=git_commit_id)
        if problem is not None:
            self._refuse("app_invalid", f"registerApplicationInfo: {problem}")
            raise InvalidRequestError(problem)
        await self._ask_apps(msgs.RegisterApp(app_id=app_id, user=user, version=version, git_commit_id=git_commit_id))

    async def app_heartbeat(self, app_id: str) -> None:
        """``appHeartbeat``; raises as ``register_app``."""
        problem = app_request_problem(app_id)
        if problem is not None:
            self._refuse("app_invalid", f"appHeartbeat: {problem}")
            raise InvalidRequestError(problem)
        await self._ask_apps(msgs.AppHeartbeat(app_id=app_id))

    async def _ask_apps(self, msg: msgs.RegisterApp | msgs.AppHeartbeat) -> None:
        try:
            await self.apps_ref.ask(msg)
        except AppRegistryFull as e:
            self._refuse("apps_full", f"app {msg.app_id}: {e}")
            raise AccessDeniedError(str(e)) from None

    def _refuse(self, kind: str, message: str) -> None:
        """Count a refused driver request; log it at the 1st, 10th, 100th, ... time of its kind."""
        self.counters.requests_refused[kind] += 1
        count = self._refusal_log.hit(("driver", kind))
        if count is not None:
            seen = f" ({count} refused so far)" if count > 1 else ""
            logger.warning("refused {}{}", message, seen)

    async def list_apps(self, *, historical: bool = False) -> list[AppView]:
        """Live apps, or the expired ones (newest first) when ``historical``."""
        views: list[AppView] = await self.apps_ref.ask(msgs.ListKnownApps(historical=historical))
        return views

    # ---------------------------------------------------------------- Uniffle's REST queries
    async def nodes(self, status: str | None = None) -> list[ServerView]:
        """Upstream's ``/api/server/nodes``: without ``status`` the servers not excluded; ``EXCLUDED``
        the excluded ones; another status name (any case) the ones not excluded in that status."""
        views = await self.list_servers()
        if status is not None and status.upper() == ServerStatus.EXCLUDED.name:
            return [v for v in views if v.excluded]
        return [v for v in views if not v.excluded and (status is None or v.status.name == status.upper())]

    async def status_summary(self) -> dict[str, int]:
        """``{status name: count}`` over every registered server."""
        return dict(Counter(v.status.name for v in await self.list_servers()))

    async def find_apps(self, wanted: AppFilter) -> list[AppView]:
        """One page of the live apps ``wanted`` matches, sorted by id; the loop gets a turn every
        ``MATCH_SLICE`` apps (a regex over 10000 apps must not hold it)."""
        chosen: list[AppView] = []
        live = await self.list_apps()
        for first in range(0, len(live), MATCH_SLICE):
            chosen.extend(a for a in live[first:first + MATCH_SLICE]
                          if wanted.matches(a.app_id, a.last_heartbeat_epoch_ms))
            if first + MATCH_SLICE < len(live):
                await asyncio.sleep(0)  # a turn of the loop, not a wait
        chosen.sort(key=lambda a: a.app_id)
        first = (wanted.page - 1) * wanted.page_size
        return chosen[first:first + wanted.page_size]

    async def user_totals(self) -> list[tuple[str, int]]:
        """``(user, live apps)``, most apps first."""
        per_user = Counter(a.user for a in await self.list_apps())
        return sorted(per_user.items(), key=lambda kv: -kv[1])

    async def apps_by_registration(self) -> list[AppView]:
        """Live apps, newest registration first."""
        return sorted(await self.list_apps(), key=lambda a: a.registered_epoch_ms, reverse=True)

    def access_cluster(self) -> str:
        """A fresh access id (every client is let in)."""
        return uuid.uuid4().hex

    def client_operation(self, client_host: str, client_port: int, operation: str, server_id: str) -> None:
        logger.info("client {}:{} reports {} on server {}", show(client_host), client_port, show(operation),
                    show(server_id))
