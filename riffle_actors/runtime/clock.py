"""Injected time: the ``Clock`` protocol, ``SystemClock`` and the test ``ManualClock``.

This module owns every way riffle_actors code reads time or waits for it. Logic never calls
``time.time()``, ``time.monotonic()`` or ``asyncio.sleep(N)`` directly; it takes a ``Clock``.

- ``monotonic()`` is for deadlines and durations, ``time()`` (epoch seconds) for wall-clock values that
  leave the process (heartbeats, historical-app records).
- ``call_at(deadline, callback)`` runs a plain callback once ``monotonic()`` reaches ``deadline`` and
  returns a handle with ``cancel()``. It is the only wake-up primitive; ``TimerActor`` arms exactly one
  such handle for its earliest deadline.
- ``sleep(seconds)`` waits on the clock (rarely needed: prefer the TimerActor).

``ManualClock`` never moves by itself. ``advance(seconds)`` moves both readings and, before returning,
synchronously runs every ``call_at`` callback whose deadline has been reached, in deadline order. So a
test writes ``clock.advance(30)`` and everything waiting on the clock has been woken (callbacks must be
cheap and non-blocking: enqueue a message, resolve a future).

Not covered here: timers for many items (see ``riffle_actors.runtime.timer``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time as _time
from collections.abc import Callable
from typing import Protocol

from loguru import logger


class Cancellable(Protocol):
    """Handle returned by ``Clock.call_at``."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Source of time for all logic; see the module docstring."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences are meaningful."""
        ...

    def time(self) -> float:
        """Wall-clock epoch seconds."""
        ...

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Cancellable:
        """Run ``callback()`` on the event loop once ``monotonic() >= deadline``."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait until ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` / ``time.time`` and the running event loop's timers."""

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Cancellable:
        # call_later with a delta: uvloop's loop.time() is not guaranteed to equal time.monotonic().
        delay = max(0.0, deadline - _time.monotonic())
        return asyncio.get_running_loop().call_later(delay, callback)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _ManualHandle:
    __slots__ = ("deadline", "callback", "cancelled")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that only moves when ``advance()`` is called; for tests and simulations.

    ``monotonic()`` starts at ``start``; ``time()`` starts at ``wall_start`` (defaults to ``start``).
    Callbacks registered with ``call_at`` run inside ``advance()`` (see the module docstring). A callback
    whose deadline has already passed when registered runs soon on the running loop, or on the next
    ``advance()`` when no loop is running.
    """

    def __init__(self, start: float = 1000.0, wall_start: float | None = None) -> None:
        self._now = start
        self._wall_offset = (start if wall_start is None else wall_start) - start
        self._pending: list[tuple[float, int, _ManualHandle]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and run every callback that became due."""
        if seconds < 0:
            raise ValueError(f"ManualClock cannot go backwards (advance({seconds}))")
        self._now += seconds
        self._run_due()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Cancellable:
        handle = _ManualHandle(deadline, callback)
        heapq.heappush(self._pending, (deadline, next(self._seq), handle))
        if deadline <= self._now:
            try:
                asyncio.get_running_loop().call_soon(self._run_due)
            except RuntimeError:  # no loop: the next advance() runs it
                pass
        return handle

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = self.call_at(self._now + max(0.0, seconds), wake)
        try:
            await fut
        finally:
            handle.cancel()

    def pending(self) -> int:
        """Number of registered, not yet run and not cancelled callbacks (for test assertions)."""
        return sum(1 for _, _, h in self._pending if not h.cancelled)

    def _run_due(self) -> None:
        pending = self._pending
        while pending and pending[0][0] <= self._now:
            _, _, handle = heapq.heappop(pending)
            if handle.cancelled:
                continue
            handle.cancelled = True
            try:
                handle.callback()
            except Exception:  # one bad callback must not starve the others
                logger.exception("ManualClock callback {!r} failed", handle.callback)
