"""DiskHealthBoard: the health of every local disk, and the rules that change it.

Owned (written) by the ``DiskMonitorActor`` only; the SpillDispatcher, the ShuffleService and
``ShuffleServer.health()`` read it synchronously on the same event loop (like the
``AppDirectory``), so the one answer to "may this disk take data?" lives in one place and
survives restarts of every actor that reads it. Pure and synchronous; times come from the
caller (a ``Clock``'s ``monotonic()``).

States of one disk::

    HEALTHY --probe: used ratio > high watermark--> OVERUSED --probe: used ratio < low watermark--> HEALTHY
    HEALTHY/OVERUSED --failure--> QUARANTINED --healthy probe--> PROBATION --N healthy probes in a row--> HEALTHY
                                       ^-------------- any failure (probe or IO) ---------|

A *failure* is a failed or timed-out probe, or an IO failure reported by the disk's users: a
kind that ``IOErrorKind.quarantines_at_once`` (ENOSPC, EROFS, TIMEOUT, CORRUPT: the disk cannot
take data now) quarantines at once, an EIO or other error after ``failures_to_quarantine`` in a
row (a single EIO may be a bad sector). Which kinds count is decided in ``riffle_actors.io.local``.
A probe is *healthy* when it wrote, synced and read back its file and the used ratio is below
the high watermark (below the low watermark when the disk was quarantined for ENOSPC, so a
full disk is not re-admitted only to fill up again). Only a HEALTHY disk takes new data
(``placeable``); a quarantined disk's existing files stay readable as long as the disk serves
them (reads report failures with an error naming the disk).

See also: ``riffle_actors.actors.disk_monitor`` (probes and publishing), ``riffle_actors.io.probe``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from riffle_actors.io.local import IOErrorKind
from riffle_actors.io.probe import ProbeResult

_CAPACITY = {IOErrorKind.ENOSPC.value, "OVERUSED"}


class DiskStatus(enum.StrEnum):
    HEALTHY = "HEALTHY"
    OVERUSED = "OVERUSED"          # above disk_high_watermark: no new data until below the low watermark
    QUARANTINED = "QUARANTINED"    # failed: no new data; probation probes decide re-admission
    PROBATION = "PROBATION"        # quarantined, with healthy probes counting towards re-admission


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    high_watermark: float = 0.8
    low_watermark: float = 0.7
    failures_to_quarantine: int = 3
    probation_probes: int = 3


@dataclass(frozen=True, slots=True)
class HealthTransition:
    """A change of a disk's ``placeable`` verdict (what the dispatcher and the logs care about)."""

    disk: str
    healthy: bool
    status: DiskStatus
    previous: DiskStatus
    reason: str


@dataclass(slots=True)
class DiskHealth:
    """Health of one disk; see the module docstring for the states."""

    name: str
    root: str
    status: DiskStatus = DiskStatus.HEALTHY
    kind: str | None = None        # IOErrorKind value (or "OVERUSED") of the last verdict
    op: str | None = None          # what failed: "write probe", "spill write", "read index", ...
    detail: str = ""
    since_monotonic: float | None = None  # when the current unhealthy spell began
    consecutive_failures: int = 0
    healthy_probes: int = 0
    capacity_bytes: int = 0
    used_bytes: int = 0
    probes_total: int = 0
    probe_failures_total: int = 0
    quarantines_total: int = 0
    last_probe_monotonic: float | None = None

    @property
    def placeable(self) -> bool:
        """May new spills and new partitions go to this disk?"""
        return self.status is DiskStatus.HEALTHY

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 0.0

    def describe(self, policy: HealthPolicy) -> str:
        """One line for an operator: what failed, why, and what the server does about it."""
        if self.status is DiskStatus.HEALTHY:
            return ""
        if self.status is DiskStatus.OVERUSED:
            text = (f"OVERUSED: {self.used_ratio:.0%} used, above disk_high_watermark {policy.high_watermark:.0%}; "
                    f"no new data until below disk_low_watermark {policy.low_watermark:.0%}")
        else:
            text = f"{self.kind} on {self.op}"
            if self.detail:
                text += f" ({self.detail})"
            text += "; quarantined"
            if self.status is DiskStatus.PROBATION:
                text += f"; probation {self.healthy_probes}/{policy.probation_probes} healthy probes"
        return text


