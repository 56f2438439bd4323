"""The actors that own the coordinator's state: ``ClusterActor`` and ``AppRegistryActor``.

Each actor wraps one pure state object and only routes messages to it (the logic and its tests
live in ``cluster.py`` / ``apps.py``):

- ``ClusterActor`` owns the ``ClusterRegistry`` (server heartbeats, assignment bookkeeping,
  operator status overrides) and the exclude-nodes file: every ``exclude_check_interval_s`` it
  re-reads the file if its mtime changed.
- ``AppRegistryActor`` owns the ``AppRegistry``.

Both expire silent members on a periodic ``Tick`` that a task owned by the actor tells itself
after ``clock.sleep(interval)``; with a ``ManualClock`` a test's ``clock.advance(...)`` drives it.
Expected failures (``AssignmentError``, ``HeartbeatRefused``, unknown server, bad status,
``AppRegistryFull``) go back to the asker and never crash the actor.

It does not cover: the use cases (``service.py``), gRPC/HTTP decoding (``riffle_actors.transport``) or
wiring (``runtime.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from riffle_actors.coordinator.apps import AppRegistry, AppRegistryFull, AppView
from riffle_actors.coordinator.assignment import Assignment, AssignmentError, AssignmentRequest
from riffle_actors.coordinator.cluster import (
    ClusterRegistry,
    ExcludeFile,
    HeartbeatRefused,
    ServerHeartbeat,
    ServerStatus,
)
from riffle_actors.runtime import Actor, Clock


class UnknownServerError(KeyError):
    """An operator named a server id the coordinator does not know."""

    def __str__(self) -> str:
        return f"unknown server {self.args[0]!r}"


# ----------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """Periodic self-message: expire silent members (and poll the exclude file)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
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
class RegistryStats:
    """Replies ``ClusterRegistry.stats()`` (admission counters for ``/api/health``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetExcluded:
    """Replace the exclude list (tests and the file poll use it)."""

    server_ids: frozenset[str]


ClusterMsg = (
    Tick | Heartbeat | AssignShuffle | ListServers | CountCandidates | SetServerStatus | SetExcluded
    | RegistryStats | SetServerTags
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
class ListApps:
    """Replies ``list[AppView]``: live apps, or the history when ``historical``."""

    historical: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AppStats:
    """Replies ``{"active", "historical", "expired_total", "registered_total"}`` (coordinator metrics)."""


AppMsg = Tick | RegisterApp | AppHeartbeat | RecordAssignment | ListApps | AppStats


# ----------------------------------------------------------------------------- actors


class _Ticking(Actor):
    """Tells itself ``Tick()`` every ``tick_interval_s`` on the injected clock."""

    clock: Clock
    tick_interval_s: float

    async def on_start(self) -> None:
        self.spawn(self._ticker())

    async def _ticker(self) -> None:
        while True:
            await self.clock.sleep(self.tick_interval_s)
            await self.ref.tell(Tick())


class ClusterActor(_Ticking):
    """Owns the server registry and the exclude-nodes file; see the module docstring."""

    expected_errors = (AssignmentError, HeartbeatRefused, UnknownServerError, ValueError)

    def __init__(
        self,
        registry: ClusterRegistry,
        *,
        clock: Clock,
        tick_interval_s: float,
        exclude_file: ExcludeFile | None = None,
        exclude_check_interval_s: float = 5.0,
    ):
        self.registry = registry
        self.clock = clock
        self.tick_interval_s = tick_interval_s
        self.exclude_file = exclude_file
        self.exclude_check_interval_s = exclude_check_interval_s
        self._next_exclude_check = clock.monotonic()
        self._poll_exclude()

    def _poll_exclude(self) -> None:
        if self.exclude_file is None:
            return
        self._next_exclude_check = self.clock.monotonic() + self.exclude_check_interval_s
        ids = self.exclude_file.poll()
        if ids is not None:
            self.registry.set_excluded(ids)

    def receive(self, msg: ClusterMsg) -> Any:
        match msg:
            case Heartbeat(heartbeat=hb, peer_host=peer):
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
            case RegistryStats():
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
            case Tick():
                self.registry.expire()
                if self.exclude_file is not None and self.clock.monotonic() >= self._next_exclude_check:
                    self._poll_exclude()
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None


class AppRegistryActor(_Ticking):
    """Owns the application registry; see the module docstring."""

    expected_errors = (AppRegistryFull,)

    def __init__(self, registry: AppRegistry, *, clock: Clock, tick_interval_s: float):
        self.registry = registry
        self.clock = clock
        self.tick_interval_s = tick_interval_s

    def receive(self, msg: AppMsg) -> Any:
        match msg:
            case RegisterApp(app_id=app_id, user=user, version=version, git_commit_id=git):
                self.registry.register(app_id, user=user, version=version, git_commit_id=git)
            case AppHeartbeat(app_id=app_id):
                self.registry.heartbeat(app_id)
            case RecordAssignment(app_id=app_id, partitions=partitions, server_ids=server_ids):
                self.registry.record_assignment(app_id, partitions=partitions, server_ids=server_ids)
            case ListApps(historical=historical):
                views: list[AppView] = self.registry.history() if historical else self.registry.active()
                return views
            case AppStats():
                return self.registry.stats()
            case Tick():
                self.registry.expire()
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None
