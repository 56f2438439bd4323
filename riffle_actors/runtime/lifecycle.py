"""StartSequence: a daemon's ordered start with rollback, and its stop in the reverse order.

A composition root (the shuffle server, the coordinator) lists what it brings up as ``Step``s, each a
name, an async ``start`` and an async ``stop`` (or none, for a step with nothing to undo), in the
order they depend on each other: the data-path locks, the actors, the listeners. Then:

- ``await seq.start()`` starts the steps one after the other. When step *k*'s ``start`` raises (or is
  cancelled), steps *k-1* .. *0* are stopped in reverse order, the failure is logged with the step's
  name, and it is raised again: a half-started daemon leaves nothing running. A failure of one of the
  ``expected_errors`` (e.g. a port in use, which the daemon reports as one line) is logged at debug
  level without its traceback; any other with its traceback. Step *k* itself is not
  stopped (it did not start); a ``start`` that fails half-way undoes its own part before raising.
- ``await seq.stop()`` stops every started step in reverse order. A step whose ``stop`` raises is
  logged and the rest still stop (a stop that cannot close a listener must not keep the data-path
  locks held); ``stop`` itself raises only a cancellation (``BaseException`` that is not an
  ``Exception``), after every step had its turn. Idempotent: a second ``stop`` (or one concurrent
  with the first) waits for the first and does nothing more.
- A ``stop`` while ``start`` runs lets the running step finish, then stops everything started and makes
  ``start`` raise ``StartAborted``.
- ``seq.running`` names the steps started and not yet stopped, in start order.

One sequence starts once: a daemon that stopped is built again (``start`` after ``start`` or after
``stop`` raises ``RuntimeError``).

Not covered: what a step does (its owner's), timeouts of a step (a step bounds its own waits).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from loguru import logger

StartFn = Callable[[], Awaitable[None]]
StopFn = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Step:
    """One thing a daemon brings up: ``start`` it, and ``stop`` (None: nothing to undo) to take it down."""

    name: str
    start: StartFn
    stop: StopFn | None = None


class StartAborted(RuntimeError):
    """``stop`` was called while ``start`` ran: what had started is stopped again."""


class _Phase(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class StartSequence:
    """The ordered start and reverse stop of ``steps``; see the module docstring.

    ``what`` names the daemon in the log lines (``"riffle-server"``, ``"coordinator"``).
    """

    __slots__ = ("_phase", "_running", "_steps", "_stop_requested", "_stopped", "expected_errors", "what")

    def __init__(self, steps: Sequence[Step], *, what: str = "daemon",
                 expected_errors: tuple[type[BaseException], ...] = ()) -> None:
        names = [s.name for s in steps]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"step names must be unique: {duplicates}")
        self.what = what
        self.expected_errors = expected_errors  # start failures the caller reports itself (no traceback)
        self._steps: tuple[Step, ...] = tuple(steps)
        self._running: list[Step] = []
        self._phase = _Phase.NEW
        self._stop_requested = False
        self._stopped: asyncio.Event | None = None  # created on the loop, by the first stop

    @property
    def running(self) -> tuple[str, ...]:
        """The names of the steps started and not stopped, in start order."""
        return tuple(s.name for s in self._running)

    @property
    def phase(self) -> str:
        """``new``, ``starting``, ``running``, ``stopping`` or ``stopped``."""
        return self._phase.value

    async def start(self) -> None:
        if self._phase is not _Phase.NEW:
            raise RuntimeError(f"{self.what}: start() called when {self._phase.value}; a sequence starts once")
        self._phase = _Phase.STARTING
        for step in self._steps:
            began = time.monotonic()
            try:
                await step.start()
            except BaseException as e:
                if isinstance(e, self.expected_errors):
                    logger.debug("{}: start failed at step {!r}: {!r}; stopping {}", self.what, step.name, e,
                                 _names_reversed(self._running) or "nothing")
                else:
                    logger.opt(exception=e).error("{}: start failed at step {!r}: {!r}; stopping {}", self.what,
                                                  step.name, e, _names_reversed(self._running) or "nothing")
                await self._stop_running()
                raise
            self._running.append(step)
            logger.debug("{}: step {!r} started in {:.3f}s", self.what, step.name, time.monotonic() - began)
            if self._stop_requested:
                logger.info("{}: stop requested during the start, after step {!r}; stopping {}", self.what,
                            step.name, _names_reversed(self._running) or "nothing")
                await self._stop_running()
                raise StartAborted(f"{self.what}: stopped during its start (after step {step.name!r})")
        self._phase = _Phase.RUNNING

    async def stop(self) -> None:
        if self._stopped is None:
            self._stopped = asyncio.Event()
        if self._phase is _Phase.NEW:
            self._phase = _Phase.STOPPED
            self._stopped.set()
            return
        if self._phase is _Phase.STARTING:  # start() stops what it started once its current step is done
            self._stop_requested = True
            await self._stopped.wait()
            return
        if self._phase is not _Phase.RUNNING:  # stopping or stopped: wait for the first stop
            await self._stopped.wait()
            return
        await self._stop_running()

    async def _stop_running(self) -> None:
        """Every running step's ``stop``, last started first; see the module docstring."""
        self._phase = _Phase.STOPPING
        if self._stopped is None:
            self._stopped = asyncio.Event()
        cancelled: BaseException | None = None
        try:
            while self._running:
                step = self._running.pop()
                if step.stop is None:
                    continue
                try:
                    await step.stop()
                except Exception as e:  # noqa: BLE001 - logged; the other steps still stop
                    logger.opt(exception=e).error("{}: stopping step {!r} failed: {!r}", self.what, step.name, e)
                except BaseException as e:  # noqa: BLE001 - a cancellation: the rest still stop, then it goes on
                    logger.warning("{}: stopping step {!r} was interrupted ({!r}); stopping the rest",
                                   self.what, step.name, e)
                    cancelled = cancelled or e
        finally:
            self._phase = _Phase.STOPPED
            self._stopped.set()
        if cancelled is not None:
            raise cancelled


def _names_reversed(steps: Sequence[Step]) -> str:
    return ", ".join(s.name for s in reversed(steps))
