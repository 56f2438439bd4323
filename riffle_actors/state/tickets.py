"""TicketBook: requireBuffer tickets (one-shot memory reservations) and their expiry.

A ticket is created only when its reservation succeeded, is consumed by exactly one
sendShuffleData, and is released when it is not used within ``timeout_s`` (spec §2.2).
Ids are a server-wide counter starting at 1. Time comes from an injected clock so that
tests move time instead of sleeping. The reservation itself lives in ``MemoryBudget``;
the caller releases it for every ticket this book returns from ``take``/``expire``/``purge_*``.
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

    def __len__(self) -> int:
        return len(self._tickets)

    def issue(self, app_id: str, shuffle_id: int, size: int) -> Ticket:
        ticket = Ticket(self._next_id, app_id, shuffle_id, size, self.clock.monotonic())
        self._next_id += 1
        self._tickets[ticket.ticket_id] = ticket
        return ticket

    def take(self, ticket_id: int) -> Ticket | None:
        """Remove and return the ticket, or None if it is unknown, used or expired."""
        return self._tickets.pop(ticket_id, None)

    def expire(self) -> list[Ticket]:
        """Remove and return every ticket older than the timeout."""
        deadline = self.clock.monotonic() - self.timeout_s
        expired = []
        while self._tickets:
            ticket = next(iter(self._tickets.values()))
            if ticket.created_monotonic > deadline:
                break
            expired.append(self._tickets.popitem(last=False)[1])
        return expired

    def purge_app(self, app_id: str, shuffle_id: int | None = None) -> list[Ticket]:
        """Remove the tickets of an app (or of one of its shuffles)."""
        gone = [
            t for t in self._tickets.values()
            if t.app_id == app_id and (shuffle_id is None or t.shuffle_id == shuffle_id)
        ]
        for t in gone:
            del self._tickets[t.ticket_id]
        return gone

    def total_size(self) -> int:
        return sum(t.size for t in self._tickets.values())
