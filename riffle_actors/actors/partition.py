"""PartitionActor: one partition of one shuffle incarnation; owns its blocks, block ids and spill state.

A child of its AppActor, started on the first data for the partition (never at
registerShuffle) and named ``part:<app>/<shuffle>.<epoch>/<partition>``. It owns a
``PartitionState`` (``riffle_actors.state.partition``): staging and in-flight batches, the
ids of every block it ever accepted (de-duplication, also of blocks already on disk), the
disks holding its files, whether it is huge. The AppActor routes one message per request
to it (never one per block) and reads the partition's ``PartitionFigures`` (its line in the
app's size table, kept current by ``PartitionState``) without asking.

Messages and what the actor does with them:

- ``AppendPart``: append (readable as soon as it is processed), settle the part's share of
  the send's ``SendTicket`` (``riffle_actors.state.send``: pure; its ``Commit`` is told to the
  MemoryManager as one ``CommitTicket`` per send), spill at once when
  staging reached the spill size: ``MarkInFlight`` to the MemoryManager, ``SpillJob`` to
  the SpillDispatcher with this actor as ``reply_to``.
- ``ReadPart``: getMemoryShuffleData (in-flight then staging after ``lastBlockId``).
- ``SpillPart`` / ``FlushPart``: spill staging now (a watermark round, a huge partition) /
  and answer once every batch in flight is on disk (finishShuffle, graceful shutdown).
- ``SpillCompleted`` (from the SpillDispatcher): drop the batch, ``ReleaseMemory`` its bytes;
  the partition's first batch on a disk also queues a ``SEGMENT`` record in the metadata log.
- ``PurgePart`` (the shuffle's purge): release what it holds, answer waiters, stop.

Memory is exact because this actor is the one that knows what it holds: every byte reaches
the MemoryManager's ``used`` once (through its ``SendTicket``) before this actor tells any
``MarkInFlight`` or ``ReleaseMemory`` about it, moves to in flight once per batch, and is
released once, by the spill acknowledgement or by the purge.

Supervision: temporary, and watched by its AppActor. A crashed PartitionActor is not
restarted (its blocks in memory are gone; a fresh actor would serve reads that silently miss
them). Its queued messages are dropped; the AppActor, told ``Terminated`` with the reason,
crashes on purpose, so the AppManager purges the whole app: every byte the app held (this
partition's included) and its tickets are released, its files deleted, every pending ask of
the app fails (``ActorDeadError`` -> NO_REGISTER) and later calls get NO_REGISTER, so Spark
retries the stage. Waiters of ``FlushPart`` get INTERNAL_ERROR right away.

See also: ``riffle_actors.actors.app`` (the router and owner), ``riffle_actors.state.partition``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, NamedTuple

from loguru import logger

from riffle_actors.actors.memory import CommitTicket, MarkInFlight, ReleaseMemory
from riffle_actors.actors.meta_log import ShuffleMetaLog
from riffle_actors.actors.spill import SpillCompleted, SpillJob
from riffle_actors.errors import InternalError, RiffleError
from riffle_actors.protocol.shuffle_meta import SEGMENT, encode_segment
from riffle_actors.records import Block, BlockBatch
from riffle_actors.runtime import Actor, ActorRef
from riffle_actors.state.partition import PartitionFigures, PartitionState, SpillLimits
from riffle_actors.state.send import Commit, SendTicket, flush_all
from riffle_actors.state.tier_policy import HDFS_TIER


# ---------------------------------------------------------------------------- replies
def tell_commit(memory: ActorRef, commit: Commit | None) -> None:
    """Carry out a ``SendTicket``'s ``Commit``: one ``CommitTicket`` to the MemoryManager (sized for every
    send of the server, its mailbox takes it at once)."""
    if commit is not None:
        memory.tell_nowait(CommitTicket(app_id=commit.app_id, ticket_size=commit.ticket_bytes,
                                        used=commit.used_bytes))


class Join:
    """Sums the integer answers of ``parts`` partition actors into ``future`` (one AppActor reply)."""

    __slots__ = ("future", "remaining", "total")

    def __init__(self, future: asyncio.Future[int], parts: int) -> None:
        self.future = future
        self.remaining = parts
        self.total = 0

    def add(self, value: int = 0) -> None:
        self.total += value
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.total)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


# ---------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True)
class PartitionContext:
    """What the PartitionActors of one shuffle share (one object per shuffle, not per partition)."""

    app_id: str
    shuffle_id: int
    epoch: int
    local_order: bool
    limits: SpillLimits
    memory: ActorRef
    spill: ActorRef
    open_sends: set[SendTicket]  # the app's sends not settled yet (the AppActor's registry of them)
    meta: ShuffleMetaLog | None = None  # the durable metadata log (segment records)


class AppendPart(NamedTuple):
    """The blocks of one send for this partition (columnar); settled through ``ticket``. ``reply`` (the
    send's, shared by its parts) is given the bytes accepted by the part that completes the ticket.

    A ``NamedTuple``, not a frozen dataclass: one is made per partition of every send (~25 per 1 MiB
    send), and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) costs ~3x more."""

    batch: BlockBatch
    ticket: SendTicket
    reply: asyncio.Future[int]


@dataclass(frozen=True, slots=True)
class ReadPart:
    """getMemoryShuffleData; the blocks go to ``reply``."""

    last_block_id: int
    read_buffer_size: int
    task_filter: Container[int] | None
    reply: asyncio.Future[list[Block]]


@dataclass(frozen=True, slots=True)
class SpillPart:
    """Spill staging now; ``reply`` (if any) is given the budget bytes put in flight."""

    reply: Join | None = None


@dataclass(frozen=True, slots=True)
class FlushPart:
    """Spill staging; ``reply`` is given 0 once every batch in flight now is on disk."""

    reply: Join


@dataclass(frozen=True, slots=True)
class PurgePart:
    """The shuffle is purged: release everything, answer waiters, stop."""


PURGE = PurgePart()

PartitionMsg = AppendPart | ReadPart | SpillPart | FlushPart | PurgePart | SpillCompleted


def abandon(msg: Any, exc: BaseException, memory: ActorRef) -> None:
    """Settle a message that no PartitionActor will process (its shuffle was purged before the actor ran):
    a send's reservation not used goes back to ``memory`` and its reply fails with ``exc``."""
    match msg:
        case AppendPart(ticket=ticket, reply=reply):
            tell_commit(memory, ticket.release_rest())
            if not reply.done():
                reply.set_exception(exc)
        case ReadPart(reply=reply):
            if not reply.done():
                reply.set_exception(exc)
        case SpillPart(reply=reply):
            if reply is not None:
                reply.add(0)
        case FlushPart(reply=reply):
            reply.add(0)
        case _:
            pass


