"""The HDFS tier against a real HDFS (MiniDFSCluster): layout, read-back as the client does, retry suffix,
fallbacks and purge.

Each test starts a riffle server with ``store_type = MEMORY_LOCALFILE_HDFS``, registers a shuffle with
a ``remoteStorage`` path on the MiniDFSCluster, sends blocks and forces spills. The blocks routed to
HDFS are read back from the HDFS files exactly as the Uniffle client's HadoopClientReadHandler does
(``tests.helpers.hdfs_read``); the others through the server's memory and local files. Every block
acknowledged must be read back byte-exact from one of them.
"""

from __future__ import annotations

import itertools

import pytest

from riffle_actors.actors.hdfs_writer import GetHdfsStats
from riffle_actors.io.hdfs import HdfsIO
from riffle_actors.server import ShuffleServer
from tests.conftest import server_config, stop_server
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.hdfs_read import hdfs_client, list_partition_files, read_hdfs_partition

pytestmark = pytest.mark.integration

_ids = itertools.count()


def hdfs_cfg(tmp_path, remote, writers=20, **hybrid):
    """``remote``: the one remote storage base the server allows (``hdfs_store.remote_storage``)."""
    return server_config(tmp_path, store_type="MEMORY_LOCALFILE_HDFS", capacity="64M",
                         hybrid_store={"memory_single_buffer_max_spill_size": "64K", **hybrid},
                         hdfs_store={"write_timeout_sec": 30, "unhealthy_retry_interval_sec": 0,
                                     "partition_write_max_concurrency": writers,
                                     "remote_storage": [{"path": remote}]})


async def write_and_spill(srv, client, app, remote, partitions=(0, 1), batches=3, size=40 << 10):
    await client.register_shuffle(app, 0, range(4), remote_storage=remote)
    written = []
    for b in range(batches):
        for p in partitions:
            blocks = make_blocks(p, b + 1, 2, size, seq_start=b * 10)
            await client.send_blocks(app, 0, blocks)
            written += blocks
        for p in partitions:
            await client.report(app, 0, b + 1, [x for x in written if x.partition_id == p and x.task_attempt_id == b + 1])
    await poll_until(lambda: srv.budget.used == 0, 30, message="spills did not finish")
    return written


async def read_all(srv, client, app, remote, written, partitions=(0, 1)):
    for p in partitions:
        want = [b for b in written if b.partition_id == p]
        ids = {b.block_id for b in want}
        local = await client.read_partition(app, 0, p, ids, partition_num=4, check_complete=False)
        remote_got = read_hdfs_partition(remote, app, 0, p, srv.server_id, ids)
        assert_read_matches({**local, **remote_got}, want)
        yield p, local, remote_got


async def test_cold_threshold_spills_land_in_hdfs_in_the_uniffle_layout(tmp_path, minihdfs):
    remote = f"{minihdfs.url}/rss-it{next(_ids)}"
    srv = ShuffleServer(hdfs_cfg(tmp_path, remote, memory_spill_to_cold_threshold_size=0))
    await srv.start()
    app = "application_hdfs_1"
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            written = await write_and_spill(srv, client, app, remote)
            async for p, local, got in read_all(srv, client, app, remote, written):
                assert not local and len(got) == 6, "every batch is above the cold threshold: all in HDFS"
                files = list_partition_files(remote, app, 0, p)
                # <serverId>_<writer index>_<retry>: concurrent batches of a partition use their own pairs
                stems = {n.rsplit(".", 1)[0] for n in files}
                assert all(f"{s}.data" in files and f"{s}.index" in files for s in stems)
                assert all(s.startswith(f"{srv.server_id}_") and s.endswith("_0") for s in stems)
                assert sum(n for name, n in files.items() if name.endswith(".index")) == 6 * 40
            stats = await srv.hdfs.ask(GetHdfsStats())
            assert stats.writes == 6 and stats.write_failures == 0
            apps = await srv.admin.apps()
            assert apps[0]["hdfs_bytes"] == sum(len(b.data) for b in written) and apps[0]["disk_bytes"] == 0
            metrics = srv.metrics.render().decode()
            assert 'riffle_spill_tier_choices_total{reason="cold_threshold",tier="hdfs"} 6.0' in metrics
            # purge: the app's HDFS directory goes with it
            await client.unregister_app(app)
            c = hdfs_client(remote)
            base = "/" + remote.rsplit("/", 1)[1]

            def app_dir_gone() -> bool:
                return all(not st.path.endswith(app) for st in c.list_status(base))
            await poll_until(app_dir_gone, 30, message="the app's HDFS directory was not deleted")
    finally:
        await stop_server(srv)


async def test_without_remote_storage_or_below_thresholds_spills_stay_local(tmp_path, minihdfs):
    remote = f"{minihdfs.url}/rss-it{next(_ids)}"
    srv = ShuffleServer(hdfs_cfg(tmp_path, remote, memory_spill_to_cold_threshold_size="1M"))
    await srv.start()
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            written = await write_and_spill(srv, client, "application_hdfs_2", remote)
            async for _p, local, got in read_all(srv, client, "application_hdfs_2", remote, written):
                assert len(local) == 6 and not got
            written = await write_and_spill(srv, client, "application_hdfs_3", "")  # no remote storage
            async for _p, local, got in read_all(srv, client, "application_hdfs_3", remote, written):
                assert len(local) == 6 and not got
    finally:
        await stop_server(srv)


class FailingHdfsIO(HdfsIO):
    """Fails the ``fail_on``-th append (1-based) after writing part of its data: a torn HDFS write."""

    def __init__(self, fail_on: set[int]):
        super().__init__()
        self.fail_on = fail_on
        self.calls = 0

    def append_pair(self, client, pair, data, index, create):
        self.calls += 1
        if self.calls in self.fail_on:
            w = client.append(pair.data) if not create else None
            if w is not None:
                w.write(b"torn")
                w.close()
            raise OSError(f"injected HDFS failure on append {self.calls}")
        return super().append_pair(client, pair, data, index, create)


async def test_failed_write_starts_a_new_file_pair_and_the_batch_falls_back_to_local(tmp_path, minihdfs):
    remote = f"{minihdfs.url}/rss-it{next(_ids)}"
    io = FailingHdfsIO({2})
    srv = ShuffleServer(hdfs_cfg(tmp_path, remote, writers=1, memory_spill_to_cold_threshold_size=0), hdfs_io=io)
    await srv.start()
    app = "application_hdfs_4"
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            written = await write_and_spill(srv, client, app, remote, partitions=(0,))
            async for _p, local, got in read_all(srv, client, app, remote, written, partitions=(0,)):
                assert len(local) == 2 and len(got) == 4, "the failed batch went to local disk"
            files = list_partition_files(remote, app, 0, 0)
            sid = srv.server_id
            assert {f"{sid}_0_0.data", f"{sid}_0_0.index", f"{sid}_0_1.data", f"{sid}_0_1.index"} == set(files)
            assert files[f"{sid}_0_0.index"] == 2 * 40 and files[f"{sid}_0_1.index"] == 2 * 40
            stats = await srv.hdfs.ask(GetHdfsStats())
            assert stats.write_failures == 1 and stats.new_file_pairs == 1
            apps = await srv.admin.apps()
            assert apps[0]["hdfs_fallbacks"] == 1
            assert 'reason="hdfs_failed",tier="localfile"} 1.0' in srv.metrics.render().decode()
    finally:
        await stop_server(srv)
