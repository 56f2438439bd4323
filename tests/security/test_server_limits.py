"""Issue 8's attacks on the shuffle server's budgets, each with its expected refusal.

- A send carrying more than its ticket reserved is refused (INVALID_REQUEST, nothing stored) and
  the budget stays exact: ``used`` never exceeds ``capacity``.
- A 300 MB gRPC message with a bogus ticket is refused by gRPC from its length prefix: the
  server's peak RSS (``VmHWM``) grows by far less than the message.
- A read asking for more than ``grpc_max_message_size`` is refused before anything is read.
- After each attack another app still writes and reads back byte-exact.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from riffle_actors.errors import StatusCode
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from riffle_actors.server import ShuffleServer
from tests.helpers import budget_figures, wait_for, wait_server_clean
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks, require_size
from tests.helpers.daemon import server_process, vm_hwm_bytes

APP = "application_1700000000000_0008_1700000000001"


async def _another_app_works(client: UniffleClient, app_id: str = "bystander") -> None:
    await client.register_shuffle(app_id, 1, range(2))
    blocks = [b for p in range(2) for b in make_blocks(p, 3, 4, 5000)]
    await client.send_blocks(app_id, 1, blocks)
    got: dict[int, bytes] = {}
    for p in range(2):
        got.update(await client.read_partition(app_id, 1, p, None))
    assert_read_matches(got, blocks)
    await client.unregister_app(app_id)


async def test_a_send_larger_than_its_ticket_is_refused_and_the_budget_stays_exact(server_factory):
    srv: ShuffleServer = await server_factory(capacity="8M")
    client = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await client.register_shuffle(APP, 0, range(1))
        ticket = await client.require_buffer(APP, 0, 1000)
        blocks = make_blocks(0, 1, 4, 1 << 20)  # 4 MiB on a 1000-byte ticket
        resp = await client.stub.sendShuffleData(client.send_request(APP, 0, ticket, blocks))
        assert resp.status == StatusCode.INVALID_REQUEST, resp
        assert "reserved 1000" in resp.retMsg and "nothing was stored" in resp.retMsg
        wait_for(lambda: budget_figures(srv) == (0, 0, 0), what="the ticket's reservation released")
        mem = await client.stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
            appId=APP, shuffleId=0, partitionId=0, lastBlockId=-1, readBufferSize=1 << 20))
        assert mem.status == StatusCode.SUCCESS and not mem.shuffleDataBlockSegments  # nothing stored
        # the ticket is spent: the same send again finds no ticket
        again = await client.stub.sendShuffleData(client.send_request(APP, 0, ticket, blocks))
        assert again.status == StatusCode.INTERNAL_ERROR and "unknown, used or expired" in again.retMsg

        # an honest ticket for exactly the blocks works, and memory never passes capacity
        for round_ in range(6):
            honest = make_blocks(0, 10 + round_, 4, 256 << 10)
            await client.send_blocks(APP, 0, honest)
            used, allocated, _ = budget_figures(srv)
            assert used + allocated <= srv.budget.capacity
        assert srv.metrics.oversized_sends._value.get() == 1
        await _another_app_works(client)
        await client.unregister_app(APP)
        await wait_server_clean(srv)
    finally:
        await client.close()


async def test_a_read_longer_than_the_message_limit_is_refused(server_factory):
    srv: ShuffleServer = await server_factory(grpc_max_message_size="2M")
    client = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await client.register_shuffle(APP, 0, range(1))
        await client.send_blocks(APP, 0, make_blocks(0, 1, 2, 1000))
        resp = await client.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
            appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1, offset=0,
            length=(1 << 31) - 1))
        assert resp.status == StatusCode.INVALID_REQUEST
        assert "grpc_max_message_size" in resp.retMsg
        await _another_app_works(client)
    finally:
        await client.close()



def test_a_300mb_message_is_refused_before_it_is_buffered(tmp_path: Path):
    with server_process(tmp_path) as srv:
        proc, port = srv.proc, srv.grpc_port
        options = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = pbg.ShuffleServerStub(channel)
            stub.registerShuffle(pb.ShuffleRegisterRequest(
                appId=APP, shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)]), timeout=30)
            before = vm_hwm_bytes(proc.pid)
            payload = os.urandom(1 << 20) * 300  # 300 MiB
            request = pb.SendShuffleDataRequest(appId=APP, shuffleId=0, requireBufferId=12345, shuffleData=[
                pb.ShuffleData(partitionId=0, block=[pb.ShuffleBlock(blockId=1, length=len(payload), data=payload)])])
            del payload
            with pytest.raises(grpc.RpcError) as refused:
                stub.sendShuffleData(request, timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
            del request
            grown = vm_hwm_bytes(proc.pid) - before
            assert grown < 100 << 20, f"peak RSS grew by {grown >> 20} MiB for a refused 300 MiB message"
            # the server goes on serving, the same channel included
            hb = stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP), timeout=30)
            assert hb.status == StatusCode.SUCCESS
            blocks = make_blocks(0, 2, 3, 2000)
            ticket = stub.requireBuffer(pb.RequireBufferRequest(appId=APP, shuffleId=0,
                                                                requireSize=require_size(blocks)), timeout=30)
            assert ticket.status == StatusCode.SUCCESS


async def test_an_oversized_task_bitmap_is_refused_and_a_large_one_still_filters(server_factory):
    from riffle_actors.protocol.bitmap import serialize_block_ids
    from riffle_actors.transport.decode import INLINE_TASK_BITMAP_BYTES, MAX_TASK_BITMAP_BYTES

    srv: ShuffleServer = await server_factory()
    client = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await client.register_shuffle(APP, 0, range(1))
        wanted, other = make_blocks(0, 7, 2, 1000), make_blocks(0, 8, 2, 1000)
        await client.send_blocks(APP, 0, wanted + other)

        def read(bitmap: bytes):
            return client.stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
                appId=APP, shuffleId=0, partitionId=0, lastBlockId=-1, readBufferSize=1 << 20,
                serializedExpectedTaskIdsBitmap=bitmap))

        too_big = await read(b"\0" * (MAX_TASK_BITMAP_BYTES + 1))
        assert too_big.status == StatusCode.INVALID_REQUEST and "serializedExpectedTaskIdsBitmap" in too_big.retMsg
        # sparse ids: a bitmap above the inline size, decoded off the loop, filters exactly
        ids = [7] + [(1 << 20) + i * 70_000 for i in range(INLINE_TASK_BITMAP_BYTES // 8)]
        bitmap = serialize_block_ids(ids)
        assert len(bitmap) > INLINE_TASK_BITMAP_BYTES
        got = await read(bitmap)
        assert got.status == StatusCode.SUCCESS
        assert {s.blockId for s in got.shuffleDataBlockSegments} == {b.block_id for b in wanted}
        await _another_app_works(client)
    finally:
        await client.close()
