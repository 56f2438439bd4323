"""A partition whose later spills moved to a second disk (issue 21) is read by every client generation.

A disk fault re-routes a partition's next spill to another disk: the partition then has a data and an
index file on each. The server presents them as ONE virtual data file (``ShuffleService.get_local_index``):
the second file's index records shifted by the first file's length, no storage ids, the total length;
a data read maps the virtual range onto the files. The 0.9.2 client (no ``storageId`` at all, the upstream
``Rss.proto``), a 0.10-style client (``storageId`` -1 with no storage ids) and urpc V1 (none on the wire)
all read every block byte-exact, also across a restart (the recovered segments keep the disk order).
"""

from __future__ import annotations

import errno
import os
from itertools import pairwise
from pathlib import Path

import pytest

from riffle_actors.io import localfile
from riffle_actors.protocol.index import decode_index
from riffle_actors.protocol.urpc import MessageType
from tests.fault.scenario import APP, Workload, partition_disks
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, blocks_by_id
from tests.helpers.upstream_proto import load_upstream_proto
from tests.helpers.urpc_client import UrpcClient

pytestmark = pytest.mark.fault

URPC = {"urpc_port": 0, "urpc_bind_address": "127.0.0.1"}


async def spread_over_two_disks(srv, client: UniffleClient) -> tuple[Workload, str, str]:
    """Partition 0 spilled on its disk A, then A fails its writes: the next spill lands on disk B."""
    w = Workload(client, partitions=range(1))
    await w.register()
    await w.write(per_partition=20)  # 320 KiB: spills (256 KiB spill size) ...
    await w.finish()  # ... and the rest: all on one disk
    (first,) = await partition_disks(srv, APP, 0, 0)
    srv.faulty[first].fail("append_batch", errno.EIO)
    await w.write(per_partition=20)
    await w.finish()
    disks = await partition_disks(srv, APP, 0, 0)
    assert disks[0] == first and len(disks) == 2, disks
    srv.faulty[first].heal()
    return w, first, disks[1]


async def read_all(client: UniffleClient, w: Workload, **kw) -> None:
    ids = await client.get_shuffle_result(APP, 0, [0])
    got = await client.read_partition(APP, 0, 0, ids, **kw)
    assert_read_matches(got, w.acked)


async def test_a_09_client_reads_a_partition_spread_over_two_disks_whole(fault_server, client_factory,
                                                                          tmp_path: Path) -> None:
    srv = await fault_server(**URPC)
    w, _, _ = await spread_over_two_disks(srv, client_factory(srv))
    pb, pb_grpc = load_upstream_proto()  # 0.9.2: no storageIds, no storageId
    old = client_factory(srv, pb=pb, pb_grpc=pb_grpc)
    await read_all(old, w)
    await read_all(old, w, read_buffer_size=100_000)  # segments of several blocks, one across the files

    # the index is one virtual file: offsets never go down, the lengths add up, no storage ids
    ix = await w.client.stub.getLocalShuffleIndex(w.client.pb.GetLocalShuffleIndexRequest(
        appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1))
    entries = decode_index(ix.indexData)
    assert list(ix.storageIds) == []
    assert all(b.offset == a.offset + a.length for a, b in pairwise(entries))
    assert ix.dataFileLen == entries[-1].offset + entries[-1].length == sum(e.length for e in entries)

    # one range across both files: the last block of disk A's file and the first of disk B's
    first_len = sum(len(b.data) for b in w.acked[:20])
    at = next(i for i, e in enumerate(entries) if e.offset == first_len)
    a, b = entries[at - 1], entries[at]
    resp = await old.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
        appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1,
        offset=a.offset, length=a.length + b.length))
    assert resp.status == 0, resp.retMsg
    by_id = blocks_by_id(w.acked)
    assert resp.data == by_id[a.block_id].data + by_id[b.block_id].data

    # a 0.10-style client (storageId -1, none handed out) and urpc V1 (no storageId on the wire)
    await read_all(w.client, w, read_buffer_size=100_000)
    urpc = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        await read_all(urpc, w, read_buffer_size=100_000)
        assert set(urpc.stub.index_types) == {MessageType.GET_LOCAL_SHUFFLE_INDEX_RESPONSE}  # V1
    finally:
        await urpc.close()


async def test_the_partition_stays_readable_after_a_restart(fault_server, client_factory, tmp_path: Path) -> None:
    paths = [str(tmp_path / "d0"), str(tmp_path / "d1")]
    srv = await fault_server(data_paths=paths)
    w, first, second = await spread_over_two_disks(srv, client_factory(srv))
    await srv.stop(0)
    srv._test_stopped = True  # type: ignore[attr-defined]
    again = await fault_server(data_paths=paths)
    await poll_until(lambda: APP in again.directory)
    assert await partition_disks(again, APP, 0, 0) == (first, second)
    pb, pb_grpc = load_upstream_proto()
    await read_all(client_factory(again, pb=pb, pb_grpc=pb_grpc), w, read_buffer_size=100_000)
    await read_all(client_factory(again), w, read_buffer_size=100_000)


async def test_urpc_v2_index_carries_no_storage_ids_for_the_virtual_file(fault_server, client_factory) -> None:
    srv = await fault_server(**URPC, urpc_config={"get_index_rpc_version": "V2"})
    w, _, _ = await spread_over_two_disks(srv, client_factory(srv))
    urpc = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        ix = await urpc.stub.getLocalShuffleIndex(urpc.pb.GetLocalShuffleIndexRequest(
            appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1))
        assert ix.status == 0 and list(ix.storageIds) == []
        assert urpc.stub.index_types == [MessageType.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE]
        await read_all(urpc, w, read_buffer_size=100_000)
    finally:
        await urpc.close()


async def test_a_spill_never_goes_back_to_the_earlier_disk_while_the_later_one_may_return(
        fault_server, client_factory) -> None:
    """The bases of the virtual file stay put: with disk B failing, the batch waits for B (not A)."""
    srv = await fault_server()
    w, first, second = await spread_over_two_disks(srv, client_factory(srv))
    data_a = localfile.partition_paths(first, APP, 0, 0)[0]
    size_a = os.path.getsize(data_a)
    srv.faulty[second].fail("append_batch", errno.EIO)
    await w.write(per_partition=20)  # spills: B fails, A is left out, the batch waits and tries B again
    await poll_until(lambda: srv.faulty[second].rules[0].hits >= 2)
    assert os.path.getsize(data_a) == size_a
    srv.faulty[second].heal()
    await w.finish()
    assert await partition_disks(srv, APP, 0, 0) == (first, second)
    assert os.path.getsize(data_a) == size_a
    pb, pb_grpc = load_upstream_proto()
    await read_all(client_factory(srv, pb=pb, pb_grpc=pb_grpc), w, read_buffer_size=100_000)
