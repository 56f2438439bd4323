"""Restart recovery with real ``riffle-server`` processes: stop (SIGTERM or SIGKILL), start again on the same
ports and data paths, and read back what the first process acknowledged (docs/recovery.md).

- SIGTERM: every block reads back byte-exact, over gRPC and urpc, with the same
  getShuffleResultForMultiPart answer; ``/apps`` says the app was recovered and lost nothing.
- SIGKILL: the blocks spilled before the kill read back byte-exact; the reported ones that were
  only in memory are counted as lost (``/apps``, the log, ``riffle_recovery_lost_blocks_total``),
  and the shuffle result is still every reported id.
- Partial files are truncated to their last whole record; directories without usable metadata
  are removed with one log line; a recovered app that no client heartbeats is purged after the
  app heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.shuffle_meta import decode_log
from tests.helpers import wait_for
from tests.helpers.client import BlockSpec, UniffleClient, make_blocks
from tests.helpers.urpc_client import UrpcClient

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CMD = [sys.executable, "-m", "riffle_actors.server"]


class Daemon:
    """One riffle-server process on ``tmp_path`` (two data paths); restarts keep the ports and paths."""

    def __init__(self, tmp_path: Path, extra: str = "") -> None:
        self.tmp = tmp_path
        self.extra = extra
        self.ports = {"grpc_port": 0, "http_port": 0, "urpc_port": 0}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def data_paths(self) -> list[Path]:
        return [self.tmp / "data1", self.tmp / "data2"]

    @property
    def log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.tmp.glob("server*.log")))

    def start(self) -> dict:
        self.starts += 1
        cfg = self.tmp / "server.toml"
        cfg.write_text(f"""grpc_port = {self.ports['grpc_port']}
