"""The shuffle server's own lifecycle as an operator drives it: decommission, its cancellation, kill.

This module owns ``Lifecycle``, the service that the admin transports (the HTTP ``/admin`` routes
and the ``ShuffleServerInternal`` gRPC service) call:

- ``decommission()``: the server reports ``DECOMMISSIONING`` in its heartbeats from now on (a
  round is sent at once), so coordinators assign it no new partitions; it keeps serving the apps
  it has. Every ``decommission_check_interval_sec`` it looks at its app directory; once no app is
  left (a ``PeriodicJobActor`` on the server's timer checks) it stops itself through the normal graceful stop (``request_stop``: the same path as
  SIGTERM, exit code 0). As upstream Uniffle's ``ShuffleServer.decommission`` /
  ``waitDecommissionFinish`` (with ``rss.server.decommission.shutdown`` = true): a second
  decommission is a no-op that succeeds; a server already stopping refuses.
- ``cancel_decommission()``: back to ``ACTIVE``, the watch ends; a no-op that succeeds on an
  ACTIVE server (as upstream); refused once the server is stopping.
- ``kill()``: the graceful stop now, whatever the apps (our ``/admin/kill``; Riffle's
  ``?kill=force``); ``kill(force=False)`` refuses while apps are registered (Riffle's ``?kill``).
- ``update_state(name)``: Riffle's ``/admin?update_state=``, case-insensitive, one of
  ``RIFFLE_STATES``: UNHEALTHY and DECOMMISSIONED are a *manual status* reported in every
  heartbeat from now on (``isHealthy=false``: the coordinators assign the server nothing), until
  HEALTHY or ACTIVE clears it (and cancels a decommission, as Riffle's single state does);
  DECOMMISSIONING and CANCEL_DECOMMISSION are ``decommission()`` / ``cancel_decommission()``.
  Each change sends a heartbeat round at once. ``riffle_state`` is Riffle's ``?get_state``
  answer. The manual status lives in memory: a restarted server is ACTIVE again.
- ``tags`` (``ServiceTags``): the server's tags as Riffle's ``?update_tags`` / ``?add_tag`` /
  ``?delete_tag`` change them at run time (the built-in ``BUILTIN_TAGS`` always stay); the
  heartbeat reports them (``heartbeat_status``).

It does not cover: authentication (the transports guard every action with the ``[admin]``
credentials), the coordinator-side status overrides (``riffle_actors.coordinator``) or the stop
itself (``ShuffleServer.stop``).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loguru import logger

from riffle_actors.actors.heartbeat import BASE_TAGS, NETTY_TAG, HeartbeatSnapshot
from riffle_actors.runtime import ActorHost, ChildSpec, PeriodicJobActor, RestartPolicy

#: the registered name of a decommission's watch (a ``PeriodicJobActor``, child of the root)
WATCH_NAME = "decommission-watch"


class LifecycleState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    DECOMMISSIONING = "DECOMMISSIONING"
    STOPPING = "STOPPING"  # kill, or the last app of a decommission gone: the graceful stop runs


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to one operator action: whether it was done, the state after it and why."""

    ok: bool
    state: str
    message: str
    apps: int

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.state, "message": self.message, "apps": self.apps}


#: Riffle's ``ServerState`` names, as ``/admin?update_state=`` accepts them (``server_state_manager.rs``)
RIFFLE_STATES = ("ACTIVE", "DECOMMISSIONING", "CANCEL_DECOMMISSION", "DECOMMISSIONED", "UNHEALTHY", "HEALTHY")

#: Tags an operator cannot delete: what every server sends (``BASE_TAGS``, ``GRPC_NETTY``) and
#: Riffle's legacy ``ss_v4`` (Riffle's ``ServiceTagsManager`` built-ins).
BUILTIN_TAGS = frozenset((*BASE_TAGS, NETTY_TAG, "ss_v4"))

#: Bounds of one tag and of the tag list (each refusal names the bound)
MAX_TAG_LENGTH = 128
MAX_TAGS = 64


class TagError(ValueError):
    """A tag change refused (a built-in tag, a bad or too long tag, too many tags)."""


