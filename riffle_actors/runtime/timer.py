"""TimerActor: the one actor that drives every deadline and periodic job of a server.

This module owns time-triggered messages. Heartbeats, ticket expiry, app-heartbeat expiry and
probation probes all register here instead of creating their own asyncio timers (thousands of
per-item timers were measured to slow a runtime to a crawl; see actor-runtime-measurements.md §5).

- Entries live in a ``sortedcontainers.SortedList`` keyed by ``(deadline, seq)``; ``seq`` keeps equal
  deadlines in scheduling order, so keys never need to be comparable.
- ``Schedule(key, deadline_monotonic, target_ref, msg)``: tell ``msg`` to ``target_ref`` once the clock's
  ``monotonic()`` reaches the deadline. Scheduling an existing ``key`` replaces it. A deadline already
  in the past fires while the ``Schedule`` is processed.
- ``ScheduleEvery(key, interval_s, target_ref, msg, first_delay_s=None)``: every ``interval_s``
  (first after ``first_delay_s``, default one interval). Missed periods are coalesced into one
  fire, and the next deadline stays on the original grid.
- ``Cancel(key)``: the ask answers whether something was cancelled.
- ``FireDue()``: fire everything due now; the ask answers how many entries remain scheduled. Tests use
  it as a barrier after ``clock.advance``.
- A target that is stopped for good loses its entry (periodic ones included). Fires ignore the
  target's mailbox capacity: timer traffic is small and must never block the timer.

**Waking.** The timer arms exactly one ``clock.call_at`` handle, for its earliest deadline, and re-arms
it when that changes. With ``SystemClock`` this is a single ``loop.call_later``. With ``ManualClock``,
``clock.advance(x)`` runs the handle, which queues a tick for the timer; a test then writes
``await timer_ref.ask(FireDue())`` to be sure every due message has been told (and asks the target
afterwards: the target's mailbox is FIFO). Tests never sleep to move time.

Messages keep positional construction (``Schedule(key, deadline, ref, msg)``) because that is the
documented call shape; they are still frozen and slotted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from loguru import logger
from sortedcontainers import SortedList

from riffle_actors.runtime.base import Actor
from riffle_actors.runtime.cell import ActorRef, tell_control
from riffle_actors.runtime.clock import Cancellable, Clock
from riffle_actors.runtime.mailbox import ActorDeadError


@dataclass(frozen=True, slots=True)
class Schedule:
    key: Hashable
    deadline_monotonic: float
    target_ref: ActorRef
    msg: Any


@dataclass(frozen=True, slots=True)
class ScheduleEvery:
    key: Hashable
    interval_s: float
    target_ref: ActorRef
    msg: Any
    first_delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    key: Hashable


@dataclass(frozen=True, slots=True)
class FireDue:
    pass


@dataclass(frozen=True, slots=True)
class _Tick:
    pass


TimerMsg = Schedule | ScheduleEvery | Cancel | FireDue | _Tick

_TICK = _Tick()


@dataclass(slots=True)
class _Entry:
    deadline: float
    seq: int
    target: ActorRef
    msg: Any
    interval: float | None


class TimerTable:
    """Every scheduled entry of one timer; hand the same table to every incarnation (see ``TimerActor``)."""

    __slots__ = ("entries", "queue", "seq")

    def __init__(self) -> None:
        self.entries: dict[Hashable, _Entry] = {}
        self.queue: SortedList = SortedList()  # (deadline, seq, key)
        self.seq = itertools.count()

    def __len__(self) -> int:
        return len(self.entries)


class TimerActor(Actor):
    """Single sorted-deadline timer; see the module docstring. ``clock`` defaults to the system's.

    **What survives a crash.** The entries live in ``table``, a ``TimerTable`` the owner creates once
    and hands to every incarnation (a supervisor's factory: ``lambda: TimerActor(clock, table)``), so a
    restarted timer keeps every schedule, periodic ones on their grid; its ``on_start`` fires what fell
    due meanwhile and arms the wake-up again. Only the armed clock handle belongs to an incarnation
    (cancelled by ``on_stop``). Without a table (tests), the entries die with the incarnation.
    """

    mailbox_size = 100_000
    expected_errors = (ValueError,)  # a bad request is answered, it does not take the timer down

    def __init__(self, clock: Clock | None = None, table: TimerTable | None = None) -> None:
        self.clock = clock
        table = table if table is not None else TimerTable()
        self._entries = table.entries
        self._queue = table.queue
        self._seq = table.seq
        self._handle: Cancellable | None = None
        self._armed_at: float | None = None

    async def on_start(self) -> None:
        if self.clock is None:
            self.clock = self.system.clock
        if self._entries:  # a restart: what fell due while no incarnation ran fires now
            self._fire_due()
            self._rearm()

    async def on_stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def receive(self, msg: TimerMsg) -> Any:
        result: Any = None
        match msg:
            case Schedule(key=key, deadline_monotonic=deadline, target_ref=target, msg=payload):
                self._add(key, deadline, target, payload, None)
            case ScheduleEvery(interval_s=interval, first_delay_s=first):
                if not interval > 0:
                    raise ValueError(f"ScheduleEvery interval must be > 0, got {interval}")
                delay = interval if first is None else first
                self._add(msg.key, self._now() + delay, msg.target_ref, msg.msg, interval)
            case Cancel(key=key):
                result = self._remove(key)
            case FireDue() | _Tick():
                pass
            case _:
                raise TypeError(f"TimerActor: unexpected message {msg!r}")
        self._fire_due()
        self._rearm()
        return len(self._entries) if isinstance(msg, FireDue) else result

    def _now(self) -> float:
        assert self.clock is not None
        return self.clock.monotonic()

    def _add(self, key: Hashable, deadline: float, target: ActorRef, msg: Any,
             interval: float | None) -> None:
        self._remove(key)
        entry = _Entry(deadline, next(self._seq), target, msg, interval)
        self._entries[key] = entry
        self._queue.add((deadline, entry.seq, key))

    def _remove(self, key: Hashable) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._queue.remove((entry.deadline, entry.seq, key))
        return True

    def _fire_due(self) -> None:
        now = self._now()
        queue = self._queue
        while queue and queue[0][0] <= now:
            deadline, _, key = queue.pop(0)
            entry = self._entries.pop(key)
            try:
                tell_control(entry.target, entry.msg)
            except ActorDeadError:
                logger.debug("timer: target {!r} of {!r} is stopped; entry dropped", entry.target.name, key)
                continue
            interval = entry.interval
            if interval is not None:
                missed = math.floor((now - deadline) / interval)
                self._add(key, deadline + (missed + 1) * interval, entry.target, entry.msg, interval)

    def _rearm(self) -> None:
        head = self._queue[0][0] if self._queue else None
        if head == self._armed_at:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_at = head
        if head is not None:
            assert self.clock is not None
            self._handle = self.clock.call_at(head, self._wake)

    def _wake(self) -> None:
        self._handle = None
        self._armed_at = None  # re-armed by the tick even if the loop's timer fired a little early
        try:
            tell_control(self.ref, _TICK)
        except ActorDeadError:
            pass
