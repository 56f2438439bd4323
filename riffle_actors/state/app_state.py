"""AppState: the app-level bookkeeping of one application on this server (owned by its AppActor).

Per app: registered shuffles with their partition ranges and incarnation epochs, the size
table of their partitions (one ``PartitionEntry`` per partition that received data: the
routing slot of its PartitionActor and the ``PartitionFigures`` that actor keeps current),
reported block ids per partition, commit counters, the byte figures of ``/apps`` and the last
time the app was seen. A partition's blocks, de-duplication and spills are not here: they
belong to its PartitionActor (``riffle_actors.state.partition``). Pure and synchronous; time
comes from an injected clock.

The two operations whose cost grows with a shuffle's size, ``report`` and
``shuffle_result``, also exist as *steps* (``report_steps``, ``shuffle_result_steps``):
generators that do a bounded amount of work per ``next()`` (at most ``_IDS_PER_CHUNK`` ids or
``_STEP_WORK`` units) and return their result through ``StopIteration``. The AppActor gives
the event loop a turn between steps (``riffle_actors.runtime.slicing``); ``drain`` runs them in
one go, which is exactly what ``report`` and ``shuffle_result`` do.

Input bounds (``AppLimits``, from ``[app_config]``): an app registers at most
``shuffle_number_max_limit`` shuffles; a shuffle's partition ids lie below
``partition_number_max_limit`` and below what the app's block-id layout can encode (its
``spark.rss.blockId.maxPartitions`` / ``spark.rss.client.blockId.partitionIdBits`` properties,
sent by 0.10 clients); a report names registered partitions only (the others are refused, by
name, before anything is added: a set is created for a partition only once it is known) and
carries at most ``report_block_id_number_max_limit`` ids (each partition counting as one at
least, an empty list costs a set too), at most ``report_partition_block_id_number_max_limit``
of them for one partition. Every refusal is INVALID_REQUEST naming its key.

See also: ``riffle_actors.state.partition`` (one partition's memory), ``riffle_actors.actors.app``.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard, TypeVar

from riffle_actors.errors import InvalidRequestError, NoRegisterError
from riffle_actors.protocol.bitmap import STEP_IDS, BlockIdSetMap, id_array, union_serialize_steps
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.runtime import ActorRef, Clock
from riffle_actors.state.partition import PartitionFigures

T = TypeVar("T")

# Work per step of report_steps / shuffle_result_steps, in "ids": an id costs ~30-100 ns to convert
# (a protobuf field is the slow source) and check, and ~0.1-1 us to add (the most when every id has
# a high word of its own: CRoaring's 64-bit tree then holds one container per id); a partition ~1-2 us
# of bookkeeping, hence _PARTITION_WORK. A step is then ~0.1-3 ms whatever the layout, also inside one
# huge partition: about the actor's time slice (1 ms, riffle_actors.runtime.slicing) at most.
_STEP_WORK = STEP_IDS
_PARTITION_WORK = 32
_IDS_PER_CHUNK = STEP_IDS  # a partition's ids are converted and added this many at a time

_SEQUENCE_TYPES: dict[type, bool] = {}  # per-type isinstance(..., Sequence): an ABC check costs ~0.5 us


def _is_sequence(value: object) -> TypeGuard[Sequence[int]]:
    cls = type(value)
    known = _SEQUENCE_TYPES.get(cls)
    if known is None:
        known = _SEQUENCE_TYPES[cls] = isinstance(value, Sequence)
    return known


@dataclass(frozen=True, slots=True, kw_only=True)
class AppLimits:
    """The per-app and per-request bounds of ``[app_config]`` (see the module docstring)."""

    max_shuffles: int = 10_000  # shuffle_number_max_limit
    max_partitions: int = 1 << 20  # partition_number_max_limit
    report_max_ids: int = 1_000_000  # report_block_id_number_max_limit
    report_max_partition_ids: int = 200_000  # report_partition_block_id_number_max_limit


# SparkConf keys (registerShuffle properties, 0.10+) that fix the block-id layout's partition field
_MAX_PARTITIONS_KEY = "spark.rss.blockId.maxPartitions"
_PARTITION_BITS_KEY = "spark.rss.client.blockId.partitionIdBits"
_NAMED_IN_REFUSAL = 10  # partition ids a refusal lists; the count says how many more


def partition_id_bound(limits: AppLimits, properties: Mapping[str, str]) -> tuple[int, str]:
    """(the bound partition ids stay below, where it comes from): ``partition_number_max_limit``, or less
    when the app's block-id layout (its properties) encodes fewer partitions. Unparsable values are
    ignored (the client itself refuses them)."""
    bound, why = limits.max_partitions, "[app_config] partition_number_max_limit"
    for key, from_value in ((_MAX_PARTITIONS_KEY, int), (_PARTITION_BITS_KEY, lambda v: 1 << int(v))):
        text = properties.get(key)
        if text is None:
            continue
        try:
            layout_bound = from_value(text.strip())
        except (ValueError, OverflowError):
            continue
        if 0 < layout_bound < bound:
            bound, why = layout_bound, f"the app's block-id layout ({key}={text.strip()})"
    return bound, why


def _named(partition_ids: list[int], count: int) -> str:
    more = f" and {count - len(partition_ids)} more" if count > len(partition_ids) else ""
    return ", ".join(map(str, partition_ids)) + more


def drain(steps: Generator[None, None, T]) -> T:
    """Run ``steps`` to the end without pausing; their result."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        result: T = done.value
        return result


