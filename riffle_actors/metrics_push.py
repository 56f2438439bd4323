"""Optional push of a daemon's Prometheus registry to a Pushgateway (``[metrics]``, Riffle's keys).

``MetricsPusher.push_once()``, every ``push_interval_sec`` (both daemons run it as a
``runtime.PeriodicJobActor`` on their timer; nothing here sleeps), awaits ``refresh()`` (the daemon
fills its pull snapshot, as a scrape would) and then
PUTs the registry to ``<push_gateway_endpoint>/metrics/job/<job>/<label>/<value>...`` on a thread
(``prometheus_client.push_to_gateway``: blocking IO stays off the event loop). The grouping key is
``instance`` (the daemon's id, e.g. the server id), ``version`` and the configured ``labels``, as
Riffle pushes ``worker_id`` and ``version`` with job ``uniffle-worker``. A failed push is logged
(first failure, then every 10th in a row) and counted in ``failures``; it never stops the daemon.

It does not cover: which metrics exist (``riffle_actors.metrics``, ``coordinator.metrics``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from loguru import logger
from prometheus_client import CollectorRegistry, push_to_gateway

from riffle_actors.config import MetricsConfig
from riffle_actors.runtime import Clock

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

