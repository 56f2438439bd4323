"""Faults of the HDFS tier on a real HDFS (MiniDFSCluster): DataNode or NameNode stopped mid-spill, a
crashed or stuck HDFS writer, every local disk quarantined.

The invariant: every block acknowledged by sendShuffleData is read back byte-exact, from memory, the
local files (through the server) or the HDFS files (directly, as the Uniffle client does). When HDFS
fails, spills fall back to local disk (counted); when every local disk is quarantined, they go to HDFS.
Each test starts its own MiniDFSCluster, since it breaks it; it is stopped even when the test fails.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from io import RawIOBase

import pytest

from riffle_actors.actors.app_manager import FlushAllApps
from riffle_actors.actors.hdfs_writer import GetHdfsStats
from riffle_actors.io.hdfs import HdfsIO
from riffle_actors.server import ShuffleServer
from tests.conftest import stop_server
from tests.fault.conftest import fault_config
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.hdfs_read import read_hdfs_partition
from tests.helpers.minihdfs import MiniHdfs, hdfs_prerequisite

pytestmark = [pytest.mark.fault, pytest.mark.timeout(600)]

PARTITIONS = (0, 1)
APP = "application_hdfs_fault_1"


@pytest.fixture
def hdfs(tmp_path):
    reason = hdfs_prerequisite()
    if reason:
        pytest.skip(reason)
    h = MiniHdfs.start(tmp_path / "hdfs")
    try:
        yield h
    finally:
        h.stop()


def hdfs_config(tmp_path, remote, **hybrid):
    return fault_config(tmp_path, store_type="MEMORY_LOCALFILE_HDFS",
                        hybrid_store={"memory_single_buffer_max_spill_size": "128K", **hybrid},
                        hdfs_store={"write_timeout_sec": 10, "unhealthy_retry_interval_sec": 0.5,
                                    "remote_storage": [{"path": remote}]})


async def send_rounds(client, rounds, written, start=0, size=48 << 10):
    for r in range(start, start + rounds):
        for p in PARTITIONS:
            blocks = make_blocks(p, r + 1, 2, size, seq_start=0)
            await client.send_blocks(APP, 0, blocks)
            await client.report(APP, 0, r + 1, blocks)
            written += blocks


async def read_back(srv, client, remote, written):
    """Every acknowledged block, from the server (memory + local files) or from HDFS; (local, hdfs) counts."""
    n_local = n_hdfs = 0
    for p in PARTITIONS:
        want = [b for b in written if b.partition_id == p]
        ids = {b.block_id for b in want}
        local = await client.read_partition(APP, 0, p, ids, partition_num=2, check_complete=False)
        got = await asyncio.to_thread(read_hdfs_partition, remote, APP, 0, p, srv.server_id, ids)
        assert_read_matches({**got, **local}, want)
        n_local += len(local)
        n_hdfs += len(set(got) - set(local))
    return n_local, n_hdfs


async def flush(srv):
    """Spill everything still in memory (as finishShuffle / a graceful stop do) and wait until it landed."""
    await srv.app_manager.ask(FlushAllApps())
    await poll_until(lambda: srv.budget.used == 0, 120, message="memory not empty after a flush")


def choices(srv, reason):
    text = srv.metrics.render().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("riffle_spill_tier_choices_total{") and f'reason="{reason}"' in line)


@pytest.mark.parametrize("node", ["datanode", "namenode"])
async def test_hdfs_node_stopped_mid_spill_falls_back_to_local_without_loss(tmp_path, hdfs, node):
    remote = f"{hdfs.url}/rss"
    srv = ShuffleServer(hdfs_config(tmp_path, remote, memory_spill_to_cold_threshold_size=0))
    await srv.start()
    written = []
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(APP, 0, PARTITIONS, remote_storage=remote)
            await send_rounds(client, 6, written)
            await poll_until(lambda: srv.budget.used == 0, 60, message="spills before the fault")
            before = await srv.hdfs.ask(GetHdfsStats())
            assert before.writes > 0 and before.write_failures == 0
            await asyncio.to_thread(hdfs.command, "stop-datanode 0" if node == "datanode" else "stop-namenode")
            await send_rounds(client, 6, written, start=6)
            await poll_until(lambda: srv.budget.used == 0, 120, message="spills during the fault")
            during = await srv.hdfs.ask(GetHdfsStats())
            assert during.write_failures > 0, "no HDFS write failed while the node was down"
            assert choices(srv, "hdfs_failed") > 0
            apps = await srv.admin.apps()
            assert apps[0]["hdfs_fallbacks"] > 0 and apps[0]["disk_bytes"] > 0
            await asyncio.to_thread(hdfs.command, "restart-datanode 0" if node == "datanode"
                                    else "restart-namenode")
            # HDFS comes back: after the retry interval, spills reach it again
            await send_rounds(client, 6, written, start=12)
            await poll_until(lambda: srv.budget.used == 0, 120, message="spills after the fault")

            async def writes_resumed():
                return (await srv.hdfs.ask(GetHdfsStats())).writes > during.writes
            if not await writes_resumed():
                await send_rounds(client, 2, written, start=18)
                await poll_until(writes_resumed, 60, message="HDFS writes did not resume after the restart")
            # the file pairs abandoned at the failure are closed by lease recovery once HDFS works again
            async def recovered():
                return (await srv.hdfs.ask(GetHdfsStats())).pending_recoveries == 0
            await poll_until(recovered, 90, message="abandoned HDFS files were not recovered")
            n_local, n_hdfs = await read_back(srv, client, remote, written)
            assert n_local > 0 and n_hdfs > 0
            assert n_local + n_hdfs == len(written), "0 acknowledged blocks lost"
    finally:
        await stop_server(srv)


async def test_every_local_disk_quarantined_spills_continue_to_hdfs(tmp_path, hdfs, fault_server):
    remote = f"{hdfs.url}/rss"
    srv = await fault_server(store_type="MEMORY_LOCALFILE_HDFS",
                             hdfs_store={"write_timeout_sec": 10, "unhealthy_retry_interval_sec": 0.5,
                                         "remote_storage": [{"path": remote}]})
    written = []
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await client.register_shuffle(APP, 0, PARTITIONS, remote_storage=remote)
        await send_rounds(client, 4, written)  # below the cold threshold (none): local disks
        await flush(srv)
        assert (await srv.hdfs.ask(GetHdfsStats())).writes == 0
        for io in srv.faulty.values():
            io.fail("append_batch", errno.EROFS)  # read-only file systems: quarantined at once
        await send_rounds(client, 8, written, start=4)
        await poll_until(lambda: not srv.disk_health.placeable_disks(), 60, message="disks not quarantined")
        await flush(srv)  # with no disk to take them, the spills continue to HDFS
        assert (await srv.hdfs.ask(GetHdfsStats())).writes > 0
        assert choices(srv, "no_healthy_disk") > 0
        n_local, n_hdfs = await read_back(srv, client, remote, written)
        assert n_local > 0 and n_hdfs > 0 and n_local + n_hdfs == len(written)


def seam_server(tmp_path, remote, io, write_timeout_s):
    """A server spilling everything to HDFS through the IO seam ``io``, one file pair per partition."""
    cfg = fault_config(tmp_path, store_type="MEMORY_LOCALFILE_HDFS",
                       hybrid_store={"memory_single_buffer_max_spill_size": "128K",
                                     "memory_spill_to_cold_threshold_size": 0},
                       hdfs_store={"write_timeout_sec": write_timeout_s, "unhealthy_retry_interval_sec": 0,
                                   "partition_write_max_concurrency": 1, "remote_storage": [{"path": remote}]})
    return ShuffleServer(cfg, hdfs_io=io)


class StuckOnceHdfsIO(HdfsIO):
    """The first append after ``arm()`` blocks until ``release()`` (a stuck HDFS call)."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.stuck = threading.Event()
        self.go = threading.Event()

    def arm(self):
        self.stuck, self.go = threading.Event(), threading.Event()
        self.armed = True

    def release(self):
        self.go.set()

    def append_pair(self, client, pair, data, index, create):
        if self.armed:
            self.armed = False
            self.stuck.set()
            self.go.wait(60)
        return super().append_pair(client, pair, data, index, create)