class PartitionEntry:
    """A partition's line in the app's size table.

    ``figures`` is written by the partition's actor only (``PartitionState``); ``ref`` and
    ``starting`` by the AppActor only: the actor once started, and whether a start is under way
    (the messages waiting for it are the AppActor's, not state).
    """

    __slots__ = ("figures", "ref", "sequential_read", "starting")

    def __init__(self) -> None:
        self.figures = PartitionFigures()
        self.ref: ActorRef | None = None
        self.starting = False
        # read whole and in order (a memory read without a task filter came first): Riffle's mark
        # for its sequential read-ahead, ``riffle_actors.state.read_ahead``
        self.sequential_read = False

    @property
    def has_actor(self) -> bool:
        """Its PartitionActor runs or is starting."""
        return self.ref is not None or self.starting


class _Batches(Sequence[tuple[int, "array[int]"]]):
    """A report's checked ids, columnar: every id in one ``array('Q')``, and per batch (at most
    ``_IDS_PER_CHUNK`` ids of one partition) its partition id and end in two ``array('q')``.

    A report may name 1M partitions: a ``(partition id, array[int])`` tuple per batch was two GC-tracked
    objects each, alive for the whole report (and its metadata-log encoding), which the cyclic GC's
    full collections scanned (~45-60 ms at 200k partitions). Items are made when read.
    """

    __slots__ = ("_ends", "_ids", "_partition_ids")

    def __init__(self) -> None:
        self._partition_ids = array("q")
        self._ends = array("q")
        self._ids = array("Q")

    def append(self, partition_id: int, ids: array[int]) -> None:
        self._ids.extend(ids)
        self._partition_ids.append(partition_id)
        self._ends.append(len(self._ids))

    def __len__(self) -> int:
        return len(self._partition_ids)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            raise TypeError("_Batches cannot be sliced")
        if index < 0:
            index += len(self._partition_ids)
        start = self._ends[index - 1] if index > 0 else 0
        return self._partition_ids[index], self._ids[start:self._ends[index]]

    def __iter__(self) -> Iterator[tuple[int, array[int]]]:
        ids = self._ids
        start = 0
        for partition_id, end in zip(self._partition_ids, self._ends):
            yield partition_id, ids[start:end]
            start = end


class ShuffleState:
    """One registered shuffle. ``epoch`` tells its incarnations apart: a shuffle id unregistered and
    registered again (Uniffle's stage retry does that) gets a new epoch, so late spills and spill
    completions of the old incarnation are recognised and dropped."""

    __slots__ = (
        "_ends",
        "_starts",
        "commit_count",
        "epoch",
        "local_order",
        "lost_blocks",
        "partitions",
        "reported",
        "shuffle_id",
    )

    def __init__(self, shuffle_id: int, local_order: bool, epoch: int = 0):
        self.shuffle_id = shuffle_id
        self.epoch = epoch
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.partitions: dict[int, PartitionEntry] = {}
        self.reported = BlockIdSetMap()  # no GC-tracked object per partition (see BlockIdSetMap)
        self.commit_count = 0
        self.local_order = local_order
        self.lost_blocks = 0  # reported ids a restart found no data for (``riffle_actors.state.recovery``)

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

    def partition(self, partition_id: int) -> PartitionEntry:
        """The partition's entry, created on first use; NO_REGISTER if its range is unknown."""
        p = self.partitions.get(partition_id)
        if p is None:
            if not self.is_registered(partition_id):
                raise NoRegisterError(f"partition {partition_id} of shuffle {self.shuffle_id} is not registered")
            p = self.partitions[partition_id] = PartitionEntry()
        return p

    @property
    def range_count(self) -> int:
        return len(self._starts)

    def memory_bytes(self) -> tuple[int, int]:
        """(staging bytes, in-flight bytes) over all partitions."""
        staging = in_flight = 0
        for p in self.partitions.values():
            staging += p.figures.staging_bytes
            in_flight += p.figures.in_flight_bytes
        return staging, in_flight

    def received_bytes(self) -> int:
        return sum(p.figures.total_bytes for p in self.partitions.values())


