"""``riffle-local``: a coordinator and a server that registers, on loopback only, with an admin token;
one Ctrl-C (SIGINT to the terminal's process group) stops both with one flush each and exit 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration


def _start(tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    log = tmp_path / "local.err"
    proc = subprocess.Popen(
        [sys.executable, "-m", "riffle_actors.local", "--data-dir", str(tmp_path / "data"),
         "--coordinator-port", "0", "--coordinator-http-port", "0", "--server-port", "0",
         "--server-http-port", "0", "--server-urpc-port", "0", "--capacity", "64M"],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        start_new_session=True,  # its own process group, as a shell job: Ctrl-C is a SIGINT to that group
        env={k: v for k, v in os.environ.items() if k not in ("RIFFLE_ADMIN_TOKEN", "WORKER_IP")})
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:  # ends at EOF if riffle-local dies; the test timeout bounds it otherwise
        lines.append(line)
        if line.startswith("Everything listens on"):
            break
    return proc, "".join(lines), log


def _post_status(port: int, sid: str, token: str | None) -> int:
    # DECOMMISSIONED: an override at the coordinator only. (DECOMMISSIONING would also reach the
    # server, which shares the token here, and a server without apps then stops by itself.)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/servers/{sid}/status", method="POST",
                                 data=json.dumps({"status": "DECOMMISSIONED"}).encode())
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_riffle_local_is_loopback_only_token_protected_and_stops_on_one_ctrl_c(tmp_path: Path):
    proc, text, log = _start(tmp_path)
    try:
        assert "spark.rss.coordinator.quorum=127.0.0.1:" in text, text + log.read_text()
        assert "Uniffle client jar" in text  # where it is, or how to get it
        token = re.search(r"Admin token .*: (\S+)", text).group(1)
        coordinator_http = int(text.split("Servers: curl http://127.0.0.1:")[1].split("/")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{coordinator_http}/api/servers", timeout=5) as r:
            servers = json.loads(r.read())
        assert len(servers) == 1 and servers[0]["status"] == "ACTIVE"
        assert servers[0]["ip"] == "127.0.0.1", servers[0]  # advertises what it binds

        daemons = psutil.Process(proc.pid).children(recursive=True)
        assert len(daemons) == 2
        listening = [c.laddr for p in daemons for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        # gRPC listens on an IPv6 socket for an IPv4 address: ::ffff:127.0.0.1 is the same loopback address
        assert len(listening) == 5, listening  # coordinator gRPC + HTTP, server gRPC + urpc + HTTP
        assert {a.ip.removeprefix("::ffff:") for a in listening} == {"127.0.0.1"}, listening

        sid = servers[0]["id"]
        assert _post_status(coordinator_http, sid, None) == 401
        assert _post_status(coordinator_http, sid, "x" * 32) == 401
        assert _post_status(coordinator_http, sid, token) == 200

        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert proc.wait(60) == 0, log.read_text()  # 0 only when both daemons exited 0
        _gone, alive = psutil.wait_procs(daemons, timeout=30)
        assert not alive, f"daemons left behind: {alive}"
        err = log.read_text()
        assert "second" not in err, err
        assert err.count("riffle-server stopped (exit 0)") == 1, err
        assert err.count("riffle-coordinator stopped (exit 0)") == 1 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_riffle_local_stops_on_sigterm(tmp_path: Path):
    proc, text, log = _start(tmp_path)
    try:
        assert "Ctrl-C stops both" in text, text + log.read_text()
        daemons = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        _gone, alive = psutil.wait_procs(daemons, timeout=30)
        assert not alive, f"daemons left behind: {alive}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
