"""MemoryManagerActor: the write-memory budget, requireBuffer tickets and the spill trigger.

The logic is the ``MemoryLedger`` (``riffle_actors.state.memory_ledger``, pure): a send's bytes from
its reservation to their release, the per-app share of tickets, the watermark trigger. This actor
is its one owner: it routes each message to the ledger and carries out what comes back (a
``SpillRound`` becomes a ``SpillLargest`` told to the AppManager, one round at a time).
requireBuffer reserves bytes and issues a one-shot ticket (``RequireBuffer``, forwarded by the
AppActor after its checks: one ask per requireBuffer); sendShuffleData takes the ticket
(``TakeTicket``, refused when the send needs more than it reserved), which hands the send on to its
AppActor in the same step (one ask per send); its ``SendTicket``
(``riffle_actors.state.send``) turns the reservation into used bytes once the blocks are in partition
buffers (``CommitTicket``). Tickets not used in time are released by ``ExpireTickets`` (told by the
timer). With ``[hybrid_store] sensitive_watermark_spill_enable`` (Riffle's "sensitive" mode) the
bytes being spilled count in the high-watermark test. ``SetWatermarks`` changes both watermarks (and
the mode) live (``conf_reload_enable``).

**What survives a crash** (a permanent child of the root). The accounting: the ``MemoryBudget``
and the ``TicketBook`` are the server's, handed to every incarnation, and every message changes
them in one synchronous step, so a crash between two messages leaves them exact. The mail: the
tells that carry accounting (``CommitTicket``, ``MarkInFlight``, ``ReleaseMemory``,
``PurgeAppMemory``) and the asks queued behind the crash wait in the mailbox, which outlives the
incarnation, and the next one applies them in order; an ask being handled when it crashed is
answered with the error (a ``requireBuffer`` then reserved nothing, or its ticket is in the book and
expires). Lost with the incarnation: whether a spill round is under way (the next incarnation starts
a new round on its next commit; a duplicate round only spills a little early) and the counters
``expired_tickets_total`` / ``spill_rounds_total`` / the high-watermark timer, which start again.

See also: ``riffle_actors.state.memory_ledger``, ``riffle_actors.state.budget``, ``riffle_actors.state.tickets``,
``riffle_actors.actors.app_manager``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loguru import logger

from riffle_actors.errors import NoBufferError, RiffleError
from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, Clock, Forward, MailboxFullError
from riffle_actors.state.budget import BudgetSnapshot, MemoryBudget
from riffle_actors.state.memory_ledger import SPILL_ROUND_TIMEOUT_S, MemoryLedger, SpillRound
from riffle_actors.state.send import SendTicket
from riffle_actors.state.tickets import TicketBook


@dataclass(frozen=True, slots=True, kw_only=True)
class RequireBuffer:
    """Reserve ``size`` bytes: the ticket id, or with ``split_partition_ids`` (forwarded by the AppActor
    after its checks, see ``CheckBufferRequest``) a ``BufferGrant`` carrying them."""

    app_id: str
    shuffle_id: int
    size: int
    split_partition_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TakeTicket:
    """A send takes its ticket: the bytes it reserved (refused when the send ``needed`` more; with
    ``release`` the reservation goes back at once: the send is refused anyway).

    With ``fund`` and ``then`` (sendShuffleData: one ask for the ticket and the append): the ticket's
    size goes into ``fund`` (the send's ``SendTicket``) and the ask is handed on as ``then`` (the
    ``AppendBlocks`` to the app's actor, which answers it); without, the answer is the size."""

    ticket_id: int
    app_id: str
    needed: int | None = None
    release: bool = False
    fund: SendTicket | None = None
    then: Forward | None = None


@dataclass(frozen=True, slots=True)
class BufferGrant:
    """requireBuffer's answer: the ticket, and the partitions the client should move elsewhere."""

    ticket_id: int
    split_partition_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitTicket:
    """A send finished: release the ticket's reservation, count ``used`` bytes as held."""

    app_id: str
    ticket_size: int
    used: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkInFlight:
    app_id: str
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseMemory:
    app_id: str
    size: int
    was_in_flight: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeAppMemory:
    app_id: str
    shuffle_id: int | None = None


@dataclass(frozen=True, slots=True)
class ExpireTickets:
    pass


@dataclass(frozen=True, slots=True)
class SpillRoundDone:
    scheduled_bytes: int


@dataclass(frozen=True, slots=True)
class GetBudget:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class SetWatermarks:
    """A config reload: the new ``[hybrid_store]`` watermarks (ratios of capacity) and sensitive mode."""

    high_watermark: float
    low_watermark: float
    sensitive: bool


@dataclass(frozen=True, slots=True)
class BudgetReport:
    budget: BudgetSnapshot
    tickets: int
    expired_tickets_total: int
    spill_rounds_total: int
    above_high_watermark_since: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillLargest:
    """Told to the AppManager: spill the largest buffers for about ``target_bytes``."""

    target_bytes: int
    reply_to: ActorRef


MemoryMsg = (RequireBuffer | TakeTicket | CommitTicket | MarkInFlight | ReleaseMemory | PurgeAppMemory
             | ExpireTickets | SpillRoundDone | GetBudget | SetWatermarks)


class MemoryManagerActor(Actor):
    """Routes its messages to the ``MemoryLedger`` (the logic, pure) and carries out its instructions:
    a ``SpillRound`` becomes a ``SpillLargest`` told to the AppManager."""

    mailbox_size = 1_000_000  # one tell per in-flight batch; refusing one would lose track of memory
    expected_errors = (RiffleError,)

    def __init__(self, *, budget: MemoryBudget, tickets: TicketBook, high_watermark: float, low_watermark: float,
                 clock: Clock, app_manager_name: str = "app_manager", app_max_ticket_bytes: int | None = None,
                 app_max_tickets: int | None = None, sensitive_watermark: bool = False):
        # budget and tickets are created by the server and handed to every incarnation, so a
        # restart of this actor keeps the accounting of the memory that is really in use
        self.ledger = MemoryLedger(budget, tickets, clock, high_watermark=high_watermark,
                                   low_watermark=low_watermark, sensitive=sensitive_watermark,
                                   app_max_ticket_bytes=app_max_ticket_bytes, app_max_tickets=app_max_tickets)
        self.budget = budget
        self.tickets = tickets
        # the AppManager that serves spill rounds, found by its registered name when memory has to be
        # spilled (the two actors refer to each other and it starts after this one; a name survives restarts)
        self.app_manager_name = app_manager_name

    def receive(self, msg: MemoryMsg) -> Any:
        ledger = self.ledger
        match msg:
            case CommitTicket(app_id=app_id, ticket_size=ticket_size, used=used):
                self._spill(ledger.commit(app_id, ticket_size, used))
            case RequireBuffer(app_id=app_id, shuffle_id=shuffle_id, size=size, split_partition_ids=split):
                try:
                    ticket_id = ledger.require(app_id, shuffle_id, size)
                except NoBufferError:
                    self._spill(ledger.spill(force=True))
                    raise
                return ticket_id if split is None else BufferGrant(ticket_id, split)
            case TakeTicket(ticket_id=ticket_id, app_id=app_id, needed=needed, release=release, then=then):
                size = ledger.take(ticket_id, app_id, needed, release)
                if then is None:
                    return size
                if msg.fund is not None:
                    msg.fund.fund(size)  # from here the send's ticket gives back what no partition uses
                return then
            case MarkInFlight(app_id=app_id, size=size):
                ledger.mark_in_flight(app_id, size)
            case ReleaseMemory(app_id=app_id, size=size, was_in_flight=was_in_flight):
                ledger.release(app_id, size, was_in_flight=was_in_flight)
            case PurgeAppMemory(app_id=app_id, shuffle_id=shuffle_id):
                ledger.purge_app(app_id, shuffle_id)
            case ExpireTickets():
                expired, spill = ledger.expire()
                if expired:
                    logger.info("released {} expired buffer tickets ({} bytes)", len(expired),
                                sum(t.size for t in expired))
                self._spill(spill)
            case SpillRoundDone(scheduled_bytes=scheduled):
                self._spill(ledger.round_done(scheduled))
            case SetWatermarks(high_watermark=high, low_watermark=low, sensitive=sensitive):
                self._spill(ledger.set_watermarks(high, low, sensitive))
            case GetBudget():
                return BudgetReport(self.budget.snapshot(), len(self.tickets), ledger.expired_tickets_total,
                                    ledger.spill_rounds_total, ledger.above_high_since)
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None

    def _spill(self, spill: SpillRound | None) -> None:
        """Carry out the ledger's ``SpillRound``: one ``SpillLargest`` to the AppManager."""
        if spill is None:
            return
        app_manager = self.system.get(self.app_manager_name)
        if app_manager is None:
            return
        if spill.overdue:
            logger.warning("spill round without an answer for {:.0f}s; starting a new one", SPILL_ROUND_TIMEOUT_S)
        try:
            app_manager.tell_nowait(SpillLargest(target_bytes=spill.target_bytes, reply_to=self.ref))
        except (MailboxFullError, ActorDeadError):
            return  # the next commit or tick tries again
        self.ledger.round_started()
