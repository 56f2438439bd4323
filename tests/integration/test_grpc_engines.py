"""The two engines of the gRPC port (``grpc_engine``: GRPCIO and LOOP) answer a grpcio client alike.

Every other test runs on the default engine; this file runs the same calls on both and compares:
a write and a read of memory and spilled data (replies larger than the client's HTTP/2 window,
so they go out under flow control), the bitmap of a report, the answers to an unknown method and
to a request above ``grpc_max_message_size``, the admin RPCs' credential check (metadata), a
deadline the handler cannot meet, and a stop with calls in progress. The LOOP engine's own
refusals of malformed HTTP/2 are in tests/security/test_grpc_loop_hostile.py.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from riffle_actors.transport.grpc_loop import LoopGrpcServer
from tests.conftest import ServerFactory
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks

pytestmark = pytest.mark.integration

APP = "application_1700000000000_0019_1700000000019"
ENGINES = ("GRPCIO", "LOOP")


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


async def _start(server_factory: ServerFactory, engine: str, **overrides):
    srv = await server_factory(grpc_engine=engine, **overrides)
    assert isinstance(srv._grpc, LoopGrpcServer) == (engine == "LOOP")
    return srv


async def test_write_and_read_back_memory_and_spilled_data(server_factory: ServerFactory, engine: str) -> None:
    srv = await _start(server_factory, engine, capacity="64M",
                       hybrid_store={"memory_single_buffer_max_spill_size": "64K"})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}", read_buffer_size=6 << 20) as c:
        await c.register_shuffle(APP, 0, range(4))
        blocks = [b for p in range(4) for b in make_blocks(p, 1, 24, 96 << 10)]
        for p in range(4):
            await c.send_blocks(APP, 0, [b for b in blocks if b.partition_id == p])
        await c.report(APP, 0, 1, blocks)
        ids = await c.get_shuffle_result(APP, 0, range(4))
        assert set(ids) == {b.block_id for b in blocks}
        for p in range(4):
            got = await c.read_partition(APP, 0, p, ids)
            assert_read_matches(got, [b for b in blocks if b.partition_id == p])


async def test_unknown_method_and_oversized_request(server_factory: ServerFactory, engine: str) -> None:
    srv = await _start(server_factory, engine, grpc_max_message_size="1M")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        unknown = channel.unary_unary("/rss.common.ShuffleServer/noSuchMethod",
                                      request_serializer=lambda m: m, response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await unknown(b"")
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        stub = pb_grpc.ShuffleServerStub(channel)
        big = pb.SendShuffleDataRequest(appId=APP, shuffleId=0, requireBufferId=1, shuffleData=[
            pb.ShuffleData(partitionId=0, block=[pb.ShuffleBlock(blockId=1, length=2 << 20, data=b"x" * (2 << 20))])])
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.sendShuffleData(big)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # the connection still serves (an answer of the service: this app is not registered)
        answer = await stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP))
        assert "not registered" in answer.retMsg


async def test_admin_rpc_reads_the_authorization_metadata(server_factory: ServerFactory, engine: str) -> None:
    srv = await _start(server_factory, engine, admin={"token": "s3cret-token-for-the-test"})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = pb_grpc.ShuffleServerInternalStub(channel)
        refused = await stub.cancelDecommission(pb.CancelDecommissionRequest())
        assert refused.status != 0 and "credentials" in refused.retMsg
        allowed = await stub.cancelDecommission(pb.CancelDecommissionRequest(),
                                                metadata=(("authorization", "Bearer s3cret-token-for-the-test"),))
        assert "credentials" not in allowed.retMsg


async def test_deadline_and_stop_with_a_call_in_progress(server_factory: ServerFactory, engine: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    srv = await _start(server_factory, engine)
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
        await c.register_shuffle(APP, 0, range(1))
    release = asyncio.Event()
    started = asyncio.Event()
    cancelled: list[bool] = []
    real = srv.service.app_heartbeat

    async def slow_heartbeat(app_id: str) -> None:
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        await real(app_id)

    monkeypatch.setattr(srv.service, "app_heartbeat", slow_heartbeat)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = pb_grpc.ShuffleServerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP), timeout=0.2)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await poll_until(lambda: cancelled, message="the handler past its deadline is cancelled")
        # a call in progress when the port stops is let finish within the grace period
        started.clear()
        call = asyncio.ensure_future(stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP), timeout=20))
        await asyncio.wait_for(started.wait(), 10)
        stopping = asyncio.ensure_future(srv._grpc.stop(10))

        async def refuses_new_calls() -> bool:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as fresh:
                try:
                    # (not appHeartbeat, which blocks here: any answer means the port still takes calls)
                    await pb_grpc.ShuffleServerStub(fresh).requireBuffer(
                        pb.RequireBufferRequest(appId="someone-else", requireSize=1), timeout=5)
                except grpc.aio.AioRpcError:
                    return True
            return False

        await poll_until(refuses_new_calls, message="the stopping port refuses new calls")
        assert not call.done()
        release.set()
        answer = await call
        assert answer.status == 0
        await stopping
