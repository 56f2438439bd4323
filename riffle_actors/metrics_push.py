"""Optional push of a daemon's Prometheus registry to a Pushgateway (``[metrics]``, Riffle's keys).

``MetricsPusher.push_once()``, every ``push_interval_sec`` (the server runs it as a ``PeriodicJobActor``
on its timer; ``run()``, a loop on the injected clock until cancelled, is the coordinator's), awaits ``refresh()`` (the daemon fills its pull snapshot, as a scrape would) and then
PUTs the registry to ``<push_gateway_endpoint>/metrics/job/<job>/<label>/<value>...`` on a thread
(``prometheus_client.push_to_gateway``: blocking IO stays off the event loop). The grouping key is
``instance`` (the daemon's id, e.g. the server id), ``version`` and the configured ``labels``, as
Riffle pushes ``worker_id`` and ``version`` with job ``uniffle-worker``. A failed push is logged
(first failure, then every 10th in a row) and counted in ``failures``; it never stops the daemon.

``MetricsPushActor`` runs the same pushes on the runtime's timers instead of a sleeping loop: the
daemon's ``TimerActor`` tells it ``PushMetrics`` every ``push_interval_sec`` (the first at once), and
it pushes once at a time (a tick while a push still runs is skipped). The coordinator uses it.

It does not cover: which metrics exist (``riffle_actors.metrics``, ``coordinator.metrics``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from loguru import logger
from prometheus_client import CollectorRegistry, push_to_gateway

from riffle_actors.config import MetricsConfig
from riffle_actors.runtime import Actor, Clock

SERVER_JOB = "uniffle-worker"  # Riffle's job name for its servers
COORDINATOR_JOB = "riffle-coordinator"


class MetricsPusher:
    """See the module docstring."""

    def __init__(self, cfg: MetricsConfig, *, registry: CollectorRegistry, job: str,
                 grouping: Mapping[str, str], refresh: Callable[[], Awaitable[None]], clock: Clock):
        if cfg.push_gateway_endpoint is None:
            raise ValueError("no push_gateway_endpoint configured")
        self.endpoint = cfg.push_gateway_endpoint.rstrip("/")
        self.interval_s = float(cfg.push_interval_sec)
        self.registry = registry
        self.job = job
        self.grouping = {**grouping, **cfg.labels}
        self.refresh = refresh
        self.clock = clock
        self.pushes = 0
        self.failures = 0
        self._failing = 0

    async def push_once(self) -> bool:
        """Refresh and push now; True when the gateway took it."""
        try:
            await self.refresh()
            await asyncio.to_thread(push_to_gateway, self.endpoint, job=self.job, registry=self.registry,
                                    grouping_key=self.grouping, timeout=max(1.0, min(self.interval_s, 10.0)))
        except Exception as e:  # noqa: BLE001 - a gateway outage must not stop the daemon
            self.failures += 1
            self._failing += 1
            if self._failing == 1 or self._failing % 10 == 0:
                logger.warning("metrics push to {} failed ({} in a row): {!r}", self.endpoint, self._failing, e)
            return False
        if self._failing:
            logger.info("metrics push to {} works again after {} failure(s)", self.endpoint, self._failing)
        self._failing = 0
        self.pushes += 1
        return True

    def describe(self) -> None:
        logger.info("pushing metrics to {} every {}s (job {}, labels {})", self.endpoint, self.interval_s,
                    self.job, self.grouping)

    async def run(self) -> None:
        self.describe()
        while True:
            await self.push_once()
            await self.clock.sleep(self.interval_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class PushMetrics:
    """From the timer: refresh and push now (skipped while the previous push still runs)."""


class MetricsPushActor(Actor):
    """Pushes ``pusher``'s registry on each ``PushMetrics``; see the module docstring."""

    def __init__(self, pusher: MetricsPusher) -> None:
        self.pusher = pusher
        self._pushing = False

    async def on_start(self) -> None:
        p = self.pusher
        logger.info("pushing metrics to {} every {}s (job {}, labels {})", p.endpoint, p.interval_s, p.job,
                    p.grouping)

    def receive(self, msg: PushMetrics) -> Any:
        match msg:
            case PushMetrics():
                if not self._pushing:
                    self._pushing = True
                    self.spawn(self._push())
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None

    async def _push(self) -> None:
        try:
            await self.pusher.push_once()  # never raises: a failure is counted and logged
        finally:
            self._pushing = False
