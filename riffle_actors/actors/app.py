"""AppActor: one per application; owns its shuffles, partition buffers and reported block ids.

Every message refreshes the app's last-seen time, after the "app check" (an app silent for
longer than the heartbeat timeout answers NO_REGISTER, spec §2.0). Appends de-duplicate
block ids and make the blocks readable before the reply. A partition buffer above its
single-buffer spill size is spilled right away; the MemoryManager's watermark rounds ask
for spill candidates and pick the largest. Spill completions drop the in-flight batch and
give its memory back.

Reports and shuffle results go through a ``SliceLane``: one at a time, in arrival order, in
time slices of ~1 ms with the event loop's other work in between (a 2M-id result is ~0.1-0.5 s
of CPU). Other messages are processed between the slices; none of them changes reported ids
(a purge drops the shuffle, and an operation still running on it finishes on the detached
state, whose result nobody can ask for any more).

Supervision: temporary. A crashed AppActor is not restarted (that would hide lost data);
the AppManager purges it and later calls get NO_REGISTER, so Spark retries the stage.

See also: ``riffle_actors.state.app_state`` (the logic), ``riffle_actors.runtime.slicing``,
``riffle_actors.actors.app_manager``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from loguru import logger

from riffle_actors.runtime import Actor, ActorDeadError, ActorRef
from riffle_actors.actors.memory import CommitTicket, MarkInFlight, ReleaseMemory
from riffle_actors.runtime.slicing import SliceLane
from riffle_actors.actors.spill import SpillCompleted, SpillJob
from riffle_actors.runtime.clock import Clock
from riffle_actors.errors import HugePartitionBackpressureError, InvalidRequestError, RiffleError
from riffle_actors.protocol.blockid import BlockIdLayout
from riffle_actors.records import Block
from riffle_actors.state.app_state import AppState, PartitionState


# ---------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterShuffle:
    shuffle_id: int
    ranges: tuple[tuple[int, int], ...]
    local_order: bool
    user: str = ""
    properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendBlocks:
    """All partitions of one sendShuffleData request, paid for by a ticket of ``ticket_size`` bytes.

    Once the message is processed (whatever its outcome) the AppActor has told the MemoryManager
    ``CommitTicket``; the sender gives the reservation back itself only on ``ActorDeadError``.
    """

    shuffle_id: int
    partitions: tuple[tuple[int, tuple[Block, ...]], ...]
    ticket_size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportShuffleResult:
    shuffle_id: int
    task_attempt_id: int
    # iterated once; the gRPC adapter hands over a generator of its protobuf repeated fields
    partition_to_block_ids: Iterable[tuple[int, Sequence[int]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class GetShuffleResult:
    shuffle_id: int
    partition_ids: tuple[int, ...]
    layout: BlockIdLayout | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMemoryData:
    shuffle_id: int
    partition_id: int
    last_block_id: int
    read_buffer_size: int
    task_filter: Container[int] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetPartitionDisks:
    shuffle_id: int
    partition_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckHugePartitions:
    """requireBuffer naming these partitions: refused (``HugePartitionBackpressureError``) while one of
    them is huge and holds more than ``limit_bytes`` in memory (staging + in flight)."""

    shuffle_id: int
    partition_ids: tuple[int, ...]
    limit_bytes: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class CommitShuffleTask:
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class FinishShuffle:
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class PurgeShuffle:
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class GetSpillCandidates:
    pass


@dataclass(frozen=True, slots=True)
class SpillPartitions:
    keys: tuple[tuple[int, int], ...]  # (shuffle_id, partition_id)


@dataclass(frozen=True, slots=True)
class SpillAll:
    """Spill every buffer (graceful shutdown); replies once all spills completed."""


@dataclass(frozen=True, slots=True)
class GetAppInfo:
    pass


@dataclass(frozen=True, slots=True)
class IsExpired:
    pass


@dataclass(frozen=True, slots=True)
class AppInfo:
    app_id: str
    user: str
    registered_epoch_ms: int
    idle_s: float
    shuffles: dict[int, dict]
    partition_count: int
    memory_bytes: int
    in_flight_bytes: int
    received_bytes: int


AppMsg = (RegisterShuffle | AppendBlocks | ReportShuffleResult | GetShuffleResult | GetMemoryData
          | GetPartitionDisks | CheckHugePartitions | Heartbeat | CommitShuffleTask | FinishShuffle | PurgeShuffle
          | GetSpillCandidates | SpillPartitions | SpillAll | SpillCompleted | GetAppInfo | IsExpired)


class AppActor(Actor):
    expected_errors = (RiffleError,)

    def __init__(self, app_id: str, *, clock: Clock, heartbeat_timeout_s: float, memory: ActorRef,
                 spill: ActorRef, single_buffer_spill_bytes: int | None, huge_threshold_bytes: int | None = None,
                 huge_spill_bytes: int | None = None):
        self.state = AppState(app_id, clock, heartbeat_timeout_s)
        self.app_id = app_id
        self.memory = memory
        self.spill = spill
        self.single_buffer_spill_bytes = single_buffer_spill_bytes
        self.huge_threshold_bytes = huge_threshold_bytes
        self.huge_spill_bytes = huge_spill_bytes
        # (shuffle, partition, flight) -> futures waiting for that flight (finishShuffle, shutdown)
        self._flight_waiters: dict[tuple[int, int, int], list[asyncio.Future]] = {}
        self._lane = SliceLane()  # reports and shuffle results, see the module docstring
        self.log = logger.bind(app_id=app_id)

    def receive(self, msg: AppMsg):
        state = self.state
        match msg:
            case SpillCompleted():
                self._complete_flight(msg)
                return None
            case IsExpired():
                return state.is_expired()
            case GetAppInfo():
                return self._info()
            case GetSpillCandidates():
                return [(p.buffer.staging_bytes, sid, pid)
                        for sid, s in state.shuffles.items() for pid, p in s.partitions.items()
                        if p.buffer.staging_bytes]
            case SpillPartitions(keys=keys):
                scheduled = 0
                for sid, pid in keys:
                    shuffle = state.shuffles.get(sid)
                    p = shuffle.partitions.get(pid) if shuffle else None
                    if p is not None:
                        scheduled += self._spill(sid, pid, p)
                return scheduled
            case SpillAll():
                return self._spill_and_wait(None)
            case PurgeShuffle(shuffle_id=sid):
                # no app check: an expired app may still drop a shuffle
                self._purge_shuffle(sid)
                return state.last_epoch  # the disks fence every incarnation up to this one
            case AppendBlocks():
                return self._append(msg)
            case CheckHugePartitions():
                self._check_huge(msg)
                return None
            case RegisterShuffle():
                state.touch()
                if msg.user:
                    state.user = msg.user
                if msg.properties:
                    state.properties = dict(msg.properties)
                state.register_shuffle(msg.shuffle_id, msg.ranges, msg.local_order)
                return None
        # every other message is subject to the app check
        state.check_alive()
        state.touch()
        match msg:
            case GetMemoryData():
                shuffle = state.shuffles.get(msg.shuffle_id)
                p = shuffle.partitions.get(msg.partition_id) if shuffle else None
                if p is None:
                    return []
                return p.buffer.read(msg.last_block_id, msg.read_buffer_size, msg.task_filter)
            case GetPartitionDisks(shuffle_id=sid, partition_id=pid):
                shuffle = state.shuffles.get(sid)
                p = shuffle.partitions.get(pid) if shuffle else None
                return tuple(p.disks) if p else ()
            case ReportShuffleResult(shuffle_id=sid, partition_to_block_ids=p2b):
                return self._lane.submit(state.report_steps(sid, p2b))
            case GetShuffleResult(shuffle_id=sid, partition_ids=pids):
                return self._lane.submit(state.shuffle_result_steps(sid, pids))
            case Heartbeat():
                return None
            case CommitShuffleTask(shuffle_id=sid):
                shuffle = state.shuffle(sid)
                shuffle.commit_count += 1
                return shuffle.commit_count
            case FinishShuffle(shuffle_id=sid):
                state.shuffle(sid)
                return self._spill_and_wait(sid)
            case _:
                raise InvalidRequestError(f"unexpected message {type(msg).__name__}")

    def _append(self, msg: AppendBlocks) -> int:
        """Append a send's blocks; returns the budget bytes accepted (duplicates are dropped)."""
        state = self.state
        sid = msg.shuffle_id
        accepted = 0
        appended: list[tuple[int, PartitionState]] = []
        try:
            state.check_alive()
            state.touch()
            shuffle = state.shuffle(sid)
            # resolve every partition first: a NO_REGISTER must not leave half a request behind
            targets = [(pid, shuffle.partition(pid), blocks) for pid, blocks in msg.partitions]
            for pid, _p, blocks in targets:
                for b in blocks:
                    if b.block_id < 0:  # not a Java block id; it would also break the id bitmaps
                        raise InvalidRequestError(f"partition {pid}: negative blockId {b.block_id}")
            for pid, p, blocks in targets:
                accepted += p.buffer.append(blocks)
                appended.append((pid, p))
            state.received_bytes += accepted
        finally:
            # the ticket becomes used memory here, in this actor, so the MemoryManager sees it
            # before the MarkInFlight of a spill of these blocks and before any purge of the app
            self.memory.tell_nowait(CommitTicket(app_id=self.app_id, ticket_size=msg.ticket_size, used=accepted))
        for pid, p in appended:
            limit = self._spill_limit(p)
            if limit is not None and p.buffer.staging_bytes >= limit:
                self._spill(sid, pid, p)
        return accepted

    def _check_huge(self, msg: CheckHugePartitions) -> None:
        """Partition-limit backpressure (Riffle's huge partitions); the memory figures are this actor's."""
        shuffle = self.state.shuffles.get(msg.shuffle_id)
        if shuffle is None:
            return
        for pid in msg.partition_ids:
            p = shuffle.partitions.get(pid)
            if p is None or not p.huge or p.buffer.memory_bytes <= msg.limit_bytes:
                continue
            if not p.buffer.in_flight_bytes:
                # nothing on its way to disk: spill the staging now, or the partition would stay
                # above the limit (its buffer may be below the huge spill size) and never drain
                self._spill(msg.shuffle_id, pid, p)
            raise HugePartitionBackpressureError(
                f"partition {pid} of shuffle {msg.shuffle_id} is huge ({p.buffer.total_bytes} bytes received) and "
                f"holds {p.buffer.memory_bytes} bytes in memory, more than {msg.limit_bytes} "
                f"(partition_limit_memory_backpressure_ratio of capacity); retry later")

    # ------------------------------------------------------------- spills
    def _spill_limit(self, p: PartitionState) -> int | None:
        if not p.huge and self.huge_threshold_bytes is not None and p.buffer.total_bytes > self.huge_threshold_bytes:
            p.huge = True
            self.log.warning("partition is huge: {} bytes received", p.buffer.total_bytes)
        if p.huge and self.huge_spill_bytes is not None:
            return self.huge_spill_bytes
        return self.single_buffer_spill_bytes

    def _spill(self, shuffle_id: int, partition_id: int, p: PartitionState) -> int:
        flight = p.buffer.start_flight()
        if flight is None:
            return 0
        blocks = flight.blocks
        if self.state.shuffles[shuffle_id].local_order:
            blocks = tuple(sorted(blocks, key=lambda b: b.task_attempt_id))
        # tell_nowait: both mailboxes are sized for every in-flight batch of the server
        self.memory.tell_nowait(MarkInFlight(app_id=self.app_id, size=flight.size))
        self.spill.tell_nowait(SpillJob(app_id=self.app_id, shuffle_id=shuffle_id, partition_id=partition_id,
                                       flight_id=flight.flight_id, blocks=blocks,
                                       preferred_disk=p.current_disk, reply_to=self.ref,
                                       epoch=self.state.shuffles[shuffle_id].epoch))
        return flight.size

    def _complete_flight(self, done: SpillCompleted) -> None:
        shuffle = self.state.shuffles.get(done.shuffle_id)
        if shuffle is None or shuffle.epoch != done.epoch:
            return  # shuffle purged meanwhile (maybe registered again): the purge released its memory
        p = shuffle.partitions.get(done.partition_id)
        if p is None:
            return
        if done.disk is not None:
            if done.disk not in p.disks:
                p.disks.append(done.disk)
            p.disk_bytes += done.data_bytes
        size = p.buffer.complete_flight(done.flight_id)
        if size:
            self.memory.tell_nowait(ReleaseMemory(app_id=self.app_id, size=size, was_in_flight=True))
        for fut in self._flight_waiters.pop((done.shuffle_id, done.partition_id, done.flight_id), ()):
            if not fut.done():
                fut.set_result(None)

    def _spill_and_wait(self, shuffle_id: int | None):
        """Spill every buffer of one shuffle (or of the app) and reply when all flights are on disk."""
        loop = asyncio.get_running_loop()
        waiters = []
        for sid, shuffle in self.state.shuffles.items():
            if shuffle_id is not None and sid != shuffle_id:
                continue
            for pid, p in shuffle.partitions.items():
                self._spill(sid, pid, p)
                for fid in p.buffer.in_flight_ids():
                    fut = loop.create_future()
                    self._flight_waiters.setdefault((sid, pid, fid), []).append(fut)
                    waiters.append(fut)
        if not waiters:
            return None
        return asyncio.gather(*waiters)  # a future: the reply comes later, the mailbox keeps flowing

    def _purge_shuffle(self, shuffle_id: int) -> int:
        shuffle = self.state.shuffles.pop(shuffle_id, None)
        if shuffle is None:
            return 0
        staging, in_flight = shuffle.memory_bytes()
        if staging:
            self.memory.tell_nowait(ReleaseMemory(app_id=self.app_id, size=staging, was_in_flight=False))
        if in_flight:
            self.memory.tell_nowait(ReleaseMemory(app_id=self.app_id, size=in_flight, was_in_flight=True))
        for key in [k for k in self._flight_waiters if k[0] == shuffle_id]:
            for fut in self._flight_waiters.pop(key):
                if not fut.done():
                    fut.set_result(None)
        return staging + in_flight

    async def on_stop(self) -> None:
        for futs in self._flight_waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(ActorDeadError(f"app {self.app_id} stopped"))
        self._flight_waiters.clear()

    def _info(self) -> AppInfo:
        s = self.state
        staging, in_flight = s.memory_bytes()
        shuffles = {}
        for sid, sh in s.shuffles.items():
            shuffles[sid] = {
                "ranges": sh.range_count,
                "partitions": len(sh.partitions),
                "memory_bytes": sum(p.buffer.memory_bytes for p in sh.partitions.values()),
                "disk_bytes": sum(p.disk_bytes for p in sh.partitions.values()),
                "received_bytes": sum(p.buffer.total_bytes for p in sh.partitions.values()),
                "reported_partitions": len(sh.reported),
                "disks": sorted({d for p in sh.partitions.values() for d in p.disks}),
                "huge_partitions": sum(1 for p in sh.partitions.values() if p.huge),
            }
        return AppInfo(s.app_id, s.user, s.registered_epoch_ms, s.clock.monotonic() - s.last_seen_monotonic,
                       shuffles, s.partition_count(), staging + in_flight, in_flight, s.received_bytes)
