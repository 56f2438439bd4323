"""The application registry: which Spark apps are alive, and a bounded history of finished ones (pure).

This module owns the coordinator's view of applications: ``registerApplicationInfo`` records an
app (user, client version), ``appHeartbeat`` and ``getShuffleAssignments`` keep it alive, and
``expire()`` moves apps silent for ``heartbeat_timeout_s`` (injected clock) to a history that
keeps only the newest ``history_size`` entries. At most ``max_apps`` apps are live: a new app
id beyond that raises ``AppRegistryFull`` (the service answers ACCESS_DENIED naming ``[app]
max_apps``), while apps already registered keep heartbeating; an assignment of an app that
cannot be registered is simply not credited. Ids are checked by the caller
(``protocol.ids.check_app_id``) before they get here, so every id and every log line is bounded. Per-app counters (shuffles assigned,
partitions, servers used) let tests and operators check that a job really went through us.

It does not cover: purging app data (shuffle servers do that themselves when the app stops
heartbeating them) or timers (``actors.py`` is told ``ExpireApps`` by the ``TimerActor``). Pure: the
registrations and expiries are returned as ``events.RegistryEvent``s (``take_events()``), logged by
the owning actor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from riffle_actors.coordinator.events import EventOutbox, RegistryEvent
from riffle_actors.runtime import Clock


class AppRegistryFull(Exception):
    """A new app id while ``max_apps`` apps are live; the message names the key."""


@dataclass(slots=True, kw_only=True)
class _App:
    app_id: str
    user: str = ""
    version: str = ""
    git_commit_id: str = ""
    registered_epoch_ms: int
    last_heartbeat_monotonic: float
    last_heartbeat_epoch_ms: int
    shuffles: int = 0
    partitions: int = 0
    servers: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True, kw_only=True)
class AppStats:
    """The registry's counts (``/metrics``, Uniffle's ``/api/app/total``)."""

    active: int
    historical: int
    expired_total: int
    registered_total: int
    refused_total: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AppView:
    """An immutable snapshot of one app; ``expired_epoch_ms`` is set for historical apps."""

    app_id: str
    user: str
    version: str
    git_commit_id: str
    registered_epoch_ms: int
    last_heartbeat_epoch_ms: int
    shuffles: int
    partitions: int
    servers: tuple[str, ...]
    expired_epoch_ms: int | None = None


class AppRegistry:
    """Live apps keyed by app id, plus the newest ``history_size`` expired ones."""

    def __init__(self, *, clock: Clock, heartbeat_timeout_s: float, history_size: int = 1000,
                 max_apps: int = 10000):
        self.clock = clock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_apps = max_apps
        self.refused_total = 0
        self._apps: dict[str, _App] = {}
        self._history: deque[AppView] = deque(maxlen=history_size)
        self.expired_total = 0
        self.registered_total = 0
        self.outbox = EventOutbox()  # registrations and expiries, logged by the owning actor

    def take_events(self) -> list[RegistryEvent]:
        """What happened since the last call (``events.RegistryEvent``), for the owner to log."""
        return self.outbox.take_events()

    def _touch(self, app_id: str) -> _App:
        now_m, now_ms = self.clock.monotonic(), int(self.clock.time() * 1000)
        app = self._apps.get(app_id)
        if app is None:
            if len(self._apps) >= self.max_apps:
                self.refused_total += 1
                raise AppRegistryFull(f"the coordinator already tracks {len(self._apps)} live apps ([app] max_apps = "
                                      f"{self.max_apps}); a new app is refused until some expire")
            app = _App(app_id=app_id, registered_epoch_ms=now_ms, last_heartbeat_monotonic=now_m, last_heartbeat_epoch_ms=now_ms)
            self._apps[app_id] = app
            self.registered_total += 1
            self.outbox.info("app_registered", f"app {app_id} registered")
        else:
            app.last_heartbeat_monotonic, app.last_heartbeat_epoch_ms = now_m, now_ms
        return app

    def register(self, app_id: str, *, user: str = "", version: str = "", git_commit_id: str = "") -> None:
        """``registerApplicationInfo``: record (or refresh) an app and who runs it."""
        app = self._touch(app_id)
        app.user = user or app.user
        app.version = version or app.version
        app.git_commit_id = git_commit_id or app.git_commit_id

    def heartbeat(self, app_id: str) -> None:
        """``appHeartbeat``: keep the app alive (an unknown app is registered without a user)."""
        self._touch(app_id)

    def record_assignment(self, app_id: str, *, partitions: int, server_ids: Iterable[str]) -> None:
        """A shuffle of ``app_id`` got servers; counts as activity (not credited when the registry is full)."""
        try:
            app = self._touch(app_id)
        except AppRegistryFull:
            return
        app.shuffles += 1
        app.partitions += partitions
        app.servers.update(server_ids)

    def expire(self) -> list[str]:
        """Move apps silent for longer than the timeout to the history; returns their ids."""
        deadline = self.clock.monotonic() - self.heartbeat_timeout_s
        gone = [a for a in self._apps.values() if a.last_heartbeat_monotonic < deadline]
        now_ms = int(self.clock.time() * 1000)
        for app in gone:
            del self._apps[app.app_id]
            self._history.append(_view(app, expired_epoch_ms=now_ms))
            self.outbox.info("app_expired", f"app {app.app_id} expired: no heartbeat for {self.heartbeat_timeout_s}s")
        self.expired_total += len(gone)
        return [a.app_id for a in gone]

    def stats(self) -> AppStats:
        """Counts for the coordinator's metrics."""
        return AppStats(active=len(self._apps), historical=len(self._history), expired_total=self.expired_total,
                        registered_total=self.registered_total, refused_total=self.refused_total)

    def __contains__(self, app_id: object) -> bool:
        return app_id in self._apps

    def __len__(self) -> int:
        return len(self._apps)

    def active(self) -> list[AppView]:
        """Live apps, oldest registration first."""
        return [_view(a) for a in sorted(self._apps.values(), key=lambda a: (a.registered_epoch_ms, a.app_id))]

    def history(self) -> list[AppView]:
        """Expired apps, most recently expired first."""
        return list(reversed(self._history))


def _view(app: _App, *, expired_epoch_ms: int | None = None) -> AppView:
    return AppView(
        app_id=app.app_id,
        user=app.user,
        version=app.version,
        git_commit_id=app.git_commit_id,
        registered_epoch_ms=app.registered_epoch_ms,
        last_heartbeat_epoch_ms=app.last_heartbeat_epoch_ms,
        shuffles=app.shuffles,
        partitions=app.partitions,
        servers=tuple(sorted(app.servers)),
        expired_epoch_ms=expired_epoch_ms,
    )
