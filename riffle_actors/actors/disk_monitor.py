"""DiskMonitorActor: probes every disk out of process and decides quarantine and re-admission.

The one writer of the ``DiskHealthBoard`` (``riffle_actors.state.disk_health``). Its inputs:

- ``RunProbeRound`` (told by the TimerActor every ``disk_healthy_check_interval_sec``; tests
  ask it and get the round's results): every disk is probed at once by a ``ProbeFleet``, i.e.
  in its own worker process (spoken to over pipes only, no listening socket), driven from this
  actor's single probe thread. A probe not answered within ``disk_probe_timeout_sec``
  quarantines its disk (TIMEOUT) and its process is killed and replaced; the server's event
  loop never waits on a disk.
- ``DiskIOFailed`` / ``DiskIOSucceeded``: outcomes of real spills and reads, reported by the
  SpillDispatcher and the ShuffleService (ENOSPC/EROFS/TIMEOUT quarantine at once, EIO after
  ``failures_to_quarantine`` in a row).

Each verdict change is logged (naming the disk, its path, the reason and the action) and told
to every subscriber (given at construction) as ``DiskHealthChanged`` (the SpillDispatcher pumps
its queue on it).
Rounds never overlap: a round asked while one runs waits for that one.

Supervision: permanent, under the storage supervisor. The board (every verdict, failure count and
probation) outlives its incarnations, and so does the mailbox: ``DiskIOFailed`` reports and
``RunProbeRound`` asks queued behind a crash are handled by the next incarnation; a round in
progress is cancelled and its asker gets ``ActorDeadError`` (the timer asks again next interval);
the probe fleet is shut down by ``on_stop`` (its workers exit; a hung one is SIGKILLed) and
started again lazily by the next incarnation's first round. The fleet lives on the probe
thread, which lives as long as the incarnation: a worker is killed by the kernel when the
thread that started it ends (``PR_SET_PDEATHSIG``), and so when the whole server dies.

Why plain worker processes on pipes (not thespian's multiprocTCPBase, used before): thespian's
workers listened on TCP ports of 0.0.0.0 and un-pickled whatever arrived there. Measured
figures of both are in ``riffle_actors.io.probe_fleet``.

Its messages live in ``riffle_actors.actors.storage_messages``.

See also: ``riffle_actors.io.probe_fleet``, ``riffle_actors.io.probe``, ``riffle_actors.actors.spill``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from loguru import logger

from riffle_actors.actors.storage_messages import (
    DiskHealthChanged,
    DiskIOFailed,
    DiskIOSucceeded,
    GetProbeStats,
    ProbeStats,
    RunProbeRound,
)
from riffle_actors.io.probe import ProbeFn, ProbeResult, probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet, ProbeTarget
from riffle_actors.io.probe_worker import function_ref
from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, Clock, SystemClock
from riffle_actors.state.disk_health import DiskHealthBoard, HealthTransition

DiskMonitorMsg = RunProbeRound | DiskIOFailed | DiskIOSucceeded | GetProbeStats


class DiskMonitorActor(Actor):
    def __init__(self, *, board: DiskHealthBoard, probe_timeout_s: float, interval_s: float,
                 probe_fn: ProbeFn = probe_disk, clock: Clock | None = None,
                 subscribers: Sequence[ActorRef] = (),
                 fleet_factory: Callable[[], ProbeFleet] = ProbeFleet):
        function_ref(probe_fn)  # it runs in the worker processes: a lambda fails here, not in every round
        self.board = board
        self.probe_timeout_s = probe_timeout_s
        self.interval_s = interval_s
        self.probe_fn = probe_fn
        self.clock = clock or SystemClock()
        self.subscribers = list(subscribers)
        self.fleet_factory = fleet_factory
        self.rounds = 0
        self._round: asyncio.Task | None = None
        self._fleet: ProbeFleet | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._stopping = threading.Event()

    async def on_start(self) -> None:
        self._stopping = threading.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="disk-probe")
        self._fleet = self.fleet_factory()
        self._fleet.stop_requested = self._stopping  # lets a round end early on shutdown

    async def on_stop(self) -> None:
        self._stopping.set()
        thread, fleet = self._thread, self._fleet
        self._thread = self._fleet = None
        if thread is None or fleet is None:
            return
        try:
            # on the probe thread: the fleet is never touched by two threads
            await asyncio.get_running_loop().run_in_executor(thread, fleet.shutdown)
        finally:
            thread.shutdown(wait=False)

    def receive(self, msg: DiskMonitorMsg):
        match msg:
            case RunProbeRound():
                if self._round is None or self._round.done():
                    self._round = self.spawn(self._run_round())
                return _wait_for(self._round)
            case DiskIOFailed(disk=disk, kind=kind, op=op, detail=detail):
                if disk in self.board.disks:
                    self._publish(self.board.on_io_failure(disk, kind, op, detail, self.clock.monotonic()))
            case DiskIOSucceeded(disk=disk):
                self.board.on_io_success(disk)
            case GetProbeStats():
                f = self._fleet
                return ProbeStats(self.rounds, bool(f and f.running), f.starts if f else 0,
                                  f.worker_pids() if f else {}, tuple(f.killed_pids) if f else ())
            case _:
                raise TypeError(f"unexpected message {msg!r}")
        return None

    async def _run_round(self) -> dict[str, ProbeResult | None]:
        targets = [ProbeTarget(d.name, d.root, self.probe_fn) for d in self.board.disks.values()]
        assert self._thread is not None and self._fleet is not None
        results = await asyncio.get_running_loop().run_in_executor(
            self._thread, self._fleet.probe, targets, self.probe_timeout_s)
        self.rounds += 1
        now = self.clock.monotonic()
        for disk, result in results.items():
            if result is None:
                continue  # the probing machinery gave no verdict: the disk is not blamed
            self._publish(self.board.on_probe(disk, result, now))
        return results

    def _publish(self, change: HealthTransition | None) -> None:
        if change is None:
            return
        d = self.board[change.disk]
        where = change.disk if d.root == change.disk else f"{change.disk} ({d.root})"
        log = logger.bind(disk=change.disk)
        if change.healthy:
            log.info("disk {} is HEALTHY again: {}; it takes new spills and partitions", where, change.reason)
        else:
            action = ("new spills and partitions go to the other disks, spills pending on it are re-routed; "
                      f"probation probes every {self.interval_s:g}s re-admit it")
            log.error("disk {} is {}: {}; {}", where, change.status.value, change.reason, action)
        msg = DiskHealthChanged(change.disk, change.healthy, change.reason)
        for ref in list(self.subscribers):
            try:
                ref.tell_nowait(msg)
            except ActorDeadError:
                self.subscribers.remove(ref)
            except Exception as e:  # noqa: BLE001 - a full mailbox: the subscriber reads the board anyway
                log.warning("could not tell {} about disk {}: {!r}", ref.name, change.disk, e)


async def _wait_for(task: asyncio.Task):
    """One reply per ask, however many asks share a round."""
    return await asyncio.shield(task)
