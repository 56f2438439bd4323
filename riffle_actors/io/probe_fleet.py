"""``ProbeFleet``: runs disk probes out of process, with a timeout, killing what hangs.

One thespian ``multiprocTCPBase`` actor system per server, started with
``{'Process Startup Method': 'spawn'}`` (forking a process that runs gRPC threads is unsafe)
on a free ``Admin Port`` of its own (thespian's default, 1900, would be shared by every server
and test on the host). It hosts one ``ProbeWorker`` per disk, each in its own process, so a
probe stuck in the kernel on one dying disk delays no other disk's probe and never the
server's event loop. Only control messages cross it (a path in, a ``ProbeResult`` out).

A round (``probe``) tells every disk's worker a ``ProbeRequest`` and listens for the replies
until ``timeout_s``. A worker that did not answer in time:

- is still alive: its probe hangs on the disk. The disk gets a ``TIMEOUT`` result, the worker
  process is SIGKILLed (it may linger while the kernel holds it in an uninterruptible sleep)
  and forgotten; the next round creates a fresh one;
- is gone: the probing machinery failed, not the disk. No verdict (``None``) for that disk,
  and the worker is replaced.

A failure of thespian itself (admin unreachable, ...) gives no verdict for any disk and
restarts the system on the next round. The fleet starts lazily on the first round, and its
start-up time (about 0.2 s plus 0.07 s per worker with ``spawn``, measured on this VM) never
counts against a probe's timeout.

Threading: a thespian ``ActorSystem`` must not be shared between threads (measured: replies
delivered to the wrong thread), so a ``ProbeFleet`` is used from exactly one thread (the Disk
monitor's probe thread). ``shutdown()`` must always run: a multiprocTCPBase system outlives
the process that created it; an ``atexit`` hook is the last line of defence.

See also: ``riffle_actors.io.probe`` (the probe and the worker actor),
``riffle_actors.actors.disk_monitor`` (who calls this), actor-runtime-measurements §1.3-1.4, §5.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from loguru import logger
from thespian.actors import Actor as ThespianActor
from thespian.actors import WakeupMessage

from riffle_actors.io.local import IOErrorKind, classify
from riffle_actors.io.probe import ProbeFn, ProbeResult

# thespian's own log records go to its logger process; keep them to warnings on stderr
_LOG_DEFS = {
    "version": 1,
    "formatters": {"plain": {"format": "thespian %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "level": "ERROR"}},
    "root": {"handlers": ["stderr"], "level": "ERROR"},
}


# ---------------------------------------------------------------------------- the worker (child side)
@dataclass(frozen=True, slots=True)
class ProbeRequest:
    seq: int
    disk: str
    root: str
    probe_fn: ProbeFn  # a module-level function: pickled by reference


@dataclass(frozen=True, slots=True)
class ProbeReply:
    seq: int
    disk: str
    result: ProbeResult
    pid: int


@dataclass(frozen=True, slots=True)
class WhoAreYou:
    """Asks a worker for its process id (so a hung worker can be killed); names the owner to watch."""

    owner_pid: int
    owner_pgid: int


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    pid: int


class ProbeWorker(ThespianActor):
    """Runs probes one at a time in its own process; replies ``ProbeReply`` to the sender.

    It catches every exception itself: thespian re-runs a failing handler before giving up.
    It also watches the owner (the server process): a multiprocTCPBase system outlives its
    creator, so when the owner died without ``shutdown()`` (SIGKILL, OOM killer), the worker
    kills the whole thespian process group (admin, logger, workers) instead of leaking it.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._owner: tuple[int, int] | None = None

    def receiveMessage(self, msg, sender):  # thespian's API (camelCase)
        if isinstance(msg, ProbeRequest):
            try:
                result = msg.probe_fn(msg.root)
            except Exception as e:  # noqa: BLE001 - a probe reports, it never raises
                result = ProbeResult(False, kind=classify(e).value, op="probe", detail=f"{type(e).__name__}: {e}")
            self.send(sender, ProbeReply(msg.seq, msg.disk, result, os.getpid()))
        elif isinstance(msg, WhoAreYou):
            if self._owner is None:
                self._owner = (msg.owner_pid, msg.owner_pgid)
                self.wakeupAfter(_OWNER_CHECK)
            self.send(sender, WorkerIdentity(os.getpid()))
        elif isinstance(msg, WakeupMessage) and self._owner is not None:
            if _pid_exists(self._owner[0]):
                self.wakeupAfter(_OWNER_CHECK)
            else:
                _kill_orphaned_fleet(self._owner[1])


_OWNER_CHECK = timedelta(seconds=1)


