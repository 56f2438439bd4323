"""``ProbeFleet``: runs disk probes out of process, with a timeout, killing and replacing what hangs.

It owns one worker process per disk (``riffle_actors.io.probe_worker``, started with
``subprocess``: fork + exec of a fresh interpreter, no Python code runs in between), and the two
pipes to each: requests in, replies out, one JSON object per line. A probe stuck in the kernel on
one dying disk therefore delays no other disk's probe, and never the server's event loop.

Nothing listens: no TCP port, no unix socket, nothing another process can connect to. The pipes
are created non-inheritable and handed to exactly one child (``pass_fds``), and no message is
un-pickled on either side (a probe function travels as its ``module:qualname``).

A round (``probe``):

1. makes sure every disk has a worker that said ``ready``: a dead one is reaped and replaced,
   new ones start in parallel. Their start-up (bounded by ``setup_timeout_s``) is not counted
   against the probe timeout; a worker that does not start gives its disk no verdict;
2. sends every disk's request, then waits for the replies until ``timeout_s``;
3. a worker that did not answer in time:

   - is still alive: its probe hangs on the disk. The disk gets a ``TIMEOUT`` result, the
     worker is SIGKILLed (it may linger while the kernel holds it in an uninterruptible sleep;
     it is reaped by a later round or by ``shutdown``) and a replacement is started at once;
   - is gone: the probing machinery failed, not the disk. No verdict (``None``), and the worker
     is replaced.

``stop_requested`` (a ``threading.Event``) ends a round early with no verdict for what is
still pending. ``shutdown()`` closes the request pipes (an idle worker exits on EOF), waits
``exit_grace_s`` and SIGKILLs what is left. If the owner dies without ``shutdown()`` (SIGKILL,
OOM killer), its workers die with it: each one asked the kernel for ``PR_SET_PDEATHSIG``
(SIGKILL) and also exits on EOF of its request pipe.

Threading: ``PR_SET_PDEATHSIG`` fires when the *thread* that started the worker ends, and the
fleet's state is unsynchronised, so a ``ProbeFleet`` is used from exactly one long-lived thread
(the DiskMonitor's probe thread).

Measured on the 2-core development VM, shared with other jobs (load 2-3), Python 3.11, two disks
in one ext4, a 0.5 s timeout for the hung probe; medians of two runs of
``python3 scripts/bench_probe_fleet.py --alternatives`` (3 and 5 fleets, 20 rounds each):

==========================================  ===============  ===============  ===============
                                            thespian TCP     multiprocessing  subprocess +
                                            (before)         spawn + Pipe     os.pipe (this)
==========================================  ===============  ===============  ===============
first round: start 2 workers + probe        1030-1630 ms     425-460 ms       350-400 ms
probe round, 2 disks                        7.1-9.8 ms       1.3-2.2 ms       2.1-4.0 ms
hung probe: round returns after timeout +   9.2-9.4 ms       3.5-6.1 ms       4.5-8.8 ms
next round: replacement worker + probe      430-440 ms       195-280 ms       160-210 ms
shutdown                                    35-50 ms         70-105 ms        80-100 ms
listens on                                  TCP, 0.0.0.0     nothing          nothing
==========================================  ===============  ===============  ===============

A worker's start is a fresh interpreter (about 0.1 s here, most of it ``site``) plus the probe's
imports; the hung round's few milliseconds past the timeout are the SIGKILL and the fork + exec
of the replacement. Shutdown waits for the workers to exit on EOF.

``multiprocessing`` with ``spawn`` would do, on private pipes too, but it re-imports the owner's
``__main__`` module in every worker (for the server: gRPC and the whole runtime), starts a
resource tracker process and pickles what crosses the pipes; a fresh interpreter that imports
only the probe, and JSON that needs no trust to decode, are simpler and no slower.

See also: ``riffle_actors.io.probe`` (the probe), ``riffle_actors.io.probe_worker`` (the worker
side), ``riffle_actors.actors.disk_monitor`` (who calls this).
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from riffle_actors.io.local import IOErrorKind
from riffle_actors.io.probe import ProbeFn, ProbeResult
from riffle_actors.io.probe_worker import encode, function_ref, result_from_json

_WAIT_SLICE_S = 0.1  # how quickly a round notices stop_requested
_MAX_LINE = 1 << 20  # a reply line longer than this is a broken worker


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One disk to probe: its name, its root directory and a module-level probe function."""

    disk: str
    root: str
    probe_fn: ProbeFn

    def __post_init__(self) -> None:
        function_ref(self.probe_fn)  # fails here, in the caller, for a lambda or a nested function


