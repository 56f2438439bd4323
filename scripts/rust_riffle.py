"""Launching a Riffle (Rust) ``riffle-server`` for the comparison modes of the benchmarks (``--riffle-bin``).

The binary is not part of this project: build it from zuston/riffle yourself and pass its path. What
the benchmarks need to know about it, learnt from running Riffle 0.27 here:

- it is started as ``riffle-server --config FILE`` (this build refuses to start without ``--config``);
- it will not start without a reachable coordinator (``coordinator_quorum``; the heartbeat module
  panics with "No active coordinator server found"), so the benchmarks give it one of ours;
- it binds the ports its config names (no port file), so they are picked here and the launcher waits
  until they accept connections.

Used by ``bench_ingest.py``, ``bench_idle.py`` and ``bench_spark_transports.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RiffleProcess", "free_port", "start_riffle"]


def free_port() -> int:
    """A loopback TCP port free right now (Riffle cannot report the port it took for 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RiffleProcess:
    proc: subprocess.Popen
    grpc_port: int
    http_port: int
    urpc_port: int  # 0 when not asked for
    log_path: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def tails(self, lines: int = 40) -> str:
        """The last lines of its log (what ``e2e.Cluster.tails`` prints when a start fails)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return f"--- Riffle {self.log_path}\n" + "\n".join(text)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def start_riffle(binary: str, workdir: Path, *, quorum: str, capacity: str, data_dir: Path, urpc: bool,
                 heartbeat_s: int | None = None, direct_io: bool = True,
                 timeout_s: float = 60) -> RiffleProcess:
    """Riffle on free loopback ports with memory ``capacity``, one data directory, O_DIRECT appends
    (``direct_io``, as ours by default); returns once its ports accept."""
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port = free_port(), free_port()
    urpc_port = free_port() if urpc else 0
    cfg = workdir / "riffle.toml"
    lines = [f"grpc_port = {grpc_port}", f"http_port = {http_port}",
             *([f"urpc_port = {urpc_port}"] if urpc else []),
             f'coordinator_quorum = ["{quorum}"]',
             *([f"heartbeat_interval_seconds = {heartbeat_s}"] if heartbeat_s is not None else []),
             'store_type = "MEMORY_LOCALFILE"',
             "[memory_store]", f'capacity = "{capacity}"',
             "[localfile_store]", f'data_paths = ["{data_dir}"]', f"direct_io_enable = {str(direct_io).lower()}"]
    cfg.write_text("\n".join(lines) + "\n")
    log_path = workdir / "riffle.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, "--config", str(cfg)], cwd=workdir,
                                env={**os.environ, "WORKER_IP": "127.0.0.1", "RUST_LOG": "warn"},
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    riffle = RiffleProcess(proc, grpc_port, http_port, urpc_port, log_path)
    deadline = time.monotonic() + timeout_s
    for port in [grpc_port, http_port] + ([urpc_port] if urpc else []):
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                riffle.stop()
                raise SystemExit(f"Riffle did not start (exit {proc.returncode}); see {log_path}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)  # a benchmark waiting for another process's port, not a test
    return riffle
