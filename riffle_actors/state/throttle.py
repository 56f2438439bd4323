"""TokenBucket: the byte throughput limit of one disk (``[localfile_store.io_limiter]``, Riffle's).

Pure state with an injected clock: every call passes ``now`` (seconds, monotonic) and the bucket
answers how long the caller must wait before its IO may run. The caller does the waiting (the
Disk actor's IO threads sleep it: ``riffle_actors.actors.disk``); nothing here sleeps or locks.

The bucket holds at most ``capacity`` tokens (one second of the rate: Riffle's burst is its
per-second quota) and refills at ``rate`` tokens (bytes) per second. ``acquire(n, now)`` takes
``n`` tokens at once and returns the wait: 0 when the bucket holds ``n``, else the time the refill
needs to cover the shortfall. The tokens are taken at the call (the balance may go negative), so
a caller that arrives later waits behind every earlier one: waits are granted in call order,
nobody is starved and nobody waits for ever. A request bigger than ``capacity`` is never refused
(Riffle lets it pass unthrottled with a warning; that would let a big spill batch exceed the
limit): it is charged in full, so it waits for a full bucket plus the excess.

See also: ``riffle_actors.actors.disk`` (where the waits are slept), docs/storage.md "Disk throttle".
"""

from __future__ import annotations


class TokenBucket:
    """``rate`` bytes per second, at most ``capacity`` bytes of burst; starts full at ``now``."""

    __slots__ = ("_at", "_tokens", "capacity", "granted", "rate", "waited_s")

    def __init__(self, rate: float, capacity: float | None = None, *, now: float):
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.capacity = float(rate if capacity is None else capacity)
        if self.capacity <= 0:
            raise ValueError("capacity must be positive")
        self._tokens = self.capacity
        self._at = now
        self.granted = 0  # bytes charged since creation
        self.waited_s = 0.0  # total of the waits answered

    def tokens(self, now: float) -> float:
        """Tokens the bucket holds at ``now`` (negative: owed by callers still waiting)."""
        self._refill(now)
        return self._tokens

    def _refill(self, now: float) -> None:
        if now > self._at:  # a clock that goes back (or stands still) adds nothing
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def acquire(self, n: int, now: float) -> float:
        """Take ``n`` bytes' tokens; the seconds to wait before the IO runs (0.0: at once)."""
        if n <= 0:
            return 0.0
        self._refill(now)
        self._tokens -= n
        self.granted += n
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self.rate
        self.waited_s += wait
        return wait
