"""AppActor: one per application; owns the app-level state and routes partition work to PartitionActors.

It owns the ``AppState`` (``riffle_actors.state.app_state``): registered shuffles with their
ranges and epochs, reported block ids and shuffle results, commit counters, the app check
(an app silent for longer than the heartbeat timeout answers NO_REGISTER, spec §2.0; every
message refreshes the last-seen time after it), huge-partition accounting and the app's
memory and byte figures. It does not own blocks: each partition that received data has a
``PartitionActor`` (``riffle_actors.actors.partition``), a child of this actor, started on
the partition's first data (not at registerShuffle), which owns its staging and in-flight
batches, its block ids and its spill state.

Routing (one message per request per partition, never one per block):

- sendShuffleData: the app check and every NO_REGISTER / INVALID_REQUEST check happen here,
  for the whole request, before any partition sees it; then one ``AppendPart`` per partition.
  The reply (bytes accepted) comes once every part is readable; the ticket becomes used
  memory through the request's ``SendTicket`` (one ``CommitTicket`` per send).
- getMemoryShuffleData: one ``ReadPart``; a partition without an actor has nothing in memory.
- requireBuffer (``CheckBufferRequest``, the RPC's one ask): registration, the huge-partition
  backpressure, and the partitions named that are above Riffle's partition-split threshold
  (``[app_config] partition_split_*``), which the reply's ``needSplitPartitionIds`` asks the client
  to move (both decided by ``riffle_actors.state.send.BufferAdmission``); then the reservation is
  handed on to the MemoryManager (``RequireBuffer`` in a runtime ``Forward``), whose ``BufferGrant``
  answers the RPC: no hop back through this actor or the service.
- Spill rounds, huge partitions, ``/apps``, getLocalShuffleIndex/Data: answered from the size
  table (each partition's ``PartitionFigures``, which its actor keeps current), so the
  AppManager's watermark round costs one ask per app; the chosen partitions get a ``SpillPart``.
- finishShuffle / graceful shutdown: a ``FlushPart`` per partition, replied when all are on disk.
- unregisterShuffle: a ``PurgePart`` per partition (after whatever is queued for it), which
  releases the partition's memory and stops it.

While a partition actor starts (one loop turn or so), its messages wait, in order, in this
actor's table of waiting messages (its ``PartitionEntry`` only says a start is under way).
A send's replies, reads and spill orders are futures completed by the partition actors (no
task and no extra hop per request); since they are this actor's reply-later awaitables, they
fail with ``ActorDeadError`` if this actor stops, and the sends' reservations not yet used go
back to the MemoryManager in ``on_stop``.

Reports and shuffle results go through a ``SliceLane``: one at a time, in arrival order, in
time slices of ~1 ms with the event loop's other work in between (a 2M-id result is ~0.1-0.5 s
of CPU). Other messages are processed between the slices; none of them changes reported ids
(a purge drops the shuffle, and an operation still running on it finishes on the detached
state, whose result nobody can ask for any more).

Durable metadata (``riffle_actors.actors.meta_log``, docs/recovery.md): registerShuffle and
reportShuffleResult are answered once their record is in the shuffle's metadata log, so a
restarted server knows the shuffle and answers getShuffleResult* with every id it acknowledged.
At a restart, ``RestoreApp`` (sent once, right after the start) rebuilds the app from what
recovery found: registrations, reported ids, the disks of each partition, the lost-block counts.
The state does it (``riffle_actors.state.app_restore``) and returns a plan, which this actor
carries out (the metadata log's home and registrations, the lost-block log line). ``/apps``
figures are a report the state builds (``riffle_actors.state.app_report``).

Supervision: temporary. A crashed AppActor is not restarted (that would hide lost data);
the AppManager purges it and later calls get NO_REGISTER, so Spark retries the stage. Only
``RiffleError`` s (a refusal) and ``ChildStartError`` are expected errors; any other exception,
an unknown message included, is a bug: the asker gets it (INTERNAL_ERROR, ``errors.to_status``)
and the actor crashes. Bad input is refused before it gets here, where the service layer parses
and checks the request. Its partition actors are stopped with it. A crashed partition actor
(seen through death watch) crashes this actor on purpose, with the same outcome: the app is
purged, nothing is hidden.

Messages and replies: ``riffle_actors.actors.app_messages``; the ``/apps`` report records:
``riffle_actors.state.app_report``.

See also: ``riffle_actors.state.app_state`` (the logic), ``riffle_actors.actors.partition``,
``riffle_actors.runtime.slicing``, ``riffle_actors.actors.app_manager``.
"""

