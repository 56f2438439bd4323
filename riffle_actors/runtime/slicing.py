"""SliceLane: long state operations of one actor, run in time slices so the event loop keeps turning.

Some operations of an actor cost CPU in proportion to the data they touch (an AppActor's
reports and shuffle results: 2M block ids cost ~0.1-0.5 s in one go). On the shared event loop
that would stall every other app's RPCs, heartbeats included. Such an operation is written as
*steps*: a generator that does a bounded amount of work per ``next()`` and returns its result
through ``StopIteration`` (see ``riffle_actors.state.app_state``). A ``SliceLane`` runs them:

- **One at a time, in arrival order.** An operation starts only when the one before it has
  finished, so a get submitted after a report sees all of it, and two reports never interleave.
  Other messages of the actor (appends, heartbeats) are still processed between slices; they
  do not touch what the steps touch, or only read it (see the AppActor).
- **Inline when cheap.** While the lane is idle, ``submit`` runs the steps right away and returns
  the result when they finish within the current turn's slice: a Spark task's report (a few
  thousand ids) costs no task and no extra loop turn. Inline work is bounded per loop turn, not
  per message, so a mailbox full of small reports cannot add up to a stall either.
- **Otherwise reply later.** ``submit`` returns a task (the actor runtime then replies when it
  ends) that runs ``SLICE_S`` of steps, yields to the loop, and so on.

Steps are bounded *inside* one operation's unit of work too, not only between units: a shuffle
result over one partition of 2M ids is ~1000 steps of at most ``riffle_actors.protocol.bitmap.STEP_IDS``
ids each (``union_serialize_steps``), so the lane gives the loop a turn every ``SLICE_S`` whatever the
id layout. ``slices`` counts the turns given (a test and debugging figure).

Everything runs on the event loop thread: no state is shared with another thread, and a step
is atomic with respect to the actor's other messages. (A worker thread would not help: the
bitmap library holds the GIL, so a long C call on a thread stalls the loop just the same.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

SLICE_S = 0.001
"""CPU time a lane spends before it gives the loop a turn. An RPC needs ~4-5 loop turns from
request to response, so another app's heartbeat waits ~5 ms behind a busy lane. Measured with
scripts/bench_loop_lag.py: 2 ms slices doubled the heartbeat's median under load (16 ms against
8-10), 0.5 ms made a 2M-id result ~1.5x slower (more turns, each ~20-50 us) for little gain."""

_UNFINISHED: Any = object()


def run_until(steps: Generator[None, None, T], deadline: float,
              now: Callable[[], float] = time.perf_counter) -> T:
    """Run steps until they finish (their result) or ``now()`` passes ``deadline`` (``_UNFINISHED``).
    At least one step runs. Exceptions of the steps propagate."""
    try:
        while True:
            next(steps)
            if now() >= deadline:
                return _UNFINISHED  # type: ignore[no-any-return]  # the sentinel stands for "no T yet"
    except StopIteration as done:
        result: T = done.value
        return result


class SliceLane:
    """Runs step generators for one actor; see the module docstring. Use from the actor only.

    ``slice_s`` defaults to the module's ``SLICE_S`` at construction; ``now`` (CPU-ish time, not
    the actor clock: slices are about the event loop, not about logical time) is a test seam.
    """

    def __init__(self, slice_s: float | None = None, now: Callable[[], float] = time.perf_counter) -> None:
        self.slice_s = SLICE_S if slice_s is None else slice_s
        self._now = now
        self._tail: asyncio.Task[Any] | None = None  # the last operation that did not finish inline
        self._turn_ends: float | None = None  # inline budget of the current loop turn
        self.slices = 0  # times an unfinished operation gave the loop a turn

    @property
    def idle(self) -> bool:
        return self._tail is None or self._tail.done()

    def submit(self, steps: Generator[None, None, T]) -> T | asyncio.Task[T]:
        """The result of ``steps`` if they finished inline, else a task that finishes them."""
        loop = asyncio.get_running_loop()
        if self.idle:
            now = self._now()
            if self._turn_ends is None:
                self._turn_ends = now + self.slice_s
                loop.call_soon(self._next_turn)  # runs once the loop has had its turn
            if now < self._turn_ends:
                result = run_until(steps, self._turn_ends, self._now)
                if result is not _UNFINISHED:
                    return result
            task = loop.create_task(self._finish(None, steps), name="slice-lane")
        else:
            task = loop.create_task(self._finish(self._tail, steps), name="slice-lane")
        self._tail = task
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        """A finished operation is its asker's only: kept as the tail, its failure (whose traceback
        holds the operation's inputs, a whole request) would stay alive until the next operation."""
        if self._tail is task:
            self._tail = None

    def _next_turn(self) -> None:
        self._turn_ends = None

    async def _finish(self, previous: asyncio.Task[Any] | None, steps: Generator[None, None, T]) -> T:
        if previous is not None:
            # wait, not await: its failure belongs to its own asker, not to this operation
            await asyncio.wait([previous])
            # and drop it: a failure of this operation keeps this frame in its traceback, which would
            # otherwise keep every earlier failed operation (and its inputs) alive, one through the other
            previous = None
        while True:
            self.slices += 1
            await asyncio.sleep(0)
            result = run_until(steps, self._now() + self.slice_s, self._now)
            if result is not _UNFINISHED:
                return result
