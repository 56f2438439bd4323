"""``hdfs_store.precheck_enable`` against a real MiniDFSCluster: a server whose remote storage bases all
answer starts (and says so); one whose NameNode is down, or whose base names a port nobody listens on,
refuses to start, naming the base, in process and as the ``riffle-server`` daemon (exit 1); without the
key the same server starts regardless (nothing is contacted before an app uses HDFS).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from loguru import logger

from riffle_actors.io.hdfs import HdfsPrecheckError
from tests.conftest import stop_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _hdfs_cfg(*remotes: str, precheck: bool = True) -> dict:
    # hdfs-native retries a refused connection for longer than this: a dead NameNode is the timeout
    return {"store_type": "MEMORY_LOCALFILE_HDFS",
            "hdfs_store": {"precheck_enable": precheck, "write_timeout_sec": 5,
                           "remote_storage": [{"path": r} for r in remotes]}}


def _dead_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        return f"hdfs://127.0.0.1:{s.getsockname()[1]}"


async def test_precheck_starts_when_every_base_answers_and_refuses_a_dead_namenode(server_factory, minihdfs):
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO", format="{message}")
    try:
        srv = await server_factory(**_hdfs_cfg(f"{minihdfs.url}/rss-precheck"))
        assert any("precheck_enable: reached" in line and "/rss-precheck" in line for line in lines), lines
        await stop_server(srv)

        await asyncio.to_thread(minihdfs.command, "stop-namenode")
        try:
            with pytest.raises(HdfsPrecheckError, match=r"remote storage .*/rss-precheck") as e:
                await server_factory(**_hdfs_cfg(f"{minihdfs.url}/rss-precheck"))
            assert "precheck_enable" in str(e.value) and "not starting" in str(e.value)
            # without the key nothing is contacted at start: the same config starts
            srv = await server_factory(**_hdfs_cfg(f"{minihdfs.url}/rss-precheck", precheck=False))
            await stop_server(srv)
        finally:
            await asyncio.to_thread(minihdfs.command, "restart-namenode")
        srv = await server_factory(**_hdfs_cfg(f"{minihdfs.url}/rss-precheck"))  # up again: starts again
        await stop_server(srv)
    finally:
        logger.remove(sink)


async def test_precheck_names_the_one_base_that_cannot_be_reached(server_factory, minihdfs):
    dead = _dead_url()
    with pytest.raises(HdfsPrecheckError, match=f"remote storage {dead}/rss (cannot be reached|did not answer within 5s)"):
        await server_factory(**_hdfs_cfg(f"{minihdfs.url}/rss-a", f"{dead}/rss"))


def test_riffle_server_daemon_exits_1_when_precheck_fails(tmp_path, minihdfs):
    dead = _dead_url()
    cfg = tmp_path / "server.toml"
    cfg.write_text(f"""
store_type = "MEMORY_LOCALFILE_HDFS"
grpc_port = 0
http_port = 0
grpc_bind_address = "127.0.0.1"
http_bind_address = "127.0.0.1"
coordinator_quorum = []
[memory_store]
capacity = "16M"
[localfile_store]
data_paths = ["{tmp_path / 'disk'}"]
[hdfs_store]
precheck_enable = true
write_timeout_sec = 5
[[hdfs_store.remote_storage]]
path = "{minihdfs.url}/rss-ok"
[[hdfs_store.remote_storage]]
path = "{dead}/rss"
""")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "riffle_actors.server", "-c", str(cfg)], capture_output=True, check=False,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert f"remote storage {dead}/rss did not answer within 5s" in r.stderr, r.stderr[-2000:]
    assert "/rss-ok" not in r.stderr.split("precheck_enable: remote storage")[-1]  # the one that failed is named