def _pid_exists(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as gone (its parent may reap it only after we exit)."""
    return _is_alive(pid)


def _kill_orphaned_fleet(owner_pgid: int) -> None:  # pragma: no cover - runs in a worker process
    group = os.getpgrp()
    if group != owner_pgid:  # thespian's admin detached into a group of its own: all of it is ours
        os.killpg(group, signal.SIGKILL)
    os.kill(os.getppid(), signal.SIGKILL)  # the admin, at least
    os._exit(0)


_LISTEN_SLICE_S = 0.1  # how quickly a round notices stop_requested

_live_fleets: weakref.WeakSet[ProbeFleet] = weakref.WeakSet()


@atexit.register
def _shutdown_leftovers() -> None:  # pragma: no cover - only when an owner forgot shutdown()
    for fleet in list(_live_fleets):
        fleet.shutdown()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for thespian's admin port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class _Worker:
    address: object
    pid: int


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    disk: str
    root: str
    probe_fn: ProbeFn


class ProbeFleet:
    """Out-of-process probe runner; see the module docstring. Use from one thread only."""

    def __init__(self, *, admin_port: int | None = None, start_method: str = "spawn",
                 setup_timeout_s: float = 30.0):
        self.admin_port = admin_port
        self.start_method = start_method
        self.setup_timeout_s = setup_timeout_s
        self._asys = None
        self._workers: dict[str, _Worker] = {}
        self._seq = itertools.count(1)
        self.killed_pids: list[int] = []
        self.stop_requested: threading.Event | None = None  # set by the owner to end a round early
        self.starts = 0
        self.start_seconds = 0.0

    # ------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return self._asys is not None

    def worker_pids(self) -> dict[str, int]:
        return {disk: w.pid for disk, w in self._workers.items()}

    def start(self) -> None:
        if self._asys is not None:
            return
        from thespian.actors import ActorSystem

        started = time.monotonic()
        port = self.admin_port or free_port()
        self._asys = ActorSystem("multiprocTCPBase", {"Admin Port": port, "Process Startup Method": self.start_method},
                                 logDefs=_LOG_DEFS, transientUnique=True)
        self._used_port = port
        self.starts += 1
        self.start_seconds += time.monotonic() - started
        _live_fleets.add(self)
        logger.debug("disk probe fleet started: thespian multiprocTCPBase ({}), admin port {}, {:.2f}s",
                     self.start_method, port, time.monotonic() - started)

    def shutdown(self) -> None:
        """Kill every worker that may hang, then shut the thespian system down. Idempotent."""
        asys, self._asys = self._asys, None
        workers, self._workers = self._workers, {}
        _live_fleets.discard(self)
        if asys is None:
            return
        for w in workers.values():
            self._kill(w.pid)  # a hung worker would stall thespian's shutdown handshake
        base = getattr(asys, "_systemBase", None)
        try:
            asys.shutdown()
        except Exception as e:  # noqa: BLE001 - shutting down regardless
            logger.warning("disk probe fleet: thespian shutdown failed: {!r}", e)
        finally:
            # thespian skips closing its transport when the admin did not answer; closing is
            # idempotent, and an open one would be closed by __del__ during interpreter teardown
            transport = getattr(base, "transport", None)
            if transport is not None:
                try:
                    transport.close()
                except Exception as e:  # noqa: BLE001 - best effort
                    logger.debug("disk probe fleet: closing thespian's transport: {!r}", e)

    def _stopping(self) -> bool:
        return self.stop_requested is not None and self.stop_requested.is_set()

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
            self.killed_pids.append(pid)
        except ProcessLookupError:
            pass
        except OSError as e:
            logger.warning("disk probe fleet: cannot kill worker {}: {!r}", pid, e)

    def _worker(self, disk: str) -> _Worker:
        w = self._workers.get(disk)
        if w is not None:
            if _is_alive(w.pid):
                return w
            # a tell to a dead worker's address blocks in thespian's transport for tens of
            # seconds (measured: ~35 s of connect retries), so check before telling
            logger.warning("disk probe worker of {} (pid {}) died; replacing it", disk, w.pid)
            del self._workers[disk]
        assert self._asys is not None
        addr = self._asys.createActor(ProbeWorker)
        self._asys.tell(addr, WhoAreYou(os.getpid(), os.getpgrp()))
        deadline = time.monotonic() + self.setup_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"probe worker for disk {disk} did not start within {self.setup_timeout_s}s")
            if self._stopping():
                raise TimeoutError("shutting down")
            reply = self._asys.listen(min(remaining, _LISTEN_SLICE_S))
            if isinstance(reply, WorkerIdentity):
                break  # the only asker of WhoAreYou is this thread, one worker at a time
        w = self._workers[disk] = _Worker(addr, reply.pid)
        return w

    # ------------------------------------------------------------- rounds
    def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> dict[str, ProbeResult | None]:
        """Probe every target at once; ``None`` = no verdict (the probing machinery failed)."""
        results: dict[str, ProbeResult | None] = {t.disk: None for t in targets}
        try:
            self.start()
            assert self._asys is not None
            asys = self._asys
            # every worker exists before the first request goes out: while a worker is being
            # created, listen() would otherwise swallow another worker's reply
            workers = [self._worker(t.disk) for t in targets]
            pending: dict[int, ProbeTarget] = {}
            for t, w in zip(targets, workers):
                seq = next(self._seq)
                asys.tell(w.address, ProbeRequest(seq, t.disk, t.root, t.probe_fn))
                pending[seq] = t
            deadline = time.monotonic() + timeout_s
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if self._stopping():
                    return results  # shutting down: no verdict for what is still pending
                reply = asys.listen(min(remaining, _LISTEN_SLICE_S))
                if isinstance(reply, ProbeReply) and reply.seq in pending:
                    del pending[reply.seq]
                    results[reply.disk] = reply.result
                # anything else: a late reply of an earlier round, or a thespian notice
            for t in pending.values():
                results[t.disk] = self._timed_out(t.disk, timeout_s)
        except Exception as e:  # noqa: BLE001 - the machinery failed, not the disks
            logger.opt(exception=e).warning("disk probe round failed in thespian; restarting the probe fleet")
            self.shutdown()
        return results

    def _timed_out(self, disk: str, timeout_s: float) -> ProbeResult | None:
        w = self._workers.pop(disk)
        alive = _is_alive(w.pid)
        self._kill(w.pid)
        if not alive:
            logger.warning("disk probe worker of {} (pid {}) died; replacing it (no verdict on the disk)", disk, w.pid)
            return None
        return ProbeResult(False, kind=IOErrorKind.TIMEOUT.value, op="probe",
                           detail=f"probe not answered within {timeout_s:g}s; probe process {w.pid} killed")


def _is_alive(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except Exception:  # noqa: BLE001 - gone or unreadable: not alive
        return False
