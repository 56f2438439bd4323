"""The metadata log when its home disk fails: the app moves to another disk, reports still succeed, and a
server started on the same data paths (in this process, a fresh ``ShuffleServer``) rebuilds the app from the
logs of every disk with the same shuffle result."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from riffle_actors.io.faults import FaultyLocalIO
from riffle_actors.protocol.shuffle_meta import decode_log
from riffle_actors.server import ShuffleServer
from tests.conftest import server_config, stop_server
from tests.helpers.client import UniffleClient, make_blocks

pytestmark = pytest.mark.integration

APP = "app-failover"


async def _start(tmp_path: Path, faulty: dict[str, FaultyLocalIO]) -> ShuffleServer:
    def local_io(name: str, root: str) -> FaultyLocalIO:
        faulty[name] = FaultyLocalIO(name=name)
        return faulty[name]

    srv = ShuffleServer(server_config(tmp_path, disks=2), local_io_factory=local_io)
    await srv.start()
    return srv


async def test_a_failing_home_disk_moves_the_metadata_and_a_restart_still_reads_it(tmp_path: Path) -> None:
    faulty: dict[str, FaultyLocalIO] = {}
    srv = await _start(tmp_path, faulty)
    blocks = [b for p in range(4) for b in make_blocks(p, 1, 2, 2000)]
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            await c.register_shuffle(APP, 0, range(4))
            assert srv.meta_log is not None
            home = srv.meta_log.home(APP)
            faulty[home].fail("append_meta", errno.EROFS)  # the home disk turns read-only for metadata
            await c.send_blocks(APP, 0, blocks)
            await c.report(APP, 0, 1, blocks)  # succeeds: written on the other disk
            other = srv.meta_log.home(APP)
            assert other != home and srv.meta_log.moves == 1
            before = await c.get_shuffle_result(APP, 0, range(4))
            assert set(before) == {b.block_id for b in blocks}
            resp = await c.stub.finishShuffle(c.pb.FinishShuffleRequest(appId=APP, shuffleId=0))
            assert resp.status == 0
    finally:
        await stop_server(srv)
    moved = decode_log(Path(other, APP, "0", "shuffle.meta").read_bytes())
    assert {type(r).__name__ for r in moved.records} >= {"RegisterRecord", "BlockIdsRecord"}

    faulty = {}
    srv = await _start(tmp_path, faulty)
    more = [b for p in range(4) for b in make_blocks(p, 2, 1, 900, seq_start=10)]
    try:
        assert srv.recovery is not None and srv.recovery.apps == 1 and srv.recovery.lost_blocks == 0
        # reported to the coordinators with the next heartbeat
        assert srv.admin is not None and [a.app_id for a in srv.admin.heartbeat_snapshot().apps] == [APP]
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            assert await c.get_shuffle_result(APP, 0, range(4)) == before
            for p in range(4):
                got = await c.read_partition(APP, 0, p, set(before), partition_num=4)
                assert got == {b.block_id: b.data for b in blocks if b.partition_id == p}
            # the recovered home fails too: the app moves back, with the recovered registration
            assert srv.meta_log is not None and srv.meta_log.home(APP) == other
            faulty[other].fail("append_meta", errno.EIO)
            await c.send_blocks(APP, 0, more)
            await c.report(APP, 0, 2, more)
            assert srv.meta_log.home(APP) == home
            after = await c.get_shuffle_result(APP, 0, range(4))
            resp = await c.stub.finishShuffle(c.pb.FinishShuffleRequest(appId=APP, shuffleId=0))
            assert resp.status == 0
    finally:
        await stop_server(srv)
    Path(other, APP, "0", "shuffle.meta").unlink()  # the log on the failed disk is gone
    srv = await _start(tmp_path, {})
    try:
        assert srv.recovery is not None and srv.recovery.apps == 1
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            assert set(await c.get_shuffle_result(APP, 0, range(4))) == set(after) == set(before) | {
                b.block_id for b in more}
    finally:
        await stop_server(srv)
