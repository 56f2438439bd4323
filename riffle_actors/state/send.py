"""SendTicket and BufferAdmission: a send's settlement and requireBuffer's partition checks, as pure state.

``SendTicket`` is one sendShuffleData's reservation on its way to used memory. The ShuffleService
makes it empty; the MemoryManager ``fund``s it with the taken ticket's size (``MemoryLedger.take``) and
hands the send on to the AppActor in the same step (``TakeTicket.then``, a runtime ``Forward``); the
AppActor ``expect``s the parts it routes (one per partition with blocks) and registers it with the
app's open sends; each PartitionActor calls ``part_done(offered, accepted)`` once its part is
readable. Nothing here tells anything: every method returns a ``Commit`` instruction (ticket bytes
leaving the reservations, bytes now held) or None, and the actor that called it tells the
MemoryManager one ``CommitTicket`` with it. So the bytes of a send take one path, ticket ->
``Commit`` -> ``MemoryLedger.commit``, and each byte is counted exactly once:

- the last part settles the ticket: its slack (reserved, not needed) goes back with the used bytes,
  in one ``Commit`` per send (never one per part);
- ``flush``: what the parts processed so far add up to, earlier: a partition asks for it before it
  tells ``MarkInFlight`` or ``ReleaseMemory`` about blocks of this send (the ledger must count them
  used first);
- ``release_rest``: the send ends whatever is still to come (the AppActor stopped, a part was
  abandoned): what no part used goes back. Idempotent; a part processed after it still counts its
  used bytes (and only those).

Everything runs on the event loop thread; the reply to the send (a future) is the actors' business
(``AppendPart.reply``): ``complete`` says when the last part is in.

``BufferAdmission`` is requireBuffer's decision over an app's size table: the huge-partition
backpressure (Riffle's ``partition_limit_memory_backpressure_ratio``) and the partitions above the
partition-split threshold. It returns a ``Backpressure`` instruction (refuse; and spill the
partition now when nothing of it is on its way to disk) or the split partitions.

Not covered: the server's budget and tickets (``riffle_actors.state.memory_ledger``), the partition's
own figures (``riffle_actors.state.partition``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from riffle_actors.state.app_state import PartitionEntry


@dataclass(frozen=True, slots=True)
class Commit:
    """Instruction: ``ticket_bytes`` leave the app's reservations, ``used_bytes`` are now held."""

    app_id: str
    ticket_bytes: int
    used_bytes: int


class SendTicket:
    """One send's reservation turned into used memory; see the module docstring."""

    __slots__ = ("_registry", "_share", "_used", "accepted", "app_id", "complete", "remaining", "unprocessed")

    def __init__(self, app_id: str, size: int) -> None:
        self.app_id = app_id
        self.unprocessed = size  # reservation bytes no part has settled yet
        self.remaining = 1  # parts still to come; <= 0 once settled
        self.accepted = 0
        self._share = 0  # settled reservation bytes not committed yet
        self._used = 0  # accepted bytes not committed yet
        self._registry: set[SendTicket] | None = None
        self.complete = False  # every part expected came in before any release_rest: the reply is ``accepted``

    def fund(self, size: int) -> None:
        """The taken ticket's ``size``, set by the MemoryManager as it takes the ticket (before any part):
        a ticket made before that (``SendTicket(app_id, 0)``) holds nothing to give back until then."""
        self.unprocessed = size

    @property
    def settled(self) -> bool:
        return self.remaining <= 0

    def expect(self, parts: int, registry: set[SendTicket]) -> None:
        """Wait for ``parts`` parts; ``registry`` (the app's open sends) holds the ticket until settled."""
        self.remaining = parts
        self._registry = registry
        registry.add(self)

    def part_done(self, offered: int, accepted: int) -> Commit | None:
        """A part is readable: ``offered`` bytes of the ticket paid for ``accepted`` bytes now held.

        The ``Commit`` to tell now: at the last part (the whole send), or for a part processed after
        ``release_rest``; None while parts are still to come."""
        share = min(offered, self.unprocessed)
        self.unprocessed -= share
        self._share += share
        self._used += accepted
        self.accepted += accepted
        self.remaining -= 1
        if self.remaining > 0:
            return None
        if self.remaining == 0:
            self.complete = True
            return self._settle()
        return self.flush()  # a part processed after release_rest

    def flush(self) -> Commit | None:
        """What the parts processed so far add up to and was not committed yet."""
        if not (self._share or self._used):
            return None
        commit = Commit(self.app_id, self._share, self._used)
        self._share = self._used = 0
        return commit

    def release_rest(self) -> Commit | None:
        """Settle now: what no part used goes back (with what the parts did not commit yet)."""
        self.remaining = min(self.remaining, 0)
        return self._settle()

    def _settle(self) -> Commit | None:
        self._share += self.unprocessed  # the slack of the ticket, or what will never be used
        self.unprocessed = 0
        if self._registry is not None:
            self._registry.discard(self)
            self._registry = None
        return self.flush()


