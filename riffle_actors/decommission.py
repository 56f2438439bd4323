"""The shuffle server's own lifecycle as an operator drives it: decommission, its cancellation, kill.

This module owns ``Lifecycle``, the service that the admin transports (the HTTP ``/admin`` routes
and the ``ShuffleServerInternal`` gRPC service) call:

- ``decommission()``: the server reports ``DECOMMISSIONING`` in its heartbeats from now on (a
  round is sent at once), so coordinators assign it no new partitions; it keeps serving the apps
  it has. Every ``decommission_check_interval_sec`` it looks at its app directory; once no app is
  left it stops itself through the normal graceful stop (``request_stop``: the same path as
  SIGTERM, exit code 0). As upstream Uniffle's ``ShuffleServer.decommission`` /
  ``waitDecommissionFinish`` (with ``rss.server.decommission.shutdown`` = true): a second
  decommission is a no-op that succeeds; a server already stopping refuses.
- ``cancel_decommission()``: back to ``ACTIVE``, the watch ends; a no-op that succeeds on an
  ACTIVE server (as upstream); refused once the server is stopping.
- ``kill()``: the graceful stop now, whatever the apps (Riffle's admin kill).

It does not cover: authentication (the transports guard every action with the ``[admin]``
credentials), the coordinator-side status overrides (``riffle_actors.coordinator``) or the stop
itself (``ShuffleServer.stop``).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from loguru import logger

from riffle_actors.actors.heartbeat import HeartbeatSnapshot
from riffle_actors.runtime import Clock


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


class Lifecycle:
    """See the module docstring. All methods run on the server's event loop."""

    def __init__(self, *, apps: Mapping[str, Any], clock: Clock, check_interval_s: float,
                 request_stop: Callable[[], None], announce: Callable[[], Awaitable[Any]] | None = None,
                 announce_timeout_s: float = 2.0):
        """``apps``: the live app directory (read only); ``request_stop()`` starts the graceful stop;
        ``announce()`` sends a heartbeat round now, so a status change has reached the coordinators
        when the action answers (waited for at most ``announce_timeout_s``)."""
        self._apps = apps
        self._clock = clock
        self._interval = check_interval_s
        self._request_stop = request_stop
        self.announce = announce
        self._announce_timeout = announce_timeout_s
        self.state = LifecycleState.ACTIVE
        self._watch: asyncio.Task[None] | None = None

    @property
    def app_count(self) -> int:
        return len(self._apps)

    def _outcome(self, ok: bool, message: str) -> Outcome:
        return Outcome(ok, self.state.value, message, len(self._apps))

    def heartbeat_status(self, snapshot: HeartbeatSnapshot) -> HeartbeatSnapshot:
        """The snapshot with the status this lifecycle reports (the stop's own DECOMMISSIONED is the
        HeartbeatActor's)."""
        if self.state is LifecycleState.DECOMMISSIONING:
            return replace(snapshot, status=LifecycleState.DECOMMISSIONING.value)
        return snapshot

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
        self._watch = asyncio.get_running_loop().create_task(self._watch_apps(), name="decommission-watch")
        await self._tell_coordinators()
        return self._outcome(True, f"decommissioning; the server stops once its {apps} app(s) are gone")

    async def cancel_decommission(self) -> Outcome:
        if self.state is LifecycleState.ACTIVE:
            return self._outcome(True, "nothing to cancel: the server is ACTIVE")
        if self.state is not LifecycleState.DECOMMISSIONING:
            return self._outcome(False, f"cannot cancel: the server is {self.state.value}")
        self.state = LifecycleState.ACTIVE
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        logger.warning("decommission cancelled: ACTIVE again")
        await self._tell_coordinators()
        return self._outcome(True, "decommission cancelled; ACTIVE")

    async def kill(self) -> Outcome:
        if self.state is LifecycleState.STOPPING:
            return self._outcome(True, "already stopping")
        apps = len(self._apps)
        self._stop(f"killed by an operator ({apps} app(s) still registered)")
        return self._outcome(True, "stopping gracefully: announce DECOMMISSIONED, flush memory, exit")

    def _stop(self, why: str) -> None:
        self.state = LifecycleState.STOPPING
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        self._watch = None
        logger.warning("stopping: {}", why)
        self._request_stop()

    async def _watch_apps(self) -> None:
        logged = -1
        while self.state is LifecycleState.DECOMMISSIONING:
            left = len(self._apps)
            if left == 0:
                self._stop("decommissioned: no app left")
                return
            if left != logged:  # each change once, not every check
                logger.info("decommissioning: {} app(s) left", left)
                logged = left
            await self._clock.sleep(self._interval)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
