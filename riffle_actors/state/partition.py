"""PartitionState: the logic of one partition's memory, owned by its PartitionActor.

Owns, for one (app, shuffle incarnation, partition): the ``PartitionBuffer`` (staging and
in-flight batches, the block ids ever accepted, the read cursor), where the partition's
spilled files live (``disks``, first use first), whether it is huge (and whether it is above
Riffle's partition-split threshold: ``split``), and the spill
decisions: when an append makes staging reach the spill size (the huge spill size once the
partition is huge), ``append`` says so and ``start_spill`` turns staging into an in-flight
batch (sorted by task attempt for LOCAL_ORDER shuffles). Pure and synchronous: the actor
carries the decisions out (memory messages, spill jobs, replies).

``PartitionFigures`` is the partition's line in its app's size table: the figures the AppActor
needs without asking (spill candidates, huge-partition backpressure, ``/apps``, the disks of a
read). ``PartitionState`` is its only writer and keeps it current after every operation; the
AppActor only reads it, synchronously, on the same event loop (as the ShuffleService reads the
``AppDirectory``), so a spill round costs one ask per app, not one per partition.

Not covered: the app-level bookkeeping (``riffle_actors.state.app_state``), the messages and
the crash semantics (``riffle_actors.actors.partition``).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, replace

from riffle_actors.records import Block
from riffle_actors.state.buffer import Flight, PartitionBuffer
from riffle_actors.state.tier_policy import HDFS_TIER


@dataclass(slots=True)
class SpillLimits:
    """Spill sizes of every partition of an app (``[hybrid_store]`` / ``[app_config]``); None = off.

    One instance may be shared by every app of the server and changed in place by a config reload
    (``conf_reload_enable``): the partitions read it as they append, on the same event loop, so a
    change applies to every partition at once (their next append) and is never seen half made."""

    single_buffer_bytes: int | None = None
    huge_threshold_bytes: int | None = None  # received bytes above which a partition is huge
    huge_spill_bytes: int | None = None  # spill size of a huge partition
    # received bytes above which the client is asked to split the partition (Riffle's partition split)
    split_threshold_bytes: int | None = None

    def spill_size(self, huge: bool) -> int | None:
        if huge and self.huge_spill_bytes is not None:
            return self.huge_spill_bytes
        return self.single_buffer_bytes


class PartitionFigures:
    """One partition's line in its app's size table; written by its ``PartitionState`` only."""

    __slots__ = ("disk_bytes", "disks", "hdfs_bytes", "huge", "in_flight_bytes", "split", "staging_bytes",
                 "total_bytes")

    def __init__(self) -> None:
        self.staging_bytes = 0
        self.in_flight_bytes = 0
        self.total_bytes = 0  # every byte ever accepted, memory or disk
        self.disk_bytes = 0  # block bytes acknowledged on disk
        self.disks: tuple[str, ...] = ()  # where the spilled files live, first use first
        self.hdfs_bytes = 0  # block bytes acknowledged on HDFS (read by clients from HDFS, never here)
        self.huge = False
        self.split = False  # above the split threshold once: requireBuffer names it in needSplitPartitionIds

    @property
    def memory_bytes(self) -> int:
        return self.staging_bytes + self.in_flight_bytes

    def __repr__(self) -> str:
        return (f"PartitionFigures(staging={self.staging_bytes}, in_flight={self.in_flight_bytes}, "
                f"total={self.total_bytes}, disk={self.disk_bytes}, disks={self.disks}, huge={self.huge}, "
                f"split={self.split})")


class PartitionState:
    """One partition's buffer, files and spill decisions; see the module docstring."""

    __slots__ = ("_base_total", "buffer", "figures", "limits", "local_order")

    def __init__(self, figures: PartitionFigures | None = None, limits: SpillLimits | None = None,
                 local_order: bool = False) -> None:
        self.buffer = PartitionBuffer()
        self.figures = figures if figures is not None else PartitionFigures()
        self._base_total = self.figures.total_bytes  # received before this state (a restart's recovered bytes)
        self.limits = limits if limits is not None else SpillLimits()
        self.local_order = local_order

    # ------------------------------------------------------------------ writes
    def append(self, blocks: Iterable[Block]) -> tuple[int, int, bool]:
        """Append blocks (duplicates dropped): (accepted bytes, dropped bytes, became huge).

        Sizes are budget bytes (``len(data) + 32``): accepted + dropped is what the blocks cost
        the sender's ticket. ``should_spill`` tells whether staging reached its spill size now.
        """
        accepted, dropped = self.buffer.append_blocks(blocks)
        f = self.figures
        f.staging_bytes = self.buffer.staging_bytes
        f.total_bytes = self._base_total + self.buffer.total_bytes
        became_huge = False
        threshold = self.limits.huge_threshold_bytes
        if not f.huge and threshold is not None and f.total_bytes > threshold:
            f.huge = became_huge = True
        split = self.limits.split_threshold_bytes
        if not f.split and split is not None and f.total_bytes > split:
            f.split = True  # for good, as Riffle: the client moves the partition's next writes elsewhere
        return accepted, dropped, became_huge

    def should_spill(self) -> bool:
        limit = self.limits.spill_size(self.figures.huge)
        return limit is not None and self.buffer.staging_bytes >= limit and self.buffer.staging_bytes > 0

    def start_spill(self) -> Flight | None:
        """Move staging in flight (None when staging is empty); LOCAL_ORDER sorts it by task attempt."""
        flight = self.buffer.start_flight()
        if flight is None:
            return None
        self.figures.staging_bytes = 0
        self.figures.in_flight_bytes = self.buffer.in_flight_bytes
        if self.local_order:
            flight = replace(flight, blocks=tuple(sorted(flight.blocks, key=lambda b: b.task_attempt_id)))
        return flight

    def complete_spill(self, flight_id: int, disk: str | None, data_bytes: int) -> int:
        """A batch is on ``disk`` (data and index): drop it from memory; the budget bytes released.

        ``disk`` None: the write was abandoned (the app or shuffle is being purged); the batch
        leaves memory all the same, since nobody will read it any more.
        """
        released = self.buffer.complete_flight(flight_id)
        if not released:
            return 0  # not (or no longer) in flight: acknowledged already
        f = self.figures
        if disk == HDFS_TIER:
            f.hdfs_bytes += data_bytes
        elif disk is not None:
            if disk not in f.disks:
                f.disks = (*f.disks, disk)
            f.disk_bytes += data_bytes
        f.in_flight_bytes = self.buffer.in_flight_bytes
        return released

    def release_all(self) -> tuple[int, int]:
        """The partition is purged: forget its blocks; (staging, in-flight) budget bytes released."""
        staging, in_flight = self.buffer.staging_bytes, self.buffer.in_flight_bytes
        self.buffer = PartitionBuffer()
        self.figures.staging_bytes = self.figures.in_flight_bytes = 0
        return staging, in_flight

    # ------------------------------------------------------------------ reads
    def read(self, last_block_id: int, read_buffer_size: int,
             task_filter: Container[int] | None = None) -> list[Block]:
        """getMemoryShuffleData: in-flight then staging after ``last_block_id`` (``PartitionBuffer.read``)."""
        return self.buffer.read(last_block_id, read_buffer_size, task_filter)

    def in_flight_ids(self) -> list[int]:
        return self.buffer.in_flight_ids()
