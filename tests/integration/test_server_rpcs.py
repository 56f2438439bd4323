"""Every ShuffleServer RPC over gRPC (our proto): success and error paths, spec §2.

Each test runs against a fresh in-process server (port 0, tmp data paths, 4 MiB of memory).
The autouse ``_witness`` fixture checks, after every test, that another app still works
end to end (register, write, read) and then that purging every app leaves the server clean:
budget used/allocated/in-flight 0, no ticket, no app directory on any disk.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from riffle_actors.errors import StatusCode
from riffle_actors.protocol.bitmap import deserialize_block_ids, serialize_block_ids
from riffle_actors.protocol.blockid import SPARK_DEFAULT
from riffle_actors.protocol.index import decode_index
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.server import ShuffleServer
from tests.helpers import app_dirs, budget_figures, poll_until, wait_server_clean
from tests.helpers.client import BlockSpec, UniffleClient, assert_read_matches, make_blocks, require_size

pytestmark = pytest.mark.integration

S = StatusCode
APP = "application_1700000000000_0001_1700000000001"


# ---------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(autouse=True)
def _witness(request: pytest.FixtureRequest) -> None:
    """Tests on the default ``server`` get the after-test witness check."""
    if "server" in request.fixturenames:
        request.getfixturevalue("_witness_check")


@pytest_asyncio.fixture
async def _witness_check(server: ShuffleServer, client: UniffleClient) -> AsyncIterator[None]:
    """After the test: another app still works, and purging every app leaves the server clean."""
    yield
    assert server.escalated is None
    witness = "witness_app"
    await client.register_shuffle(witness, 7, range(3))
    blocks = [b for p in range(3) for b in make_blocks(p, 5, 4, 3000)]
    await client.send_blocks(witness, 7, blocks)
    await client.report(witness, 7, 5, blocks)
    ids = await client.get_shuffle_result(witness, 7, range(3))
    assert set(ids) == {b.block_id for b in blocks}
    for p in range(3):
        assert_read_matches(await client.read_partition(witness, 7, p, ids),
                            [b for b in blocks if b.partition_id == p])
    assert (await server.admin.health()).to_json()["status"] == "HEALTHY"
    for app_id in list(server.directory):
        await client.unregister_app(app_id)
    await wait_server_clean(server)


async def register(client: UniffleClient, app_id: str = APP, shuffle_id: int = 0, partitions=range(4)) -> None:
    await client.register_shuffle(app_id, shuffle_id, partitions)


async def write(client: UniffleClient, app_id: str = APP, shuffle_id: int = 0, partitions=range(4), *,
                task: int = 1, count: int = 5, size: int = 1000, report: bool = True) -> list[BlockSpec]:
    blocks = [b for p in partitions for b in make_blocks(p, task, count, size)]
    await client.send_blocks(app_id, shuffle_id, blocks)
    if report:
        await client.report(app_id, shuffle_id, task, blocks)
    return blocks


async def ticket(stub: Any, size: int, app_id: str = APP, shuffle_id: int = 0) -> int:
    resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=size, appId=app_id, shuffleId=shuffle_id))
    assert resp.status == S.SUCCESS, resp.retMsg
    return resp.requireBufferId


def memory_req(partition_id: int, last: int = -1, rbs: int = 1 << 20, app_id: str = APP, shuffle_id: int = 0,
               **kw: Any) -> Any:
    return pb.GetMemoryShuffleDataRequest(appId=app_id, shuffleId=shuffle_id, partitionId=partition_id,
                                          lastBlockId=last, readBufferSize=rbs, **kw)


def seg_ids(resp: Any) -> list[int]:
    return [s.blockId for s in resp.shuffleDataBlockSegments]


def check_segments(resp: Any, blocks: dict[int, BlockSpec]) -> None:
    """Offsets are relative to ``data`` and every block's metadata and bytes are returned unchanged."""
    offset = 0
    for seg in resp.shuffleDataBlockSegments:
        b = blocks[seg.blockId]
        assert seg.offset == offset
        assert (seg.length, seg.uncompressLength, seg.crc, seg.taskAttemptId) == (
            len(b.data), b.uncompress_length, b.crc, b.task_attempt_id)
        assert resp.data[seg.offset:seg.offset + seg.length] == b.data
        offset += seg.length
    assert len(resp.data) == offset


async def finish(stub: Any, app_id: str = APP, shuffle_id: int = 0) -> None:
    resp = await stub.finishShuffle(pb.FinishShuffleRequest(appId=app_id, shuffleId=shuffle_id))
    assert resp.status == S.SUCCESS, resp.retMsg


async def read_index(stub: Any, partition_id: int, app_id: str = APP, shuffle_id: int = 0) -> Any:
    return await stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
        appId=app_id, shuffleId=shuffle_id, partitionId=partition_id, partitionNumPerRange=1, partitionNum=4))


