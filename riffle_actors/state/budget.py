"""MemoryBudget: the write-memory accounting of one server (owned by the MemoryManagerActor).

Three figures, all bytes, with the invariant ``0 <= in_flight <= used`` and
``allocated + used <= capacity`` (except transiently when a send carries more than it
reserved, which the next check corrects):

- ``allocated``: reserved by requireBuffer tickets that no send has used yet;
- ``used``: blocks held in partition buffers (staging + in-flight), counted as Uniffle does,
  ``len(data) + 32`` per block;
- ``in_flight``: the part of ``used`` being spilled right now (still readable from memory).

Usage is also kept per app so that the purge of an app (or the crash of its actor) gives
back exactly what it held, even if its buffers are gone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    capacity: int
    allocated: int
    used: int
    in_flight: int

    @property
    def available(self) -> int:
        return max(0, self.capacity - self.allocated - self.used)


class MemoryBudget:
    """Capacity / allocated / used / in-flight bytes, with per-app usage."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.allocated = 0
        self.used = 0
        self.in_flight = 0
        self._used_by_app: dict[str, int] = {}
        self._in_flight_by_app: dict[str, int] = {}

    def snapshot(self) -> BudgetSnapshot:
        return BudgetSnapshot(self.capacity, self.allocated, self.used, self.in_flight)

    def try_allocate(self, size: int) -> bool:
        """Reserve ``size`` bytes if they fit next to what is allocated and used."""
        if size < 0:
            raise ValueError("size must not be negative")
        if self.allocated + self.used + size > self.capacity:
            return False
        self.allocated += size
        return True

    def release_allocated(self, size: int) -> None:
        self.allocated = max(0, self.allocated - size)

    def add_used(self, app_id: str, size: int) -> None:
        """Blocks of ``app_id`` now live in memory."""
        if size:
            self.used += size
            self._used_by_app[app_id] = self._used_by_app.get(app_id, 0) + size

    def mark_in_flight(self, app_id: str, size: int) -> None:
        """A spill of ``size`` bytes of ``app_id`` started (the bytes stay used)."""
        if app_id in self._used_by_app and size:
            self.in_flight += size
            self._in_flight_by_app[app_id] = self._in_flight_by_app.get(app_id, 0) + size

    def release_used(self, app_id: str, size: int, *, was_in_flight: bool) -> int:
        """Blocks of ``app_id`` left memory; returns the bytes actually released.

        Releases for an app that was purged already are ignored (its bytes went with the purge).
        """
        held = self._used_by_app.get(app_id)
        if held is None:
            return 0
        size = min(size, held)
        self.used -= size
        if held - size:
            self._used_by_app[app_id] = held - size
        else:
            del self._used_by_app[app_id]
        if was_in_flight:
            inf = self._in_flight_by_app.get(app_id, 0)
            dec = min(size, inf)
            self.in_flight -= dec
            if inf - dec:
                self._in_flight_by_app[app_id] = inf - dec
            else:
                self._in_flight_by_app.pop(app_id, None)
        return size

    def purge_app(self, app_id: str) -> int:
        """Forget everything ``app_id`` held; returns the bytes released."""
        size = self._used_by_app.pop(app_id, 0)
        self.used -= size
        self.in_flight -= self._in_flight_by_app.pop(app_id, 0)
        return size

    def used_by_app(self, app_id: str) -> int:
        return self._used_by_app.get(app_id, 0)

    def spillable(self) -> int:
        """Bytes in memory that are not being spilled already."""
        return self.used - self.in_flight