async def test_stuck_or_crashed_writer_loses_nothing_and_is_restarted(tmp_path, hdfs):
    remote = f"{hdfs.url}/rss"
    io = StuckOnceHdfsIO()
    srv = seam_server(tmp_path, remote, io, write_timeout_s=8)
    await srv.start()
    written = []
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(APP, 0, PARTITIONS, remote_storage=remote)
            await send_rounds(client, 2, written)
            await flush(srv)
            first = await srv.hdfs.ask(GetHdfsStats())
            assert first.writes == 2 and first.write_failures == 0, first  # one file pair per partition
            # a stuck HDFS call: the write times out, the batch goes local, its file pair is abandoned
            io.arm()
            await send_rounds(client, 2, written, start=2)
            await flush(srv)
            assert io.stuck.is_set()
            stats = await srv.hdfs.ask(GetHdfsStats())
            assert stats.write_failures >= 1 and stats.new_file_pairs >= 1
            io.release()
            # the writer actor crashes while it holds a batch: its supervisor restarts it, the batch
            # (still in memory) goes to local disk
            io.arm()
            await send_rounds(client, 2, written, start=4)
            flushing = asyncio.ensure_future(flush(srv))
            await poll_until(io.stuck.is_set, 30, message="no HDFS write in flight")
            await srv.hdfs.tell("not a message")  # TypeError in receive: the actor crashes
            await flushing
            io.release()
            assert srv.hdfs.is_alive, "the supervisor restarted the writer"
            # the restarted writer writes again
            await send_rounds(client, 2, written, start=6)
            await flush(srv)
            assert (await srv.hdfs.ask(GetHdfsStats())).writes > stats.writes, "restarted writer writes again"
            n_local, n_hdfs = await read_back(srv, client, remote, written)
            assert n_local + n_hdfs == len(written) and n_local > 0 and n_hdfs > 0
    finally:
        io.release()
        await stop_server(srv)


