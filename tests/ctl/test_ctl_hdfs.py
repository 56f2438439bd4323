"""``riffle-ctl bench hdfs append`` against a real HDFS (MiniDFSCluster): appends and reads through
the HDFS tier's IO layer, figures per pass, no file left; an unreachable NameNode is one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _ctl(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "riffle_actors.ctl", *args], check=False, capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def _bench(file_url: str, total: str, batch: str, *more: str, timeout: float = 120.0):
    return _ctl("bench", "hdfs", "append", "--file-path", file_url, "--total-size", total, "--batch-size", batch,
                *more, timeout=timeout)


def test_disk_bench_on_an_hdfs_directory(minihdfs) -> None:
    import hdfs_native

    client = hdfs_native.Client(minihdfs.url)
    client.mkdirs("/bench", 0o755, True)
    r = _bench(f"{minihdfs.url}/bench/bench.data", "8M", "1M", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["mode"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert list(rows) == ["hdfs append", "hdfs read"]
    for mode in ("hdfs append", "hdfs read"):
        assert rows[mode]["bytes"] == 8 << 20 and rows[mode]["blocks"] == 8 and rows[mode]["mb_per_s"] > 0
        assert 0 < rows[mode]["p50_ms"] <= rows[mode]["p95_ms"] <= rows[mode]["p99_ms"] <= rows[mode]["max_ms"]
    assert "hdfs append" in r.stderr  # the progress bar
    assert [st.path for st in client.list_status("/bench", False)] == []  # the file removed

    table = _bench(f"{minihdfs.url}/bench/t.data", "2M", "512K")
    assert table.returncode == 0 and "hdfs read" in table.stdout
    missing = _bench(f"{minihdfs.url}/nope/x.data", "1M", "1M")
    assert missing.returncode == 1 and "is not a directory" in missing.stderr and "Traceback" not in missing.stderr
    # an existing file is the operator's: refused, left alone
    with client.create("/bench/mine.data") as f:
        f.write(b"keep")
    exists = _bench(f"{minihdfs.url}/bench/mine.data", "1M", "1M")
    assert exists.returncode == 1 and "exists; name a new file" in exists.stderr
    assert [st.length for st in client.list_status("/bench", False)] == [4]


def test_ctrl_c_during_an_hdfs_bench_removes_the_scratch_file(minihdfs) -> None:
    import hdfs_native

    client = hdfs_native.Client(minihdfs.url)
    client.mkdirs("/bench-int", 0o755, True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "riffle_actors.ctl", "bench", "hdfs", "append", "--file-path",
                             f"{minihdfs.url}/bench-int/big.data", "--total-size", "4G", "--batch-size", "1M"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        wait_for(lambda: any(st.length > 0 for st in client.list_status("/bench-int", False)), 60,
                 "the scratch file being written")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert list(client.list_status("/bench-int", False)) == []


def test_disk_bench_names_an_unreachable_namenode() -> None:
    with socket.socket() as s:  # a local port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"hdfs://127.0.0.1:{port}/bench/x.data"
    r = _bench(url, "1M", "1M", timeout=60)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"hdfs://127.0.0.1:{port}" in lines[0] and "unreachable" in lines[0], r.stderr
