"""Which storage tier a spill batch goes to: the local disks (warm) or HDFS (cold).

This module owns the decision only, as pure functions of figures the SpillDispatcher has at
hand, and the HDFS health verdict (``HdfsHealth``) those decisions read. The HDFS writer
actors (``riffle_actors.actors.hdfs_writer``) carry the decisions out. Rules, in order:

1. The app sent no remote storage in registerShuffle, or ``store_type`` has no HDFS: local.
2. ``store_type = MEMORY_HDFS`` (no local tier): HDFS, healthy or not (a failed write pauses
   and is tried again; the batch stays in memory meanwhile).
3. A huge partition's batch larger than ``huge_partition_memory_spill_to_hdfs_threshold_size``:
   HDFS (reason ``huge_partition``).
4. A batch larger than ``memory_spill_to_cold_threshold_size``: HDFS (``cold_threshold``).
5. No local disk healthy: HDFS (``no_healthy_disk``).
6. Otherwise local (``localfile``).

When rules 3-5 pick HDFS while HDFS is unhealthy (a write failed less than ``retry_after_s``
ago), the batch goes to the local disks instead (reason ``hdfs_unhealthy``), or, with no
healthy local disk either, waits in memory. A failed HDFS write marks HDFS unhealthy and the
same batch falls back to the local disks at once (reason ``hdfs_failed``), so an HDFS outage
never loses an acknowledged block. (Riffle's ``huge_partition_fallback_enable`` defaults to
false; here a fallback is always allowed: data kept in memory forever is the worse outcome.)

``HDFS_TIER`` is the name a batch written to HDFS reports in place of a disk name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

HDFS_TIER = "hdfs"


class Tier(enum.StrEnum):
    LOCALFILE = "localfile"
    HDFS = "hdfs"


class TierReason(enum.StrEnum):
    LOCALFILE = "localfile"              # the default: warm tier
    NO_REMOTE_STORAGE = "no_remote_storage"
    MEMORY_HDFS = "memory_hdfs"          # store_type has no local tier
    HUGE_PARTITION = "huge_partition"
    COLD_THRESHOLD = "cold_threshold"
    NO_HEALTHY_DISK = "no_healthy_disk"
    HDFS_UNHEALTHY = "hdfs_unhealthy"    # HDFS wanted, but it failed recently: local instead
    HDFS_FAILED = "hdfs_failed"          # this batch's HDFS write failed: local instead


class TierChoice(NamedTuple):
    tier: Tier
    reason: TierReason


@dataclass(frozen=True, slots=True)
class TierRules:
    """The policy's settings (from ``store_type``, ``[hybrid_store]`` and ``[hdfs_store]``)."""

    hdfs_enabled: bool = False
    local_enabled: bool = True
    cold_threshold_bytes: int | None = None        # memory_spill_to_cold_threshold_size
    huge_to_hdfs_bytes: int | None = None          # huge_partition_memory_spill_to_hdfs_threshold_size
    retry_after_s: float = 30.0                    # hdfs_store.unhealthy_retry_interval_sec


class HdfsHealth:
    """HDFS's verdict: healthy until a write fails, then unhealthy for ``retry_after_s``."""

    __slots__ = ("consecutive_failures", "failures_total", "last_error", "retry_after_s", "unhealthy_until")

    def __init__(self, retry_after_s: float = 30.0):
        self.retry_after_s = retry_after_s
        self.unhealthy_until = 0.0
        self.consecutive_failures = 0
        self.failures_total = 0
        self.last_error = ""

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until

    def failed(self, now: float, error: str) -> None:
        self.consecutive_failures += 1
        self.failures_total += 1
        self.last_error = error
        self.unhealthy_until = now + self.retry_after_s

    def succeeded(self) -> None:
        self.consecutive_failures = 0
        self.unhealthy_until = 0.0


def choose_tier(rules: TierRules, *, batch_bytes: int, huge: bool, healthy_disks: int, has_remote: bool,
                hdfs_healthy: bool) -> TierChoice:
    """The tier of one spill attempt (see the module docstring for the rules)."""
    if not rules.hdfs_enabled or not has_remote:
        return TierChoice(Tier.LOCALFILE, TierReason.NO_REMOTE_STORAGE if rules.hdfs_enabled
                          else TierReason.LOCALFILE)
    if not rules.local_enabled:
        return TierChoice(Tier.HDFS, TierReason.MEMORY_HDFS)
    if huge and rules.huge_to_hdfs_bytes is not None and batch_bytes > rules.huge_to_hdfs_bytes:
        wanted = TierReason.HUGE_PARTITION
    elif rules.cold_threshold_bytes is not None and batch_bytes > rules.cold_threshold_bytes:
        wanted = TierReason.COLD_THRESHOLD
    elif healthy_disks == 0:
        wanted = TierReason.NO_HEALTHY_DISK
    else:
        return TierChoice(Tier.LOCALFILE, TierReason.LOCALFILE)
    if hdfs_healthy:
        return TierChoice(Tier.HDFS, wanted)
    return TierChoice(Tier.LOCALFILE, TierReason.HDFS_UNHEALTHY)