http_port = {self.ports['http_port']}
urpc_port = {self.ports['urpc_port']}
grace_period_sec = 30
{self.extra}
[memory_store]
capacity = "256M"
[localfile_store]
data_paths = [{", ".join(f'"{p}"' for p in self.data_paths)}]
[log]
path = "{self.tmp / f'server{self.starts}.log'}"
""")
        port_file = self.tmp / "ports.json"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([*CMD, "--config", str(cfg), "--port-file", str(port_file)], env=ENV,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def ports() -> dict | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"riffle-server exited with {self.proc.returncode}:\n{self.log[-3000:]}")
            try:
                return json.loads(port_file.read_text())
            except (FileNotFoundError, ValueError):
                return None

        got = wait_for(ports, 90, "port file")
        if self.starts == 1:
            self.ports = {k: got[k] for k in self.ports}
        else:
            assert {k: got[k] for k in self.ports} == self.ports, "restarted on other ports"
        return got

    def stop(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(90)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def http(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['http_port']}{path}", timeout=10) as r:
            body = r.read()
        return json.loads(body) if path != "/metrics" else body.decode()

    def client(self) -> UniffleClient:
        return UniffleClient(f"127.0.0.1:{self.ports['grpc_port']}", retry_deadline_s=60)

    def urpc_client(self) -> UrpcClient:
        return UrpcClient(f"127.0.0.1:{self.ports['grpc_port']}", self.ports["urpc_port"], retry_deadline_s=60)


@pytest.fixture
def daemon(tmp_path: Path):
    d = Daemon(tmp_path)
    yield d
    d.kill()


APP = "app-restart"
PARTITIONS = list(range(12))


def blocks_of(task: int, partitions: list[int], count: int, size: int, seq: int = 0) -> list[BlockSpec]:
    return [b for p in partitions for b in make_blocks(p, task, count, size, seq_start=seq)]


async def write(client: UniffleClient, shuffle_id: int, tasks: dict[int, list[BlockSpec]]) -> None:
    for task, blocks in tasks.items():
        for i in range(0, len(blocks), 16):
            await client.send_blocks(APP, shuffle_id, blocks[i:i + 16])
        await client.report(APP, shuffle_id, task, blocks)


async def finish(client: UniffleClient, shuffle_id: int) -> None:
    resp = await client.stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=shuffle_id))
    assert resp.status == 0, resp.retMsg


async def read_all(client: UniffleClient, shuffle_id: int, expected_ids, *, check_complete: bool = True
                   ) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    for p in PARTITIONS:
        got.update(await client.read_partition(APP, shuffle_id, p, set(expected_ids), partition_num=len(PARTITIONS),
                                               check_complete=check_complete))
    return got


def run(coro):
    return asyncio.run(coro)


def test_sigterm_restart_reads_everything_back(daemon: Daemon) -> None:
    daemon.start()
    # shuffle 0: flushed by finishShuffle; shuffle 1: still in memory at SIGTERM (flushed by the stop)
    written = {0: {t: blocks_of(t, PARTITIONS, 3, 3000 + 100 * t) for t in (1, 2, 3)},
               1: {t: blocks_of(t, PARTITIONS[:6], 2, 5000) for t in (7, 8)}}

    async def phase1():
        async with daemon.client() as c:
            for sid in written:
                await c.register_shuffle(APP, sid, PARTITIONS, local_order=(sid == 1))
            for sid, tasks in written.items():
                await write(c, sid, tasks)
            await finish(c, 0)
            return {sid: await c.get_shuffle_result(APP, sid, PARTITIONS) for sid in written}

    before = run(phase1())
    for sid, tasks in written.items():
        assert set(before[sid]) == {b.block_id for bl in tasks.values() for b in bl}
    assert daemon.stop(signal.SIGTERM) == 0
    # what the restart reads: one metadata log per shuffle, with its registration, reports and segments
    logs = [decode_log(p.read_bytes()) for d in daemon.data_paths for p in d.rglob("shuffle.meta")]
    assert len(logs) == 2 and all(log.problem == "" for log in logs)
    kinds = {type(r).__name__ for log in logs for r in log.records}
    assert kinds == {"RegisterRecord", "BlockIdsRecord", "SegmentRecord"}

    daemon.start()
    apps = daemon.http("/apps")
    assert [a["app_id"] for a in apps] == [APP]
    assert apps[0]["recovered"] is True and apps[0]["lost_blocks"] == 0
    assert "recovery took" in daemon.log

    async def phase2():
        async with daemon.client() as c:
            for sid, tasks in written.items():
                assert await c.get_shuffle_result(APP, sid, PARTITIONS) == before[sid]
                got = await read_all(c, sid, before[sid])
                assert got == {b.block_id: b.data for bl in tasks.values() for b in bl}
        async with daemon.urpc_client() as u:
            await u.connect()
            for sid, tasks in written.items():
                got = await read_all(u, sid, before[sid])
                assert got == {b.block_id: b.data for bl in tasks.values() for b in bl}
            # the recovered app takes new data for a recovered shuffle
            more = blocks_of(9, PARTITIONS[:2], 2, 700, seq=50)
            await write(u, 0, {9: more})
            ids = set(before[0]) | {b.block_id for b in more}
            assert set(await u.get_shuffle_result(APP, 0, PARTITIONS)) == ids
            got = await read_all(u, 0, ids)
            assert {b.block_id for b in more} <= set(got)

    run(phase2())
    assert daemon.stop(signal.SIGTERM) == 0


def test_sigkill_keeps_what_was_spilled_and_counts_the_rest(daemon: Daemon) -> None:
    daemon.start()
    on_disk = {t: blocks_of(t, PARTITIONS, 2, 4000) for t in (1, 2)}
    in_memory = {t: blocks_of(t, PARTITIONS[:5], 1, 2000, seq=10) for t in (3,)}

    async def phase1():
        async with daemon.client() as c:
            await c.register_shuffle(APP, 0, PARTITIONS)
            await write(c, 0, on_disk)
            await finish(c, 0)  # everything so far is on disk
            await write(c, 0, in_memory)  # acknowledged and reported, only in memory
            return await c.get_shuffle_result(APP, 0, PARTITIONS)

    before = run(phase1())
    lost = {b.block_id for bl in in_memory.values() for b in bl}
    assert lost <= set(before)
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL

    daemon.start()
    apps = daemon.http("/apps")
    assert apps[0]["app_id"] == APP and apps[0]["lost_blocks"] == len(lost)
    assert apps[0]["shuffles"]["0"]["lost_blocks"] == len(lost)
    assert f"app {APP} lost {len(lost)} reported blocks in the restart" in daemon.log
    assert f"riffle_recovery_lost_blocks_total {float(len(lost))}" in daemon.http("/metrics")

    async def phase2():
        async with daemon.client() as c:
            assert await c.get_shuffle_result(APP, 0, PARTITIONS) == before
            got = await read_all(c, 0, before, check_complete=False)
            assert got == {b.block_id: b.data for bl in on_disk.values() for b in bl}

    run(phase2())


def test_partial_files_are_truncated_and_unusable_dirs_removed(daemon: Daemon) -> None:
    daemon.start()
    blocks = {1: blocks_of(1, PARTITIONS[:3], 2, 1500)}

    async def phase1():
        async with daemon.client() as c:
            await c.register_shuffle(APP, 0, PARTITIONS)
            await write(c, 0, blocks)
            await finish(c, 0)
            return await c.get_shuffle_result(APP, 0, PARTITIONS)

    before = run(phase1())
    assert daemon.stop(signal.SIGTERM) == 0
    index = next(p for d in daemon.data_paths for p in d.rglob("partition-0.index"))
    with open(index, "ab") as f:
        f.write(b"\x01" * 17)  # a torn index record, as a crash in the middle of an append leaves
    meta = next(p for d in daemon.data_paths for p in d.rglob("shuffle.meta"))
    with open(meta, "ab") as f:
        f.write(b"\x05\x00")  # a torn metadata record
    stray = daemon.data_paths[1] / "app-without-meta" / "3"
    stray.mkdir(parents=True)
    (stray / "partition-0.data").write_bytes(b"x" * 100)
    (stray / "partition-0.index").write_bytes(b"")

    daemon.start()
    assert not stray.parent.exists()
    log = daemon.log
    assert f"recovery removed {stray.parent}: app app-without-meta has no usable shuffle metadata" in log
    assert "torn last index record, truncated 17 bytes" in log
    assert index.stat().st_size % 40 == 0

    async def phase2():
        async with daemon.client() as c:
            assert await c.get_shuffle_result(APP, 0, PARTITIONS) == before
            got = await read_all(c, 0, before)
            assert got == {b.block_id: b.data for bl in blocks.values() for b in bl}

    run(phase2())


def test_recovered_app_without_heartbeat_is_purged(tmp_path: Path) -> None:
    d = Daemon(tmp_path, extra="[app_config]\napp_heartbeat_timeout_min = 0.05\napp_expiry_check_interval_sec = 1")
    try:
        d.start()

        async def phase1():
            async with d.client() as c:
                await c.register_shuffle(APP, 0, PARTITIONS)
                await write(c, 0, {1: blocks_of(1, PARTITIONS[:2], 1, 1000)})

        run(phase1())
        assert d.stop(signal.SIGTERM) == 0
        d.start()
        assert [a["app_id"] for a in d.http("/apps")] == [APP]
        wait_for(lambda: d.http("/apps") == [], 60, "the silent recovered app to be purged")
        wait_for(lambda: not any((p / APP).exists() for p in d.data_paths), 30, "its files to be removed")
        assert f"app {APP} purged" in d.log
    finally:
        d.kill()