def data_req(partition_id: int, offset: int, length: int, storage_id: int = -1, app_id: str = APP) -> Any:
    return pb.GetLocalShuffleDataRequest(appId=app_id, shuffleId=0, partitionId=partition_id, partitionNumPerRange=1,
                                         partitionNum=4, offset=offset, length=length, storageId=storage_id)


# ---------------------------------------------------------------------------- registerShuffle
async def test_register_shuffle_is_idempotent(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    await register(client)  # the driver may retry
    await register(client, partitions=[2, 3, 4, 5])  # overlapping ranges: kept, new ones added
    resp = await stub.registerShuffle(pb.ShuffleRegisterRequest(
        appId=APP, shuffleId=1, partitionRanges=[pb.ShufflePartitionRange(start=0, end=9)]))
    assert resp.status == S.SUCCESS
    apps = await server.admin.apps()
    assert [a["app_id"] for a in apps] == [APP]
    assert apps[0]["user"] == "tester"
    assert set(apps[0]["shuffles"]) == {0, 1}
    assert apps[0]["shuffles"][0]["ranges"] == 6
    # every registered partition takes data; an inclusive multi-partition range too
    await write(client, partitions=[0, 5])
    await write(client, shuffle_id=1, partitions=[9], task=2)


@pytest.mark.parametrize("app_id", ["../x", "", "a/b", "..", ".", "x" * 300, "app\x00id", "a b"])
async def test_register_invalid_app_id(server: ShuffleServer, stub: Any, app_id: str) -> None:
    resp = await stub.registerShuffle(pb.ShuffleRegisterRequest(
        appId=app_id, shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)]))
    assert resp.status == S.INVALID_REQUEST, resp
    assert resp.retMsg
    assert not server.directory
    assert app_dirs(server, with_data=False) == []
    parent = os.path.dirname(server.cfg.localfile_store.data_paths[0])
    assert not os.path.exists(os.path.join(parent, "x"))


@pytest.mark.parametrize("start, end", [(3, 2), (-1, 0), (-5, -5)])
async def test_register_bad_range(server: ShuffleServer, stub: Any, start: int, end: int) -> None:
    resp = await stub.registerShuffle(pb.ShuffleRegisterRequest(
        appId=APP, shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0),
                                                 pb.ShufflePartitionRange(start=start, end=end)]))
    assert resp.status == S.INVALID_REQUEST
    assert APP not in server.directory


# ---------------------------------------------------------------------------- requireBuffer
async def test_require_buffer_issues_increasing_ids(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    first = await ticket(stub, 1000)
    second = await ticket(stub, 2000)
    assert first >= 1 and second == first + 1
    assert budget_figures(server) == (0, 3000, 0)
    assert len(server.tickets) == 2


async def test_require_buffer_unknown_app(server: ShuffleServer, stub: Any) -> None:
    resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=10, appId="nobody", shuffleId=0))
    assert (resp.status, resp.requireBufferId) == (S.NO_REGISTER, -1)
    assert budget_figures(server) == (0, 0, 0)


