"""MemoryManagerActor: the write-memory budget, requireBuffer tickets and the spill trigger.

Owns a ``MemoryBudget`` and a ``TicketBook``. requireBuffer reserves bytes and issues a
one-shot ticket (NO_BUFFER past the app's share of tickets: ``app_max_ticket_bytes`` /
``app_max_tickets``); sendShuffleData takes the ticket and, once its blocks are in a partition
buffer, converts the reservation into used bytes. Tickets not used in time are released by
``ExpireTickets`` (told by the timer). When memory not already being spilled rises above the
high watermark, it asks the AppManager to spill the largest buffers down to the low
watermark, one round at a time. With ``[hybrid_store] sensitive_watermark_spill_enable`` (Riffle's
"sensitive" mode) the bytes being spilled count too: used memory, in flight included, above the high
watermark starts a round (still sized on the bytes not in flight, down to the low watermark, and
skipped when those are below it already), so a slow disk that keeps memory in flight makes the
server spill more of the rest instead of waiting for the flights to finish. ``SetWatermarks``
changes both watermarks (and the mode) live (``conf_reload_enable``).

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

See also: ``riffle_actors.state.budget``, ``riffle_actors.state.tickets``, ``riffle_actors.actors.app_manager``.
"""

from __future__ import annotations

from dataclasses import dataclass

from loguru import logger

from riffle_actors.errors import NoBufferError, RiffleError, TicketNotFoundError
from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, Clock, MailboxFullError
from riffle_actors.state.budget import BudgetSnapshot, MemoryBudget
from riffle_actors.state.tickets import Ticket, TicketBook


@dataclass(frozen=True, slots=True, kw_only=True)
class RequireBuffer:
    app_id: str
    shuffle_id: int
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TakeTicket:
    ticket_id: int
    app_id: str


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


_SPILL_ROUND_TIMEOUT_S = 30.0

MemoryMsg = (RequireBuffer | TakeTicket | CommitTicket | MarkInFlight | ReleaseMemory | PurgeAppMemory
             | ExpireTickets | SpillRoundDone | GetBudget | SetWatermarks)


