"""Benchmark of the out-of-process disk probe fleet (not run in CI).

For each fleet implementation, ``--fleets`` times over two fresh directories (two "disks"):

- first round: starts a worker per disk (from nothing) and probes both;
- ``--rounds`` probe rounds of the two disks (the steady state);
- a round in which disk ``a``'s probe hangs (``tests.fault.probes.HANG``), with a 0.5 s timeout:
  how long after the timeout the round returns (the hang is detected and the worker SIGKILLed);
- the round started right after it: the replacement worker's start plus a probe;
- ``shutdown()``.

Implementations: ``subprocess`` (``riffle_actors.io.probe_fleet``, what the server uses) and,
with ``--alternatives``, ``multiprocessing`` (a minimal ``spawn`` + ``Pipe(duplex=False)`` fleet
defined below) and ``thespian`` (the former multiprocTCPBase fleet, taken from git at
``--thespian-rev``; needs thespian installed).

    python scripts/bench_probe_fleet.py [--fleets 3] [--rounds 20] [--alternatives]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from riffle_actors.io.probe import ProbeResult, probe_disk
from tests.fault.probes import HANG, scripted_probe

HUNG_TIMEOUT_S = 0.5


# ---------------------------------------------------------------------------- multiprocessing prototype
def _mp_worker(requests: Connection, replies: Connection) -> None:
    replies.send(("ready", os.getpid()))
    while True:
        try:
            seq, fn, root = requests.recv()
        except EOFError:
            return
        replies.send(("result", seq, fn(root)))


@dataclass(frozen=True)
class MpTarget:
    disk: str
    root: str
    probe_fn: Callable[[str], ProbeResult]


@dataclass
class _MpWorker:
    proc: Any
    requests: Connection
    replies: Connection
    ready: bool = False


@dataclass
class MpFleet:
    """``spawn`` workers, one pair of one-way pipes each; the same round logic as the real fleet."""

    workers: dict[str, _MpWorker] = field(default_factory=dict)
    seq: int = 0

    def _start(self, disk: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        req_r, req_w = ctx.Pipe(duplex=False)
        rep_r, rep_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_mp_worker, args=(req_r, rep_w), daemon=True)
        proc.start()
        req_r.close()
        rep_w.close()
        self.workers[disk] = _MpWorker(proc, req_w, rep_r)

    def probe(self, targets: Sequence[MpTarget], timeout_s: float) -> dict[str, ProbeResult | None]:
        for t in targets:
            if t.disk not in self.workers:
                self._start(t.disk)
        for t in targets:
            w = self.workers[t.disk]
            if not w.ready:
                w.ready = w.replies.recv()[0] == "ready"
        pending: dict[Connection, str] = {}
        for t in targets:
            self.seq += 1
            self.workers[t.disk].requests.send((self.seq, t.probe_fn, t.root))
            pending[self.workers[t.disk].replies] = t.disk
        results: dict[str, ProbeResult | None] = {t.disk: None for t in targets}
        deadline = time.monotonic() + timeout_s
        while pending and (remaining := deadline - time.monotonic()) > 0:
            for conn in wait(list(pending), remaining):
                _, _, results[pending.pop(conn)] = conn.recv()  # type: ignore[misc,index]
        for disk in pending.values():
            w = self.workers.pop(disk)
            w.proc.kill()
            w.requests.close()
            w.replies.close()
            results[disk] = ProbeResult(False, kind="TIMEOUT", op="probe")
            self._start(disk)  # replaced at once, like the real fleet
        return results

    def shutdown(self) -> None:
        for w in self.workers.values():
            w.requests.close()
        for w in self.workers.values():
            w.proc.join(1.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.replies.close()
        self.workers.clear()


# ---------------------------------------------------------------------------- the runs
def thespian_module(rev: str) -> ModuleType:
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:riffle_actors/io/probe_fleet.py"],
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="thespian-fleet-")) / "thespian_probe_fleet.py"
    path.write_text(source)
    sys.path.insert(0, str(path.parent))  # the spawned thespian workers import it by name
    spec = importlib.util.spec_from_file_location("thespian_probe_fleet", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["thespian_probe_fleet"] = module
    spec.loader.exec_module(module)
    return module


def run(make_fleet: Callable[[], Any], make_target: Callable[..., Any], fleets: int,
        rounds: int) -> dict[str, list[float]]:
    m: dict[str, list[float]] = {k: [] for k in ("first", "round", "hung", "replace", "shutdown")}
    for _ in range(fleets):
        with tempfile.TemporaryDirectory() as d:
            a, b = Path(d, "a"), Path(d, "b")
            a.mkdir()
            b.mkdir()
            targets = [make_target("a", str(a), scripted_probe), make_target("b", str(b), probe_disk)]
            fleet = make_fleet()
            try:
                t = time.monotonic()
                r = fleet.probe(targets, 30)
                m["first"].append(time.monotonic() - t)
                assert all(x is not None and x.ok for x in r.values()), r
                for _ in range(rounds):
                    t = time.monotonic()
                    r = fleet.probe(targets, 30)
                    m["round"].append(time.monotonic() - t)
                    assert all(x is not None and x.ok for x in r.values()), r
                (a / HANG).touch()
                t = time.monotonic()
                r = fleet.probe(targets, HUNG_TIMEOUT_S)
                m["hung"].append(time.monotonic() - t - HUNG_TIMEOUT_S)
                assert r["a"] is not None and r["a"].kind == "TIMEOUT" and r["b"] is not None and r["b"].ok, r
                (a / HANG).unlink()
                t = time.monotonic()
                r = fleet.probe(targets, 30)
                m["replace"].append(time.monotonic() - t)
                assert all(x is not None and x.ok for x in r.values()), r
            finally:
                t = time.monotonic()
                fleet.shutdown()
                m["shutdown"].append(time.monotonic() - t)
    return m


LABELS = {
    "first": "first round: start + 2 workers + probe",
    "round": "probe round, 2 disks",
    "hung": f"hung probe: returns after the {HUNG_TIMEOUT_S:g} s timeout +",
    "replace": "next round (replacement worker + probe)",
    "shutdown": "shutdown",
}


def report(name: str, m: dict[str, list[float]]) -> None:
    print(f"{name}:")
    for key, label in LABELS.items():
        xs = sorted(m[key])
        print(f"  {label:<45} median {statistics.median(xs) * 1e3:7.1f} ms   "
              f"min {xs[0] * 1e3:7.1f}   max {xs[-1] * 1e3:7.1f}   (n={len(xs)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--alternatives", action="store_true", help="also measure multiprocessing and thespian")
    ap.add_argument("--thespian-rev", default="6a56195", help="git revision holding the thespian fleet")
    args = ap.parse_args()
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")  # the fleets' debug lines would drown the figures

    from riffle_actors.io.probe_fleet import ProbeFleet, ProbeTarget

    report("subprocess + os.pipe, JSON lines (riffle_actors.io.probe_fleet)",
           run(ProbeFleet, ProbeTarget, args.fleets, args.rounds))
    if args.alternatives:
        report("multiprocessing spawn + Pipe(duplex=False), pickle",
               run(MpFleet, MpTarget, args.fleets, args.rounds))
        old = thespian_module(args.thespian_rev)
        report(f"thespian multiprocTCPBase (git {args.thespian_rev})",
               run(old.ProbeFleet, old.ProbeTarget, args.fleets, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