async def test_require_buffer_over_capacity(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    capacity = server.cfg.memory_store.capacity
    resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=capacity + 1, appId=APP, shuffleId=0))
    assert (resp.status, resp.requireBufferId) == (S.NO_BUFFER, -1)
    assert "capacity" in resp.retMsg
    half = await ticket(stub, capacity // 2)
    resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=capacity // 2 + 1, appId=APP, shuffleId=0))
    assert (resp.status, resp.requireBufferId) == (S.NO_BUFFER, -1)
    assert budget_figures(server) == (0, capacity // 2, 0)
    assert half > 0


async def test_require_buffer_negative_size(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=-5, appId=APP, shuffleId=0))
    assert resp.status != S.SUCCESS and resp.requireBufferId == -1
    assert budget_figures(server) == (0, 0, 0) and len(server.tickets) == 0


# ---------------------------------------------------------------------------- sendShuffleData
async def test_send_makes_blocks_readable_at_once(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    blocks = make_blocks(1, 3, 4, 500)
    t = await ticket(stub, require_size(blocks))
    resp = await stub.sendShuffleData(client.send_request(APP, 0, t, blocks))
    assert resp.status == S.SUCCESS, resp.retMsg
    # the reservation became used memory: Σ(len + 32)
    await poll_until(lambda: budget_figures(server) == (require_size(blocks), 0, 0))
    mem = await stub.getMemoryShuffleData(memory_req(1))
    assert seg_ids(mem) == [b.block_id for b in blocks]
    check_segments(mem, {b.block_id: b for b in blocks})


async def test_send_unknown_app(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    resp = await stub.sendShuffleData(client.send_request("ghost", 0, 1, make_blocks(0, 1, 1, 10)))
    assert resp.status == S.NO_REGISTER


@pytest.mark.parametrize("ticket_id", [0, -1, 987654321])
async def test_send_bogus_ticket(server: ShuffleServer, client: UniffleClient, stub: Any, ticket_id: int) -> None:
    await register(client)
    resp = await stub.sendShuffleData(client.send_request(APP, 0, ticket_id, make_blocks(0, 1, 2, 10)))
    assert resp.status == S.INTERNAL_ERROR
    assert "requireBufferId" in resp.retMsg
    assert (await stub.getMemoryShuffleData(memory_req(0))).shuffleDataBlockSegments == []
    assert budget_figures(server) == (0, 0, 0)


async def test_send_used_ticket(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    first = make_blocks(0, 1, 2, 10)
    t = await ticket(stub, require_size(first))
    assert (await stub.sendShuffleData(client.send_request(APP, 0, t, first))).status == S.SUCCESS
    second = make_blocks(0, 2, 2, 10)
    resp = await stub.sendShuffleData(client.send_request(APP, 0, t, second))
    assert resp.status == S.INTERNAL_ERROR
    assert seg_ids(await stub.getMemoryShuffleData(memory_req(0))) == [b.block_id for b in first]
    await poll_until(lambda: budget_figures(server) == (require_size(first), 0, 0))


async def test_send_ticket_of_another_app(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    await register(client, "other_app")
    t = await ticket(stub, 100, app_id="other_app")
    resp = await stub.sendShuffleData(client.send_request(APP, 0, t, make_blocks(0, 1, 1, 10)))
    assert resp.status == S.INTERNAL_ERROR
    await poll_until(lambda: budget_figures(server) == (0, 0, 0))
    assert len(server.tickets) == 0


async def test_send_without_data(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    t = await ticket(stub, 100)
    resp = await stub.sendShuffleData(pb.SendShuffleDataRequest(appId=APP, shuffleId=0, requireBufferId=t))
    assert resp.status == S.INTERNAL_ERROR
    assert "No data" in resp.retMsg


async def test_send_expired_ticket(server_factory, manual_clock) -> None:
    srv = await server_factory(clock=manual_clock)
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await register(client)
        blocks = make_blocks(0, 1, 2, 100)
        t = await ticket(client.stub, require_size(blocks))
        assert budget_figures(srv) == (0, require_size(blocks), 0)
        await client.heartbeat(APP)
        manual_clock.advance(srv.cfg.memory_store.buffer_ticket_timeout_sec + 1)
        await poll_until(lambda: budget_figures(srv) == (0, 0, 0) and len(srv.tickets) == 0)
        resp = await client.stub.sendShuffleData(client.send_request(APP, 0, t, blocks))
        assert resp.status == S.INTERNAL_ERROR
        assert (await client.stub.getMemoryShuffleData(memory_req(0))).shuffleDataBlockSegments == []
        # a new ticket works
        await client.send_blocks(APP, 0, blocks)
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


async def test_send_to_unregistered_partition_leaks_nothing(server: ShuffleServer, client: UniffleClient,
                                                            stub: Any) -> None:
    await register(client, partitions=[0, 1])
    good = make_blocks(0, 1, 3, 100)
    bad = make_blocks(7, 1, 3, 100)
    t = await ticket(stub, require_size(good + bad))
    resp = await stub.sendShuffleData(client.send_request(APP, 0, t, good + bad))
    assert resp.status == S.NO_REGISTER
    assert "partition 7" in resp.retMsg
    # nothing of the request was kept, and the reservation was given back
    assert (await stub.getMemoryShuffleData(memory_req(0))).shuffleDataBlockSegments == []
    await poll_until(lambda: budget_figures(server) == (0, 0, 0))
    assert len(server.tickets) == 0
    # an unregistered shuffle too
    t = await ticket(stub, require_size(good))
    resp = await stub.sendShuffleData(client.send_request(APP, 3, t, good))
    assert resp.status == S.NO_REGISTER
    await poll_until(lambda: budget_figures(server) == (0, 0, 0))


async def test_send_negative_block_id_is_rejected(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    """A malformed block id is the client's error: the app and its data must survive it."""
    await register(client)
    kept = await write(client, partitions=[0])
    bad = make_blocks(1, 1, 2, 100)
    bad[1] = bad[1]._replace(block_id=-7)
    t = await ticket(stub, require_size(bad))
    resp = await stub.sendShuffleData(client.send_request(APP, 0, t, make_blocks(2, 1, 1, 100) + bad))
    assert resp.status == S.INVALID_REQUEST
    await poll_until(lambda: budget_figures(server) == (require_size(kept), 0, 0))
    assert seg_ids(await stub.getMemoryShuffleData(memory_req(2))) == []  # nothing of the request kept
    assert not await server.admin.history()  # the app was not purged
    ids = await client.get_shuffle_result(APP, 0, [0])
    assert_read_matches(await client.read_partition(APP, 0, 0, ids), kept)


async def test_retried_send_is_deduplicated(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    blocks = make_blocks(2, 1, 6, 700)
    await client.send_blocks(APP, 0, blocks)
    await client.send_blocks(APP, 0, blocks)  # the client did not see the first answer and retries
    await client.send_blocks(APP, 0, blocks[2:4] + make_blocks(2, 2, 1, 700))
    await poll_until(lambda: budget_figures(server) == (require_size(blocks) + 700 + 32, 0, 0))
    seen = []
    last = -1
    while True:
        resp = await stub.getMemoryShuffleData(memory_req(2, last, 1000))
        if not resp.shuffleDataBlockSegments:
            break
        seen.extend(seg_ids(resp))
        last = seen[-1]
    assert len(seen) == len(set(seen)) == 7
    # still de-duplicated once the first copy is on disk
    await finish(stub)
    await client.send_blocks(APP, 0, blocks)
    assert (await stub.getMemoryShuffleData(memory_req(2))).shuffleDataBlockSegments == []
    assert len(decode_index((await read_index(stub, 2)).indexData)) == 7


async def test_messages_above_grpc_default_limit(server_factory) -> None:
    """The Java client sends up to 16 MiB per request and reads ~14 MiB per response (spec §1.1)."""
    srv = await server_factory(capacity="64M", hybrid_store={"memory_single_buffer_max_spill_size": "64M"})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await register(client)
        blocks = make_blocks(0, 1, 3, 3 << 20)  # one 9 MiB request
        await client.send_blocks(APP, 0, blocks)
        mem = await client.stub.getMemoryShuffleData(memory_req(0, rbs=14 << 20))
        assert seg_ids(mem) == [b.block_id for b in blocks] and len(mem.data) == 9 << 20
        await finish(client.stub)
        ix = await read_index(client.stub, 0)
        whole = await client.stub.getLocalShuffleData(data_req(0, 0, ix.dataFileLen, ix.storageIds[0]))
        assert whole.status == S.SUCCESS and whole.data == b"".join(b.data for b in blocks)
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


# ---------------------------------------------------------------------------- shuffle results
async def test_report_and_get_shuffle_result(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    p0 = [SPARK_DEFAULT.get_block_id(s, 0, 1) for s in range(3)]
    p1 = [SPARK_DEFAULT.get_block_id(s, 1, 2) for s in range(70000, 70003)]
    resp = await stub.reportShuffleResult(pb.ReportShuffleResultRequest(
        appId=APP, shuffleId=0, taskAttemptId=1, bitmapNum=1,
        partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=0, blockIds=p0),
                             pb.PartitionToBlockIds(partitionId=1, blockIds=p1)]))
    assert resp.status == S.SUCCESS
    # a duplicate report (task retried) changes nothing
    await stub.reportShuffleResult(pb.ReportShuffleResultRequest(
        appId=APP, shuffleId=0, taskAttemptId=1, bitmapNum=1,
        partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=0, blockIds=p0)]))
    layout = pb.BlockIdLayout(sequenceNoBits=21, partitionIdBits=20, taskAttemptIdBits=22)
    single = await stub.getShuffleResult(pb.GetShuffleResultRequest(appId=APP, shuffleId=0, partitionId=1,
                                                                    blockIdLayout=layout))
    assert single.status == S.SUCCESS
    assert list(deserialize_block_ids(single.serializedBitmap)) == sorted(p1)
    multi = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId=APP, shuffleId=0, partitions=[0, 1, 3], blockIdLayout=layout))
    assert multi.status == S.SUCCESS
    assert set(deserialize_block_ids(multi.serializedBitmap)) == set(p0 + p1)
    # a partition nothing was reported for: the empty set (5 bytes or none)
    none = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId=APP, shuffleId=0, partitions=[3], blockIdLayout=layout))
    assert none.status == S.SUCCESS and len(deserialize_block_ids(none.serializedBitmap)) == 0


async def test_never_reported_shuffle_is_empty_bytes(server: ShuffleServer, client: UniffleClient,
                                                     stub: Any) -> None:
    await register(client)
    await write(client, report=False)
    layout = pb.BlockIdLayout(sequenceNoBits=21, partitionIdBits=20, taskAttemptIdBits=22)
    for shuffle_id in (0, 42):  # registered or not
        resp = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
            appId=APP, shuffleId=shuffle_id, partitions=[0, 1], blockIdLayout=layout))
        assert (resp.status, resp.serializedBitmap) == (S.SUCCESS, b"")
    resp = await stub.getShuffleResult(pb.GetShuffleResultRequest(appId=APP, shuffleId=0, partitionId=0,
                                                                  blockIdLayout=layout))
    assert (resp.status, resp.serializedBitmap) == (S.SUCCESS, b"")