class ServiceTags:
    """The server's own tags at run time: the config's ``tags``, then what an operator changed.

    Built-in tags (``BUILTIN_TAGS``) are not held here: the heartbeat always adds them, so they
    can be neither removed nor replaced."""

    def __init__(self, initial: Sequence[str] = ()):
        self._tags: dict[str, None] = {}
        self.update([t for t in initial if t not in BUILTIN_TAGS])

    @property
    def current(self) -> tuple[str, ...]:
        return tuple(self._tags)

    @staticmethod
    def _check(tag: str) -> str:
        tag = tag.strip()
        if not tag:
            raise TagError("a tag must not be empty")
        if len(tag) > MAX_TAG_LENGTH or not tag.isprintable() or "," in tag:
            raise TagError(f"bad tag {tag[:40]!r}: at most {MAX_TAG_LENGTH} printable characters, no comma")
        return tag

    def update(self, tags: Sequence[str]) -> None:
        """Replace the tags (Riffle's ``update_tags``; built-in ones in ``tags`` are ignored)."""
        new = dict.fromkeys(t for t in (self._check(t) for t in tags) if t not in BUILTIN_TAGS)
        if len(new) > MAX_TAGS:
            raise TagError(f"too many tags: {len(new)}, at most {MAX_TAGS}")
        self._tags = new

    def add(self, tag: str) -> None:
        tag = self._check(tag)
        if tag in BUILTIN_TAGS or tag in self._tags:
            return
        if len(self._tags) >= MAX_TAGS:
            raise TagError(f"too many tags: at most {MAX_TAGS}")
        self._tags[tag] = None

    def delete(self, tag: str) -> None:
        """Raises ``TagError`` for a built-in tag and for a tag the server does not have."""
        tag = tag.strip()
        if tag in BUILTIN_TAGS:
            raise TagError(f"{tag!r} is a built-in tag and always stays ({', '.join(sorted(BUILTIN_TAGS))})")
        if tag not in self._tags:
            raise TagError(f"the server has no tag {tag[:40]!r}; its tags: {', '.join(self._tags) or '-'}")
        del self._tags[tag]


