"""Ingest CRC check over real sockets, both transports: a send holding a block whose bytes do not match its
crc is refused whole (INTERNAL_ERROR naming the block, nothing stored, the ticket given back, counted); the
client's resend is accepted and counted as repaired; ``[app_config] block_crc_check_enable = false`` turns
the check off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from riffle_actors.errors import StatusCode
from riffle_actors.server import ShuffleServer
from tests.helpers import metric_total, poll_until
from tests.helpers.client import BlockSpec, UniffleClient, assert_read_matches, make_blocks
from tests.helpers.urpc_client import UrpcClient

pytestmark = pytest.mark.integration

APP = "application_1700000000000_0021_1700000000001"
URPC = {"urpc_port": 0, "urpc_bind_address": "127.0.0.1"}


def flipped(b: BlockSpec, at: int = 17) -> BlockSpec:
    """``b`` with one bit of its bytes flipped after the crc was computed (bit rot on the way)."""
    data = bytearray(b.data)
    data[at] ^= 0x04
    return b._replace(data=bytes(data))


@pytest_asyncio.fixture(params=["grpc", "urpc"])
async def wired(request, server_factory) -> AsyncIterator[tuple[ShuffleServer, UniffleClient]]:
    server = await server_factory(**URPC)
    target = f"127.0.0.1:{server.grpc_port}"
    client = (UniffleClient(target) if request.param == "grpc"
              else await UrpcClient(target, server.urpc_port).connect())
    yield server, client
    await client.close()


async def send_once(client: UniffleClient, blocks: list[BlockSpec]):
    ticket = await client.require_buffer(APP, 0, client.send_require_size(APP, 0, blocks),
                                         sorted({b.partition_id for b in blocks}))
    return await client.stub.sendShuffleData(client.send_request(APP, 0, ticket, blocks))


async def test_a_send_with_a_corrupt_block_is_refused_whole_and_its_resend_counts_as_repaired(wired) -> None:
    server, client = wired
    await client.register_shuffle(APP, 0, [0, 1])
    blocks = make_blocks(0, 1, 4, 5000) + make_blocks(1, 1, 3, 5000)
    bad = flipped(blocks[5])  # partition 1's second block
    resp = await send_once(client, blocks[:5] + [bad] + blocks[6:])
    assert resp.status == StatusCode.INTERNAL_ERROR  # the code the Uniffle client resends on
    assert str(bad.block_id) in resp.retMsg and "partition 1" in resp.retMsg and "refused" in resp.retMsg
    # nothing of the send was stored (its good blocks of partition 0 included), its ticket was given back
    for pid in (0, 1):
        assert await client.read_partition(APP, 0, pid, None, check_complete=False) == {}
    await poll_until(lambda: server.budget.allocated == 0 and server.budget.used == 0,
                     message="the refused send's reservation is given back")
    assert metric_total(server, "riffle_server_crc_refused_sends_total") == 1
    assert metric_total(server, "riffle_server_crc_refused_blocks_total") == 7
    assert metric_total(server, "riffle_server_received_bytes_total") == 0

    # the client resends the intact blocks: accepted, readable, counted as repaired
    await client.send_blocks(APP, 0, blocks)
    await client.report(APP, 0, 1, blocks)
    ids = await client.get_shuffle_result(APP, 0, [0, 1])
    for pid in (0, 1):
        assert_read_matches(await client.read_partition(APP, 0, pid, ids), [b for b in blocks if b.partition_id == pid])
    assert metric_total(server, "riffle_server_crc_repaired_blocks_total") == 7
    assert metric_total(server, "riffle_server_crc_checked_bytes_total") == 2 * sum(len(b.data) for b in blocks)
    (app,) = [a for a in await server.admin.apps() if a["app_id"] == APP]
    assert (app["refused_blocks"], app["repaired_blocks"], app["corrupt_blocks"]) == (7, 7, 0)


async def test_a_crc_outside_32_bits_is_refused(wired) -> None:
    _server, client = wired
    await client.register_shuffle(APP, 0, [0])
    (b,) = make_blocks(0, 1, 1, 100)
    resp = await send_once(client, [b._replace(crc=b.crc | (1 << 40))])
    assert resp.status == StatusCode.INTERNAL_ERROR and str(b.block_id) in resp.retMsg


async def test_the_check_can_be_turned_off(server_factory) -> None:
    server = await server_factory(app_config={"block_crc_check_enable": False})
    async with UniffleClient(f"127.0.0.1:{server.grpc_port}") as client:
        await client.register_shuffle(APP, 0, [0])
        (b,) = make_blocks(0, 1, 1, 1000)
        resp = await send_once(client, [flipped(b)])
        assert resp.status == StatusCode.SUCCESS
    assert metric_total(server, "riffle_server_crc_checked_bytes_total") == 0


async def test_a_big_send_is_checked_off_the_loop_and_refused(server_factory) -> None:
    # 12 MiB in one send: above the on-loop limit, checked on a thread
    server = await server_factory(capacity="64M", hybrid_store={"memory_single_buffer_max_spill_size": "32M"})
    async with UniffleClient(f"127.0.0.1:{server.grpc_port}") as client:
        await client.register_shuffle(APP, 0, [0])
        blocks = make_blocks(0, 1, 12, 1 << 20)
        bad = flipped(blocks[-1], at=(1 << 20) - 1)
        resp = await send_once(client, blocks[:-1] + [bad])
        assert resp.status == StatusCode.INTERNAL_ERROR and str(bad.block_id) in resp.retMsg
        await client.send_blocks(APP, 0, blocks)
    assert metric_total(server, "riffle_server_crc_repaired_blocks_total") == 12