@pytest.mark.parametrize("bits", [(10, 10, 10), (0, 31, 32), (40, 1, 22), (21, 20, -22)])
async def test_invalid_block_id_layout(server: ShuffleServer, client: UniffleClient, stub: Any, bits) -> None:
    await register(client)
    await write(client)
    s, p, t = bits
    layout = pb.BlockIdLayout(sequenceNoBits=s, partitionIdBits=p, taskAttemptIdBits=t)
    resp = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId=APP, shuffleId=0, partitions=[0], blockIdLayout=layout))
    assert resp.status == S.INVALID_REQUEST
    assert resp.serializedBitmap == b""
    resp = await stub.getShuffleResult(pb.GetShuffleResultRequest(appId=APP, shuffleId=0, partitionId=0,
                                                                  blockIdLayout=layout))
    assert resp.status == S.INVALID_REQUEST


async def test_shuffle_result_errors(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    resp = await stub.reportShuffleResult(pb.ReportShuffleResultRequest(
        appId="ghost", shuffleId=0, taskAttemptId=1,
        partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=0, blockIds=[1])]))
    assert resp.status == S.NO_REGISTER
    resp = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId="ghost", shuffleId=0, partitions=[0]))
    assert resp.status == S.NO_REGISTER
    resp = await stub.getShuffleResult(pb.GetShuffleResultRequest(appId="ghost", shuffleId=0, partitionId=0))
    assert resp.status == S.NO_REGISTER
    await register(client)
    resp = await stub.reportShuffleResult(pb.ReportShuffleResultRequest(
        appId=APP, shuffleId=9, taskAttemptId=1,
        partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=0, blockIds=[1])]))
    assert resp.status == S.NO_REGISTER  # shuffle 9 was never registered
    good = [SPARK_DEFAULT.get_block_id(0, 1, 1)]
    resp = await stub.reportShuffleResult(pb.ReportShuffleResultRequest(
        appId=APP, shuffleId=0, taskAttemptId=1,
        partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=1, blockIds=good),
                             pb.PartitionToBlockIds(partitionId=0, blockIds=[5, -5])]))
    assert resp.status == S.INVALID_REQUEST  # a negative id is not a Java block id
    # the request was rejected as a whole, and the app lives on
    resp = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId=APP, shuffleId=0, partitions=[0, 1]))
    assert resp.status == S.SUCCESS and len(deserialize_block_ids(resp.serializedBitmap)) == 0
    assert (await stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP))).status == S.SUCCESS
    assert not await server.admin.history()


