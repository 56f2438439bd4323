"""PeriodicJobActor: one periodic async job of a daemon, woken by its ``TimerActor``.

For periodic work that is not an actor's own message handling (a push to a metrics gateway, a look
at the config file, a decommission's check of the apps left): instead of a task that sleeps in a
loop, the job's actor asks the timer for a one-shot ``Schedule`` of ``RunJob`` and, once a run has
finished, for the next one, ``interval_s()`` later (read at each run, so an interval changed by a
config reload applies from the next run). So:

- every deadline of the daemon is in its one timer (one armed loop timer for all of them; an idle
  daemon wakes only when a job is due);
- runs never overlap (the next one is scheduled when the previous one is done) and a slow run delays
  the next rather than piling up, as the sleeping loops did;
- a run that raises is logged (``what`` names the job) and the job goes on; ``runs`` / ``failures``
  count them;
- ``first_delay_s``: the first run, after start (0: at once); default one interval;
- a restarted incarnation schedules its next run again (``on_start``); ``on_stop`` cancels the timer
  entry and the run in progress (an owned task).

Not covered: the job's own bounds (a job bounds its own waits).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from riffle_actors.runtime.base import Actor
from riffle_actors.runtime.cell import ActorRef
from riffle_actors.runtime.mailbox import ActorDeadError, MailboxFullError
from riffle_actors.runtime.timer import Cancel, Schedule


@dataclass(frozen=True, slots=True)
class RunJob:
    """Told by the timer: run the job now (ignored while a run is in progress)."""


class PeriodicJobActor(Actor):
    """See the module docstring. ``key``: the job's entry in ``timer`` (unique among its entries)."""


    def __init__(self, job: Callable[[], Awaitable[Any]], *, timer: ActorRef, key: str,
                 interval_s: Callable[[], float], first_delay_s: float | None = None, what: str = "") -> None:
        self.job = job
        self.timer = timer
        self.key = key
        self.interval_s = interval_s
        self.first_delay_s = first_delay_s
        self.what = what or key
        self.runs = 0
        self.failures = 0
        self._running = False

    async def on_start(self) -> None:
        self._schedule(self.interval_s() if self.first_delay_s is None else self.first_delay_s)

    async def on_stop(self) -> None:
        try:
            self.timer.tell_nowait(Cancel(self.key))
        except (ActorDeadError, MailboxFullError):
            pass  # the timer stopped first: its entries went with it

    def receive(self, msg: RunJob) -> bool:
        """Answers whether a run started."""
        if not isinstance(msg, RunJob):
            raise TypeError(f"PeriodicJobActor: unexpected message {msg!r}")
        if self._running:
            return False
        self._running = True
        self.spawn(self._run())
        return True

    async def _run(self) -> None:
        try:
            await self.job()
        except Exception as e:  # noqa: BLE001 - logged; the job runs again at its next time
            self.failures += 1
            logger.opt(exception=e).error("periodic job {}: a run failed: {!r}", self.what, e)
        finally:
            self.runs += 1
            self._running = False
        self._schedule(self.interval_s())

    def _schedule(self, delay_s: float) -> None:
        due = self.system.clock.monotonic() + max(0.0, delay_s)
        try:
            self.timer.tell_nowait(Schedule(self.key, due, self.ref, RunJob()))
        except ActorDeadError:
            logger.debug("periodic job {}: the timer is stopped; no next run", self.what)