class MemoryManagerActor(Actor):
    mailbox_size = 1_000_000  # one tell per in-flight batch; refusing one would lose track of memory
    expected_errors = (RiffleError,)

    def __init__(self, *, budget: MemoryBudget, tickets: TicketBook, high_watermark: float, low_watermark: float,
                 clock: Clock, app_manager_name: str = "app_manager", app_max_ticket_bytes: int | None = None,
                 app_max_tickets: int | None = None, sensitive_watermark: bool = False):
        # budget and tickets are created by the server and handed to every incarnation, so a
        # restart of this actor keeps the accounting of the memory that is really in use
        self.budget = budget
        self.tickets = tickets
        self.clock = clock
        self.high_bytes = int(budget.capacity * high_watermark)
        self.low_bytes = int(budget.capacity * low_watermark)
        # [hybrid_store] sensitive_watermark_spill_enable: in-flight bytes count in the high-watermark test
        self.sensitive_watermark = sensitive_watermark
        # the AppManager that serves spill rounds, found by its registered name when memory has to be
        # spilled (the two actors refer to each other and it starts after this one; a name survives restarts)
        self.app_manager_name = app_manager_name
        # [memory_store] app_buffer_ticket_max_ratio x capacity / app_buffer_ticket_max_number; None = unbounded
        self.app_max_ticket_bytes = app_max_ticket_bytes
        self.app_max_tickets = app_max_tickets
        self._spill_round_active = False
        self._spill_round_started = 0.0
        self.expired_tickets_total = 0
        self.spill_rounds_total = 0
        self._above_high_since: float | None = None

    def receive(self, msg: MemoryMsg):
        match msg:
            case RequireBuffer(app_id=app_id, shuffle_id=shuffle_id, size=size):
                self._check_app_share(app_id, size)
                if not self.budget.try_allocate(size):
                    self._maybe_spill(force=True)
                    b = self.budget
                    raise NoBufferError(
                        f"no buffer for {size} bytes: capacity {b.capacity}, used {b.used}, allocated {b.allocated}")
                return self.tickets.issue(app_id, shuffle_id, size).ticket_id
            case TakeTicket(ticket_id=ticket_id, app_id=app_id):
                ticket = self.tickets.take(ticket_id)
                if ticket is None:
                    raise TicketNotFoundError(f"requireBufferId {ticket_id} is unknown, used or expired")
                if ticket.app_id != app_id:
                    self._release(ticket)
                    raise TicketNotFoundError(f"requireBufferId {ticket_id} belongs to another app")
                return ticket.size
            case CommitTicket(app_id=app_id, ticket_size=ticket_size, used=used):
                self.budget.release_allocated(ticket_size)
                self.budget.add_used(app_id, used)
                self._maybe_spill()
            case MarkInFlight(app_id=app_id, size=size):
                self.budget.mark_in_flight(app_id, size)
            case ReleaseMemory(app_id=app_id, size=size, was_in_flight=was_in_flight):
                self.budget.release_used(app_id, size, was_in_flight=was_in_flight)
                self._track_watermark()
            case PurgeAppMemory(app_id=app_id, shuffle_id=None):
                for t in self.tickets.purge_app(app_id):
                    self._release(t)
                self.budget.purge_app(app_id)
                self._track_watermark()
            case PurgeAppMemory(app_id=app_id, shuffle_id=shuffle_id):
                for t in self.tickets.purge_app(app_id, shuffle_id):
                    self._release(t)
            case ExpireTickets():
                expired = self.tickets.expire()
                for t in expired:
                    self._release(t)
                if expired:
                    self.expired_tickets_total += len(expired)
                    logger.info("released {} expired buffer tickets ({} bytes)", len(expired),
                                sum(t.size for t in expired))
                self._maybe_spill()
            case SpillRoundDone(scheduled_bytes=scheduled):
                self._spill_round_active = False
                if scheduled:
                    self._maybe_spill()
            case SetWatermarks(high_watermark=high, low_watermark=low, sensitive=sensitive):
                self.high_bytes = int(self.budget.capacity * high)
                self.low_bytes = int(self.budget.capacity * low)
                self.sensitive_watermark = sensitive
                self._maybe_spill()
            case GetBudget():
                return BudgetReport(self.budget.snapshot(), len(self.tickets), self.expired_tickets_total,
                                    self.spill_rounds_total, self._above_high_since)
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    def _check_app_share(self, app_id: str, size: int) -> None:
        """NO_BUFFER (the client backs off and retries, its own sends free its tickets meanwhile) when
        one more ticket would take the app above its share of the outstanding reservations."""
        count, held = self.tickets.held(app_id)
        if self.app_max_tickets is not None and count >= self.app_max_tickets:
            raise NoBufferError(f"app {app_id} already holds {count} unused buffer tickets, the most one app may "
                                f"hold ([memory_store] app_buffer_ticket_max_number); retry after its sends")
        if self.app_max_ticket_bytes is not None and held + size > self.app_max_ticket_bytes:
            raise NoBufferError(
                f"no buffer for {size} bytes: app {app_id} already holds {held} bytes in unused tickets, and one "
                f"app may hold {self.app_max_ticket_bytes} ([memory_store] app_buffer_ticket_max_ratio of "
                f"capacity); retry after its sends")

    def _release(self, ticket: Ticket) -> None:
        self.budget.release_allocated(ticket.size)

    def _track_watermark(self) -> None:
        if self.budget.used > self.high_bytes:
            if self._above_high_since is None:
                self._above_high_since = self.clock.monotonic()
        else:
            self._above_high_since = None

    def _maybe_spill(self, force: bool = False) -> None:
        self._track_watermark()
        app_manager = self.system.get(self.app_manager_name)
        if app_manager is None:
            return
        if self._spill_round_active:
            if self.clock.monotonic() - self._spill_round_started < _SPILL_ROUND_TIMEOUT_S:
                return
            # the round's answer was lost (e.g. the AppManager restarted): do not stop spilling forever
            logger.warning("spill round without an answer for {:.0f}s; starting a new one", _SPILL_ROUND_TIMEOUT_S)
        spillable = self.budget.spillable()
        pressure = self.budget.used + self.budget.allocated
        if spillable <= 0:
            return
        # Riffle's ratio: (used - in_flight) / capacity, or used / capacity in the sensitive mode
        measured = self.budget.used if self.sensitive_watermark else spillable
        if measured > self.high_bytes or (force and pressure > self.high_bytes):
            if self.sensitive_watermark and spillable <= self.low_bytes and not force:
                return  # Riffle: nothing to spill when what is not in flight is below the low watermark
            target = max(spillable - self.low_bytes, 1)
            try:
                app_manager.tell_nowait(SpillLargest(target_bytes=target, reply_to=self.ref))
            except (MailboxFullError, ActorDeadError):
                return  # the next commit or tick tries again
            self._spill_round_active = True
            self._spill_round_started = self.clock.monotonic()
            self.spill_rounds_total += 1
