#!/usr/bin/env python3
"""Idle cost: the CPU an idle ``riffle-server`` (no apps) burns per second, next to its coordinator.

Starts a ``riffle-coordinator`` and a ``riffle-server`` (port 0, loopback, ``--heartbeat`` seconds between
heartbeats, the default disk probe period), waits ``--warmup`` seconds (default 65: past the server's first
disk-probe round, which comes one probe period, 60 s, after the start; until it, each heartbeat's refresh also
reads every disk's usage on the disk's reader thread, ~0.3 ms more per heartbeat), then samples the CPU time (user + system) of each daemon's whole process tree (the server's disk-probe
workers included) over ``--seconds`` and prints CPU-seconds per second, wake-ups per second of the server's
main thread (voluntary context switches) and, with ``--riffle-bin PATH``, the same for a Riffle server started
on the same kind of config in the same invocation, heartbeating to the same coordinator
(``scripts/rust_riffle.py``), and the ratio ours / Riffle's. ``--rounds`` repeats the
measurement, interleaved, and prints the median.

    python scripts/bench_idle.py [--seconds 30] [--heartbeat 1] [--rounds 3] [--riffle-bin ./riffle-server]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from scripts.rust_riffle import start_riffle

ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ENV.pop("RIFFLE_ADMIN_TOKEN", None)


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise SystemExit(f"{path} did not appear in {timeout}s")


def _tree_cpu(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _wakeups(pid: int) -> int:
    try:
        return psutil.Process(pid).num_ctx_switches().voluntary
    except psutil.NoSuchProcess:
        return 0


def _measure(pid: int, seconds: float) -> tuple[float, float]:
    cpu0, wake0, t0 = _tree_cpu(pid), _wakeups(pid), time.monotonic()
    time.sleep(seconds)  # a benchmark's measuring window, not a test waiting on a condition
    elapsed = time.monotonic() - t0
    return (_tree_cpu(pid) - cpu0) / elapsed, (_wakeups(pid) - wake0) / elapsed


def _server_config(data: Path, coordinator_port: int, heartbeat: int) -> str:
    return f"""grpc_port = 0
http_port = 0
grpc_bind_address = "127.0.0.1"
http_bind_address = "127.0.0.1"
coordinator_quorum = ["127.0.0.1:{coordinator_port}"]
heartbeat_interval_seconds = {heartbeat}
store_type = "MEMORY_LOCALFILE"
[memory_store]
capacity = "1G"
[localfile_store]
data_paths = ["{data}"]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=65,
                    help="seconds between the start and the first sample (default: past the first disk-probe "
                         "round, 60 s after the start; before it each refresh also reads the disks' usage)")
    ap.add_argument("--heartbeat", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--riffle-bin", help="a Riffle riffle-server binary to compare with (not part of this project)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="riffle-idle-") as tmp:
        root = Path(tmp)
        procs: list[subprocess.Popen] = []
        try:
            (root / "coordinator.toml").write_text('grpc_port = 0\nhttp_port = 0\ngrpc_bind_address = "127.0.0.1"\n'
                                                   'http_bind_address = "127.0.0.1"\n')
            coord = subprocess.Popen([sys.executable, "-m", "riffle_actors.coordinator", "--config",
                                      str(root / "coordinator.toml"), "--port-file", str(root / "coord.json")],
                                     env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(coord)
            cport = _wait_file(root / "coord.json", coord)["grpc_port"]
            (root / "server.toml").write_text(_server_config(root / "data", cport, args.heartbeat))
            server = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config",
                                       str(root / "server.toml"), "--port-file", str(root / "server.json")],
                                      env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(server)
            _wait_file(root / "server.json", server)
            riffle = None
            if args.riffle_bin:
                riffle = start_riffle(args.riffle_bin, root / "riffle", quorum=f"127.0.0.1:{cport}", capacity="1G",
                                      data_dir=root / "riffle-data", urpc=False, heartbeat_s=args.heartbeat,
                                      direct_io=False).proc
                procs.append(riffle)
            time.sleep(args.warmup)  # let start-up work (registration, the first probe round) pass
            rows: dict[str, list[tuple[float, float]]] = {"riffle_actors server": [], "coordinator": []}
            if riffle is not None:
                rows["Riffle server"] = []
            for _ in range(args.rounds):
                rows["riffle_actors server"].append(_measure(server.pid, args.seconds))
                rows["coordinator"].append(_measure(coord.pid, min(args.seconds, 10)))
                if riffle is not None:
                    rows["Riffle server"].append(_measure(riffle.pid, args.seconds))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    print(f"idle, heartbeat every {args.heartbeat}s, {args.seconds:g}s x {args.rounds} round(s), medians:")
    print(f"{'process':<22} {'CPU s/s':>10} {'wake-ups/s':>11}")
    med = {}
    for name, values in rows.items():
        cpu = statistics.median(v[0] for v in values)
        wake = statistics.median(v[1] for v in values)
        med[name] = cpu
        print(f"{name:<22} {cpu:>10.5f} {wake:>11.1f}")
    if "Riffle server" in med and med["Riffle server"] > 0:
        print(f"ours / Riffle idle CPU: {med['riffle_actors server'] / med['Riffle server']:.2f}x")


if __name__ == "__main__":
    main()
