"""Riffle's partition split (``[app_config] partition_split_enable`` / ``partition_split_threshold``)
over gRPC, against a real server.

Riffle's wire behaviour (riffle-server ``app_manager/app.rs`` and ``grpc/service.rs``): once a
partition received more than the threshold it is marked split for good; a *successful*
requireBuffer that names it (``partitionIds``) lists it in ``needSplitPartitionIds`` (field 4 of
``RequireBufferResponse``), and the Uniffle 0.10+ client reassigns it to other servers. The
partition keeps being written and read here. The Uniffle 0.9.2 client has no field 4 (its
``Rss.proto`` ends at ``retMsg``): the test with the upstream proto shows it decodes the answer as
a plain success with the field left unknown, so a 0.9.2 job runs on regardless. urpc (Netty) has
no requireBuffer message: the client always asks for buffers over gRPC.
"""

from __future__ import annotations

from google.protobuf.unknown_fields import UnknownFieldSet

from riffle_actors.errors import StatusCode
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.upstream_proto import load_upstream_proto

APP = "application_1700000000000_0042_1700000000001"


async def _require(client: UniffleClient, pids: list[int]) -> pb.RequireBufferResponse:
    resp = await client.stub.requireBuffer(pb.RequireBufferRequest(requireSize=100, appId=APP, shuffleId=0,
                                                                   partitionIds=pids))
    assert resp.status == StatusCode.SUCCESS, resp
    return resp


async def test_require_buffer_names_the_partitions_above_the_split_threshold(server_factory):
    srv = await server_factory(app_config={"partition_split_enable": True, "partition_split_threshold": "8K"})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await client.register_shuffle(APP, 0, range(3))
        small = make_blocks(1, 1, 2, 1000)
        big = make_blocks(0, 1, 4, 2000)
        await client.send_blocks(APP, 0, small + big)
        assert list((await _require(client, [0, 1, 2])).needSplitPartitionIds) == []  # 8000 + 128 not above 8K
        assert not (await srv.admin.apps())[0]["partition_split_triggered"]
        more = make_blocks(0, 2, 1, 500)
        await client.send_blocks(APP, 0, more)  # partition 0: 8692 bytes > 8192
        assert list((await _require(client, [2, 0, 1])).needSplitPartitionIds) == [0]
        assert list((await _require(client, [1, 2])).needSplitPartitionIds) == []  # only those named
        assert list((await _require(client, [])).needSplitPartitionIds) == []  # 0.9.2 names none
        # the split partition is still written and read as before
        last = make_blocks(0, 3, 1, 700)
        await client.send_blocks(APP, 0, last)
        assert_read_matches(await client.read_partition(APP, 0, 0, None), big + more + last)
        assert_read_matches(await client.read_partition(APP, 0, 1, None), small)
        app = (await srv.admin.apps())[0]
        assert app["partition_split_triggered"] is True
        await client.unregister_app(APP)


async def test_no_split_when_disabled(server_factory):
    srv = await server_factory(app_config={"partition_split_threshold": "1K"})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await client.register_shuffle(APP, 0, range(1))
        await client.send_blocks(APP, 0, make_blocks(0, 1, 4, 2000))
        assert list((await _require(client, [0])).needSplitPartitionIds) == []
        await client.unregister_app(APP)


async def test_the_0_9_2_client_reads_a_split_answer_as_a_plain_success(server_factory):
    upb, upb_grpc = load_upstream_proto()
    assert "needSplitPartitionIds" not in upb.RequireBufferResponse.DESCRIPTOR.fields_by_name
    srv = await server_factory(app_config={"partition_split_enable": True, "partition_split_threshold": "1K"})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}", upb, upb_grpc) as client:
        await client.register_shuffle(APP, 0, range(1))
        blocks = make_blocks(0, 1, 2, 1000)
        await client.send_blocks(APP, 0, blocks)  # 2064 bytes > 1K: split
        resp = await client.stub.requireBuffer(upb.RequireBufferRequest(requireSize=100, appId=APP, shuffleId=0,
                                                                        partitionIds=[0]))
        assert resp.status == StatusCode.SUCCESS and resp.requireBufferId > 0
        # the server did send field 4 (packed: partition 0); this client keeps it as an unknown field
        assert [(f.field_number, f.data) for f in UnknownFieldSet(resp)] == [(4, b"\x00")]
        more = make_blocks(0, 2, 1, 300)
        await client.send_blocks(APP, 0, more)  # it goes on writing the split partition
        assert_read_matches(await client.read_partition(APP, 0, 0, None), blocks + more)
        await client.unregister_app(APP)
