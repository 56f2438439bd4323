"""``riffle-local`` brings up a coordinator and a server that registers, and stops both on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

pytestmark = pytest.mark.integration


def test_riffle_local_starts_registers_and_stops(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "riffle_actors.local", "--data-dir", str(tmp_path / "data"),
         "--coordinator-port", "0", "--coordinator-http-port", "0", "--server-port", "0",
         "--server-http-port", "0", "--capacity", "64M"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Health:"):
                break
        text = "".join(lines)
        assert "spark.rss.coordinator.quorum=127.0.0.1:" in text, text
        coordinator_http = int(text.split("Servers: curl http://127.0.0.1:")[1].split("/")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{coordinator_http}/api/servers", timeout=5) as r:
            servers = json.loads(r.read())
        assert len(servers) == 1 and servers[0]["status"] == "ACTIVE"
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"daemons left behind: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