class Lifecycle:
    """See the module docstring. All methods run on the server's event loop."""

    def __init__(self, *, apps: Mapping[str, Any], system: ActorHost, check_interval_s: float,
                 request_stop: Callable[[], None], announce: Callable[[], Awaitable[Any]] | None = None,
                 announce_timeout_s: float = 2.0, tags: Sequence[str] = (), start_unhealthy: bool = False,
                 timer_name: str = "timer"):
        """``apps``: the live app directory (read only); ``request_stop()`` starts the graceful stop;
        ``system``: where a decommission's watch runs, a ``PeriodicJobActor`` woken by the system's
        ``TimerActor`` (registered as ``timer_name``) every ``check_interval_s``;
        ``announce()`` sends a heartbeat round now, so a status change has reached the coordinators
        when the action answers (waited for at most ``announce_timeout_s``). ``start_unhealthy``
        (Riffle's ``initial_unhealthy_status_enable``): the manual status is UNHEALTHY from the first
        heartbeat, until an operator sets the server HEALTHY."""
        self._apps = apps
        self._system = system
        self._timer_name = timer_name
        self._interval = check_interval_s
        self._request_stop = request_stop
        self.announce = announce
        self._announce_timeout = announce_timeout_s
        self.state = LifecycleState.ACTIVE
        # UNHEALTHY | DECOMMISSIONED, set by update_state (or UNHEALTHY from the start)
        self.manual_status: str | None = "UNHEALTHY" if start_unhealthy else None
        self.tags = ServiceTags(tags)
        self.checks = 0  # app-count checks made by decommission watches (for tests)
        self._logged_left = -1

    @property
    def app_count(self) -> int:
        return len(self._apps)

    def _outcome(self, ok: bool, message: str) -> Outcome:
        return Outcome(ok, self.state.value, message, len(self._apps))

    def heartbeat_status(self, snapshot: HeartbeatSnapshot) -> HeartbeatSnapshot:
        """The snapshot with the status and tags this lifecycle reports (the stop's own
        DECOMMISSIONED is the HeartbeatActor's). A decommission wins over a manual status."""
        snapshot = replace(snapshot, tags=self.tags.current)
        if self.state is LifecycleState.DECOMMISSIONING:
            return replace(snapshot, status=LifecycleState.DECOMMISSIONING.value)
        if self.manual_status is not None:
            return replace(snapshot, status=self.manual_status, is_healthy=False)
        return snapshot

    @property
    def riffle_state(self) -> str:
        """Riffle's ``?get_state`` answer: a stopping server says DECOMMISSIONED (what Riffle's
        ``instance kill --interval-secs`` waits for)."""
        if self.state is LifecycleState.STOPPING:
            return "DECOMMISSIONED"
        if self.state is LifecycleState.DECOMMISSIONING:
            return self.state.value
        return self.manual_status or "ACTIVE"

    async def update_state(self, name: str) -> Outcome:
        """Riffle's ``update_state``; raises ``ValueError`` for a name not in ``RIFFLE_STATES``."""
        state = name.strip().upper().replace("-", "_")
        if state not in RIFFLE_STATES:
            raise ValueError(f"unknown state {name[:40]!r}; one of: {', '.join(RIFFLE_STATES)} (any case)")
        if state == "DECOMMISSIONING":
            return await self.decommission()
        if state == "CANCEL_DECOMMISSION":
            return await self.cancel_decommission()
        if self.state is LifecycleState.STOPPING:
            return self._outcome(False, f"cannot set {state}: the server is STOPPING")
        before = self.riffle_state
        if state in ("UNHEALTHY", "DECOMMISSIONED"):
            self.manual_status = state
        else:  # HEALTHY, ACTIVE: Riffle's state is one value, so this also ends a decommission
            self.manual_status = None
            if self.state is LifecycleState.DECOMMISSIONING:
                await self.cancel_decommission()
        if before != self.riffle_state:
            logger.warning("operator set the server {} (was {}){}", state, before,
                           ": the coordinators assign it nothing" if self.manual_status else "")
            await self._tell_coordinators()
        return self._outcome(True, f"{before} -> {self.riffle_state}")

    async def tags_changed(self) -> None:
        """The tags changed: tell the coordinators now."""
        logger.info("tags now {}", ", ".join(self.tags.current) or "-")
        await self._tell_coordinators()

    async def _tell_coordinators(self) -> None:
        if self.announce is not None:
            try:
                await asyncio.wait_for(self.announce(), timeout=self._announce_timeout)
            except Exception as e:  # noqa: BLE001 - the next regular heartbeat carries it anyway
                logger.warning("could not send a heartbeat after the status change: {!r}", e)

    async def decommission(self) -> Outcome:
        if self.state is LifecycleState.DECOMMISSIONING:
            return self._outcome(True, f"already decommissioning; {len(self._apps)} app(s) left")
        if self.state is not LifecycleState.ACTIVE:
            return self._outcome(False, f"cannot decommission: the server is {self.state.value}")
        self.state = LifecycleState.DECOMMISSIONING
        apps = len(self._apps)
        logger.warning("decommissioning: no new apps from the coordinators; {} app(s) still served, the server "
                       "stops once none is left (checked every {}s)", apps, self._interval)
        await self._start_watch()
        await self._tell_coordinators()
        return self._outcome(True, f"decommissioning; the server stops once its {apps} app(s) are gone")

    async def cancel_decommission(self) -> Outcome:
        if self.state is LifecycleState.ACTIVE:
            return self._outcome(True, "nothing to cancel: the server is ACTIVE")
        if self.state is not LifecycleState.DECOMMISSIONING:
            return self._outcome(False, f"cannot cancel: the server is {self.state.value}")
        self.state = LifecycleState.ACTIVE
        await self._stop_watch()
        logger.warning("decommission cancelled: ACTIVE again")
        await self._tell_coordinators()
        return self._outcome(True, "decommission cancelled; ACTIVE")

    async def kill(self, force: bool = True) -> Outcome:
        if self.state is LifecycleState.STOPPING:
            return self._outcome(True, "already stopping")
        apps = len(self._apps)
        if not force and apps:
            return self._outcome(False, f"still {apps} app(s); kill=force stops the server whatever the apps")
        await self._stop_watch()
        self._stop(f"killed by an operator ({apps} app(s) still registered)")
        return self._outcome(True, "stopping gracefully: announce DECOMMISSIONED, flush memory, exit")

    def _stop(self, why: str) -> None:
        """The graceful stop (its own stop ends a watch still running: ``close``)."""
        self.state = LifecycleState.STOPPING
        logger.warning("stopping: {}", why)
        self._request_stop()

    async def _start_watch(self) -> None:
        """Every ``check_interval_s`` (the first check at once) until the decommission ends."""
        timer = self._system.get(self._timer_name)
        if timer is None:
            raise RuntimeError(f"no {self._timer_name!r} actor: a decommission's watch needs the server's timer")
        self._logged_left = -1
        await self._system.start_child(None, ChildSpec(WATCH_NAME, lambda: PeriodicJobActor(
            self._check_apps, timer=timer, key=WATCH_NAME, interval_s=lambda: self._interval, first_delay_s=0.0,
            what="decommission watch"), RestartPolicy.TRANSIENT))

    async def _stop_watch(self) -> None:
        watch = self._system.get(WATCH_NAME)
        if watch is not None and watch.is_alive:
            await self._system.stop_child(None, WATCH_NAME)

    async def _check_apps(self) -> None:
        """One check of a decommission: stop once no app is left."""
        if self.state is not LifecycleState.DECOMMISSIONING:
            return
        self.checks += 1
        left = len(self._apps)
        if left == 0:
            self._stop("decommissioned: no app left")
            return
        if left != self._logged_left:  # each change once, not every check
            logger.info("decommissioning: {} app(s) left", left)
            self._logged_left = left

    async def close(self) -> None:
        """The server stops: a decommission's watch ends."""
        await self._stop_watch()
