"""Bounded actor mailbox, its envelope and statistics, and the two delivery errors.

This module owns the data structure between senders and one actor: a ``collections.deque`` of
envelopes with a capacity, a one-shot "mail arrived" callback for the consumer (the actor's cell) and a
FIFO of producer waiters (senders blocked by back-pressure). It deliberately is not an ``asyncio.Queue``:
the deque and no per-message future are about 3x cheaper (see shared/reference/actor-runtime-measurements.md
§2).

- An ``Envelope`` is a plain ``(msg, reply)`` tuple; ``reply`` is the ask's future or ``None`` for a
  tell. A tuple, not a class, because one is built per message on the hot path.
- ``put_nowait`` raises ``MailboxFullError`` at capacity; ``put`` waits for space.
- ``put_control`` ignores the capacity; it is for runtime control messages whose number is bounded
  by something else (child exits, ``Terminated``, timer fires, cross-thread completions).
- **Waking the consumer.** An idle consumer calls ``notify_next_put()``; the next put then calls the
  ``on_put`` callback given at construction, once, synchronously (it must only schedule work). A busy
  consumer does not ask, so a put into a busy mailbox costs an append and one flag test.
- ``close()`` makes every later put raise ``ActorDeadError``, wakes blocked senders (they get
  ``ActorDeadError``) and returns the undelivered envelopes so the owner can fail their asks.
- **An idle mailbox holds no deque.** An empty ``collections.deque`` costs about 760 bytes, which
  100k idle actors would pay for nothing. ``queue`` is a shared empty tuple until the first put (or
  again once the consumer went idle with it empty), and the deque of blocked senders is made when the
  first sender blocks. The hot path does not pay for this: the limit is 0 while there is no deque, so
  the one "full or closed" comparison also sends the first put to the slow path, which makes the deque.

Not covered: who consumes the mailbox and what happens to a failed ask (``cell.py``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Envelope = tuple[Any, "asyncio.Future[Any] | None"]

_NO_QUEUE: Any = ()  # the queue of a mailbox that holds no deque (never used, or idle and empty)


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

    __slots__ = ("name", "queue", "capacity", "closed", "putters", "_limit", "_loop", "_on_put", "_notify")

    def __init__(self, name: str, capacity: int, loop: asyncio.AbstractEventLoop,
                 on_put: Callable[[], None]) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {capacity}")
        self.name = name
        self.queue: deque[Envelope] = _NO_QUEUE  # a deque from the first put; see the module docstring
        self.capacity = capacity
        self.closed = False
        # Senders blocked on a full mailbox, oldest first; None until the first one blocks.
        self.putters: deque[asyncio.Future[None]] | None = None
        # One comparison on the hot path covers "full", "closed" and "no deque yet": the limit is 0 in the
        # last two cases.
        self._limit = 0
        self._loop = loop
        self._on_put = on_put
        self._notify = False

    def __len__(self) -> int:
        return len(self.queue)

    def put_nowait(self, env: Envelope) -> None:
        """Append ``env`` or raise ``MailboxFullError`` / ``ActorDeadError``."""
        q = self.queue
        if len(q) >= self._limit:
            q = self._room()
        q.append(env)
        if self._notify:
            self._notify = False
            self._on_put()

    def _room(self) -> deque[Envelope]:
        """Slow path of a put: the deque to append to, made if there is none; raise if full or closed."""
        if self.closed:
            raise ActorDeadError(f"actor {self.name!r} is stopped")
        q = self.queue
        if q is not _NO_QUEUE:
            raise MailboxFullError(f"mailbox of {self.name!r} is full ({self.capacity})")
        q = self.queue = deque()
        self._limit = self.capacity
        return q

    def put_control(self, env: Envelope) -> None:
        """Append ``env`` regardless of capacity (bounded control traffic only); raise if closed."""
        if self.closed:
            raise ActorDeadError(f"actor {self.name!r} is stopped")
        q = self.queue
        if q is _NO_QUEUE:
            q = self.queue = deque()
            self._limit = self.capacity
        q.append(env)
        if self._notify:
            self._notify = False
            self._on_put()

    async def put(self, env: Envelope) -> None:
        """Append ``env``, waiting for space while the mailbox is full (back-pressure)."""
        while True:
            try:
                self.put_nowait(env)
                return
            except MailboxFullError:
                pass
            waiter: asyncio.Future[None] = self._loop.create_future()
            putters = self.putters
            if putters is None:
                putters = self.putters = deque()
            putters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release_one()  # we were handed a slot we will not use: pass it on
                else:
                    try:
                        putters.remove(waiter)
                    except ValueError:
                        pass
                raise

    def notify_next_put(self) -> None:
        """Call ``on_put`` at the next put (once); the consumer calls this when it goes idle.

        An empty mailbox gives its deque back here: an idle actor holds none."""
        self._notify = True
        if not self.queue:
            self._drop_queue()

    def _drop_queue(self) -> None:
        self.queue = _NO_QUEUE
        self._limit = 0

    def cancel_notify(self) -> None:
        """Undo ``notify_next_put`` (the consumer is about to end or was woken another way)."""
        self._notify = False

    def release_one(self) -> None:
        """Wake the oldest sender blocked on a full mailbox (the consumer calls this after a pop)."""
        putters = self.putters
        while putters:
            waiter = putters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def requeue_front(self, env: Envelope) -> None:
        """Put ``env`` back at the head (a message taken but not handled); ignores the capacity."""
        q = self.queue
        if q is _NO_QUEUE:
            q = self.queue = deque()
            self._limit = self.capacity
        q.appendleft(env)

    def close(self) -> list[Envelope]:
        """Refuse every later put and wake all blocked senders; return what was queued."""
        self.closed = True
        self._notify = False
        drained = list(self.queue)
        self._drop_queue()
        while self.putters:
            self.release_one()  # they retry, see ``closed`` and raise ActorDeadError
        return drained
