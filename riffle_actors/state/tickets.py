"""TicketBook: requireBuffer tickets (one-shot memory reservations) and their expiry.

A ticket is created only when its reservation succeeded, is consumed by exactly one
sendShuffleData, and is released when it is not used within ``timeout_s`` (spec §2.2).
Ids are a server-wide counter starting at 1. Time comes from an injected clock so that
tests move time instead of sleeping. The reservation itself lives in ``MemoryBudget``;
the caller releases it for every ticket this book returns from ``take``/``expire``/``purge_*``.

The book also keeps, per app, how many tickets it holds and how many bytes they reserve
(``held``), so the MemoryManager can bound one app's share (``[memory_store]
app_buffer_ticket_max_ratio`` / ``app_buffer_ticket_max_number``): a ticket can never be renewed
past those bounds, since one taken again after its expiry counts like a new one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from riffle_actors.runtime import Clock


@dataclass(frozen=True, slots=True)
class Ticket:
    ticket_id: int
    app_id: str
    shuffle_id: int
    size: int
    created_monotonic: float


class TicketBook:
    def __init__(self, clock: Clock, timeout_s: float):
        self.clock = clock
        self.timeout_s = timeout_s
        self._next_id = 1
        # insertion order == creation order, so expiry scans only the oldest entries
        self._tickets: OrderedDict[int, Ticket] = OrderedDict()
        self._held: dict[str, tuple[int, int]] = {}  # app id -> (tickets, reserved bytes)

    def __len__(self) -> int:
        return len(self._tickets)

    def issue(self, app_id: str, shuffle_id: int, size: int) -> Ticket:
        ticket = Ticket(self._next_id, app_id, shuffle_id, size, self.clock.monotonic())
        self._next_id += 1
        self._tickets[ticket.ticket_id] = ticket
        count, size_bytes = self._held.get(app_id, (0, 0))
        self._held[app_id] = (count + 1, size_bytes + size)
        return ticket

    def held(self, app_id: str) -> tuple[int, int]:
        """(tickets, reserved bytes) the app holds now."""
        return self._held.get(app_id, (0, 0))

    def _forget(self, ticket: Ticket) -> None:
        count, size_bytes = self._held[ticket.app_id]
        if count == 1:
            del self._held[ticket.app_id]
        else:
            self._held[ticket.app_id] = (count - 1, size_bytes - ticket.size)

    def take(self, ticket_id: int) -> Ticket | None:
        """Remove and return the ticket, or None if it is unknown, used or expired."""
        ticket = self._tickets.pop(ticket_id, None)
        if ticket is not None:
            self._forget(ticket)
        return ticket

    def expire(self) -> list[Ticket]:
        """Remove and return every ticket older than the timeout."""
        deadline = self.clock.monotonic() - self.timeout_s
        expired = []
        while self._tickets:
            ticket = next(iter(self._tickets.values()))
            if ticket.created_monotonic > deadline:
                break
            expired.append(self._tickets.popitem(last=False)[1])
            self._forget(expired[-1])
        return expired

    def purge_app(self, app_id: str, shuffle_id: int | None = None) -> list[Ticket]:
        """Remove the tickets of an app (or of one of its shuffles)."""
        gone = [
            t for t in self._tickets.values()
            if t.app_id == app_id and (shuffle_id is None or t.shuffle_id == shuffle_id)
        ]
        for t in gone:
            del self._tickets[t.ticket_id]
            self._forget(t)
        return gone

    def total_size(self) -> int:
        return sum(t.size for t in self._tickets.values())
