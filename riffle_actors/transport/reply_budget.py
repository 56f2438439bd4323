"""Bytes of read replies the process holds, bounded over every transport (``max_reply_bytes``).

A read reply (getLocalShuffleData, getMemoryShuffleData, getLocalShuffleIndex) is memory the
server holds from the read until the client has taken the bytes: a client that asks and never
reads (urpc: does not read its socket; gRPC: never grants HTTP/2 flow-control window) would
otherwise make the process grow without bound, outside the memory budget of ``[memory_store]``.
``ReplyBudget`` is one byte count with FIFO waiters: a read takes its expected reply size before
it reads, waits while the total is over the limit, and after ``reply_wait_timeout_sec`` is
answered NO_BUFFER (the Uniffle client backs off and retries a read answered NO_BUFFER). The
transports give the bytes back once the reply left the process (urpc: its socket's write buffer
drained; gRPC: the message was handed to HTTP/2 under the client's window).

A request is always admitted when nothing is held, so one reply larger than the limit still goes
through alone. The gRPC adapter also keeps one per connection (``grpc_max_reply_bytes_per_connection``);
urpc bounds its connections itself, from the socket's write buffer.

See also: ``riffle_actors.transport.urpc_server``, ``riffle_actors.transport.grpc_server``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from riffle_actors.errors import NoBufferError


class ReplyBudget:
    """A byte count with a limit; ``acquire`` waits (FIFO) while the count is over it."""

    def __init__(self, limit: int, wait_timeout_s: float | None, *, key: str = "max_reply_bytes",
                 scope: str = "the server", on_change: Callable[[int], None] | None = None):
        self.limit = limit
        self.scope = scope
        self.wait_timeout_s = wait_timeout_s
        self.key = key
        self.held = 0
        self.peak = 0
        self.refused = 0
        self._on_change = on_change
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    def _fits(self, n: int) -> bool:
        return self.held == 0 or self.held + n <= self.limit

    async def acquire(self, n: int) -> None:
        """Take ``n`` bytes; waits while over the limit; TimeoutError after the wait timeout."""
        if not self._waiters and self._fits(n):
            self.take(n)
            return
        fut = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            if self.wait_timeout_s is None:
                await fut
            else:
                await asyncio.wait_for(asyncio.shield(fut), self.wait_timeout_s)
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted just as the wait ended: give it back
            else:
                fut.cancel()
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
                self._wake()
            raise

    async def acquire_or_refuse(self, n: int) -> None:
        """``acquire``, with the timeout turned into NO_BUFFER naming the key."""
        try:
            await self.acquire(n)
        except TimeoutError:
            self.refused += 1
            raise NoBufferError(f"{self.scope} holds {self.held} bytes of read replies not yet taken by their "
                                f"clients (limit {self.limit}, {self.key}); waited {self.wait_timeout_s:g}s "
                                f"(reply_wait_timeout_sec), retry later") from None

    def take(self, n: int) -> None:
        """Count ``n`` bytes at once, above the limit if need be (a reply found larger than expected)."""
        if n <= 0:
            return
        self.held += n
        self.peak = max(self.peak, self.held)
        if self._on_change is not None:
            self._on_change(self.held)

    def release(self, n: int) -> None:
        if n <= 0:
            return
        self.held -= n
        if self._on_change is not None:
            self._on_change(self.held)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits(n):
                return
            self._waiters.popleft()
            self.take(n)
            fut.set_result(None)
