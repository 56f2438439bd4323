"""``riffle-ctl disk-bench`` against a real HDFS (MiniDFSCluster): appends and reads through the
HDFS tier's IO layer, figures per pass, no scratch file left; an unreachable NameNode is one line."""

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


def test_disk_bench_on_an_hdfs_directory(minihdfs) -> None:
    import hdfs_native

    client = hdfs_native.Client(minihdfs.url)
    client.mkdirs("/bench", 0o755, True)
    r = _ctl("disk-bench", f"{minihdfs.url}/bench", "--size", "8M", "--block-size", "1M", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["mode"]: row for row in json.loads(r.stdout)}
    assert list(rows) == ["hdfs write", "hdfs read", "O_DIRECT write", "O_DIRECT read"]
    for mode in ("hdfs write", "hdfs read"):
        assert rows[mode]["bytes"] == 8 << 20 and rows[mode]["blocks"] == 8 and rows[mode]["mb_per_s"] > 0
        assert 0 < rows[mode]["p50_ms"] <= rows[mode]["p95_ms"] <= rows[mode]["p99_ms"] <= rows[mode]["max_ms"]
    for mode in ("O_DIRECT write", "O_DIRECT read"):
        assert "does not apply to HDFS" in rows[mode]["skipped"]
    assert "hdfs write" in r.stderr  # the progress bar
    assert [st.path for st in client.list_status("/bench", False)] == []  # scratch file removed

    table = _ctl("disk-bench", f"{minihdfs.url}/bench", "--size", "2M", "--block-size", "512K")
    assert table.returncode == 0 and "hdfs read" in table.stdout and "does not apply to HDFS" in table.stdout
    missing = _ctl("disk-bench", f"{minihdfs.url}/nope", "--size", "1M")
    assert missing.returncode == 1 and "is not a directory" in missing.stderr and "Traceback" not in missing.stderr
    assert [st.path for st in client.list_status("/bench", False)] == []


def test_ctrl_c_during_an_hdfs_bench_removes_the_scratch_file(minihdfs) -> None:
    import hdfs_native

    client = hdfs_native.Client(minihdfs.url)
    client.mkdirs("/bench-int", 0o755, True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "riffle_actors.ctl", "disk-bench", f"{minihdfs.url}/bench-int",
                             "--size", "4G", "--block-size", "1M"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
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
    url = f"hdfs://127.0.0.1:{port}/bench"
    r = _ctl("disk-bench", url, "--size", "1M", timeout=60)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"hdfs://127.0.0.1:{port}" in lines[0] and "unreachable" in lines[0], r.stderr
