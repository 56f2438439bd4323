"""Riffle's local-read keys on a real server, seen over gRPC and urpc and in the data files' page cache.

- ``direct_io_read_enable``: reads over both transports are byte-exact at any alignment and leave the
  data file out of the page cache (``fincore``); urpc replies are no longer ``sendfile``d. Without the
  key the same reads fill the cache and go by ``sendfile``.
- ``index_consistency_detection_enable``: an index whose last record does not end where its data file
  ends (the data file cut short or grown behind the server's back) is logged as an ERROR and counted
  (``riffle_localfile_index_inconsistencies_total``) and still served; spills running while indexes
  are read never count as inconsistent.
- ``read_ahead_options``: for an app that asks (``spark.rss.riffle.readAheadEnabled``), the first local
  read of a partition read whole loads ``batch_number x batch_size`` bytes into the page cache, and a
  read near the loaded end loads two more batches (metrics and ``fincore``); no load for an app that
  did not ask, nor for a filtered (AQE) read; urpc V3 read plans load the announced segments.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from loguru import logger

from riffle_actors.protocol import urpc
from riffle_actors.protocol.index import decode_index
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from tests.helpers import parse_metrics, poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.urpc_client import UrpcClient

pytestmark = pytest.mark.integration

APP = "application_1764547200000_0031_1764547200001"
URPC = {"urpc_port": 0, "urpc_bind_address": "127.0.0.1"}
READ_AHEAD = {"spark.rss.riffle.readAheadEnabled": "true"}


def _needs_fincore() -> None:
    if shutil.which("fincore") is None:
        pytest.skip("fincore (util-linux) is needed to see the page cache")


def _resident(path: Path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _data_file(srv, partition: int = 0) -> Path:
    [root] = srv.disk_names
    return Path(root) / APP / "0" / f"partition-{partition}.data"


async def _metrics(srv) -> dict:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{srv.http_port}/metrics") as r:
        return parse_metrics(await r.text())


def _sum(m: dict, name: str, **labels: str) -> float:
    return sum(v for lab, v in m.get(name, []) if all(lab.get(k) == w for k, w in labels.items()))


async def _spill(srv, c: UniffleClient, count: int, size: int, *, properties=None, partition: int = 0):
    """Write one partition that ends up wholly on disk; its blocks."""
    await c.register_shuffle(APP, 0, [partition], properties=properties)
    blocks = make_blocks(partition, 1, count, size)
    for i in range(0, len(blocks), 8):
        await c.send_blocks(APP, 0, blocks[i:i + 8])
    await c.report(APP, 0, 1, blocks)
    await poll_until(lambda: srv.budget.in_flight == 0 and srv.budget.used == 0, message="spills did not finish")
    return blocks


# ------------------------------------------------------------------------------------- direct reads
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
async def test_direct_reads_over_grpc_and_urpc_bypass_the_page_cache(server_factory, direct: bool) -> None:
    _needs_fincore()
    srv = await server_factory(**URPC, disks=1, memory_store={"capacity": "32M"},
                               # direct: with the read CRC check (its index lookup leaves the data file's
                               # pages alone); buffered: without it, so urpc goes by sendfile
                               localfile_store={"direct_io_read_enable": direct, "read_crc_check_enable": direct},
                               hybrid_store={"memory_single_buffer_max_spill_size": "64K"})
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    g = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        blocks = await _spill(srv, c, count=200, size=50_000)  # 10 MB: above a reader's 8 MiB buffer
        path = _data_file(srv)
        _evict(path)
        assert _resident(path) == 0
        # gRPC: the Java client's read (memory, index, one data read per segment)
        assert_read_matches(await g.read_partition(APP, 0, 0, await g.get_shuffle_result(APP, 0, [0])), blocks)
        # urpc: ranges at every alignment, the file's unaligned tail, the whole file
        data = path.read_bytes() if not direct else None
        rid = c.conn.next_id()
        index = await c.conn.request(urpc.encode_get_local_index(rid, APP, 0, 0), rid)
        size = index.data_file_len
        by_id = {b.block_id: b.data for b in blocks}
        expected = b"".join(by_id[e.block_id] for e in decode_index(bytes(index.body)))
        if data is not None:
            assert data == expected
        for offset, length in [(0, size), (1, 4095), (4097, 3 << 20), (size - 7, 7), (12345, 1 << 20)]:
            rid = c.conn.next_id()
            r = await c.conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, offset, length), rid)
            assert r.status == 0, r.ret_msg
            assert bytes(r.body) == expected[offset:offset + length], (offset, length)
        if direct:
            assert _resident(path) == 0  # nothing read through the page cache
            assert srv._urpc.sendfile_replies == 0  # sendfile cannot bypass it
        else:
            assert _resident(path) >= size // 2
            assert srv._urpc.sendfile_replies > 0
    finally:
        await g.close()
        await c.close()


# -------------------------------------------------------------------------------- index consistency
async def test_an_index_inconsistent_with_its_data_file_is_logged_counted_and_served(server_factory) -> None:
    srv = await server_factory(disks=1, localfile_store={"index_consistency_detection_enable": True},
                               hybrid_store={"memory_single_buffer_max_spill_size": "8K"})
    [disk] = srv.disk_names
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(m.record["message"]), level="ERROR", format="{message}")
    c = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        blocks = await _spill(srv, c, count=20, size=10_000)

        async def index() -> pb.GetLocalShuffleIndexResponse:
            r = await c.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
                appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1))
            assert r.status == 0, r.retMsg
            return r

        r = await index()
        assert r.dataFileLen == 200_000 and len(r.indexData) == 20 * 40
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_index_inconsistencies_total", disk=disk) == 0 and not errors
        # the data file grown behind the server's back: the last record no longer ends at its end
        with open(_data_file(srv), "ab") as f:  # noqa: ASYNC230 - 100 bytes, a test's own file
            f.write(b"x" * 100)
        r = await index()
        assert r.dataFileLen == 200_100 and len(r.indexData) == 20 * 40  # served as read
        [line] = [e for e in errors if "index inconsistency" in e]
        assert f"app {APP} shuffle 0 partition 0 on disk {disk}" in line
        assert "ends at 200000, the data file holds 200100 bytes" in line
        # cut short: the same
        os.truncate(_data_file(srv), 150_000)
        await index()
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_index_inconsistencies_total", disk=disk) == 2
        assert _sum(m, "total_localfile_detected_in_consistency") == 2  # Riffle's name of it
        assert sum("index inconsistency" in e for e in errors) == 2
        assert blocks
    finally:
        logger.remove(sink)
        await c.close()


async def test_index_reads_during_spills_are_never_counted_inconsistent(server_factory) -> None:
    """Appends write the data, then the index records (and with O_DIRECT pad and cut the tail): an index
    read between the two sees a longer data file. That is looked at again with appends held off."""
    srv = await server_factory(disks=1, localfile_store={"index_consistency_detection_enable": True},
                               memory_store={"capacity": "64M"},
                               hybrid_store={"memory_single_buffer_max_spill_size": "1K"})
    [disk] = srv.disk_names
    c = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await c.register_shuffle(APP, 0, [0])
        blocks = make_blocks(0, 1, 300, 6_000)
        stop = asyncio.Event()
        reads = 0

        async def reader() -> None:
            nonlocal reads
            while not stop.is_set():
                r = await c.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
                    appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1))
                assert r.status == 0, r.retMsg
                reads += 1

        task = asyncio.create_task(reader())
        try:
            for i in range(0, len(blocks), 2):  # every send is a spill of its own (above 1K)
                await c.send_blocks(APP, 0, blocks[i:i + 2])
            await poll_until(lambda: srv.budget.used == 0 and srv.budget.in_flight == 0, message="spills")
        finally:
            stop.set()
            await task
        assert reads > 20
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_index_inconsistencies_total", disk=disk) == 0
    finally:
        await c.close()


# --------------------------------------------------------------------------------------- read-ahead
async def _first_local_read(srv, c: UniffleClient, *, task_filter: bool = False, length: int = 65536) -> bytes:
    """The Java reader's start: a memory read (with the AQE task filter or not), then the data file's first
    ``length`` bytes."""
    from riffle_actors.protocol.bitmap import serialize_block_ids

    r = await c.stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
        appId=APP, shuffleId=0, partitionId=0, lastBlockId=-1, readBufferSize=1 << 20,
        serializedExpectedTaskIdsBitmap=serialize_block_ids({1}) if task_filter else b""))
    assert r.status == 0 and not r.shuffleDataBlockSegments, r.retMsg
    r = await c.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
        appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1, offset=0, length=length))
    assert r.status == 0, r.retMsg
    return r.data


RA_CFG = {"read_ahead_options": {"batch_size": "1M", "batch_number": 4}}


async def test_sequential_read_ahead_loads_batches_ahead_of_the_reader(server_factory) -> None:
    _needs_fincore()
    srv = await server_factory(disks=1, memory_store={"capacity": "32M"}, localfile_store=RA_CFG,
                               hybrid_store={"memory_single_buffer_max_spill_size": "64K"})
    [disk] = srv.disk_names
    c = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await _spill(srv, c, count=120, size=100_000, properties=READ_AHEAD)  # 12 MB
        path = _data_file(srv)
        _evict(path)
        assert _resident(path) == 0
        await _first_local_read(srv, c)

        async def loaded(n: int) -> bool:
            m = await _metrics(srv)
            return _sum(m, "riffle_localfile_read_ahead_total", disk=disk, kind="sequential", outcome="loaded") == n

        await poll_until(lambda: loaded(1), message="no read-ahead")
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_read_ahead_bytes_total", disk=disk, kind="sequential") == 4 << 20
        # the kernel queued the 4 MiB; they arrive in the page cache on their own
        await poll_until(lambda: _resident(path) >= 4 << 20, timeout=30, interval=0.05, message="pages not loaded")
        # a read within two batches of the loaded end (4 MiB) loads two more batches after it
        r = await c.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
            appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1, offset=3 << 20,
            length=65536))
        assert r.status == 0
        await poll_until(lambda: loaded(2), message="no second read-ahead")
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_read_ahead_bytes_total", disk=disk, kind="sequential") == 6 << 20
        assert _sum(m, "read_ahead_bytes") == 6 << 20 and _sum(m, "read_ahead_operations") == 2  # Riffle's names
        await poll_until(lambda: _resident(path) >= 6 << 20, timeout=30, interval=0.05, message="pages not loaded")
    finally:
        await c.close()


@pytest.mark.parametrize("case", ["app_did_not_ask", "filtered_read", "option_unset"])
async def test_no_read_ahead_unless_asked_for_a_whole_partition(server_factory, case: str) -> None:
    _needs_fincore()
    srv = await server_factory(disks=1, memory_store={"capacity": "32M"},
                               localfile_store={} if case == "option_unset" else RA_CFG,
                               hybrid_store={"memory_single_buffer_max_spill_size": "64K"})
    c = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await _spill(srv, c, count=120, size=100_000, properties=None if case == "app_did_not_ask" else READ_AHEAD)
        path = _data_file(srv)
        _evict(path)
        await _first_local_read(srv, c, task_filter=case == "filtered_read")
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_read_ahead_total") == 0
        assert _resident(path) < 2 << 20  # the read and the kernel's own small read-ahead only
    finally:
        await c.close()


async def test_read_plans_load_the_segments_a_urpc_client_announces(server_factory) -> None:
    _needs_fincore()
    srv = await server_factory(**URPC, disks=1, memory_store={"capacity": "32M"},
                               localfile_store={"read_ahead_options": {"read_plan_enable": True}},
                               hybrid_store={"memory_single_buffer_max_spill_size": "64K"})
    [disk] = srv.disk_names
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        await _spill(srv, c, count=120, size=100_000, properties=READ_AHEAD)
        path = _data_file(srv)
        _evict(path)
        plan = [(4 << 20, 1 << 20), (8 << 20, 1 << 20), (10 << 20, 1 << 20)]
        rid = c.conn.next_id()
        r = await c.conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, 0, 65536, storage_id=0,
                                                            next_segments=plan, task_attempt_id=7), rid)
        assert r.status == 0, r.ret_msg

        async def loaded() -> float:
            m = await _metrics(srv)
            return _sum(m, "riffle_localfile_read_ahead_total", disk=disk, kind="read_plan", outcome="loaded")

        await poll_until(lambda: _loaded_n(srv, disk, 3), message="read plan not loaded")
        await poll_until(lambda: _resident(path) >= 3 << 20, timeout=30, interval=0.05, message="pages not loaded")
        # the same plan announced again loads nothing more; a segment the reader passed is a miss
        rid = c.conn.next_id()
        r = await c.conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, 65536, 65536, storage_id=0,
                                                            next_segments=plan, task_attempt_id=7), rid)
        assert r.status == 0
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_read_ahead_total", disk=disk, kind="read_plan") == 3
        assert await loaded() == 3
    finally:
        await c.close()


async def _loaded_n(srv, disk: str, n: int) -> bool:
    m = await _metrics(srv)
    return _sum(m, "riffle_localfile_read_ahead_total", disk=disk, kind="read_plan", outcome="loaded") == n


async def test_a_read_plan_is_looked_at_only_as_far_as_read_plan_concurrency(server_factory) -> None:
    srv = await server_factory(**URPC, disks=1, memory_store={"capacity": "32M"},
                               localfile_store={"read_ahead_options": {"read_plan_enable": True,
                                                                       "read_plan_concurrency": 2}},
                               hybrid_store={"memory_single_buffer_max_spill_size": "64K"})
    [disk] = srv.disk_names
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        await _spill(srv, c, count=40, size=100_000, properties=READ_AHEAD)
        plan = [(i << 20, 65536) for i in range(1, 4000)]  # thousands announced in one frame
        rid = c.conn.next_id()
        r = await c.conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, 0, 65536, storage_id=0,
                                                            next_segments=plan, task_attempt_id=3), rid)
        assert r.status == 0, r.ret_msg

        async def settled() -> bool:
            m = await _metrics(srv)
            return _sum(m, "riffle_localfile_read_ahead_total", disk=disk, kind="read_plan") == 2

        await poll_until(settled, message="read plan loads")
        m = await _metrics(srv)
        assert _sum(m, "riffle_localfile_read_ahead_total", disk=disk, kind="read_plan", outcome="loaded") == 2
    finally:
        await c.close()
