"""A ``riffle-server`` as a separate process, for tests that measure the daemon itself (its peak RSS,
its sockets, what it survives): ``server_process(tmp_path, ...)`` writes a loopback config on port 0,
starts ``python -m riffle_actors.server`` with ``--port-file``, waits (on the port file) until it
listens and yields a ``ServerProcess``; it is always terminated (SIGTERM, then SIGKILL after 30 s).

``top`` is TOML put at the top level, ``memory_store`` / ``urpc_config`` lines go into those sections,
and ``tables`` is TOML appended at the end (whole sections). With ``urpc=True`` the urpc port is on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def vm_hwm_bytes(pid: int) -> int:
    """Peak resident set size of ``pid`` so far (Linux ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, ports: dict, log: Path):
        self.proc, self.log = proc, log
        self.grpc_port, self.http_port = ports["grpc_port"], ports["http_port"]
        self.urpc_port = ports.get("urpc_port")
        self.target = f"127.0.0.1:{self.grpc_port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of /metrics (0 when absent)."""
        pattern = re.compile(rf"^{re.escape(name)}(\{{([^}}]*)\}})? (\S+)$", re.MULTILINE)
        for m in pattern.finditer(self.metrics()):
            if all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
                return float(m.group(3))
        return 0.0

    def vm_hwm(self) -> int:
        return vm_hwm_bytes(self.proc.pid)


@contextmanager
def server_process(tmp_path: Path, *, top: str = "", memory_store: str = "", urpc_config: str = "",
                   tables: str = "", capacity: str = "64M", urpc: bool = False) -> Iterator[ServerProcess]:
    cfg = tmp_path / "server.toml"
    log = tmp_path / "server.log"
    urpc_lines = 'urpc_port = 0\nurpc_bind_address = "127.0.0.1"\n' if urpc else ""
    cfg.write_text(f"""grpc_port = 0
grpc_bind_address = "127.0.0.1"
http_port = 0
http_bind_address = "127.0.0.1"
{urpc_lines}grace_period_sec = 0
{top}
[memory_store]
capacity = "{capacity}"
{memory_store}
[localfile_store]
data_paths = ["{tmp_path / 'data'}"]
[urpc_config]
{urpc_config}
[log]
path = "{log}"
{tables}
""")
    port_file = tmp_path / "ports.json"
    proc = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(cfg),
                             "--port-file", str(port_file)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_file.exists() or proc.poll() is not None, timeout=60, what="server ports")
        assert proc.poll() is None, log.read_text() if log.exists() else "server exited"
        yield ServerProcess(proc, json.loads(port_file.read_text()), log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# what a daemon advertises when WORKER_IP is unset: its bind address (loopback in these tests)
LOOPBACK_ENV = {k: v for k, v in ENV.items() if k != "WORKER_IP"}


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Daemons:
    """Every daemon a test starts (``python -m <module> --config ... --port-file ...``, output in
    ``<root>/<name>.out``); ``kill_all`` at teardown kills them all, and the workers of a host too
    (their pids are read from the host's port file), whatever happened."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.worker_pids: set[int] = set()

    def start(self, module: str, name: str, config: str, timeout: float = 90
              ) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
        cfg = self.root / f"{name}.toml"
        cfg.write_text(config)
        port_file = self.root / f"{name}.ports.json"
        with open(self.root / f"{name}.out", "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(cfg), "--port-file",
                                     str(port_file)], env=LOOPBACK_ENV, cwd=self.root, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)

        def ready() -> dict[str, int] | None:
            assert proc.poll() is None, f"{name} exited with {proc.returncode}: {self.tail(name)}"
            try:
                return json.loads(port_file.read_text())
            except (FileNotFoundError, ValueError):
                return None

        ports = wait_for(ready, timeout, f"{name} port file")
        self.worker_pids |= {v for k, v in ports.items() if k.startswith("worker_") and k.endswith("_pid")}
        return proc, ports

    def tail(self, name: str) -> str:
        return (self.root / f"{name}.out").read_text(errors="replace")[-4000:]

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        for pid in self.worker_pids:  # the kernel kills them with their parent; make sure anyway
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
