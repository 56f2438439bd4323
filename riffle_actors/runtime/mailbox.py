"""Bounded actor mailbox, its envelope and statistics, and the two delivery errors.

This module owns the data structure between senders and one actor: a ``collections.deque`` of
envelopes with a capacity, one consumer waiter future (the actor's run loop) and a FIFO of producer
waiters (senders blocked by back-pressure). It deliberately is not an ``asyncio.Queue``: the deque plus a
single waiter is about 3x cheaper per message (see shared/reference/actor-runtime-measurements.md §2).

- An ``Envelope`` is a plain ``(msg, reply)`` tuple; ``reply`` is the ask's future or ``None`` for a
  tell. A tuple, not a class, because one is built per message on the hot path.
- ``put_nowait`` raises ``MailboxFullError`` at capacity; ``put`` waits for space.
- ``put_control`` ignores the capacity; it is for runtime control messages whose number is bounded
  by something else (child exits, ``Terminated``, timer fires, cross-thread completions).
- ``close()`` makes every later put raise ``ActorDeadError``, wakes blocked senders (they get
  ``ActorDeadError``) and returns the undelivered envelopes so the owner can fail their asks.

Not covered: who consumes the mailbox and what happens to a failed ask (``base.py``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

Envelope = tuple[Any, "asyncio.Future[Any] | None"]


class ActorDeadError(Exception):
    """The actor is stopped (or crashed) and will not process, or did not finish, this message."""


class MailboxFullError(Exception):
    """``tell_nowait`` found the mailbox at capacity (use ``await tell`` to wait instead)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MailboxStatistics:
    """Snapshot of one actor's mailbox, for ``/debug/actors`` and mailbox gauges."""

    name: str
    depth: int
    capacity: int
    processed: int
    restarts: int
    state: str


class Mailbox:
    """Bounded FIFO of envelopes with one consumer; see the module docstring."""

    __slots__ = ("name", "queue", "capacity", "closed", "putters", "_limit", "_loop", "_getter")

    def __init__(self, name: str, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {capacity}")
        self.name = name
        self.queue: deque[Envelope] = deque()
        self.capacity = capacity
        self.closed = False
        self.putters: deque[asyncio.Future[None]] = deque()
        # One comparison on the hot path covers both "full" and "closed": closing sets the limit to 0.
        self._limit = capacity
        self._loop = loop
        self._getter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self.queue)

    def put_nowait(self, env: Envelope) -> None:
        """Append ``env`` or raise ``MailboxFullError`` / ``ActorDeadError``."""
        q = self.queue
        if len(q) >= self._limit:
            if self.closed:
                raise ActorDeadError(f"actor {self.name!r} is stopped")
            raise MailboxFullError(f"mailbox of {self.name!r} is full ({self.capacity})")
        q.append(env)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    def put_control(self, env: Envelope) -> None:
        """Append ``env`` regardless of capacity (bounded control traffic only); raise if closed."""
        if self.closed:
            raise ActorDeadError(f"actor {self.name!r} is stopped")
        self.queue.append(env)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    async def put(self, env: Envelope) -> None:
        """Append ``env``, waiting for space while the mailbox is full (back-pressure)."""
        while True:
            try:
                self.put_nowait(env)
                return
            except MailboxFullError:
                pass
            waiter: asyncio.Future[None] = self._loop.create_future()
            self.putters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release_one()  # we were handed a slot we will not use: pass it on
                else:
                    try:
                        self.putters.remove(waiter)
                    except ValueError:
                        pass
                raise

    def wait_nonempty(self) -> asyncio.Future[None]:
        """Future resolved by the next put; only the single consumer calls this."""
        getter = self._loop.create_future()
        self._getter = getter
        return getter

    def release_one(self) -> None:
        """Wake the oldest sender blocked on a full mailbox (the consumer calls this after a pop)."""
        putters = self.putters
        while putters:
            waiter = putters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def drain(self) -> list[Envelope]:
        """Remove and return everything queued, waking blocked senders into the freed space."""
        drained = list(self.queue)
        self.queue.clear()
        for _ in range(min(len(drained), len(self.putters))):
            self.release_one()
        return drained

    def close(self) -> list[Envelope]:
        """Refuse every later put, wake all blocked senders and the consumer, return what was queued."""
        self.closed = True
        self._limit = 0
        drained = list(self.queue)
        self.queue.clear()
        while self.putters:
            self.release_one()  # they retry, see ``closed`` and raise ActorDeadError
        getter, self._getter = self._getter, None
        if getter is not None and not getter.done():
            getter.set_result(None)
        return drained
