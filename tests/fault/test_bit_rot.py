"""Bit rot at rest: a byte flipped in a spilled data file is found by the disk's scrubber and never served.

Real server, real files: blocks are written until a partition is spilled, one byte of its data file is
flipped on disk behind the server's back, and then (waiting on the scrubber's metric, never a sleep)
every read of a range holding that block is refused over gRPC and urpc (INTERNAL_ERROR naming the
block), reads of the other blocks and partitions still work, and ``/apps`` and the metrics count it.
A purge forgets the findings with the files; the scrubber's reads are charged to ``io_limiter``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from riffle_actors.errors import StatusCode
from riffle_actors.protocol.index import INDEX_RECORD, decode_index
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.server import ShuffleServer
from tests.helpers import flip_byte, metric_total, parse_metrics, poll_until
from tests.helpers.client import UniffleClient, UniffleError, assert_read_matches, write_block_by_block
from tests.helpers.urpc_client import UrpcClient

APP = "application_1700000000000_0021_1700000000002"
SCRUB = {"scrub_rate": "1G", "scrub_interval_sec": 0.05}
SPILL_EACH = {"memory_single_buffer_max_spill_size": "256K"}  # every 300 kB block is spilled


async def spilled(server: ShuffleServer, client: UniffleClient, pid: int, nblocks: int):
    """Wait until all ``nblocks`` of partition ``pid`` are in its index; (entries, data file path)."""
    async def index():
        ix = await client.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
            appId=APP, shuffleId=0, partitionId=pid, partitionNumPerRange=1, partitionNum=1))
        return ix if len(ix.indexData) // 40 == nblocks else None
    ix = await poll_until(index, timeout=30, message=f"partition {pid} spilled")
    path = Path(server.disk_names[0]) / APP / "0" / f"partition-{pid}.data"  # one disk
    return decode_index(ix.indexData), path


@pytest.mark.parametrize("transport", ["grpc", "urpc"])
async def test_the_scrubber_finds_a_flipped_byte_and_reads_of_that_block_are_refused(
        server_factory, transport: str) -> None:
    server = await server_factory(disks=1, urpc_port=0, urpc_bind_address="127.0.0.1", localfile_store=SCRUB,
                                  hybrid_store=SPILL_EACH)
    target = f"127.0.0.1:{server.grpc_port}"
    client = UniffleClient(target) if transport == "grpc" else await UrpcClient(target, server.urpc_port).connect()
    try:
        blocks = await write_block_by_block(client, APP, [0, 1])
        entries, path = await spilled(server, client, 0, 6)
        await spilled(server, client, 1, 6)
        victim = entries[3]
        flip_byte(path, victim.offset + 1234)
        await poll_until(lambda: metric_total(server, "riffle_scrub_corrupt_blocks_total") >= 1, timeout=30,
                         message="the scrubber finds the flipped byte")
        assert metric_total(server, "riffle_scrub_corrupt_blocks_total") == 1  # later passes do not count it again

        ids = await client.get_shuffle_result(APP, 0, [0, 1])
        # one read of the whole partition holds the corrupt block: refused, its bytes never leave the server
        with pytest.raises(UniffleError) as err:
            await client.read_partition(APP, 0, 0, ids)
        assert err.value.status == StatusCode.INTERNAL_ERROR and err.value.rpc == "getLocalShuffleData"
        assert str(victim.block_id) in str(err.value) and "corrupt" in str(err.value)
        # reads of ranges without it are served (each block alone), and so is the other partition
        for e in entries:
            resp = await client.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
                appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1,
                offset=e.offset, length=e.length, storageId=-1))
            if e.block_id == victim.block_id:
                assert resp.status == StatusCode.INTERNAL_ERROR and resp.data == b""
            else:
                assert resp.status == StatusCode.SUCCESS and len(resp.data) == e.length
        assert_read_matches(await client.read_partition(APP, 0, 1, ids), [b for b in blocks if b.partition_id == 1])

        assert metric_total(server, "riffle_server_corrupt_reads_refused_total") == 2
        (app,) = [a for a in await server.admin.apps() if a["app_id"] == APP]
        assert (app["corrupt_blocks"], app["corrupt_reads_refused"]) == (1, 2)

        # the purge deletes the files and the findings: the app id registered again is read normally
        await client.unregister_app(APP)
        await poll_until(lambda: not server.integrity.corrupt_partitions(), timeout=60, message="findings forgotten")
    finally:
        await client.close()


async def test_the_scrubber_reads_through_the_disk_throttle(server_factory) -> None:
    server = await server_factory(disks=1, localfile_store={**SCRUB, "io_limiter": {"capacity": "256M"}},
                                  hybrid_store=SPILL_EACH)
    async with UniffleClient(f"127.0.0.1:{server.grpc_port}") as client:
        await write_block_by_block(client, APP, [0])
        _entries, path = await spilled(server, client, 0, 6)
        size = path.stat().st_size
        # no client read of the data file: every data byte charged for reads is the scrubber's
        await poll_until(lambda: metric_total(server, "riffle_scrub_bytes_total") >= size, timeout=30)
        disk = server.disk_names[0]
        samples = parse_metrics(server.metrics.render().decode())["riffle_disk_throttle_bytes_total"]
        read = sum(v for labels, v in samples if labels == {"disk": disk, "op": "read"})
        index_reads = 40 * 6 * 2  # the test's own index reads, at most this much
        assert read >= size - index_reads and metric_total(server, "riffle_scrub_passes_total") >= 1


async def test_a_symlinked_partition_file_is_never_scrubbed(server_factory, tmp_path: Path) -> None:
    server = await server_factory(disks=1, localfile_store=SCRUB,
                                  hybrid_store=SPILL_EACH)
    async with UniffleClient(f"127.0.0.1:{server.grpc_port}") as client:
        await write_block_by_block(client, APP, [0])
        _entries, path = await spilled(server, client, 0, 6)
        # a partition whose index and data are symlinks to files outside the data path
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "x.data").write_bytes(b"\0" * 1000)
        # one record whose crc does not match: scrubbed through the symlink, it would be found corrupt
        (outside / "x.index").write_bytes(INDEX_RECORD.pack(0, 1000, 1000, 12345, 99, 1))
        os.symlink(outside / "x.index", path.parent / "partition-7.index")
        os.symlink(outside / "x.data", path.parent / "partition-7.data")
        passes = metric_total(server, "riffle_scrub_passes_total")
        await poll_until(lambda: metric_total(server, "riffle_scrub_passes_total") >= passes + 2, timeout=30)
        assert not server.integrity.corrupt_partitions()