# ---------------------------------------------------------------------------- getMemoryShuffleData
async def test_memory_cursor(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    blocks = make_blocks(0, 1, 6, 1000)
    await client.send_blocks(APP, 0, blocks[:3])
    await client.send_blocks(APP, 0, blocks[3:])
    by_id = {b.block_id: b for b in blocks}
    order = [b.block_id for b in blocks]
    first = await stub.getMemoryShuffleData(memory_req(0, -1, 2500))
    assert first.status == S.SUCCESS
    assert seg_ids(first) == order[:3]  # stops once >= readBufferSize
    check_segments(first, by_id)
    nxt = await stub.getMemoryShuffleData(memory_req(0, order[2], 2500))
    assert seg_ids(nxt) == order[3:6]
    check_segments(nxt, by_id)
    end = await stub.getMemoryShuffleData(memory_req(0, order[5], 2500))
    assert (end.status, seg_ids(end), end.data) == (S.SUCCESS, [], b"")
    # an id no longer (or never) in memory restarts from the beginning
    again = await stub.getMemoryShuffleData(memory_req(0, 123456789, 1 << 20))
    assert seg_ids(again) == order
    # at least one block even when it is bigger than readBufferSize
    one = await stub.getMemoryShuffleData(memory_req(0, -1, 1))
    assert seg_ids(one) == order[:1]
    zero = await stub.getMemoryShuffleData(memory_req(0, order[0], 0))
    assert seg_ids(zero) == order[1:2]
    # partitions, shuffles without data: empty, not an error
    for req in (memory_req(3), memory_req(0, shuffle_id=5)):
        resp = await stub.getMemoryShuffleData(req)
        assert (resp.status, seg_ids(resp)) == (S.SUCCESS, [])


async def test_memory_task_filter(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    t1 = make_blocks(1, 1, 3, 100)
    t2 = make_blocks(1, 2, 3, 100)
    t3 = make_blocks(1, 3, 1, 100)
    await client.send_blocks(APP, 0, [t1[0], t2[0], t1[1], t2[1], t1[2], t2[2], t3[0]])
    resp = await stub.getMemoryShuffleData(memory_req(1, serializedExpectedTaskIdsBitmap=serialize_block_ids([2, 3])))
    assert seg_ids(resp) == [b.block_id for b in (t2[0], t2[1], t2[2], t3[0])]
    check_segments(resp, {b.block_id: b for b in t1 + t2 + t3})
    # the cursor may be a block of a filtered-out task
    resp = await stub.getMemoryShuffleData(memory_req(1, t1[1].block_id,
                                                      serializedExpectedTaskIdsBitmap=serialize_block_ids([1])))
    assert seg_ids(resp) == [t1[2].block_id]
    # empty bytes = no filter; an empty set filters everything
    resp = await stub.getMemoryShuffleData(memory_req(1, serializedExpectedTaskIdsBitmap=b""))
    assert len(seg_ids(resp)) == 7
    resp = await stub.getMemoryShuffleData(memory_req(1, serializedExpectedTaskIdsBitmap=serialize_block_ids([])))
    assert (resp.status, seg_ids(resp)) == (S.SUCCESS, [])


@pytest.mark.parametrize("bitmap", [b"\x00", b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x01\x00\x00\x00\x00\xff",
                                    b"\x00\x7f\xff\xff\xff", os.urandom(64)])
async def test_memory_malformed_bitmap(server: ShuffleServer, client: UniffleClient, stub: Any,
                                       bitmap: bytes) -> None:
    await register(client)
    await write(client, partitions=[0])
    resp = await stub.getMemoryShuffleData(memory_req(0, serializedExpectedTaskIdsBitmap=bitmap))
    assert resp.status == S.INVALID_REQUEST
    assert seg_ids(resp) == [] and resp.data == b""


async def test_memory_unknown_app(server: ShuffleServer, stub: Any) -> None:
    resp = await stub.getMemoryShuffleData(memory_req(0, app_id="ghost"))
    assert (resp.status, seg_ids(resp)) == (S.NO_REGISTER, [])


# ---------------------------------------------------------------------------- local index / data
async def test_index_before_any_flush(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    await write(client)
    for partition_id in (0, 3, 11):
        resp = await read_index(stub, partition_id)
        assert (resp.status, resp.indexData, resp.dataFileLen, list(resp.storageIds)) == (S.SUCCESS, b"", 0, [])
    resp = await read_index(stub, 0, app_id="ghost")
    assert resp.status == S.NO_REGISTER


async def test_local_files_after_finish(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    blocks = await write(client, partitions=[0, 1], count=8, size=1500)
    await finish(stub)
    p1 = [b for b in blocks if b.partition_id == 1]
    ix = await read_index(stub, 1)
    assert ix.status == S.SUCCESS
    entries = decode_index(ix.indexData)
    assert [e.block_id for e in entries] == [b.block_id for b in p1]
    assert ix.dataFileLen == sum(len(b.data) for b in p1)
    assert len(ix.storageIds) == 1
    for e, b in zip(entries, p1):
        assert (e.length, e.uncompress_length, e.crc, e.task_attempt_id) == (
            len(b.data), b.uncompress_length, b.crc, b.task_attempt_id)
    storage_id = ix.storageIds[0]
    # exactly the requested bytes: the whole file, one block, a range across blocks
    whole = await stub.getLocalShuffleData(data_req(1, 0, ix.dataFileLen, storage_id))
    assert whole.status == S.SUCCESS and whole.data == b"".join(b.data for b in p1)
    third = entries[2]
    one = await stub.getLocalShuffleData(data_req(1, third.offset, third.length, storage_id))
    assert one.data == p1[2].data and zlib.crc32(one.data) == third.crc
    part = await stub.getLocalShuffleData(data_req(1, 100, 2000, storage_id))
    assert part.data == whole.data[100:2100]
    # a 0.9 client sends no storageId (0 on the wire): the single file is meant
    legacy = await stub.getLocalShuffleData(data_req(1, third.offset, third.length, 0))
    assert legacy.status == S.SUCCESS and legacy.data == p1[2].data
    # beyond the end of the file: the client's mistake (INVALID_REQUEST), never a short answer
    for offset, length in ((ix.dataFileLen - 10, 20), (ix.dataFileLen + 100, 1)):
        resp = await stub.getLocalShuffleData(data_req(1, offset, length, storage_id))
        assert resp.status == S.INVALID_REQUEST and resp.data == b""
        assert "past the end of the data file" in resp.retMsg
    resp = await stub.getLocalShuffleData(data_req(1, -1, 10, storage_id))
    assert resp.status == S.INVALID_REQUEST
    # memory is empty once everything is on disk; the reader gets everything from the files
    assert seg_ids(await stub.getMemoryShuffleData(memory_req(1))) == []
    ids = await client.get_shuffle_result(APP, 0, [0, 1])
    assert_read_matches(await client.read_partition(APP, 0, 1, ids), p1)


async def test_local_data_errors(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    resp = await stub.getLocalShuffleData(data_req(0, 0, 10, app_id="ghost"))
    assert resp.status == S.NO_REGISTER
    await register(client)
    await write(client, partitions=[0])
    resp = await stub.getLocalShuffleData(data_req(0, 0, 10))  # nothing flushed yet
    assert resp.status == S.INTERNAL_ERROR
    resp = await stub.getLocalShuffleData(data_req(3, 0, 10))  # no data at all
    assert resp.status == S.INTERNAL_ERROR


# ---------------------------------------------------------------------------- lifecycle
async def test_app_heartbeat(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    resp = await stub.appHeartbeat(pb.AppHeartBeatRequest(appId="ghost"))
    assert resp.status == S.NO_REGISTER
    await register(client)
    resp = await stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP))
    assert (resp.status, resp.retMsg) == (S.SUCCESS, "")


async def test_commit_shuffle_task(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    resp = await stub.commitShuffleTask(pb.ShuffleCommitRequest(appId="ghost", shuffleId=0))
    assert resp.status == S.NO_REGISTER
    await register(client)
    counts = []
    for _ in range(3):
        resp = await stub.commitShuffleTask(pb.ShuffleCommitRequest(appId=APP, shuffleId=0))
        assert resp.status == S.SUCCESS
        counts.append(resp.commitCount)
    assert counts == [1, 2, 3]
    resp = await stub.commitShuffleTask(pb.ShuffleCommitRequest(appId=APP, shuffleId=4))
    assert resp.status == S.NO_REGISTER


async def test_finish_shuffle_puts_everything_on_disk(server: ShuffleServer, client: UniffleClient,
                                                      stub: Any) -> None:
    resp = await stub.finishShuffle(pb.FinishShuffleRequest(appId="ghost", shuffleId=0))
    assert resp.status == S.NO_REGISTER
    await register(client)
    await register(client, shuffle_id=1)
    blocks = await write(client, count=10, size=2000)
    other = await write(client, shuffle_id=1, partitions=[0], task=2)
    await finish(stub)
    # right when finishShuffle returned: every block of shuffle 0 is in the files, none in memory
    for p in range(4):
        want = [b.block_id for b in blocks if b.partition_id == p]
        assert [e.block_id for e in decode_index((await read_index(stub, p)).indexData)] == want
        assert seg_ids(await stub.getMemoryShuffleData(memory_req(p))) == []
    # shuffle 1 was not asked to finish: still in memory
    assert budget_figures(server)[0] == require_size(other)
    (app,) = await server.admin.apps()
    assert app["shuffles"][0]["disk_bytes"] == sum(len(b.data) for b in blocks)
    assert app["shuffles"][1]["disk_bytes"] == 0 and app["disk_bytes"] == app["shuffles"][0]["disk_bytes"]
    assert seg_ids(await stub.getMemoryShuffleData(memory_req(0, shuffle_id=1))) == [b.block_id for b in other]
    await finish(stub)  # again, with nothing in memory
    resp = await stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=8))
    assert resp.status == S.NO_REGISTER


async def test_unregister_shuffle(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    resp = await stub.unregisterShuffle(pb.ShuffleUnregisterRequest(appId="ghost", shuffleId=0))
    assert resp.status == S.NO_REGISTER
    await register(client)
    await register(client, shuffle_id=1)
    await write(client, count=4, size=3000)
    await finish(stub)
    await write(client, task=2)  # some in memory, some on disk
    kept = await write(client, shuffle_id=1, partitions=[2], task=3)
    await ticket(stub, 500)  # a reservation of the purged shuffle
    dirs = [os.path.join(root, APP, "0") for root in server.cfg.localfile_store.data_paths]
    assert any(os.path.exists(d) for d in dirs)
    resp = await stub.unregisterShuffle(pb.ShuffleUnregisterRequest(appId=APP, shuffleId=0))
    assert resp.status == S.SUCCESS
    await poll_until(lambda: budget_figures(server) == (require_size(kept), 0, 0)
                     and not any(os.path.exists(d) for d in dirs))
    assert len(server.tickets) == 0
    # the other shuffle is untouched
    ids = await client.get_shuffle_result(APP, 1, [2])
    assert_read_matches(await client.read_partition(APP, 1, 2, ids), kept)
    # the purged one is gone
    assert seg_ids(await stub.getMemoryShuffleData(memory_req(0))) == []
    assert (await read_index(stub, 0)).indexData == b""
    # no ticket for it any more (a ticket is only for a registered shuffle), and a send is refused too
    resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=100, appId=APP, shuffleId=0))
    assert (resp.status, resp.requireBufferId) == (S.NO_REGISTER, -1) and "shuffle 0" in resp.retMsg
    t = await ticket(stub, 100, shuffle_id=1)
    resp = await stub.sendShuffleData(client.send_request(APP, 0, t, make_blocks(0, 9, 1, 10)))
    assert resp.status == S.NO_REGISTER


async def test_shuffle_registered_again_after_unregister(server: ShuffleServer, client: UniffleClient,
                                                        stub: Any) -> None:
    """Uniffle's stage retry unregisters a shuffle and registers the same id again: nothing may be lost."""
    await register(client, partitions=[0, 1])
    await write(client, partitions=[0, 1], count=6, size=3000)
    await finish(stub)
    await client.unregister_shuffle(APP, 0)
    dirs = [os.path.join(root, APP, "0") for root in server.cfg.localfile_store.data_paths]
    await poll_until(lambda: budget_figures(server) == (0, 0, 0) and not any(os.path.exists(d) for d in dirs))
    await register(client, partitions=[0, 1])
    blocks = await write(client, partitions=[0, 1], count=6, size=3000, task=2)
    await finish(stub)
    ids = await client.get_shuffle_result(APP, 0, [0, 1])
    assert set(ids) == {b.block_id for b in blocks}
    for p in (0, 1):
        want = [b for b in blocks if b.partition_id == p]
        assert_read_matches(await client.read_partition(APP, 0, p, ids), want)
        assert [e.block_id for e in decode_index((await read_index(stub, p)).indexData)] == [b.block_id for b in want]


async def test_shuffle_registered_again_while_old_spills_are_in_flight(server_factory) -> None:
    """Late spills and spill completions of the purged incarnation never touch the new one."""
    srv = await server_factory(capacity="64M", hybrid_store={"memory_single_buffer_max_spill_size": "256K",
                                                            "memory_spill_max_concurrency": 1})
    parts = range(16)
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        for round_ in range(3):
            await register(client, partitions=parts)
            # one request, 16 spills queued behind a single spill slot
            await client.send_blocks(APP, 0, [b for p in parts for b in make_blocks(p, 1, 2, 400_000)])
            await client.unregister_shuffle(APP, 0)
            await register(client, partitions=parts)  # at once, while the old spills are in flight
            fresh = [b for p in parts for b in make_blocks(p, 10 + round_, 2, 200_000)]
            await client.send_blocks(APP, 0, fresh)
            await finish(client.stub)
            await client.report(APP, 0, 10 + round_, fresh)
            ids = await client.get_shuffle_result(APP, 0, parts)
            for p in parts:
                want = [b for b in fresh if b.partition_id == p]
                assert_read_matches(await client.read_partition(APP, 0, p, ids), want)
                index = decode_index((await read_index(client.stub, p)).indexData)
                assert {e.block_id for e in index} == {b.block_id for b in want}, "stale blocks in the files"
            await client.unregister_shuffle(APP, 0)
            await poll_until(lambda: srv.budget.used == 0)
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


async def test_unregister_app_removes_memory_and_files(server: ShuffleServer, client: UniffleClient,
                                                       stub: Any) -> None:
    resp = await stub.unregisterShuffleByAppId(pb.ShuffleUnregisterByAppIdRequest(appId="ghost"))
    assert resp.status == S.NO_REGISTER
    await register(client)
    await write(client, count=4, size=3000)
    await finish(stub)
    await write(client, task=2)
    await ticket(stub, 700)
    assert app_dirs(server, APP)
    resp = await stub.unregisterShuffleByAppId(pb.ShuffleUnregisterByAppIdRequest(appId=APP))
    assert resp.status == S.SUCCESS
    await wait_server_clean(server, APP)
    history = await server.admin.history()
    assert history[-1]["app_id"] == APP and history[-1]["reason"] == "unregistered by client"
    for resp in (await stub.requireBuffer(pb.RequireBufferRequest(requireSize=1, appId=APP, shuffleId=0)),
                 await stub.getMemoryShuffleData(memory_req(0)),
                 await read_index(stub, 0),
                 await stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP))):
        assert resp.status == S.NO_REGISTER


