"""MemoryLedger: the write memory of one server as pure state: budget, tickets, the watermark trigger.

Owned by the MemoryManagerActor, which routes events here and carries out what comes back; the
ledger itself is synchronous, has no actor, loop or IO, and is unit-tested without a loop
(``tests/unit/test_memory_ledger.py``). A send's bytes take one path through it:

1. ``require``: a requireBuffer reserves bytes in the ``MemoryBudget`` (``allocated``) and issues a
   one-shot ticket in the ``TicketBook``; NO_BUFFER past capacity or past the app's share of
   tickets (``app_max_ticket_bytes`` / ``app_max_tickets``).
2. ``take``: the send takes its ticket (gone whatever follows) and learns its size; a send that
   carries more than the ticket reserved is refused here (``TicketExceededError``) and the
   reservation goes back at once.
3. ``commit``: the send's ``SendTicket`` (``riffle_actors.state.send``) settles: ticket bytes leave
   ``allocated``, the bytes the partitions accepted become ``used``.
4. ``mark_in_flight`` / ``release``: a partition spills (the bytes stay used, now in flight) and
   its spill is acknowledged or the partition purged (the bytes leave memory).

``expire`` and ``purge_app`` release tickets nobody will use. Every event that moves memory up
answers with the watermark trigger's decision: a ``SpillRound`` instruction (ask the AppManager to
spill the largest buffers for ``target_bytes``) or None. The round stays "active" from
``round_started`` (the actor could tell it) to ``round_done``; a round without an answer for
``SPILL_ROUND_TIMEOUT_S`` no longer blocks the next (``SpillRound.overdue`` says so, for the log).
Riffle's ratios: ``(used - in_flight) / capacity`` above the high watermark, or, in the sensitive
mode (``[hybrid_store] sensitive_watermark_spill_enable``), ``used / capacity``, sized on the bytes
not in flight down to the low watermark.

What survives a crash of its actor: the ``MemoryBudget`` and ``TicketBook`` are handed in (the
server's, shared by every incarnation); the trigger's round state and counters are the ledger's and
start again with a new incarnation (a duplicate round only spills a little early).

See also: ``riffle_actors.state.budget``, ``riffle_actors.state.tickets``, ``riffle_actors.state.send``,
``riffle_actors.actors.memory``.
"""

from __future__ import annotations

from dataclasses import dataclass

from riffle_actors.errors import NoBufferError, TicketExceededError, TicketNotFoundError
from riffle_actors.runtime import Clock
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.buffer import BLOCK_OVERHEAD_BYTES
from riffle_actors.state.tickets import Ticket, TicketBook

SPILL_ROUND_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class SpillRound:
    """Instruction: ask the AppManager to spill the largest buffers for about ``target_bytes``.

    ``overdue``: the previous round never answered within ``SPILL_ROUND_TIMEOUT_S`` (its answer was
    lost, e.g. the AppManager restarted); this one starts anyway."""

    target_bytes: int
    overdue: bool = False


