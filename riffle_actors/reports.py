"""Typed reports the shuffle server gives about itself: disks, memory, health.

This module owns the shape of what ``/health``, ``/metrics`` and the coordinator heartbeat say
about the server, as frozen dataclasses (before, ``list[dict]`` built by hand in one place and
read by key in three others). ``AdminService`` (``riffle_actors.admin``) builds them; the HTTP
adapter encodes them with ``to_json()``; ``Metrics`` reads ``DiskReport`` fields for its gauges.

The JSON keys are part of the HTTP API (README, "Server HTTP endpoints"): ``DiskReport.to_json()``
keeps ``capacity`` / ``used`` as the keys of the byte counts.

It does not cover: deciding health (``riffle_actors.admin.HealthRules``) or disk verdicts
(``riffle_actors.state.disk_health``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskReport:
    """One data path: its verdict and the operator text (what failed, why, what the server did)."""

    name: str
    healthy: bool  # takes new data
    status: str  # a DiskStatus value (HEALTHY, OVERUSED, QUARANTINED, PROBATION)
    reason: str  # empty when healthy
    capacity: int  # file system bytes
    used: int
    written_bytes: int = 0
    write_failures: int = 0
    quarantines: int = 0
    probe_failures: int = 0
    last_probe_age_s: float | None = None
    spills_moved_away: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    """The write-memory budget, in bytes."""

    capacity: int
    used: int
    allocated: int
    in_flight: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthReport:
    """``/health``: HEALTHY when ``reasons`` is empty."""

    reasons: tuple[str, ...]
    disks: tuple[DiskReport, ...]
    memory: MemoryReport

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def status(self) -> str:
        return "HEALTHY" if self.healthy else "UNHEALTHY"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": list(self.reasons),
                "disks": [d.to_json() for d in self.disks], "memory": self.memory.to_json()}