class DiskHealthBoard:
    """Health of every disk, by name in ``data_paths`` order; see the module docstring."""

    def __init__(self, disks: Iterable[tuple[str, str]], policy: HealthPolicy | None = None):
        self.policy = policy or HealthPolicy()
        self.disks: dict[str, DiskHealth] = {name: DiskHealth(name, root) for name, root in disks}

    def __getitem__(self, name: str) -> DiskHealth:
        return self.disks[name]

    def placeable(self, name: str) -> bool:
        d = self.disks.get(name)
        return d is not None and d.placeable

    def placeable_disks(self) -> list[str]:
        return [name for name, d in self.disks.items() if d.placeable]

    def reasons(self) -> dict[str, str]:
        """name -> operator text, for the disks that take no new data."""
        return {name: d.describe(self.policy) for name, d in self.disks.items() if not d.placeable}

    # ------------------------------------------------------------- events
    def on_probe(self, name: str, result: ProbeResult, now: float) -> HealthTransition | None:
        d = self.disks[name]
        d.probes_total += 1
        d.last_probe_monotonic = now
        if result.capacity_bytes:
            d.capacity_bytes, d.used_bytes = result.capacity_bytes, result.used_bytes
        if not result.ok:
            d.probe_failures_total += 1
            op = f"{result.op} probe" if result.op and result.op != "probe" else "probe"
            return self._quarantine(d, result.kind or IOErrorKind.OTHER.value, op, result.detail, now)
        ratio = d.used_ratio
        p = self.policy
        match d.status:
            case DiskStatus.HEALTHY:
                d.consecutive_failures = 0
                if ratio > p.high_watermark:
                    return self._set(d, DiskStatus.OVERUSED, "OVERUSED", "capacity probe",
                                     f"{ratio:.0%} used", now)
            case DiskStatus.OVERUSED:
                if ratio < p.low_watermark:
                    return self._set(d, DiskStatus.HEALTHY, None, None, "", now,
                                     f"re-admitted: {ratio:.0%} used, below disk_low_watermark {p.low_watermark:.0%}")
            case DiskStatus.QUARANTINED | DiskStatus.PROBATION:
                limit = p.low_watermark if d.kind in _CAPACITY else p.high_watermark
                if ratio >= limit:
                    d.healthy_probes = 0
                    d.status = DiskStatus.QUARANTINED
                    return None
                d.healthy_probes += 1
                if d.healthy_probes >= p.probation_probes:
                    return self._set(d, DiskStatus.HEALTHY, None, None, "", now,
                                     f"re-admitted after {d.healthy_probes} healthy probation probes "
                                     f"(quarantined for {d.kind} on {d.op})")
                d.status = DiskStatus.PROBATION
        return None

    def on_io_failure(self, name: str, kind: str, op: str, detail: str, now: float) -> HealthTransition | None:
        d = self.disks[name]
        d.consecutive_failures += 1
        if d.status in (DiskStatus.QUARANTINED, DiskStatus.PROBATION):
            d.healthy_probes = 0  # probation starts over
            d.status = DiskStatus.QUARANTINED
            d.kind, d.op, d.detail = kind, op, detail
            return None
        if _quarantines_at_once(kind) or d.consecutive_failures >= self.policy.failures_to_quarantine:
            return self._quarantine(d, kind, op, detail, now)
        return None

    def on_io_success(self, name: str) -> None:
        d = self.disks.get(name)
        if d is not None:
            d.consecutive_failures = 0

    # ------------------------------------------------------------- transitions
    def _quarantine(self, d: DiskHealth, kind: str, op: str, detail: str, now: float) -> HealthTransition | None:
        if d.status in (DiskStatus.QUARANTINED, DiskStatus.PROBATION):
            d.healthy_probes = 0
            d.status = DiskStatus.QUARANTINED
            d.kind, d.op, d.detail = kind, op, detail
            return None
        d.quarantines_total += 1
        return self._set(d, DiskStatus.QUARANTINED, kind, op, detail, now)

    def _set(self, d: DiskHealth, status: DiskStatus, kind: str | None, op: str | None, detail: str,
             now: float, readmit_reason: str = "re-admitted") -> HealthTransition | None:
        previous = d.status
        was_placeable = d.placeable
        d.status = status
        d.kind, d.op, d.detail = kind, op, detail
        d.healthy_probes = 0
        if status is DiskStatus.HEALTHY:
            d.since_monotonic = None
            d.consecutive_failures = 0
        elif was_placeable:
            d.since_monotonic = now
        if was_placeable == d.placeable and previous is status:
            return None
        reason = d.describe(self.policy) if not d.placeable else readmit_reason
        return HealthTransition(d.name, d.placeable, status, previous, reason)


def _quarantines_at_once(kind: str) -> bool:
    try:
        return IOErrorKind(kind).quarantines_at_once
    except ValueError:  # not an IO error kind: counts like OTHER
        return False
