"""AppState: everything one application owns on this server (owned by its AppActor).

Per app: registered shuffles with their partition ranges, one ``PartitionBuffer`` per
partition that received data, the partition's disks (where its spilled files live, in the
order they were first used), reported block ids per partition, commit counters and the
last time the app was seen. Pure and synchronous; time comes from an injected clock.

See also: ``riffle_actors.state.buffer`` (one partition's memory), ``riffle_actors.actors.app``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from riffle_actors.clock import Clock
from riffle_actors.errors import InvalidRequestError, NoRegisterError
from riffle_actors.protocol.bitmap import BlockIdSet
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.state.buffer import PartitionBuffer


@dataclass(slots=True)
class PartitionState:
    buffer: PartitionBuffer = field(default_factory=PartitionBuffer)
    disks: list[str] = field(default_factory=list)  # where spilled files live, first use first
    huge: bool = False
    disk_bytes: int = 0  # block bytes acknowledged on disk (all of this partition's files)

    @property
    def current_disk(self) -> str | None:
        return self.disks[-1] if self.disks else None


class ShuffleState:
    """One registered shuffle. ``epoch`` tells its incarnations apart: a shuffle id unregistered and
    registered again (Uniffle's stage retry does that) gets a new epoch, so late spills and spill
    completions of the old incarnation are recognised and dropped."""

    __slots__ = ("shuffle_id", "epoch", "_starts", "_ends", "partitions", "reported", "commit_count", "local_order")

    def __init__(self, shuffle_id: int, local_order: bool, epoch: int = 0):
        self.shuffle_id = shuffle_id
        self.epoch = epoch
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.partitions: dict[int, PartitionState] = {}
        self.reported: dict[int, BlockIdSet] = {}
        self.commit_count = 0
        self.local_order = local_order

    def add_range(self, start: int, end: int) -> None:
        """Register the inclusive range [start, end]; re-registration is idempotent."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._starts[i] <= start <= self._ends[i]:
            return
        j = bisect.bisect_left(self._starts, start)
        self._starts.insert(j, start)
        self._ends.insert(j, end)

    def is_registered(self, partition_id: int) -> bool:
        i = bisect.bisect_right(self._starts, partition_id) - 1
        return i >= 0 and partition_id <= self._ends[i]

    def partition(self, partition_id: int) -> PartitionState:
        """The partition's state, created on first use; NO_REGISTER if its range is unknown."""
        p = self.partitions.get(partition_id)
        if p is None:
            if not self.is_registered(partition_id):
                raise NoRegisterError(f"partition {partition_id} of shuffle {self.shuffle_id} is not registered")
            p = self.partitions[partition_id] = PartitionState()
        return p

    @property
    def range_count(self) -> int:
        return len(self._starts)

    def memory_bytes(self) -> tuple[int, int]:
        """(staging bytes, in-flight bytes) over all partitions."""
        staging = in_flight = 0
        for p in self.partitions.values():
            staging += p.buffer.staging_bytes
            in_flight += p.buffer.in_flight_bytes
        return staging, in_flight


class AppState:
    def __init__(self, app_id: str, clock: Clock, heartbeat_timeout_s: float):
        self.app_id = app_id
        self.clock = clock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.shuffles: dict[int, ShuffleState] = {}
        self.last_seen_monotonic = clock.monotonic()
        self.registered_epoch_ms = int(clock.time() * 1000)
        self.user = ""
        self.properties: dict[str, str] = {}
        self.received_bytes = 0
        self.last_epoch = 0  # epoch of the newest ShuffleState; epochs count from 1

    # ------------------------------------------------------------- liveness
    def touch(self) -> None:
        self.last_seen_monotonic = self.clock.monotonic()

    def is_expired(self) -> bool:
        return self.clock.monotonic() - self.last_seen_monotonic > self.heartbeat_timeout_s

    def check_alive(self) -> None:
        """The spec's "app check": an expired app answers NO_REGISTER even before its purge."""
        if self.is_expired():
            raise NoRegisterError(f"app {self.app_id} expired (no heartbeat for {self.heartbeat_timeout_s:.0f}s)")

    # ------------------------------------------------------------- shuffles
    def register_shuffle(self, shuffle_id: int, ranges: Iterable[tuple[int, int]], local_order: bool) -> None:
        shuffle = self.shuffles.get(shuffle_id)
        if shuffle is None:
            self.last_epoch += 1
            shuffle = self.shuffles[shuffle_id] = ShuffleState(shuffle_id, local_order, self.last_epoch)
        for start, end in ranges:
            shuffle.add_range(start, end)

    def shuffle(self, shuffle_id: int) -> ShuffleState:
        s = self.shuffles.get(shuffle_id)
        if s is None:
            raise NoRegisterError(f"shuffle {shuffle_id} of app {self.app_id} is not registered")
        return s

    def report(self, shuffle_id: int, partition_to_block_ids: Iterable[tuple[int, Iterable[int]]]) -> int:
        """Add reported block ids; returns how many ids were new. INVALID_REQUEST on an id outside [0, 2**63)."""
        shuffle = self.shuffle(shuffle_id)
        # validate the whole report first: a bad id rejects it without a partial update
        batches = []
        for partition_id, block_ids in partition_to_block_ids:
            try:
                batches.append((partition_id, BlockIdSet(block_ids)))
            except ProtocolError as e:
                raise InvalidRequestError(f"partition {partition_id}: {e}") from None
        new = 0
        for partition_id, batch in batches:
            ids = shuffle.reported.get(partition_id)
            if ids is None:
                ids = shuffle.reported[partition_id] = BlockIdSet()
            before = len(ids)
            ids.union_update(batch)
            new += len(ids) - before
        return new

    def shuffle_result(self, shuffle_id: int, partition_ids: Iterable[int]) -> bytes:
        """Union of the reported ids of the partitions, in the Java Roaring64 legacy format."""
        shuffle = self.shuffles.get(shuffle_id)
        if shuffle is None or not shuffle.reported:
            return b""  # "never reported": the Java server answers empty bytes too
        result = BlockIdSet()
        for partition_id in partition_ids:
            ids = shuffle.reported.get(partition_id)
            if ids is not None:
                result.union_update(ids)
        return result.serialize()

    def memory_bytes(self) -> tuple[int, int]:
        staging = in_flight = 0
        for s in self.shuffles.values():
            a, b = s.memory_bytes()
            staging += a
            in_flight += b
        return staging, in_flight

    def partition_count(self) -> int:
        return sum(len(s.partitions) for s in self.shuffles.values())
