"""``riffle-coordinator`` as a real process: port file, signals, --daemon/status/stop, bad config.

Exercises ``riffle_actors.daemon.run_daemon`` through the coordinator's ``main``. Every process a
test starts is killed at teardown, even when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CMD = [sys.executable, "-m", "riffle_actors.coordinator"]




def read_port_file(path: Path) -> dict[str, int] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")


@pytest.fixture
def procs() -> Iterator[dict[str, Any]]:
    """Started ``Popen``s and daemon pid files; everything still alive is killed at teardown."""
    tracked: dict[str, Any] = {"popen": [], "pid_files": []}
    yield tracked
    for p in tracked["popen"]:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    for pid_file in tracked["pid_files"]:
        try:
            pid = int(Path(pid_file).read_text())
        except (OSError, ValueError):
            continue
        if not pid_gone(pid):
            os.kill(pid, signal.SIGKILL)


def write_config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "coordinator.toml"
    cfg.write_text(
        "grpc_port = 0\nhttp_port = 0\n"
        f"{extra}\n"
        '[client_conf]\n"rss.storage.type" = "MEMORY_LOCALFILE"\n'
        f'[log]\npath = "{tmp_path / "log" / "coordinator.log"}"\nlevel = "DEBUG"\n'
    )
    return cfg


def start(procs: dict[str, Any], *args: str | Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [*CMD, *map(str, args)], env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    procs["popen"].append(p)
    return p


def run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CMD, *map(str, args)], env=ENV, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def http_get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def wait_port_file(path: Path, proc: subprocess.Popen[str] | None = None) -> dict[str, int]:
    def ready() -> dict[str, int] | None:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited early with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        return read_port_file(path)

    return wait_for(ready, what=f"port file {path}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_foreground_writes_port_file_and_exits_0_on_signal(
    tmp_path: Path, procs: dict[str, Any], sig: signal.Signals
) -> None:
    port_file = tmp_path / "ports.json"
    proc = start(procs, "--config", write_config(tmp_path), "--port-file", port_file)
    ports = wait_port_file(port_file, proc)
    assert set(ports) == {"grpc_port", "http_port", "pid"} and ports["pid"] == proc.pid
    assert ports["grpc_port"] > 0 and ports["http_port"] > 0
    health = http_get(ports["http_port"], "/api/health")
    assert health["status"] == "ok" and health["servers"] == 0

    proc.send_signal(sig)
    assert proc.wait(20) == 0
    assert not port_file.exists()  # a stale port file would mislead the next waiter
    assert "stopped (exit 0)" in (tmp_path / "log" / "coordinator.log").read_text()


def test_daemon_status_and_stop(tmp_path: Path, procs: dict[str, Any]) -> None:
    pid_file, port_file = tmp_path / "run" / "coordinator.pid", tmp_path / "ports.json"
    procs["pid_files"].append(pid_file)
    cfg = write_config(tmp_path)

    started = run("--config", cfg, "--daemon", "--pid-file", pid_file, "--port-file", port_file)
    assert started.returncode == 0, started.stderr
    pid = int(pid_file.read_text())
    assert f"started, pid {pid}" in started.stdout
    ports = read_port_file(port_file)  # written before the foreground process returned
    assert ports is not None and ports["pid"] == pid
    assert http_get(ports["http_port"], "/api/health")["status"] == "ok"

    status = run("status", "--pid-file", pid_file)
    assert status.returncode == 0 and str(pid) in status.stdout

    again = run("--config", cfg, "--daemon", "--pid-file", pid_file)
    assert again.returncode == 1 and "already running" in again.stderr

    stopped = run("stop", "--pid-file", pid_file, "--timeout", "20")
    assert stopped.returncode == 0, stopped.stderr
    assert pid_gone(pid)
    assert not pid_file.exists() and not port_file.exists()
    assert run("status", "--pid-file", pid_file).returncode == 3
    assert run("stop", "--pid-file", pid_file).returncode == 0  # stopping a stopped daemon is fine
    log = (tmp_path / "log" / "coordinator.log").read_text()
    assert "coordinator up" in log and "SIGTERM received" in log


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "assignment_strategy = 'random'\n[server]\nheartbeat_timout_sec = 3\n")
    result = run("--config", cfg, "--port-file", tmp_path / "ports.json")
    assert result.returncode == 2
    assert "server.heartbeat_timout_sec: unknown key" in result.stderr
    assert "assignment_strategy" in result.stderr
    assert not (tmp_path / "ports.json").exists()
    # The same under --daemon: the error is reported before detaching.
    result = run("--config", cfg, "--daemon", "--pid-file", tmp_path / "c.pid")
    assert result.returncode == 2 and "server.heartbeat_timout_sec" in result.stderr
    assert not (tmp_path / "c.pid").exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run().returncode == 2  # --config is required
    assert run("--config", tmp_path / "missing.toml").returncode == 2
    result = run("--config", write_config(tmp_path), "--daemon")
    assert result.returncode == 2 and "--pid-file" in result.stderr


def test_daemon_start_failure_is_reported(tmp_path: Path, procs: dict[str, Any]) -> None:
    port_file = tmp_path / "first.json"
    first = start(procs, "--config", write_config(tmp_path), "--port-file", port_file)
    busy = wait_port_file(port_file, first)["http_port"]
    second = tmp_path / "second"
    second.mkdir()
    cfg = write_config(second)
    cfg.write_text(cfg.read_text().replace("http_port = 0", f"http_port = {busy}"))
    pid_file = tmp_path / "second.pid"
    procs["pid_files"].append(pid_file)
    result = run("--config", cfg, "--daemon", "--pid-file", pid_file)
    assert result.returncode == 1
    assert "failed to start" in result.stderr
    assert not pid_file.exists()


def test_stale_pid_file_is_never_signalled(tmp_path: Path, procs: dict[str, Any]) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    procs["popen"].append(bystander)
    pid_file = tmp_path / "stale.pid"
    pid_file.write_text(f"{bystander.pid}\n")  # a recycled pid: alive, but not ours
    assert run("status", "--pid-file", pid_file).returncode == 3
    assert run("stop", "--pid-file", pid_file).returncode == 0
    assert bystander.poll() is None
    pid_file.write_text("999999999\n")  # dead
    assert run("status", "--pid-file", pid_file).returncode == 3
