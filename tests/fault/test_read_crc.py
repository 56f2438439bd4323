"""Bit rot after the scrubber's last pass: the read CRC check refuses the range instead of serving it.

Real server, real files, real sockets. The scrubber is effectively off (its one pass, over an empty
data path, ends before anything is written; the next is an hour away). Blocks are written until two
partitions of one app and one of another app are spilled, then one byte of a spilled data file is
flipped behind the server's back, and the partition is read as the Uniffle client reads it: one
range of whole blocks, over gRPC and over urpc V1 (type 5, no storageId), V2 (type 24, storageId) and
V3 (type 25, the read plan), with urpc's sendfile on. Each read holding the rotten block is refused
(INTERNAL_ERROR naming the block, "found by the read check"), its block recorded in the
IntegrityLedger (``/apps`` ``corrupt_blocks``, the heartbeat totals) and counted in
``riffle_read_crc_corrupt_blocks``; later reads of it are refused by the ledger; the other blocks,
the other partition and the other app are served intact. With ``read_crc_check_enable = false`` the
same read is served, flipped byte included (over urpc by sendfile): the key is what refuses it.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from riffle_actors.errors import StatusCode
from riffle_actors.protocol import urpc
from riffle_actors.protocol.index import IndexEntry, decode_index
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.server import ShuffleServer
from tests.helpers import flip_byte, metric_total, poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, write_block_by_block
from tests.helpers.urpc_client import UrpcClient

APP = "application_1700000000000_0021_1700000000003"
OTHER = "application_1700000000000_0021_1700000000004"
SCRUB_IDLE = {"scrub_rate": "1G", "scrub_interval_sec": 3600}  # one pass at start (nothing there yet), then none
SPILL_EACH = {"memory_single_buffer_max_spill_size": "256K"}  # every 300 kB block is spilled
TRANSPORTS = ["grpc", "urpc-v1", "urpc-v2", "urpc-v3"]


async def start(server_factory, **localfile) -> ShuffleServer:
    server = await server_factory(disks=1, urpc_port=0, urpc_bind_address="127.0.0.1",
                                  urpc_config={"sendfile_enable": True},
                                  localfile_store={**SCRUB_IDLE, **localfile}, hybrid_store=SPILL_EACH)
    # the scrubber's first pass is over before anything is written: it never sees these files
    await poll_until(lambda: metric_total(server, "riffle_scrub_passes_total") >= 1, timeout=30,
                     message="the scrubber's first pass")
    return server


async def spilled(client: UniffleClient, app: str, pid: int, nblocks: int) -> list[IndexEntry]:
    async def index():
        ix = await client.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
            appId=app, shuffleId=0, partitionId=pid, partitionNumPerRange=1, partitionNum=1))
        return ix if len(ix.indexData) // 40 == nblocks else None
    ix = await poll_until(index, timeout=30, message=f"partition {pid} of {app} spilled")
    return decode_index(ix.indexData)


async def read_range(transport: str, grpc_client: UniffleClient, conn, app: str, pid: int, offset: int,
                     length: int) -> tuple[int, str, bytes]:
    """One getLocalShuffleData of ``[offset, offset + length)``: (status, message, bytes)."""
    if transport == "grpc":
        r = await grpc_client.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
            appId=app, shuffleId=0, partitionId=pid, partitionNumPerRange=1, partitionNum=1, offset=offset,
            length=length, storageId=0))
        return r.status, r.retMsg, r.data
    kw: dict = {}
    if transport in ("urpc-v2", "urpc-v3"):
        kw["storage_id"] = 0
    if transport == "urpc-v3":
        kw.update(next_segments=[(offset + length, 1 << 20)], task_attempt_id=7)
    rid = conn.next_id()
    frame = urpc.encode_get_local_data(rid, app, 0, pid, offset, length, **kw)
    assert frame[4] == {"urpc-v1": 5, "urpc-v2": 24, "urpc-v3": 25}[transport]  # the version asked for
    r = await conn.request(frame, rid)
    assert r.type == urpc.MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE
    return r.status, r.ret_msg, bytes(r.body)


async def setup(server: ShuffleServer):
    """Write APP partitions 0 and 1 and OTHER partition 0, all spilled; flip a byte of APP partition 0's
    fourth block. (grpc client, urpc client, APP blocks, OTHER blocks, entries of APP p0, the victim,
    the intact bytes of APP p0's data file)."""
    target = f"127.0.0.1:{server.grpc_port}"
    g = UniffleClient(target)
    u = await UrpcClient(target, server.urpc_port).connect()
    blocks = await write_block_by_block(g, APP, [0, 1])
    others = await write_block_by_block(g, OTHER, [0])
    entries = await spilled(g, APP, 0, 6)
    await spilled(g, APP, 1, 6)
    await spilled(g, OTHER, 0, 6)
    path = Path(server.disk_names[0]) / APP / "0" / "partition-0.data"
    intact = path.read_bytes()
    victim = entries[3]
    flip_byte(path, victim.offset + 1234)
    return g, u, blocks, others, entries, victim, intact


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_block_rotten_after_the_last_scrub_is_refused_on_read_and_recorded(server_factory,
                                                                                  transport: str) -> None:
    server = await start(server_factory)
    g, u, blocks, others, entries, victim, _intact = await setup(server)
    try:
        conn = u.conn
        size = entries[-1].offset + entries[-1].length
        # the client's read: one range of whole blocks, here the whole file (the segment holds the victim)
        status, msg, data = await read_range(transport, g, conn, APP, 0, 0, size)
        assert status == StatusCode.INTERNAL_ERROR and data == b""
        assert f"block {victim.block_id} at offset {victim.offset}" in msg and "corrupt" in msg
        assert "found by the read check" in msg and "read another replica" in msg
        # recorded as the scrubber's finds are: every later read of the block is refused by the ledger
        assert metric_total(server, "riffle_read_crc_corrupt_blocks_total") == 1
        assert metric_total(server, "riffle_scrub_corrupt_blocks_total") == 0  # not the scrubber's find
        (app,) = [a for a in await server.admin.apps() if a["app_id"] == APP]
        assert (app["corrupt_blocks"], app["corrupt_reads_refused"]) == (1, 1)
        assert dict(server.integrity.totals())["corrupt_blocks"] == 1  # what the heartbeat reports
        for e in entries:  # each block alone: only the victim is refused
            status, msg, data = await read_range(transport, g, conn, APP, 0, e.offset, e.length)
            if e.block_id == victim.block_id:
                assert status == StatusCode.INTERNAL_ERROR and data == b"" and "corrupt" in msg
            else:
                assert status == StatusCode.SUCCESS and zlib.crc32(data) == e.crc, msg
        assert metric_total(server, "riffle_read_crc_corrupt_blocks_total") == 1  # found once, refused since
        assert metric_total(server, "riffle_server_corrupt_reads_refused_total") == 2
        # the other partition and the other app are untouched
        client = g if transport == "grpc" else u
        assert_read_matches(await client.read_partition(APP, 0, 1, await g.get_shuffle_result(APP, 0, [1])),
                            [b for b in blocks if b.partition_id == 1])
        assert_read_matches(await client.read_partition(OTHER, 0, 0, await g.get_shuffle_result(OTHER, 0, [0])),
                            others)
        assert server.integrity.app(OTHER) is None
        assert metric_total(server, "riffle_read_crc_checked_blocks_total") >= 6 + 6 + 6
        if transport != "grpc":
            assert server._urpc.sendfile_replies == 0  # with the check on, the checked bytes are sent
        # the purge takes the finding with the files
        await g.unregister_app(APP)
        await poll_until(lambda: not server.integrity.corrupt_partitions(), message="findings forgotten")
    finally:
        await u.close()
        await g.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_with_the_read_check_off_the_rotten_bytes_are_served(server_factory, transport: str) -> None:
    server = await start(server_factory, read_crc_check_enable=False)
    g, u, _blocks, _others, entries, victim, intact = await setup(server)
    try:
        size = entries[-1].offset + entries[-1].length
        status, msg, data = await read_range(transport, g, u.conn, APP, 0, 0, size)
        assert status == StatusCode.SUCCESS, msg
        assert len(data) == size and data != intact  # the flipped byte went out
        assert data[victim.offset + 1234] ^ intact[victim.offset + 1234] == 0x10
        assert data[:victim.offset] == intact[:victim.offset]
        assert not server.integrity.corrupt_partitions() and server.integrity.app(APP) is None
        assert metric_total(server, "riffle_read_crc_checked_blocks_total") == 0
        if transport != "grpc":
            assert server._urpc.sendfile_replies == 1  # served by sendfile, from the file as it is
    finally:
        await u.close()
        await g.close()