class MemoryLedger:
    """The write memory of one server; see the module docstring."""

    __slots__ = ("_above_high_since", "_round_active", "_round_started", "app_max_ticket_bytes", "app_max_tickets",
                 "budget", "clock", "expired_tickets_total", "high_bytes", "low_bytes", "sensitive",
                 "spill_rounds_total", "tickets")

    def __init__(self, budget: MemoryBudget, tickets: TicketBook, clock: Clock, *, high_watermark: float,
                 low_watermark: float, sensitive: bool = False, app_max_ticket_bytes: int | None = None,
                 app_max_tickets: int | None = None) -> None:
        self.budget = budget
        self.tickets = tickets
        self.clock = clock
        self.high_bytes = int(budget.capacity * high_watermark)
        self.low_bytes = int(budget.capacity * low_watermark)
        self.sensitive = sensitive
        # [memory_store] app_buffer_ticket_max_ratio x capacity / app_buffer_ticket_max_number; None = unbounded
        self.app_max_ticket_bytes = app_max_ticket_bytes
        self.app_max_tickets = app_max_tickets
        self._round_active = False
        self._round_started = 0.0
        self._above_high_since: float | None = None
        self.expired_tickets_total = 0
        self.spill_rounds_total = 0

    # ------------------------------------------------------------------ a send's bytes
    def require(self, app_id: str, shuffle_id: int, size: int) -> int:
        """Reserve ``size`` bytes and issue a ticket; its id. ``NoBufferError`` when they do not fit (the
        caller then asks ``spill(force=True)`` for a round: memory is short now)."""
        self._check_app_share(app_id, size)
        if not self.budget.try_allocate(size):
            b = self.budget
            raise NoBufferError(
                f"no buffer for {size} bytes: capacity {b.capacity}, used {b.used}, allocated {b.allocated}")
        return self.tickets.issue(app_id, shuffle_id, size).ticket_id

    def take(self, ticket_id: int, app_id: str, needed: int | None = None, release: bool = False) -> int:
        """A send takes its ticket: the bytes it reserved. Refused (``TicketNotFoundError``) when unknown,
        used, expired or another app's (that app's reservation goes back: the ticket is spent), and
        (``TicketExceededError``) when the send needs ``needed`` bytes, more than reserved (spent too).
        ``release``: the send is refused anyway (a CRC mismatch): the reservation goes back at once."""
        ticket = self.tickets.take(ticket_id)
        if ticket is None:
            raise TicketNotFoundError(f"requireBufferId {ticket_id} is unknown, used or expired")
        if ticket.app_id != app_id:
            self._release(ticket)
            raise TicketNotFoundError(f"requireBufferId {ticket_id} belongs to another app")
        if needed is not None and needed > ticket.size:
            self._release(ticket)
            raise TicketExceededError(
                f"sendShuffleData carries {needed} bytes (data + {BLOCK_OVERHEAD_BYTES} per block) but requireBufferId "
                f"{ticket_id} "
                f"reserved {ticket.size}; refused, nothing was stored")
        if release:
            self._release(ticket)
        return ticket.size

    def commit(self, app_id: str, ticket_bytes: int, used_bytes: int) -> SpillRound | None:
        """A send (or part of one) settled: ``ticket_bytes`` leave the reservations, ``used_bytes`` are held."""
        self.budget.release_allocated(ticket_bytes)
        self.budget.add_used(app_id, used_bytes)
        return self.spill()

    def mark_in_flight(self, app_id: str, size: int) -> None:
        self.budget.mark_in_flight(app_id, size)

    def release(self, app_id: str, size: int, *, was_in_flight: bool) -> None:
        self.budget.release_used(app_id, size, was_in_flight=was_in_flight)
        self._track_watermark()

    def purge_app(self, app_id: str, shuffle_id: int | None = None) -> None:
        """The app (or one shuffle of it) is gone: its tickets' reservations go back; for the whole app,
        every byte it held too."""
        for t in self.tickets.purge_app(app_id, shuffle_id):
            self._release(t)
        if shuffle_id is None:
            self.budget.purge_app(app_id)
            self._track_watermark()

    def expire(self) -> tuple[list[Ticket], SpillRound | None]:
        """The tickets not used within their timeout, released; and the trigger's decision."""
        expired = self.tickets.expire()
        for t in expired:
            self._release(t)
        self.expired_tickets_total += len(expired)
        return expired, self.spill()

    # ------------------------------------------------------------------ the watermark trigger
    def set_watermarks(self, high_watermark: float, low_watermark: float, sensitive: bool) -> SpillRound | None:
        self.high_bytes = int(self.budget.capacity * high_watermark)
        self.low_bytes = int(self.budget.capacity * low_watermark)
        self.sensitive = sensitive
        return self.spill()

    def spill(self, force: bool = False) -> SpillRound | None:
        """Whether a spill round should start now (``force``: a reservation was just refused, so the
        reservations count as pressure too). Call ``round_started`` once the round is under way."""
        self._track_watermark()
        overdue = False
        if self._round_active:
            if self.clock.monotonic() - self._round_started < SPILL_ROUND_TIMEOUT_S:
                return None
            overdue = True
        b = self.budget
        spillable = b.spillable()
        if spillable <= 0:
            return None
        measured = b.used if self.sensitive else spillable
        if measured > self.high_bytes or (force and b.used + b.allocated > self.high_bytes):
            if self.sensitive and spillable <= self.low_bytes and not force:
                return None  # Riffle: nothing to spill when what is not in flight is below the low watermark
            return SpillRound(max(spillable - self.low_bytes, 1), overdue)
        return None

    def round_started(self) -> None:
        self._round_active = True
        self._round_started = self.clock.monotonic()
        self.spill_rounds_total += 1

    def round_done(self, scheduled_bytes: int) -> SpillRound | None:
        """The AppManager's answer; another round may follow at once when this one put bytes in flight."""
        self._round_active = False
        return self.spill() if scheduled_bytes else None

    @property
    def above_high_since(self) -> float | None:
        """Since when (monotonic) used memory is above the high watermark, None when it is not."""
        return self._above_high_since

    # ------------------------------------------------------------------ internals
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