class LateReopenHdfsIO(HdfsIO):
    """The first append after ``arm()`` is a call that reaches the NameNode late: it waits until
    ``release()``, then reopens the data file for append, writes, and leaves it open (its close failed),
    so the file's last block stays under construction until its lease is recovered."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.stuck = threading.Event()
        self.go = threading.Event()
        self.left_open = threading.Event()

    def arm(self):
        self.armed = True

    def release(self):
        self.go.set()

    def append_pair(self, client, pair, data, index, create):
        if not self.armed:
            return super().append_pair(client, pair, data, index, create)
        self.armed = False
        self.stuck.set()
        self.go.wait(60)
        w = client.append(pair.data)
        for chunk in data:
            w.write(chunk)
        RawIOBase.close(w)  # abandoned without closing it on the NameNode
        self.left_open.set()
        raise OSError("the pipeline failed before the file was closed")


async def test_timed_out_write_that_reopens_its_file_later_is_recovered_after_it_ends(tmp_path, hdfs):
    """A write that times out may still reach the NameNode: its file is recovered only after that call ended,
    so no file is left open (hiding the bytes acknowledged in it) once recovery reports nothing pending."""
    remote = f"{hdfs.url}/rss"
    io = LateReopenHdfsIO()
    srv = seam_server(tmp_path, remote, io, write_timeout_s=3)
    await srv.start()
    written = []
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(APP, 0, PARTITIONS, remote_storage=remote)
            await send_rounds(client, 2, written)
            await flush(srv)
            assert (await srv.hdfs.ask(GetHdfsStats())).writes == 2  # a file pair per partition
            io.arm()
            await send_rounds(client, 2, written, start=2)
            await flush(srv)  # one write timed out: its batch went local, its pair is abandoned
            assert io.stuck.is_set()
            await send_rounds(client, 2, written, start=4)
            await flush(srv)  # HDFS works: a round of lease recovery runs
            stats = await srv.hdfs.ask(GetHdfsStats())
            assert stats.write_failures == 1 and stats.writes > 2, stats
            assert stats.pending_recoveries == 2, "the files of a call still running were recovered"
            io.release()
            await poll_until(io.left_open.is_set, 30, message="the late call did not run")
            async def recovered():
                return (await srv.hdfs.ask(GetHdfsStats())).pending_recoveries == 0
            await poll_until(recovered, 60, message="the file the late call left open was not recovered")
            n_local, n_hdfs = await read_back(srv, client, remote, written)
            assert n_local + n_hdfs == len(written) and n_local > 0 and n_hdfs > 0
            assert (await srv.hdfs.ask(GetHdfsStats())).lost_bytes == 0
    finally:
        io.release()
        await stop_server(srv)


class ShortAfterRecoveryHdfsIO(HdfsIO):
    """The first append after ``arm()`` fails; once recovered, its files are reported empty (as if lease
    recovery had kept none of the acknowledged bytes)."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.failed: set[str] = set()

    def append_pair(self, client, pair, data, index, create):
        if self.armed:
            self.armed = False
            self.failed.update(pair)
            raise OSError(errno.EIO, "injected append failure")
        return super().append_pair(client, pair, data, index, create)

    def file_length(self, client, path):
        return 0 if path in self.failed else super().file_length(client, path)


async def test_acknowledged_bytes_missing_after_lease_recovery_are_counted(tmp_path, hdfs):
    remote = f"{hdfs.url}/rss"
    io = ShortAfterRecoveryHdfsIO()
    srv = seam_server(tmp_path, remote, io, write_timeout_s=10)
    await srv.start()
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(APP, 0, PARTITIONS, remote_storage=remote)
            await send_rounds(client, 2, [])
            await flush(srv)
            first = await srv.hdfs.ask(GetHdfsStats())
            io.armed = True
            await send_rounds(client, 2, [], start=2)
            await flush(srv)
            await send_rounds(client, 2, [], start=4)
            await flush(srv)

            async def recovered():
                return (await srv.hdfs.ask(GetHdfsStats())).pending_recoveries == 0
            await poll_until(recovered, 60, message="the abandoned files were not recovered")
            stats = await srv.hdfs.ask(GetHdfsStats())
            # the failed pair held one partition's first write: 2 rounds of 2 blocks of 48 KiB, 4 index records
            assert stats.write_failures == 1 and first.written_bytes == 8 * (48 << 10)
            assert stats.lost_bytes == 4 * (48 << 10) + 4 * 40, stats
            text = srv.metrics.render().decode()
            assert f"riffle_hdfs_lost_bytes_total {float(stats.lost_bytes)}" in text
    finally:
        await stop_server(srv)