class WorkerGone(Exception):
    """The worker process exited, or its pipes broke."""


@dataclass(eq=False, slots=True)
class _Worker:
    """One worker process and the owner's ends of its pipes (non-blocking)."""

    disk: str
    proc: subprocess.Popen
    to_worker: int
    from_worker: int
    started: float
    ready: bool = False
    killed: bool = False
    pending_seq: int | None = None  # the request it is working on
    inbox: bytearray = field(default_factory=bytearray)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None  # reaps it when it has exited

    def send(self, msg: dict[str, Any]) -> None:
        data = memoryview(encode(msg))
        try:
            while data:
                data = data[os.write(self.to_worker, data):]
        except BlockingIOError as e:  # a request is a few hundred bytes: a full pipe means a stuck worker
            raise WorkerGone(f"request pipe full: {e}") from e
        except OSError as e:
            raise WorkerGone(f"request pipe: {e}") from e

    def receive(self) -> list[dict[str, Any]]:
        """The complete messages readable now; ``WorkerGone`` on EOF."""
        try:
            chunk = os.read(self.from_worker, 1 << 16)
        except BlockingIOError:
            return []
        except OSError as e:
            raise WorkerGone(f"reply pipe: {e}") from e
        if not chunk:
            raise WorkerGone("reply pipe closed")
        self.inbox += chunk
        messages = []
        while (end := self.inbox.find(b"\n")) >= 0:
            line, self.inbox[:] = bytes(self.inbox[:end]), self.inbox[end + 1:]
            messages.append(json.loads(line))
        if len(self.inbox) > _MAX_LINE:
            raise WorkerGone(f"reply line longer than {_MAX_LINE} bytes")
        return messages

    def close_requests(self) -> None:
        if self.to_worker >= 0:
            os.close(self.to_worker)
            self.to_worker = -1

    def close(self) -> None:
        self.close_requests()
        if self.from_worker >= 0:
            os.close(self.from_worker)
            self.from_worker = -1

    def exit_status(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _worker_env() -> dict[str, str]:
    """The owner's environment, with ``PYTHONPATH`` = the owner's ``sys.path`` (absolute), so the
    worker imports the same ``riffle_actors`` and probe functions (tests pass their own)."""
    env = dict(os.environ)
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
    return env


class ProbeFleet:
    """Out-of-process probe runner; see the module docstring. Use from one long-lived thread only."""

    def __init__(self, *, setup_timeout_s: float = 30.0, exit_grace_s: float = 1.0,
                 python: str = sys.executable):
        self.setup_timeout_s = setup_timeout_s
        self.exit_grace_s = exit_grace_s
        self.python = python
        self._workers: dict[str, _Worker] = {}
        self._dying: list[_Worker] = []  # SIGKILLed or retired, not reaped yet
        self._seq = itertools.count(1)
        self._env: dict[str, str] | None = None
        self.killed_pids: list[int] = []
        self.stop_requested: threading.Event | None = None  # set by the owner to end a round early
        self.starts = 0  # worker processes started
        self.start_seconds = 0.0  # spent waiting for workers to be ready

    # ------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        """Whether any worker process exists (from the first round until ``shutdown``)."""
        return bool(self._workers)

    def worker_pids(self) -> dict[str, int]:
        return {disk: w.pid for disk, w in self._workers.items()}

    def shutdown(self) -> None:
        """Close every request pipe, give the workers ``exit_grace_s`` to exit, SIGKILL the rest.

        Idempotent; the fleet starts again on the next round."""
        workers = list(self._workers.values()) + self._dying
        self._workers, self._dying = {}, []
        for w in workers:
            w.close_requests()  # an idle worker reads EOF and exits
        deadline = time.monotonic() + self.exit_grace_s
        for w in workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("disk probe worker of {} (pid {}) did not exit within {:g}s of shutdown; "
                               "killing it", w.disk, w.pid, self.exit_grace_s)
                self._kill(w)
        deadline = time.monotonic() + self.exit_grace_s
        for w in workers:
            w.close()
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # in the kernel: subprocess reaps it when it is collected
                logger.warning("disk probe worker of {} (pid {}) is still stuck in the kernel after SIGKILL",
                               w.disk, w.pid)
        if workers:
            logger.debug("disk probe fleet shut down ({} workers)", len(workers))

    def _stopping(self) -> bool:
        return self.stop_requested is not None and self.stop_requested.is_set()

    def _kill(self, w: _Worker) -> None:
        if w.killed:
            return
        try:
            w.proc.send_signal(signal.SIGKILL)  # a no-op once the process has been reaped
            w.killed = True
            self.killed_pids.append(w.pid)
        except OSError as e:
            logger.warning("disk probe fleet: cannot kill the worker of {} (pid {}): {!r}", w.disk, w.pid, e)

    def _retire(self, w: _Worker) -> None:
        """Forget ``w`` as its disk's worker; it is reaped by a later round or ``shutdown``."""
        if self._workers.get(w.disk) is w:
            del self._workers[w.disk]
        w.close_requests()
        self._dying.append(w)

    def _reap(self) -> None:
        still = []
        for w in self._dying:
            if w.alive():
                still.append(w)
            else:
                w.close()
        self._dying = still

    def _spawn(self, disk: str) -> _Worker | None:
        """Start a worker for ``disk`` (not waiting for it); None, logged, if the OS refuses."""
        req_r = req_w = rep_r = rep_w = -1
        try:
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            if self._env is None:
                self._env = _worker_env()
            argv = [self.python, "-P", "-m", "riffle_actors.io.probe_worker", str(req_r), str(rep_w),
                    str(os.getpid())]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(req_r, rep_w), env=self._env,
                                    cwd="/")  # never pins the server's working directory (or a mount)
        except OSError as e:
            logger.error("cannot start a disk probe worker for {}: {!r}; it gets no verdict this round",
                         disk, e)
            for fd in (req_r, req_w, rep_r, rep_w):
                if fd >= 0:
                    os.close(fd)
            return None
        os.close(req_r)  # the child's ends: from now on only the child holds them
        os.close(rep_w)
        os.set_blocking(req_w, False)
        os.set_blocking(rep_r, False)
        self.starts += 1
        w = self._workers[disk] = _Worker(disk, proc, req_w, rep_r, time.monotonic())
        return w

    # ------------------------------------------------------------- rounds
    def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> dict[str, ProbeResult | None]:
        """Probe every target at once; ``None`` = no verdict (the probing machinery failed)."""
        results: dict[str, ProbeResult | None] = {t.disk: None for t in targets}
        try:
            self._reap()
            workers = self._ready_workers([t.disk for t in targets])
            pending: dict[int, tuple[_Worker, str]] = {}
            for t in targets:
                w = workers.get(t.disk)
                if w is None:
                    continue
                seq = next(self._seq)
                try:
                    w.send({"op": "probe", "seq": seq, "root": t.root, "fn": function_ref(t.probe_fn)})
                except WorkerGone as e:
                    self._lost(w, str(e))
                    continue
                w.pending_seq = seq
                pending[w.from_worker] = (w, t.disk)
            deadline = time.monotonic() + timeout_s
            while pending and not self._stopping():
                for w, disk in self._wait_readable(pending, deadline):
                    try:
                        messages = w.receive()
                    except WorkerGone as e:
                        del pending[w.from_worker]
                        self._lost(w, str(e))
                        continue
                    for msg in messages:
                        if msg.get("op") == "result" and msg.get("seq") == w.pending_seq:
                            w.pending_seq = None
                            results[disk] = result_from_json(msg["result"])
                            del pending[w.from_worker]
                        # else: the late answer of a round that ended early (stop_requested)
                if time.monotonic() >= deadline:
                    break
            if self._stopping():
                return results  # shutting down: no verdict for what is still pending
            for w, disk in pending.values():
                results[disk] = self._timed_out(w, timeout_s)
        except Exception as e:  # noqa: BLE001 - the machinery failed, not the disks
            logger.opt(exception=e).error("disk probe round failed; restarting every probe worker")
            self.shutdown()
            return {t.disk: None for t in targets}
        return results

    def _wait_readable(self, pending: dict[int, tuple[_Worker, str]],
                       deadline: float) -> list[tuple[_Worker, str]]:
        """The pending workers with something to read (or EOF), waiting at most until ``deadline``."""
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        wait_ms = max(0, min(deadline - time.monotonic(), _WAIT_SLICE_S)) * 1000
        try:
            events = poller.poll(wait_ms)
        except InterruptedError:
            return []
        return [pending[fd] for fd, _ in events]

    def _ready_workers(self, disks: Sequence[str]) -> dict[str, _Worker]:
        """A worker per disk that has said ``ready``, starting (and replacing) them as needed."""
        starting: dict[int, tuple[_Worker, str]] = {}
        for disk in disks:
            w = self._workers.get(disk)
            if w is not None and not w.alive():
                logger.warning("disk probe worker of {} (pid {}) died ({}); replacing it", disk, w.pid,
                               w.exit_status())
                self._retire(w)
                w = None
            if w is None:
                w = self._spawn(disk)
            if w is not None and not w.ready:
                starting[w.from_worker] = (w, disk)
        if starting:
            began = time.monotonic()
            deadline = began + self.setup_timeout_s
            while starting and time.monotonic() < deadline and not self._stopping():
                for w, disk in self._wait_readable(starting, deadline):
                    try:
                        messages = w.receive()
                    except WorkerGone as e:
                        del starting[w.from_worker]
                        logger.error("disk probe worker of {} (pid {}) failed to start ({}, {}); "
                                     "no verdict on the disk this round", disk, w.pid, e, w.exit_status())
                        self._retire(w)
                        continue
                    if any(m.get("op") == "ready" for m in messages):
                        w.ready = True
                        del starting[w.from_worker]
                        logger.debug("disk probe worker of {} started: pid {}, ready after {:.3f}s",
                                     disk, w.pid, time.monotonic() - w.started)
            self.start_seconds += time.monotonic() - began
            for w, disk in starting.values():
                if not self._stopping():
                    logger.error("disk probe worker of {} (pid {}) was not ready within {:g}s; killing it, "
                                 "no verdict on the disk this round", disk, w.pid, self.setup_timeout_s)
                self._kill(w)
                self._retire(w)
        return {disk: w for disk in disks if (w := self._workers.get(disk)) is not None and w.ready}

    def _lost(self, w: _Worker, why: str) -> None:
        logger.warning("disk probe worker of {} (pid {}) died ({}; {}); replacing it on the next round, "
                       "no verdict on the disk", w.disk, w.pid, why, w.exit_status())
        self._retire(w)

    def _timed_out(self, w: _Worker, timeout_s: float) -> ProbeResult | None:
        if not w.alive():
            self._lost(w, "exited during the probe")
            return None
        self._kill(w)
        self._retire(w)
        replacement = self._spawn(w.disk)  # starts while the caller handles the verdict
        logger.warning("disk probe of {} not answered within {:g}s: worker pid {} SIGKILLed; replacement {}",
                       w.disk, timeout_s, w.pid, f"pid {replacement.pid}" if replacement else "not started")
        return ProbeResult(False, kind=IOErrorKind.TIMEOUT.value, op="probe",
                           detail=f"probe not answered within {timeout_s:g}s; probe process {w.pid} killed")
