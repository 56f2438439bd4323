"""ServiceHealthChecks: Riffle's ``[health_service_config]`` checks, as a pure policy with memory.

Four reasons for the server to call itself UNHEALTHY, next to ``admin.HealthRules`` (disks, memory
stuck above the watermark, stuck spills, a supervisor tree that gave up):

- ``alive_app_number_max_limit``: more registered apps than the limit (cleared when apps go);
- ``disk_used_ratio_health_threshold``: a data path's used/capacity above the threshold;
- ``memory_allocated_threshold``: the process's resident memory above the threshold. Sticky, as
  in Riffle: a process that grew that far is taken out of service until it is restarted;
- the hang check (``service_hang_of_mem_continuous_unchange_sec``,
  ``service_hang_of_app_valid_number``): memory in use, not 0, has not changed at all for that
  long while at least that many apps are registered. Sticky too. (Riffle compares the configured
  value with milliseconds; here it is seconds, as the key's name says. Both default to 5 minutes.)

Pure and synchronous: every reading (app count, memory in use, RSS, disk usage, ``now`` on a
monotonic clock) is an argument. ``reasons`` is called on every health evaluation (``/health``
and each snapshot refresh of the heartbeat), which is what samples memory for the hang check.

It does not cover: reading RSS or disk usage (the caller does) or the other health reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class DiskUsage:
    name: str
    capacity: int
    used: int


@dataclass(slots=True)
class ServiceHealthChecks:
    """See the module docstring; ``None`` limits are off."""

    alive_app_number_max_limit: int | None = None
    disk_used_ratio_health_threshold: float | None = None
    memory_allocated_threshold: int | None = None
    hang_unchanged_s: float = 300.0
    hang_min_apps: int = 50
    _mem_value: int = field(default=-1, init=False)
    _mem_since: float = field(default=0.0, init=False)
    _sticky: list[str] = field(default_factory=list, init=False)

    def reasons(self, *, apps: int, memory_used: int, rss: int | None, disks: Sequence[DiskUsage],
                now: float) -> list[str]:
        """Why the server is unhealthy by these checks; empty when it is healthy."""
        reasons: list[str] = []
        limit = self.alive_app_number_max_limit
        if limit is not None and apps > limit:
            reasons.append(f"{apps} apps registered, more than health_service_config.alive_app_number_max_limit="
                           f"{limit}")
        threshold = self.disk_used_ratio_health_threshold
        if threshold is not None:
            for d in disks:
                if d.capacity > 0 and d.used / d.capacity > threshold:
                    reasons.append(f"{d.name}: {d.used / d.capacity:.1%} used, above health_service_config."
                                   f"disk_used_ratio_health_threshold={threshold}")
        rss_limit = self.memory_allocated_threshold
        if rss_limit is not None and rss is not None and rss > rss_limit and not self._has_sticky("rss"):
            self._sticky.append(f"rss: process resident memory {rss} bytes exceeded health_service_config."
                                f"memory_allocated_threshold={rss_limit} (until restart)")
        self._check_hang(apps, memory_used, now)
        return reasons + [text.split(": ", 1)[1] for text in self._sticky]

    def _has_sticky(self, kind: str) -> bool:
        return any(text.startswith(f"{kind}: ") for text in self._sticky)

    def _check_hang(self, apps: int, memory_used: int, now: float) -> None:
        if self._has_sticky("hang"):
            return
        if memory_used == self._mem_value and memory_used != 0 and apps >= self.hang_min_apps:
            if now - self._mem_since > self.hang_unchanged_s:
                self._sticky.append(
                    f"hang: memory in use stayed at {memory_used} bytes for more than {self.hang_unchanged_s:g}s "
                    f"with {apps} apps registered: the server may be hung (health_service_config."
                    f"service_hang_of_mem_continuous_unchange_sec; until restart)")
        else:
            self._mem_value = memory_used
            self._mem_since = now