from __future__ import annotations

import asyncio
import inspect
from array import array
from collections import deque
from collections.abc import Iterable
from functools import partial
from typing import Any

from loguru import logger

from riffle_actors.actors.app_messages import (
    AppendBlocks,
    AppMsg,
    CheckBufferRequest,
    CommitShuffleTask,
    FinishShuffle,
    GetAppInfo,
    GetLocalReadPlan,
    GetMemoryData,
    GetPartitionDisks,
    GetShuffleResult,
    GetSpillCandidates,
    Heartbeat,
    IsExpired,
    LocalReadPlan,
    PurgeShuffle,
    RegisterShuffle,
    ReportShuffleResult,
    RestoreApp,
    SpillAll,
    SpillPartitions,
)
from riffle_actors.actors.memory import RequireBuffer
from riffle_actors.actors.meta_log import ShuffleMetaLog
from riffle_actors.actors.partition import (
    PURGE,
    AppendPart,
    FlushPart,
    Join,
    PartitionActor,
    PartitionContext,
    PartitionMsg,
    ReadPart,
    SpillPart,
    abandon,
    tell_commit,
)
from riffle_actors.errors import (
    HugePartitionBackpressureError,
    InternalError,
    InvalidRequestError,
    NoBufferError,
    NoRegisterError,
    RiffleError,
)
from riffle_actors.protocol.bitmap import release_steps
from riffle_actors.protocol.shuffle_meta import (
    BLOCK_IDS,
    REGISTER,
    encode_block_ids,
    encode_block_ids_steps,
    encode_register,
)
from riffle_actors.records import Block
from riffle_actors.runtime import (
    ActorDeadError,
    ActorRef,
    ChildSpec,
    ChildStartError,
    Clock,
    Forward,
    MailboxFullError,
    RestartPolicy,
    SliceLane,
    Supervisor,
    Terminated,
)
from riffle_actors.state.app_report import app_report
from riffle_actors.state.app_restore import restore_app
from riffle_actors.state.app_state import AppLimits, AppState, PartitionEntry, ShuffleState
from riffle_actors.state.partition import SpillLimits
from riffle_actors.state.read_ahead import client_read_ahead
from riffle_actors.state.recovery import RecoveredApp
from riffle_actors.state.send import BufferAdmission, SendTicket, release_all


class PartitionCrashedError(Exception):
    """A PartitionActor of the app crashed; raised by the AppActor to crash itself (never expected)."""


