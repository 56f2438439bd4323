"""SpillPlan and SpillQueue: the SpillDispatcher's decisions, as pure state.

This module owns every decision about one in-flight batch on its way to a disk, and none of
the IO: which disk it is written to, what happens after a failed write (another disk at once,
or the same disk again after a pause), how long a pause lasts, when a batch counts as *stuck*,
and which batches wait for a free write slot. The ``SpillDispatcherActor`` asks it and does
what it says (asks a Disk actor, waits on its injected clock, logs, replies to the AppActor).

The rules, in the order they apply:

- **Disk choice.** The partition's current disk while it may take data, else a placeable disk
  chosen by hashing the partition (``choose_disk``), so one partition's files stay together.
- **Files in order.** A partition whose files span several disks (it was re-routed) never writes to
  one of its earlier disks again (``earlier_disks``) while another disk can take the batch: its files
  form one virtual data file whose bases must not move under a reader holding its index. Only a batch
  that is already stuck may fall back to them (the partition then keeps working; a reader holding an
  older index gets bytes that fail its CRC check and reads another replica).
- **Never drop a batch.** A batch leaves memory only once a disk acknowledged it; no number of
  failures gives it up. Only the owner's purge ends it early (the actor checks that).
- **IO error on a disk** (``disk_fault``): that disk is left out for this batch and the next
  placeable disk is tried at once. When every placeable disk has failed once, or none is
  placeable, the batch pauses (``WaitFor``) and then starts over with every disk that is
  placeable *then*: a batch is re-routed as health changes, never pinned to one disk.
- **Disk actor crash** (not a disk fault: its supervisor restarts it): the same disk again
  after a pause; after ``crash_retries_per_disk`` crashes in a row on one disk the batch moves
  on as after an IO error.
- **Pauses** grow from ``first_backoff_s`` by doubling and are capped at ``max_backoff_s``;
  the actor ends a pause early when a disk becomes placeable again.
- **Stuck.** Every failed write and every pause without a disk to try is one *retry*. A batch
  with ``stuck_after_retries`` retries is stuck: it stays in memory and keeps retrying at the
  capped interval, and ``stuck()`` lists it (app id, partition, retries, how long, last error)
  for the stats and ``/health``; ``should_report_stuck`` says when to log it (at N, 2N, 4N ...
  retries, so a batch stuck for hours leaves a trail, not a flood).

Times are the caller's ``Clock.monotonic()`` readings; nothing here reads a clock or sleeps.

See also: ``riffle_actors.actors.spill`` (the actor), ``riffle_actors.state.disk_health`` (which
disks are placeable).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class SpillRetryPolicy:
    """Bounds of the retry loop of one batch; see the module docstring."""

    first_backoff_s: float = 0.05
    max_backoff_s: float = 2.0  # the longest pause between two rounds; memory waits, the disk may be back
    crash_retries_per_disk: int = 3
    stuck_after_retries: int = 10  # ~10 s of retries at the defaults

    def __post_init__(self) -> None:
        if not 0 < self.first_backoff_s <= self.max_backoff_s:
            raise ValueError(f"need 0 < first_backoff_s <= max_backoff_s, got {self}")
        if self.crash_retries_per_disk < 1 or self.stuck_after_retries < 1:
            raise ValueError(f"crash_retries_per_disk and stuck_after_retries must be >= 1, got {self}")


class BatchKey(NamedTuple):
    """One in-flight batch: its partition and the flight id its AppActor gave it."""

    app_id: str
    shuffle_id: int
    partition_id: int
    flight_id: int


@dataclass(frozen=True, slots=True)
class WriteTo:
    """Decision: write the batch to ``disk`` now."""

    disk: str


@dataclass(frozen=True, slots=True)
class WaitFor:
    """Decision: pause ``delay_s`` (less if a disk comes back), then ask again.

    ``no_disk`` is True when no disk at all may take data (worth a warning), False when the
    placeable disks all failed this batch once and it starts over after the pause.
    """

    delay_s: float
    no_disk: bool


SpillStep = WriteTo | WaitFor


@dataclass(slots=True)
class SpillAttempt:
    """Progress of one batch through the retry loop; created by ``SpillPlan.begin``."""

    key: BatchKey
    preferred_disk: str | None
    data_bytes: int
    started_monotonic: float
    backoff_s: float
    origin: str | None = None  # where the partition's files are, or the first disk tried
    earlier_disks: frozenset[str] = frozenset()  # the partition's disks before its current one: left out
    tried: set[str] = field(default_factory=set)  # disks left out until the next round
    retries: int = 0
    failed_writes: int = 0
    crashes_in_a_row: int = 0
    last_error: str = ""
    stuck: bool = False
    next_report: int = 0  # retries at which ``should_report_stuck`` answers True next


@dataclass(frozen=True, slots=True)
class StuckSpill:
    """A batch that has not reached a disk after ``stuck_after_retries`` retries (for stats and health)."""

    app_id: str
    shuffle_id: int
    partition_id: int
    flight_id: int
    data_bytes: int
    retries: int
    failed_writes: int
    waiting_s: float
    last_error: str


@dataclass(frozen=True, slots=True)
class Landed:
    """What ``SpillPlan.landed`` concluded about a batch a disk acknowledged."""

    disk: str
    moved_from: str | None  # the disk it was re-routed away from, if any
    moved_so_far: int       # batches moved from ``moved_from`` to ``disk`` so far
    log_move: bool          # 1, 2, 4, 8 ... moves: a trail for operators without a line per spill
    was_stuck: bool
    retries: int


def choose_disk(key: BatchKey, preferred: str | None, candidates: list[str]) -> str | None:
    """``preferred`` when it is a candidate, else a candidate picked by hashing the partition."""
    if not candidates:
        return None
    if preferred in candidates:
        return preferred
    digest = zlib.crc32(f"{key.app_id}/{key.shuffle_id}/{key.partition_id}".encode())
    return candidates[digest % len(candidates)]


class SpillPlan:
    """Disk choice, retry and re-route decisions for every batch in flight; see the module docstring.

    ``disks`` are the disk names in ``data_paths`` order. Besides the health board (passed in as
    a predicate), a disk can be *held out* (``hold_out``, from a ``DiskHealthChanged`` saying
    unhealthy) until ``readmit``.
    """

    def __init__(self, disks: Iterable[str], policy: SpillRetryPolicy | None = None):
        self.disks = list(disks)
        self.policy = policy or SpillRetryPolicy()
        self.held_out: dict[str, str] = {}  # disk -> reason
        self.moved: dict[tuple[str, str], int] = {}  # (from disk, to disk) -> batches
        self.retries_total = 0
        self.stuck_total = 0  # batches that ever became stuck
        self._active: dict[int, SpillAttempt] = {}  # id(attempt) -> attempt, for the reports

    # ------------------------------------------------------------- disks
    def hold_out(self, disk: str, reason: str) -> None:
        self.held_out[disk] = reason

    def readmit(self, disk: str) -> None:
        self.held_out.pop(disk, None)

    def placeable(self, board_placeable: Callable[[str], bool]) -> list[str]:
        """Disks that may take data now, in ``data_paths`` order."""
        return [d for d in self.disks if d not in self.held_out and board_placeable(d)]

    # ------------------------------------------------------------- one batch
    def begin(self, key: BatchKey, preferred_disk: str | None, data_bytes: int, now: float, *,
              earlier_disks: Iterable[str] = ()) -> SpillAttempt:
        attempt = SpillAttempt(key=key, preferred_disk=preferred_disk, data_bytes=data_bytes,
                               started_monotonic=now, backoff_s=self.policy.first_backoff_s, origin=preferred_disk,
                               earlier_disks=frozenset(earlier_disks) - {preferred_disk},
                               next_report=self.policy.stuck_after_retries)
        self._active[id(attempt)] = attempt
        return attempt

    def next_step(self, attempt: SpillAttempt, placeable: list[str]) -> SpillStep:
        """Where to write ``attempt`` now, or how long to pause first."""
        candidates = [d for d in placeable if d not in attempt.tried]
        if attempt.earlier_disks and not attempt.stuck:
            candidates = [d for d in candidates if d not in attempt.earlier_disks]
        disk = choose_disk(attempt.key, attempt.preferred_disk, candidates)
        if disk is not None:
            if attempt.origin is None:
                attempt.origin = disk
            return WriteTo(disk)
        attempt.tried.clear()  # start over with whatever is placeable after the pause
        self._retry(attempt)
        return WaitFor(self._backoff(attempt), no_disk=not placeable)

    def write_failed(self, attempt: SpillAttempt, disk: str, error: str, *, disk_fault: bool) -> float:
        """Record a failed write; returns the pause before the next ``next_step`` (0: at once).

        ``disk_fault``: the disk failed the IO (its monitor judges the disk). Otherwise its actor
        crashed or restarted before acknowledging, and the same disk is tried again after a pause.
        """
        attempt.failed_writes += 1
        attempt.last_error = f"{disk}: {error}"
        self._retry(attempt)
        if disk_fault:
            attempt.tried.add(disk)
            attempt.crashes_in_a_row = 0
            return 0.0
        attempt.crashes_in_a_row += 1
        if attempt.crashes_in_a_row >= self.policy.crash_retries_per_disk:
            attempt.tried.add(disk)
            attempt.crashes_in_a_row = 0
        return self._backoff(attempt)

    def should_report_stuck(self, attempt: SpillAttempt) -> bool:
        """True when ``attempt`` is stuck and is due for a log line (at N, 2N, 4N ... retries)."""
        if attempt.retries < attempt.next_report:
            return False
        attempt.next_report = attempt.retries * 2
        return True

    def landed(self, attempt: SpillAttempt, disk: str) -> Landed:
        """A disk acknowledged ``attempt``: count a re-route away from its origin."""
        moved_from = attempt.origin if attempt.origin is not None and attempt.origin != disk else None
        n = 0
        if moved_from is not None:
            n = self.moved.get((moved_from, disk), 0) + 1
            self.moved[(moved_from, disk)] = n
        return Landed(disk=disk, moved_from=moved_from, moved_so_far=n,
                      log_move=moved_from is not None and n & (n - 1) == 0, was_stuck=attempt.stuck,
                      retries=attempt.retries)

    def end(self, attempt: SpillAttempt) -> None:
        """``attempt`` left the loop (landed, or its app was purged)."""
        self._active.pop(id(attempt), None)

    # ------------------------------------------------------------- reports
    def in_flight(self) -> int:
        return len(self._active)

    def stuck(self, now: float) -> list[StuckSpill]:
        """Every stuck batch, the longest-waiting first."""
        out = [StuckSpill(app_id=a.key.app_id, shuffle_id=a.key.shuffle_id, partition_id=a.key.partition_id,
                          flight_id=a.key.flight_id, data_bytes=a.data_bytes, retries=a.retries,
                          failed_writes=a.failed_writes, waiting_s=max(0.0, now - a.started_monotonic),
                          last_error=a.last_error)
               for a in self._active.values() if a.stuck]
        out.sort(key=lambda s: s.waiting_s, reverse=True)
        return out

    def moved_from(self, disk: str) -> dict[str, int]:
        """to disk -> batches re-routed away from ``disk``."""
        return {to: n for (frm, to), n in self.moved.items() if frm == disk}

    # ------------------------------------------------------------- helpers
    def _retry(self, attempt: SpillAttempt) -> None:
        attempt.retries += 1
        self.retries_total += 1
        if not attempt.stuck and attempt.retries >= self.policy.stuck_after_retries:
            attempt.stuck = True
            self.stuck_total += 1

    def _backoff(self, attempt: SpillAttempt) -> float:
        delay = attempt.backoff_s
        attempt.backoff_s = min(delay * 2, self.policy.max_backoff_s)
        return delay


class SpillQueue(Generic[T]):
    """Batches waiting for one of ``max_concurrency`` write slots, first come first served, and the
    batches holding a slot (the *running table*).

    It is plain state, so its owner can keep it across incarnations of the actor that runs the
    batches: after a crash, ``restart()`` puts every batch that was running back at the head of the
    queue, in the order they started, and returns what may start again. A batch leaves the table
    only through ``finished(item)``, i.e. once it is really done.
    """

    def __init__(self, max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self._pending: deque[T] = deque()
        self._running: dict[int, T] = {}  # id(item) -> item, in start order (the dict keeps it alive)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> int:
        return len(self._running)

    def running_items(self) -> list[T]:
        return list(self._running.values())

    def push(self, item: T) -> list[T]:
        """Queue ``item``; returns what may start now (the caller runs each and calls ``finished``)."""
        self._pending.append(item)
        return self._admit()

    def finished(self, item: T) -> list[T]:
        """``item`` (started) is done; returns what may start now."""
        self._running.pop(id(item), None)
        return self._admit()

    def restart(self) -> list[T]:
        """The runner of the started items is gone: queue them again first; returns what may start."""
        running, self._running = list(self._running.values()), {}
        self._pending.extendleft(reversed(running))
        return self._admit()

    def _admit(self) -> list[T]:
        start = []
        while self._pending and len(self._running) < self.max_concurrency:
            item = self._pending.popleft()
            self._running[id(item)] = item
            start.append(item)
        return start