async def test_app_registered_again_after_unregister(server: ShuffleServer, client: UniffleClient,
                                                     stub: Any) -> None:
    """A purged app id used again (a new shuffle of a driver whose app had expired) works fully."""
    await register(client)
    await write(client)
    await client.unregister_app(APP)
    await wait_server_clean(server, APP)
    await register(client)
    blocks = await write(client, count=6, size=2000, task=4)
    await finish(stub)  # the data must really reach the disk
    ids = await client.get_shuffle_result(APP, 0, range(4))
    assert set(ids) == {b.block_id for b in blocks}
    for p in range(4):
        assert_read_matches(await client.read_partition(APP, 0, p, ids), [b for b in blocks if b.partition_id == p])
    assert app_dirs(server, APP)


async def test_remote_merge_is_disabled(server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    await register(client)
    resp = await stub.startSortMerge(pb.StartSortMergeRequest(appId=APP, shuffleId=0, partitionId=0,
                                                              uniqueBlocksBitmap=serialize_block_ids([1])))
    assert resp.status == S.INTERNAL_ERROR and resp.retMsg
    resp = await stub.getSortedShuffleData(pb.GetSortedShuffleDataRequest(appId=APP, shuffleId=0, partitionId=0))
    assert resp.status == S.INTERNAL_ERROR and resp.data == b""
