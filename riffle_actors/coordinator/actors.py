"""The actors that own the coordinator's state: ``ClusterActor`` and ``AppRegistryActor``.

Each actor wraps one pure state object and only routes messages to it (the logic and its tests
live in ``cluster.py`` / ``apps.py``), then logs the ``events.RegistryEvent``s the registry returned
(``log_events``):

- ``ClusterActor`` owns the ``ClusterRegistry`` (server heartbeats, assignment bookkeeping,
  operator status overrides) and the exclude-nodes file (``riffle_actors.io.exclude_file``): on
  ``PollExcludeFile`` it re-reads the file in a thread if its mtime changed (one read at a time;
  the mailbox is not blocked meanwhile) and applies the new list with ``SetExcluded``.
- ``AppRegistryActor`` owns the ``AppRegistry``.

Periodic work comes from the runtime's ``TimerActor``, which the composition root
(``riffle_actors.coordinator_server``) schedules: ``ExpireServers`` / ``ExpireApps`` every
``expiry_check_interval_sec`` and ``PollExcludeFile`` every ``exclude_nodes_check_interval_sec``;
with a ``ManualClock`` a test's ``clock.advance(...)`` drives them. Neither actor sleeps.
Expected failures (``AssignmentError``, ``HeartbeatRefused``, unknown server, bad status,
``AppRegistryFull``) go back to the asker and never crash the actor.

It does not cover: the use cases (``service.py``), gRPC/HTTP decoding (``riffle_actors.transport``) or
wiring (``riffle_actors.coordinator_server``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from riffle_actors.coordinator.apps import AppRegistry, AppRegistryFull, AppView
from riffle_actors.coordinator.assignment import Assignment, AssignmentError, AssignmentRequest
from riffle_actors.coordinator.cluster import ClusterRegistry, HeartbeatRefused, ServerHeartbeat, ServerStatus
from riffle_actors.coordinator.events import RegistryEvent
from riffle_actors.io.exclude_file import ExcludeFile
from riffle_actors.runtime import Actor


class UnknownServerError(KeyError):
    """An operator named a server id the coordinator does not know."""

    def __str__(self) -> str:
        return f"unknown server {self.args[0]!r}"


# ----------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireServers:
    """From the timer: drop servers silent for ``heartbeat_timeout_sec``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PollExcludeFile:
    """From the timer: re-read the exclude-nodes file if it changed (no-op without one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordHeartbeat:
    """A validated server heartbeat; replies True when the server is new, raises ``HeartbeatRefused``."""

    heartbeat: ServerHeartbeat
    peer_host: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AssignShuffle:
    """Choose servers for a shuffle; replies ``(Assignment, {server_id: ServerHeartbeat})``."""

    request: AssignmentRequest
    require_tags: tuple[str, ...] = ()
    faulty_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ListServers:
    """Replies ``list[ServerView]`` (every registered server, by id)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CountCandidates:
    """Replies the number of servers that could take new partitions (ACTIVE, not excluded)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetServerStatus:
    """Operator override (DECOMMISSIONING, or ACTIVE to clear); replies the server's new ``ServerView``."""

    server_id: str
    status: ServerStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class SetServerTags:
    """Add / remove operator tags; replies the server's new ``ServerView`` (``ValueError`` for a tag
    the server reports itself)."""

    server_id: str
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GetRegistryStats:
    """Replies ``cluster.RegistryStats`` (admission counters for ``/api/health``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetExcluded:
    """Replace the exclude list (tests and the file poll use it)."""

    server_ids: frozenset[str]


ClusterMsg = (
    ExpireServers | PollExcludeFile | RecordHeartbeat | AssignShuffle | ListServers | CountCandidates | SetServerStatus | SetExcluded
    | GetRegistryStats | SetServerTags
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterApp:
    """Record an app (ask it: raises ``AppRegistryFull`` for a new id when ``[app] max_apps`` are live)."""

    app_id: str
    user: str = ""
    version: str = ""
    git_commit_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppHeartbeat:
    """Keep an app alive (ask it: raises ``AppRegistryFull`` as ``RegisterApp``)."""

    app_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordAssignment:
    app_id: str
    partitions: int
    server_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListKnownApps:
    """Replies ``list[AppView]``: live apps, or the history when ``historical``."""

    historical: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GetAppStats:
    """Replies ``apps.AppStats`` (coordinator metrics)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireApps:
    """From the timer: move apps silent for ``[app] heartbeat_timeout_sec`` to the history."""