def flush_all(tickets: Iterable[SendTicket], app_id: str) -> Commit | None:
    """``flush`` of every open send of one app, as one ``Commit`` (a partition about to spill or purge)."""
    return _one_commit(app_id, [ticket.flush() for ticket in tickets])


def release_all(tickets: Iterable[SendTicket], app_id: str) -> Commit | None:
    """``release_rest`` of every open send of one app, as one ``Commit`` (the app's actor stopped)."""
    return _one_commit(app_id, [ticket.release_rest() for ticket in list(tickets)])


def _one_commit(app_id: str, commits: Iterable[Commit | None]) -> Commit | None:
    """The sum of ``commits`` as one ``Commit`` of ``app_id``; None when it moves nothing."""
    ticket_bytes = used_bytes = 0
    for commit in commits:
        if commit is not None:
            ticket_bytes += commit.ticket_bytes
            used_bytes += commit.used_bytes
    if ticket_bytes or used_bytes:
        return Commit(app_id, ticket_bytes, used_bytes)
    return None


# ---------------------------------------------------------------------------- requireBuffer's checks
@dataclass(frozen=True, slots=True)
class Backpressure:
    """Instruction: refuse the requireBuffer (NO_BUFFER_FOR_HUGE_PARTITION) for ``partition_id``; with
    ``spill_now``, spill its staging first (nothing of it is on its way to disk, so without a spill it
    would stay above the limit and never drain)."""

    partition_id: int
    spill_now: bool
    total_bytes: int
    memory_bytes: int


class BufferAdmission:
    """requireBuffer's decisions over one shuffle's size table (``partitions``: partition id -> its line)."""

    __slots__ = ()

    @staticmethod
    def backpressure(partitions: Mapping[int, PartitionEntry], partition_ids: Iterable[int],
                     limit_bytes: int | None) -> Backpressure | None:
        """The first partition named that is huge and holds more than ``limit_bytes`` in memory (staging +
        in flight); None when there is none (or the limit is off)."""
        if limit_bytes is None:
            return None
        for pid in partition_ids:
            entry = partitions.get(pid)
            if entry is None:
                continue
            f = entry.figures
            if not f.huge or f.memory_bytes <= limit_bytes:
                continue
            return Backpressure(pid, not f.in_flight_bytes, f.total_bytes, f.memory_bytes)
        return None

    @staticmethod
    def split(partitions: Mapping[int, PartitionEntry], partition_ids: Iterable[int],
              threshold_bytes: int | None) -> tuple[int, ...]:
        """The partitions named that the client should move (sorted): marked on a write above the
        threshold (for good, as Riffle), or above a threshold lowered by a config reload since."""
        if threshold_bytes is None:
            return ()
        split = set()
        for pid in partition_ids:
            entry = partitions.get(pid)
            if entry is not None and (entry.figures.split or entry.figures.total_bytes > threshold_bytes):
                split.add(pid)
        return tuple(sorted(split))