class AppActor(Supervisor):
    """One application; see the module docstring. A ``Supervisor`` of its PartitionActors (temporary
    children), whose ``receive`` is plain: runtime messages of the supervisor are handed on."""

    mailbox_size = 10_000
    expected_errors = (RiffleError, ChildStartError)

    def __init__(self, app_id: str, *, clock: Clock, heartbeat_timeout_s: float, memory: ActorRef,
                 spill: ActorRef, single_buffer_spill_bytes: int | None,
                 huge_threshold_bytes: int | None = None, huge_spill_bytes: int | None = None,
                 meta: ShuffleMetaLog | None = None, limits: AppLimits | None = None,
                 spill_limits: SpillLimits | None = None):
        # no restarts below: a partition actor that ends is never replaced (see the module docstring)
        super().__init__(f"app:{app_id}", max_restarts=0, within_s=1.0, clock=clock)
        self.state = AppState(app_id, clock, heartbeat_timeout_s, limits)
        self.app_id = app_id
        self.memory = memory
        self.spill = spill
        # spill_limits: the server's instance, shared by every app and changed in place by a config reload
        self.limits = (spill_limits if spill_limits is not None
                       else SpillLimits(single_buffer_spill_bytes, huge_threshold_bytes, huge_spill_bytes))
        self._contexts: dict[int, PartitionContext] = {}  # shuffle id -> its incarnation's context
        self._to_start: deque[tuple[int, int, PartitionEntry]] = deque()
        self._waiting: dict[PartitionEntry, list[PartitionMsg]] = {}  # messages for an actor starting
        self._starter: asyncio.Task[None] | None = None
        self._sends: set[SendTicket] = set()  # tickets not settled yet, released on stop
        self._lane = SliceLane()  # reports and shuffle results, see the module docstring
        self.partition_actors_started = 0
        self.log = logger.bind(app_id=app_id)
        self.meta = meta  # the durable metadata log (None: nothing is written, e.g. unit tests)

    async def on_start(self) -> None:
        await super().on_start()
        self._loop = asyncio.get_running_loop()
        if self.meta is not None:
            self.meta.attach(self.app_id, self._reported_records)

    def receive(self, msg: AppMsg) -> Any:
        state = self.state
        match msg:
            case IsExpired():
                return state.is_expired()
            case GetAppInfo():
                return app_report(state)
            case GetSpillCandidates():
                return [(e.figures.staging_bytes, sid, pid)
                        for sid, s in state.shuffles.items() for pid, e in s.partitions.items()
                        if e.figures.staging_bytes]
            case SpillPartitions(keys=keys):
                return self._spill_partitions(keys)
            case SpillAll():
                return self._flush(None)
            case PurgeShuffle(shuffle_id=sid):
                # no app check: an expired app may still drop a shuffle
                self._purge_shuffle(sid)
                return state.last_epoch  # the disks fence every incarnation up to this one
            case AppendBlocks():
                return self._append(msg)
            case RegisterShuffle():
                state.touch()
                if msg.user:
                    state.user = msg.user
                if msg.properties:
                    state.properties = dict(msg.properties)
                state.check_registration(msg.shuffle_id, msg.ranges)  # [app_config] limits: INVALID_REQUEST
                state.register_shuffle(msg.shuffle_id, msg.ranges, msg.local_order)
                # answered once the registration is on disk: a restarted server knows the shuffle
                return self._write_meta(msg.shuffle_id, REGISTER, encode_register(
                    msg.ranges, local_order=msg.local_order, user=state.user,
                    remote_storage=msg.remote_storage, properties=tuple(state.properties.items())))
            case RestoreApp(recovered=rec):
                self._restore(rec)
                return None
            case Terminated(ref=ref, reason=reason):
                if reason is not None:  # a partition actor crashed: its memory is lost, so is the app
                    raise PartitionCrashedError(f"partition actor {ref.name} crashed: {reason!r}") from reason
                return None  # stopped by its purge
            case (GetMemoryData() | GetPartitionDisks() | GetLocalReadPlan() | ReportShuffleResult() | GetShuffleResult()
                  | Heartbeat() | CommitShuffleTask() | FinishShuffle() | CheckBufferRequest()):
                pass
            case _:
                # the runtime's own supervisor messages; any other is a bug of the sender: a TypeError,
                # which crashes this actor (the app is purged, the asker gets an internal error)
                return Supervisor.receive(self, msg)
        # every other message is subject to the app check
        state.check_alive()
        state.touch()
        match msg:
            case GetMemoryData():
                entry = self._entry(msg.shuffle_id, msg.partition_id)
                if entry is not None and msg.task_filter is None:
                    entry.sequential_read = True
                if entry is None or not entry.has_actor:
                    return []
                reply: asyncio.Future[list[Block]] = self._loop.create_future()
                self._deliver(msg.shuffle_id, msg.partition_id, entry, ReadPart(
                    msg.last_block_id, msg.read_buffer_size, msg.task_filter, reply))
                return reply
            case GetPartitionDisks(shuffle_id=sid, partition_id=pid):
                entry = self._entry(sid, pid)
                return entry.figures.disks if entry is not None else ()
            case GetLocalReadPlan(shuffle_id=sid, partition_id=pid):
                entry = self._entry(sid, pid)
                if entry is None:
                    return LocalReadPlan((), None, False)
                return LocalReadPlan(tuple(entry.figures.disks), client_read_ahead(state.properties),
                                     entry.sequential_read)
            case ReportShuffleResult(shuffle_id=sid, partition_to_block_ids=p2b):
                if self.meta is None:
                    return self._lane.submit(state.report_steps(sid, p2b))
                sink: list = []
                return self._report(sid, self._lane.submit(state.report_steps(sid, p2b, sink)), sink)
            case GetShuffleResult(shuffle_id=sid, partition_ids=pids):
                return self._lane.submit(state.shuffle_result_steps(sid, pids))
            case Heartbeat():
                return None
            case CheckBufferRequest():
                return self._check_buffer_request(msg)
            case CommitShuffleTask(shuffle_id=sid):
                shuffle = state.shuffle(sid)
                shuffle.commit_count += 1
                return shuffle.commit_count
            case FinishShuffle(shuffle_id=sid):
                state.shuffle(sid)
                return self._flush(sid)
        raise TypeError(f"AppActor {self.app_id}: message {type(msg).__name__} passed the app check unhandled")

    # ------------------------------------------------------------- durable metadata
    def _write_meta(self, shuffle_id: int, kind: int, body: bytes) -> asyncio.Future[None] | None:
        """Queue a record of the shuffle's metadata log; the future of its write (None: no log)."""
        if self.meta is None:
            return None
        shuffle = self.state.shuffles.get(shuffle_id)
        if shuffle is None:
            return None
        return self.meta.append(self.app_id, shuffle_id, shuffle.epoch, kind, body)

    def _reported_records(self) -> list[tuple[int, int, bytes]]:
        """Every id reported so far, one BLOCK_IDS body per shuffle (the metadata log moves to another disk)."""
        return [(sid, shuffle.epoch,
                 encode_block_ids([(pid, array("Q", ids)) for pid, ids in shuffle.reported.items()]))
                for sid, shuffle in self.state.shuffles.items() if shuffle.reported]

    async def _report(self, shuffle_id: int, done: Any, sink: list) -> int:
        """A report is answered once its ids are in memory and in the metadata log."""
        try:
            new = await done if inspect.isawaitable(done) else done  # the lane finishes a small report at once
        finally:
            del done  # a refusal's traceback holds this frame: no cycle through the task that raised it
        if sink:
            body = self._lane.submit(encode_block_ids_steps(sink[0]))  # 200k partitions: ~0.5 s in slices
            if inspect.isawaitable(body):
                body = await body
            fut = self._write_meta(shuffle_id, BLOCK_IDS, body)
            if fut is not None:
                await fut
        return new

    def _restore(self, rec: RecoveredApp) -> None:
        """Rebuild the app from what recovery found on disk (only right after this actor started)."""
        plan = restore_app(self.state, rec)
        if self.meta is not None:
            self.meta.set_home(self.app_id, plan.home)
            for r in plan.registrations:
                self.meta.remember_registration(self.app_id, r.shuffle_id, r.epoch, r.record)
        if plan.lost_blocks:
            self.log.error("app {} lost {} reported blocks in the restart (acknowledged, only in memory when "  # noqa: PLE1205
                           "the server died): {}", self.app_id, plan.lost_blocks, plan.lost_summary)

    # ------------------------------------------------------------- routing
    def _entry(self, shuffle_id: int, partition_id: int) -> PartitionEntry | None:
        shuffle = self.state.shuffles.get(shuffle_id)
        return shuffle.partitions.get(partition_id) if shuffle is not None else None

    def _deliver(self, shuffle_id: int, partition_id: int, entry: PartitionEntry, msg: PartitionMsg) -> None:
        """Hand ``msg`` to the partition's actor, starting it on its first message."""
        ref = entry.ref
        if ref is not None:
            try:
                ref.tell_nowait(msg)
            except MailboxFullError:
                abandon(msg, NoBufferError(f"partition {partition_id} of shuffle {shuffle_id} is busy; "
                                           f"retry"), self.memory)
            except ActorDeadError:  # it crashed: this actor learns it from its Terminated next
                abandon(msg, InternalError(f"partition {partition_id} of shuffle {shuffle_id} was lost"),
                        self.memory)
            return
        waiting = self._waiting.get(entry)
        if waiting is not None:
            waiting.append(msg)
            return
        self._waiting[entry] = [msg]
        entry.starting = True
        self._to_start.append((shuffle_id, partition_id, entry))
        if self._starter is None:
            self._starter = self.spawn(self._start_partitions())

    async def _start_partitions(self) -> None:
        """Start the partition actors asked for, one after another, and hand them their waiting messages."""
        try:
            while self._to_start:
                sid, pid, entry = self._to_start.popleft()
                shuffle = self.state.shuffles.get(sid)
                if shuffle is None or shuffle.partitions.get(pid) is not entry:
                    continue  # purged meanwhile; the purge settled the waiting messages
                ctx = self._context(shuffle)
                spec = ChildSpec(f"part:{self.app_id}/{sid}.{shuffle.epoch}/{pid}",
                                 partial(PartitionActor, ctx, pid, entry.figures), RestartPolicy.TEMPORARY)
                ref = await self.start_child(spec)  # a failure crashes this actor: the app is purged
                ref.watch(self.ref)
                self.partition_actors_started += 1
                if self.state.shuffles.get(sid) is not shuffle:
                    ref.tell_nowait(PURGE)  # purged while it started: it holds nothing, it just stops
                    continue
                entry.ref = ref
                entry.starting = False
                for msg in self._waiting.pop(entry, ()):
                    self._deliver(sid, pid, entry, msg)
        finally:
            self._starter = None

    def _context(self, shuffle: ShuffleState) -> PartitionContext:
        ctx = self._contexts.get(shuffle.shuffle_id)
        if ctx is None or ctx.epoch != shuffle.epoch:
            ctx = self._contexts[shuffle.shuffle_id] = PartitionContext(
                self.app_id, shuffle.shuffle_id, shuffle.epoch, shuffle.local_order, self.limits, self.memory,
                self.spill, self._sends, self.meta)
        return ctx

    def _live_entries(self, shuffle_id: int | None) -> list[tuple[int, int, PartitionEntry]]:
        """Partitions with an actor (running or starting), of one shuffle or of the app."""
        return [(sid, pid, e) for sid, s in self.state.shuffles.items()
                if shuffle_id is None or sid == shuffle_id
                for pid, e in s.partitions.items() if e.has_actor]

    # ------------------------------------------------------------- writes
    def _append(self, msg: AppendBlocks) -> int | asyncio.Future[int]:
        """Check the whole send, then one ``AppendPart`` per partition; replies the budget bytes accepted."""
        ticket = msg.ticket
        if ticket is None:
            ticket = SendTicket(self.app_id, msg.ticket_size)
        state = self.state
        sid = msg.shuffle_id
        try:
            state.check_alive()
            state.touch()
            shuffle = state.shuffle(sid)
            entries = shuffle.partitions
            parts = []  # (partition id, its entry, its blocks) of the partitions with blocks
            # every check before any partition sees the request: an error must not leave half of it behind
            for batch in msg.partitions:
                pid = batch.partition_id
                entry = entries.get(pid)  # a partition with an entry is registered (the common case)
                if entry is None and not shuffle.is_registered(pid):
                    raise NoRegisterError(f"partition {pid} of shuffle {sid} is not registered")
                lowest = batch.min_block_id()
                if lowest < 0:  # not a Java block id; it would also break the id bitmaps
                    raise InvalidRequestError(f"partition {pid}: negative blockId {lowest}")
                if len(batch):
                    parts.append((pid, entry, batch))
        except BaseException:
            tell_commit(self.memory, ticket.release_rest())
            raise
        if not parts:
            tell_commit(self.memory, ticket.release_rest())
            return 0
        ticket.expect(len(parts), self._sends)
        reply: asyncio.Future[int] = self._loop.create_future()
        for pid, entry, batch in parts:
            if entry is None:
                entry = shuffle.partition(pid)  # its first data: the entry is made here, after every check
            self._deliver(sid, pid, entry, AppendPart(batch, ticket, reply))
        return reply

    def _check_buffer_request(self, msg: CheckBufferRequest) -> Any:
        """Registration (NO_REGISTER, as a send would answer), then the partition-limit backpressure
        (Riffle's huge partitions), from the size table; the split partitions among those named. With
        ``msg.size``: the reservation too, handed on to the MemoryManager (its ``BufferGrant`` is the reply)."""
        sid = msg.shuffle_id
        shuffle = self.state.shuffle(sid)
        for pid in msg.partition_ids:
            if not shuffle.is_registered(pid):
                raise NoRegisterError(f"partition {pid} of shuffle {sid} is not registered")
        held = BufferAdmission.backpressure(shuffle.partitions, msg.partition_ids, msg.limit_bytes)
        if held is not None:
            if held.spill_now:
                self._deliver(sid, held.partition_id, shuffle.partition(held.partition_id), SpillPart())
            raise HugePartitionBackpressureError(
                f"partition {held.partition_id} of shuffle {sid} is huge ({held.total_bytes} bytes received) and "
                f"holds {held.memory_bytes} bytes in memory, more than {msg.limit_bytes} "
                f"(partition_limit_memory_backpressure_ratio of capacity); retry later")
        split = BufferAdmission.split(shuffle.partitions, msg.partition_ids, self.limits.split_threshold_bytes)
        if split and not self.state.split_triggered:
            self.state.split_triggered = True
            self.log.warning("app {}: partition split asked for partitions {} of shuffle {} (above "  # noqa: PLE1205
                             "partition_split_threshold)", self.app_id, list(split), sid)
        if msg.size is None:
            return split
        # one ask per requireBuffer: the MemoryManager answers the service's ask itself (no hop back here;
        # its failure is the asker's, never this actor's)
        return Forward(self.memory, RequireBuffer(app_id=self.app_id, shuffle_id=sid, size=msg.size,
                                                  split_partition_ids=split))

    # ------------------------------------------------------------- spills
    def _spill_partitions(self, keys: Iterable[tuple[int, int]]) -> int | asyncio.Future[int]:
        """A watermark round's choice: the reply is the budget bytes put in flight, once they are."""
        targets = []
        for sid, pid in keys:
            entry = self._entry(sid, pid)
            if entry is not None and entry.figures.staging_bytes and entry.has_actor:
                targets.append((sid, pid, entry))
        if not targets:
            return 0
        join = Join(self._loop.create_future(), len(targets))
        for sid, pid, entry in targets:
            self._deliver(sid, pid, entry, SpillPart(join))
        return join.future

    def _flush(self, shuffle_id: int | None) -> asyncio.Future[int] | None:
        """Spill every partition of one shuffle (or of the app); reply when all batches are on disk."""
        targets = self._live_entries(shuffle_id)
        if not targets:
            return None
        join = Join(self._loop.create_future(), len(targets))
        for sid, pid, entry in targets:
            self._deliver(sid, pid, entry, FlushPart(join))
        return join.future  # a future: the reply comes later, the mailbox keeps flowing

    def _purge_shuffle(self, shuffle_id: int) -> None:
        """Drop the shuffle: each partition actor releases its memory (after what is queued) and stops."""
        shuffle = self.state.drop_shuffle(shuffle_id)
        self._contexts.pop(shuffle_id, None)
        if self.meta is not None:
            self.meta.forget_shuffle(self.app_id, shuffle_id)
        if shuffle is None:
            return
        if shuffle.reported:  # in the lane, after any result still reading them; freed whole: up to ~0.8 s
            self._lane.submit(release_steps(shuffle.reported))
        gone = NoRegisterError(f"shuffle {shuffle_id} of app {self.app_id} was unregistered")
        for entry in shuffle.partitions.values():
            if entry.ref is not None:
                try:
                    entry.ref.tell_nowait(PURGE)
                except MailboxFullError:
                    self.spawn(self._tell_later(entry.ref, PURGE))
                except ActorDeadError:
                    pass  # crashed: the app's purge (which its crash causes) releases its memory
            elif entry.starting:
                for msg in self._waiting.pop(entry, ()):
                    abandon(msg, gone, self.memory)
                entry.starting = False

    @staticmethod
    async def _tell_later(ref: ActorRef, msg: PartitionMsg) -> None:
        try:
            await ref.tell(msg)
        except ActorDeadError:
            pass

    async def on_stop(self) -> None:
        # the partition actors are stopped already (children stop first): what their queues held
        # will never be processed, so the reservations not used yet go back now, before the purge
        tell_commit(self.memory, release_all(self._sends, self.app_id))
        self._sends.clear()
        if self.meta is not None:
            self.meta.forget_app(self.app_id)