AppRegistryMsg = ExpireApps | RegisterApp | AppHeartbeat | RecordAssignment | ListKnownApps | GetAppStats


# ----------------------------------------------------------------------------- actors


def log_events(events: Iterable[RegistryEvent]) -> None:
    """Write a registry's events to the log (the pure registries never log themselves)."""
    for event in events:
        logger.log(event.level, "{}", event.message)


class ClusterActor(Actor):
    """Owns the server registry and the exclude-nodes file; see the module docstring."""

    expected_errors = (AssignmentError, HeartbeatRefused, UnknownServerError, ValueError)

    def __init__(self, registry: ClusterRegistry, *, exclude_file: ExcludeFile | None = None):
        self.registry = registry
        self.exclude_file = exclude_file
        self._polling = False  # a read of the exclude file is running in a thread

    async def _poll_exclude(self, exclude_file: ExcludeFile) -> None:
        try:
            ids = await asyncio.to_thread(exclude_file.poll)
        finally:
            self._polling = False
        if ids is not None:
            await self.ref.tell(SetExcluded(server_ids=ids))

    def receive(self, msg: ClusterMsg) -> Any:
        try:
            return self._handle(msg)
        finally:
            log_events(self.registry.take_events())

    def _handle(self, msg: ClusterMsg) -> Any:
        match msg:
            case RecordHeartbeat(heartbeat=hb, peer_host=peer):
                return self.registry.heartbeat(hb, peer_host=peer)
            case AssignShuffle(request=request, require_tags=tags, faulty_ids=faulty):
                result: tuple[Assignment, dict[str, ServerHeartbeat]] = self.registry.assign(
                    request, require_tags=tags, faulty_ids=faulty
                )
                return result
            case ListServers():
                return self.registry.views()
            case CountCandidates():
                return len(self.registry.candidates())
            case GetRegistryStats():
                return self.registry.stats()
            case SetServerStatus(server_id=sid, status=status):
                if self.registry.get(sid) is None:
                    raise UnknownServerError(sid)
                self.registry.set_operator_status(sid, status)
                return next(v for v in self.registry.views() if v.node.id == sid)
            case SetServerTags(server_id=sid, add=add, remove=remove):
                if self.registry.get(sid) is None:
                    raise UnknownServerError(sid)
                self.registry.set_operator_tags(sid, add=add, remove=remove)
                return next(v for v in self.registry.views() if v.node.id == sid)
            case SetExcluded(server_ids=ids):
                self.registry.set_excluded(ids)
            case ExpireServers():
                self.registry.expire()
            case PollExcludeFile():
                if self.exclude_file is not None and not self._polling:
                    self._polling = True
                    self.spawn(self._poll_exclude(self.exclude_file))
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None


class AppRegistryActor(Actor):
    """Owns the application registry; see the module docstring."""

    expected_errors = (AppRegistryFull,)

    def __init__(self, registry: AppRegistry):
        self.registry = registry

    def receive(self, msg: AppRegistryMsg) -> Any:
        try:
            return self._handle(msg)
        finally:
            log_events(self.registry.take_events())

    def _handle(self, msg: AppRegistryMsg) -> Any:
        match msg:
            case RegisterApp(app_id=app_id, user=user, version=version, git_commit_id=git):
                self.registry.register(app_id, user=user, version=version, git_commit_id=git)
            case AppHeartbeat(app_id=app_id):
                self.registry.heartbeat(app_id)
            case RecordAssignment(app_id=app_id, partitions=partitions, server_ids=server_ids):
                self.registry.record_assignment(app_id, partitions=partitions, server_ids=server_ids)
            case ListKnownApps(historical=historical):
                views: list[AppView] = self.registry.history() if historical else self.registry.active()
                return views
            case GetAppStats():
                return self.registry.stats()
            case ExpireApps():
                self.registry.expire()
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None