class _FlushWaiter:
    """A ``FlushPart`` waiting for the batches in flight when it arrived."""

    __slots__ = ("flight_ids", "reply")

    def __init__(self, flight_ids: set[int], reply: Join) -> None:
        self.flight_ids = flight_ids
        self.reply = reply


# ---------------------------------------------------------------------------- the actor
class PartitionActor(Actor):
    """One partition; see the module docstring. Routes messages to ``PartitionState`` and carries out
    its decisions. Nothing survives it: it is never restarted."""

    # Bounded by what feeds it: appends by the memory budget (each holds a ticket), reads and
    # spill orders by the RPCs and rounds in progress. The capacity costs nothing until used.
    mailbox_size = 100_000
    expected_errors = (RiffleError,)

    def __init__(self, ctx: PartitionContext, partition_id: int,
                 figures: PartitionFigures | None = None) -> None:
        self.ctx = ctx
        self.partition_id = partition_id
        self.state = PartitionState(figures, ctx.limits, ctx.local_order)
        self._waiters: list[_FlushWaiter] | None = None

    def receive(self, msg: PartitionMsg) -> Any:
        state = self.state
        match msg:
            case AppendPart(batch=batch, ticket=ticket, reply=reply):
                accepted, dropped, became_huge = state.append(batch.blocks())
                tell_commit(self.ctx.memory, ticket.part_done(accepted + dropped, accepted))
                if ticket.complete and not reply.done():
                    reply.set_result(ticket.accepted)
                if became_huge:
                    logger.bind(app_id=self.ctx.app_id).warning(
                        "partition {} of shuffle {} is huge: {} bytes received", self.partition_id,
                        self.ctx.shuffle_id, state.figures.total_bytes)
                if state.should_spill():
                    self._spill()
            case ReadPart(last_block_id=last, read_buffer_size=size, task_filter=task_filter, reply=reply):
                if not reply.done():
                    reply.set_result(state.read(last, size, task_filter))
            case SpillCompleted():
                self._complete(msg)
            case SpillPart(reply=reply):
                scheduled = self._spill()
                if reply is not None:
                    reply.add(scheduled)
            case FlushPart(reply=reply):
                self._spill()
                ids = state.in_flight_ids()
                if not ids:
                    reply.add(0)
                elif self._waiters is None:
                    self._waiters = [_FlushWaiter(set(ids), reply)]
                else:
                    self._waiters.append(_FlushWaiter(set(ids), reply))
            case PurgePart():
                self._purge()
            case _:
                raise TypeError(f"partition actor {self.name!r}: unexpected message {msg!r}")

    # ------------------------------------------------------------- memory and spills
    def _flush_open_sends(self) -> None:
        """Before telling the MemoryManager about our bytes: make sure it counted them as used.

        The app's sends still waiting for other partitions may hold bytes of ours: they tell what
        they have now. This runs once per spill or purge, never per append, and needs no record
        per partition of which sends it took part in.
        """
        tell_commit(self.ctx.memory, flush_all(self.ctx.open_sends, self.ctx.app_id))

    def _spill(self) -> int:
        flight = self.state.start_spill()
        if flight is None:
            return 0
        self._flush_open_sends()
        ctx = self.ctx
        disks = self.state.figures.disks
        # tell_nowait: both mailboxes are sized for every in-flight batch of the server
        ctx.memory.tell_nowait(MarkInFlight(app_id=ctx.app_id, size=flight.size))
        ctx.spill.tell_nowait(SpillJob(app_id=ctx.app_id, shuffle_id=ctx.shuffle_id,
                                       partition_id=self.partition_id, flight_id=flight.flight_id,
                                       blocks=flight.blocks, preferred_disk=disks[-1] if disks else None,
                                       earlier_disks=disks[:-1],
                                       reply_to=self.ref, epoch=ctx.epoch, huge=self.state.figures.huge))
        return flight.size

    def _complete(self, done: SpillCompleted) -> None:
        ctx = self.ctx
        if (done.epoch, done.shuffle_id, done.partition_id) != (ctx.epoch, ctx.shuffle_id, self.partition_id):
            return  # not ours (cannot happen while jobs carry this actor as reply_to)
        figures = self.state.figures
        disks_before, on_hdfs_before = len(figures.disks), figures.hdfs_bytes > 0
        released = self.state.complete_spill(done.flight_id, done.disk, done.data_bytes)
        if ctx.meta is not None:
            if len(figures.disks) > disks_before:
                # the partition has files on one more disk: its segment order, for a restarted server
                ctx.meta.append(ctx.app_id, ctx.shuffle_id, ctx.epoch, SEGMENT,
                                encode_segment(self.partition_id, figures.disks[-1]), wait=False)
            elif figures.hdfs_bytes > 0 and not on_hdfs_before:
                # blocks on the HDFS tier: a restarted server must not count them as lost
                ctx.meta.append(ctx.app_id, ctx.shuffle_id, ctx.epoch, SEGMENT,
                                encode_segment(self.partition_id, HDFS_TIER), wait=False)
        if released:
            self._flush_open_sends()
            ctx.memory.tell_nowait(ReleaseMemory(app_id=ctx.app_id, size=released, was_in_flight=True))
        if self._waiters is not None:
            still = []
            for waiter in self._waiters:
                waiter.flight_ids.discard(done.flight_id)
                if waiter.flight_ids:
                    still.append(waiter)
                else:
                    waiter.reply.add(0)
            self._waiters = still or None

    def _purge(self) -> None:
        self._flush_open_sends()
        staging, in_flight = self.state.release_all()
        ctx = self.ctx
        if staging:
            ctx.memory.tell_nowait(ReleaseMemory(app_id=ctx.app_id, size=staging, was_in_flight=False))
        if in_flight:
            ctx.memory.tell_nowait(ReleaseMemory(app_id=ctx.app_id, size=in_flight, was_in_flight=True))
        for waiter in self._waiters or ():
            waiter.reply.add(0)  # purged: nothing is left to wait for
        self._waiters = None
        self.stop_self()

    async def on_stop(self) -> None:
        # a crash (or the app's stop): a flush cannot be promised any more
        for waiter in self._waiters or ():
            waiter.reply.fail(InternalError(
                f"partition {self.partition_id} of shuffle {self.ctx.shuffle_id} of app {self.ctx.app_id} "
                f"was lost before its data reached disk"))
        self._waiters = None