class AppState:
    def __init__(self, app_id: str, clock: Clock, heartbeat_timeout_s: float, limits: AppLimits | None = None):
        self.app_id = app_id
        self.limits = limits if limits is not None else AppLimits()
        self.clock = clock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.shuffles: dict[int, ShuffleState] = {}
        self.last_seen_monotonic = clock.monotonic()
        self.registered_epoch_ms = int(clock.time() * 1000)
        self.user = ""
        self.properties: dict[str, str] = {}
        self.purged_received_bytes = 0  # received by shuffles purged since
        self.last_epoch = 0  # epoch of the newest ShuffleState; epochs count from 1
        self.recovered = False  # rebuilt from disk at the server's start (``riffle_actors.state.app_restore``)
        self.split_triggered = False  # sticky: a partition was named for a split (one purged since still counts)

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
    def check_registration(self, shuffle_id: int, ranges: Sequence[tuple[int, int]]) -> None:
        """INVALID_REQUEST if registering would take the app above its shuffle limit or a range reaches
        past the partition bound (``partition_id_bound``); nothing is registered then."""
        limits = self.limits
        if shuffle_id not in self.shuffles and len(self.shuffles) >= limits.max_shuffles:
            raise InvalidRequestError(
                f"app {self.app_id} already has {len(self.shuffles)} registered shuffles, the most one app may "
                f"have ([app_config] shuffle_number_max_limit = {limits.max_shuffles}); unregister some first")
        bound, why = partition_id_bound(limits, self.properties)
        for start, end in ranges:
            if end >= bound:
                raise InvalidRequestError(
                    f"partition range [{start}, {end}] of shuffle {shuffle_id}: partition ids must be below "
                    f"{bound} ({why})")

    def register_shuffle(self, shuffle_id: int, ranges: Iterable[tuple[int, int]], local_order: bool) -> None:
        """Register (or extend) a shuffle; the caller ran ``check_registration`` first (a restart's
        recovery does not: what is on disk was accepted before)."""
        shuffle = self.shuffles.get(shuffle_id)
        if shuffle is None:
            self.last_epoch += 1
            shuffle = self.shuffles[shuffle_id] = ShuffleState(shuffle_id, local_order, self.last_epoch)
        for start, end in ranges:
            shuffle.add_range(start, end)

    def drop_shuffle(self, shuffle_id: int) -> ShuffleState | None:
        """Forget a shuffle (its purge); the caller releases what its partitions hold."""
        shuffle = self.shuffles.pop(shuffle_id, None)
        if shuffle is not None:
            self.purged_received_bytes += shuffle.received_bytes()
        return shuffle

    def received_bytes(self) -> int:
        """Bytes accepted from clients over the app's life (duplicates not counted)."""
        return self.purged_received_bytes + sum(s.received_bytes() for s in self.shuffles.values())

    def shuffle(self, shuffle_id: int) -> ShuffleState:
        s = self.shuffles.get(shuffle_id)
        if s is None:
            raise NoRegisterError(f"shuffle {shuffle_id} of app {self.app_id} is not registered")
        return s

    def report(self, shuffle_id: int, partition_to_block_ids: Iterable[tuple[int, Iterable[int]]]) -> int:
        """Add reported block ids; returns how many ids were new. INVALID_REQUEST on an id outside [0, 2**63)."""
        return drain(self.report_steps(shuffle_id, partition_to_block_ids))

    def report_steps(self, shuffle_id: int, partition_to_block_ids: Iterable[tuple[int, Iterable[int]]],
                     sink: list[Sequence[tuple[int, array[int]]]] | None = None) -> Generator[None, None, int]:
        """``report`` in steps. NO_REGISTER / INVALID_REQUEST come from the first ``next()`` / a check step.

        The whole report is checked before anything is added, so a bad id, a partition that is not
        registered or a report above the limits (``AppLimits``) rejects it without a partial update.
        Ids of a partition that is not registered are never converted (only counted). Sequences
        (tuples, lists, protobuf repeated fields) are sliced as they are; ids are never all materialized as Python ints at once. ``sink`` (if given) receives,
        once they are added, the checked ``(partition id, ids)`` batches as one sequence (what the metadata
        log records). The batches are kept columnar (``_Batches``): no GC-tracked object per partition.
        """
        shuffle = self.shuffle(shuffle_id)
        try:
            batches = yield from self._checked_batches(shuffle, partition_to_block_ids)
        except InvalidRequestError as e:
            # a refused report lets go of its request at once: a lazy source (the gRPC adapter's generator
            # over the protobuf message) and the check pass's frame would live on in the traceback
            close = getattr(partition_to_block_ids, "close", None)
            if close is not None:
                close()
            raise e.with_traceback(None) from None
        work = 0
        new = 0
        reported = shuffle.reported
        for partition_id, batch in batches:
            new += reported.update_and_count(partition_id, batch)  # a set also for an empty list, as before
            work += len(batch) + _PARTITION_WORK
            if work >= _STEP_WORK:
                work = 0
                yield
        if sink is not None and batches:
            sink.append(batches)
        return new

    def _checked_batches(self, shuffle: ShuffleState, partition_to_block_ids: Iterable[tuple[int, Iterable[int]]],
                         ) -> Generator[None, None, _Batches]:
        """The check pass of ``report_steps``: the report's ids as checked batches, or a refusal."""
        shuffle_id = shuffle.shuffle_id
        limits = self.limits
        batches = _Batches()
        work = 0
        total = 0  # ids (a partition counts one at least) against report_block_id_number_max_limit
        unknown: list[int] = []
        unknown_count = 0
        for partition_id, block_ids in partition_to_block_ids:
            ids: Sequence[int] = block_ids if _is_sequence(block_ids) else list(block_ids)  # a generator: no slices
            n = len(ids)
            total += max(n, 1)
            if total > limits.report_max_ids:
                raise InvalidRequestError(
                    f"reportShuffleResult carries more than {limits.report_max_ids} block ids "
                    f"([app_config] report_block_id_number_max_limit; a partition counts one at least); "
                    f"refused, nothing was added")
            if n > limits.report_max_partition_ids:
                raise InvalidRequestError(
                    f"reportShuffleResult carries {n} block ids for partition {partition_id}, more than "
                    f"{limits.report_max_partition_ids} ([app_config] report_partition_block_id_number_max_limit); "
                    f"refused, nothing was added")
            if not shuffle.is_registered(partition_id):
                unknown_count += 1
                if len(unknown) < _NAMED_IN_REFUSAL:
                    unknown.append(partition_id)
                work += _PARTITION_WORK
                if work >= _STEP_WORK:
                    work = 0
                    yield
                continue
            if unknown_count:
                continue  # refused anyway: convert nothing more
            for start in range(0, max(n, 1), _IDS_PER_CHUNK):
                # a slice even when it is the whole: a protobuf field converts faster as a list
                chunk = ids[start:start + _IDS_PER_CHUNK]
                try:
                    batches.append(partition_id, id_array(chunk))
                except ProtocolError as e:
                    raise InvalidRequestError(f"partition {partition_id}: {e}") from None
                work += len(chunk) + _PARTITION_WORK
                if work >= _STEP_WORK:
                    work = 0
                    yield
        if unknown_count:
            raise InvalidRequestError(
                f"reportShuffleResult names {unknown_count} partitions of shuffle {shuffle_id} that are not "
                f"registered on this server: {_named(unknown, unknown_count)}; refused, nothing was added")
        return batches

    def shuffle_result(self, shuffle_id: int, partition_ids: Iterable[int]) -> bytes:
        """Union of the reported ids of the partitions, in the Java Roaring64 legacy format."""
        return drain(self.shuffle_result_steps(shuffle_id, partition_ids))

    def shuffle_result_steps(self, shuffle_id: int, partition_ids: Iterable[int],
                             ) -> Generator[None, None, bytes]:
        """``shuffle_result`` in steps: look the partitions up, then ``union_serialize_steps``, which
        bounds its steps inside one partition too (at most ``STEP_IDS`` ids a step).

        A report processed between two steps may or may not be in the result; every id reported
        before the first step is (sets only grow, and they are read, never copied, up front).
        """
        shuffle = self.shuffles.get(shuffle_id)
        if shuffle is None or not shuffle.reported:
            return b""  # "never reported": the Java server answers empty bytes too
        reported = shuffle.reported
        found: list[int] = []
        work = 0
        for partition_id in partition_ids:
            if reported.has_ids(partition_id):  # an empty set adds nothing to the union
                found.append(partition_id)
            work += _PARTITION_WORK // 4  # a dict lookup, no bitmap work
            if work >= _STEP_WORK:
                work = 0
                yield
        # the sets are read as views made when their step comes (ids reported meanwhile may be in too)
        return (yield from union_serialize_steps(reported.views(found)))

    def memory_bytes(self) -> tuple[int, int]:
        staging = in_flight = 0
        for s in self.shuffles.values():
            a, b = s.memory_bytes()
            staging += a
            in_flight += b
        return staging, in_flight

    def partition_count(self) -> int:
        return sum(len(s.partitions) for s in self.shuffles.values())
