"""Issue 17's attacks on the shuffle server's per-request and per-app bounds, each with its refusal.

- reportShuffleResult for 500k partitions never registered: INVALID_REQUEST naming the first of
  them (a bounded message), and the server's peak RSS (``VmHWM``) stays flat over four such 8 MB
  requests (it grew by ~285 MB per request before); reports above the id caps are refused whole.
- Too many apps on the server (ACCESS_DENIED), shuffles in one app, partition ids past the
  partition limit or past the app's block-id layout (INVALID_REQUEST), each naming its key.
- requireBuffer: no ticket for an anonymous, unregistered or half-registered request; one app
  cannot hold more than its share of the budget in tickets (NO_BUFFER naming the key), not even by
  letting them expire and taking them again; another app still gets tickets.
- Reads past the end of a file and unknown storageIds: INVALID_REQUEST, over gRPC and urpc.
- An app id with a newline (or a negative shuffle / partition id) is refused by every handler of
  both transports with INVALID_REQUEST naming the field.
After each attack another app still writes and reads back byte-exact.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc

from riffle_actors.errors import StatusCode as S
from riffle_actors.protocol import urpc
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from riffle_actors.records import Block
from riffle_actors.runtime import ManualClock
from riffle_actors.server import ShuffleServer
from tests.helpers import budget_figures, poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.daemon import server_process, vm_hwm_bytes
from tests.helpers.urpc_client import UrpcConnection

APP = "application_1700000000000_0017_1700000000001"
URPC = {"urpc_port": 0, "urpc_bind_address": "127.0.0.1"}


async def _another_app_works(client: UniffleClient, app_id: str = "bystander") -> None:
    await client.register_shuffle(app_id, 1, range(2))
    blocks = [b for p in range(2) for b in make_blocks(p, 3, 4, 5000)]
    await client.send_blocks(app_id, 1, blocks)
    await client.report(app_id, 1, 3, blocks)
    ids = await client.get_shuffle_result(app_id, 1, range(2))
    assert set(ids) == {b.block_id for b in blocks}
    got: dict[int, bytes] = {}
    for p in range(2):
        got.update(await client.read_partition(app_id, 1, p, None))
    assert_read_matches(got, blocks)
    await client.unregister_app(app_id)


def _report(app_id: str, shuffle_id: int, p2b: dict[int, list[int]]) -> pb.ReportShuffleResultRequest:
    return pb.ReportShuffleResultRequest(appId=app_id, shuffleId=shuffle_id, taskAttemptId=1, bitmapNum=1,
                                         partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=p, blockIds=ids)
                                                              for p, ids in p2b.items()])


def _register(app_id: str, shuffle_id: int, ranges: list[tuple[int, int]],
              properties: dict[str, str] | None = None) -> pb.ShuffleRegisterRequest:
    return pb.ShuffleRegisterRequest(appId=app_id, shuffleId=shuffle_id, properties=properties or {},
                                     partitionRanges=[pb.ShufflePartitionRange(start=s, end=e) for s, e in ranges])



# ---------------------------------------------------------------------------- reportShuffleResult
def test_a_report_for_partitions_never_registered_is_refused_and_costs_no_memory(tmp_path: Path):
    with server_process(tmp_path) as srv:
        proc, port = srv.proc, srv.grpc_port
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = pbg.ShuffleServerStub(channel)
            assert stub.registerShuffle(_register(APP, 0, [(0, 9)]), timeout=30).status == S.SUCCESS
            rnd = random.Random(17)
            attack = _report(APP, 0, {100 + p: [rnd.getrandbits(62), rnd.getrandbits(62)] for p in range(500_000)})
            assert attack.ByteSize() > 8_000_000
            before = vm_hwm_bytes(proc.pid)
            for _ in range(4):
                resp = stub.reportShuffleResult(attack, timeout=120)
                assert resp.status == S.INVALID_REQUEST, resp
                assert "500000 partitions of shuffle 0 that are not registered" in resp.retMsg
                assert "100, 101, 102" in resp.retMsg and "and 499990 more" in resp.retMsg
                assert len(resp.retMsg) < 400  # bounded, whatever the request names
            grown = vm_hwm_bytes(proc.pid) - before
            assert grown < 150 << 20, f"peak RSS grew by {grown >> 20} MiB for 4 refused reports"
            # nothing of it was added; the registered partitions still take reports
            result = stub.getShuffleResult(pb.GetShuffleResultRequest(appId=APP, shuffleId=0, partitionId=100))
            assert result.status == S.SUCCESS and result.serializedBitmap == b""
            ok = stub.reportShuffleResult(_report(APP, 0, {p: [p + 1] for p in range(10)}), timeout=30)
            assert ok.status == S.SUCCESS
        async def bystander() -> None:
            async with UniffleClient(f"127.0.0.1:{port}") as client:
                await _another_app_works(client)
        asyncio.run(bystander())


async def test_reports_above_the_block_id_caps_are_refused_whole(server_factory):
    srv: ShuffleServer = await server_factory(app_config={"report_block_id_number_max_limit": 1000,
                                                          "report_partition_block_id_number_max_limit": 300})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await client.register_shuffle(APP, 0, range(10))
        too_many = await client.stub.reportShuffleResult(_report(APP, 0, {p: list(range(p * 1000, p * 1000 + 200))
                                                                          for p in range(6)}))
        assert too_many.status == S.INVALID_REQUEST
        assert "report_block_id_number_max_limit" in too_many.retMsg and "nothing was added" in too_many.retMsg
        # empty lists count one each: 1001 partitions named cost as much as 1001 ids
        empties = await client.stub.reportShuffleResult(_report(APP, 0, {p: [] for p in range(1001)}))
        assert empties.status == S.INVALID_REQUEST and "report_block_id_number_max_limit" in empties.retMsg
        one_big = await client.stub.reportShuffleResult(_report(APP, 0, {0: [1], 1: list(range(301))}))
        assert one_big.status == S.INVALID_REQUEST
        assert "report_partition_block_id_number_max_limit" in one_big.retMsg and "partition 1" in one_big.retMsg
        assert not set(await client.get_shuffle_result(APP, 0, range(10)))  # none of it was added
        fits = {p: list(range(p * 1000, p * 1000 + 100)) for p in range(9)}
        assert (await client.stub.reportShuffleResult(_report(APP, 0, fits))).status == S.SUCCESS
        assert set(await client.get_shuffle_result(APP, 0, range(10))) == {i for ids in fits.values() for i in ids}
        await _another_app_works(client)


# ---------------------------------------------------------------------------- apps, shuffles, partitions
async def test_apps_beyond_the_server_limit_are_denied_until_one_leaves(server_factory):
    srv: ShuffleServer = await server_factory(app_config={"app_number_hard_limit": 3})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        for i in range(3):
            await client.register_shuffle(f"app-{i}", 0, range(1))
        denied = await client.stub.registerShuffle(_register("app-3", 0, [(0, 0)]))
        assert denied.status == S.ACCESS_DENIED
        assert "app_number_hard_limit = 3" in denied.retMsg and "3 registered apps" in denied.retMsg
        assert "app-3" not in srv.directory
        await client.register_shuffle("app-0", 1, range(1))  # a registered app goes on registering shuffles
        await client.unregister_app("app-2")
        await poll_until(lambda: "app-2" not in srv.directory)
        await _another_app_works(client)  # the room one app left is usable


async def test_an_app_beyond_its_shuffle_limit_is_refused(server_factory):
    srv: ShuffleServer = await server_factory(app_config={"shuffle_number_max_limit": 5})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        for sid in range(5):
            await client.register_shuffle(APP, sid, range(2))
        refused = await client.stub.registerShuffle(_register(APP, 5, [(0, 1)]))
        assert refused.status == S.INVALID_REQUEST
        assert "shuffle_number_max_limit = 5" in refused.retMsg and "5 registered shuffles" in refused.retMsg
        await client.register_shuffle(APP, 4, range(2, 4))  # one already registered may grow
        await client.unregister_shuffle(APP, 0)  # the purge runs after the answer: room comes back with it

        async def registered_once_room_is_back() -> bool:
            return (await client.stub.registerShuffle(_register(APP, 5, [(0, 1)]))).status == S.SUCCESS

        await poll_until(registered_once_room_is_back)
        await _another_app_works(client)


async def test_partition_ids_past_the_limit_or_the_block_id_layout_are_refused(server_factory):
    srv: ShuffleServer = await server_factory(app_config={"partition_number_max_limit": 1000})
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        stub = client.stub
        past = await stub.registerShuffle(_register(APP, 0, [(0, 10), (990, 1000)]))
        assert past.status == S.INVALID_REQUEST
        assert "[990, 1000]" in past.retMsg and "below 1000" in past.retMsg
        assert "partition_number_max_limit" in past.retMsg
        assert (await stub.registerShuffle(_register(APP, 0, [(0, 999)]))).status == S.SUCCESS
        # a 0.10 client sends its SparkConf: the layout's partition field may encode fewer ids
        layout = await stub.registerShuffle(_register(APP, 1, [(0, 100)], {"spark.rss.blockId.maxPartitions": "100"}))
        assert layout.status == S.INVALID_REQUEST and "spark.rss.blockId.maxPartitions=100" in layout.retMsg
        bits = await stub.registerShuffle(_register(APP, 2, [(0, 64)],
                                                    {"spark.rss.client.blockId.partitionIdBits": "6"}))
        assert bits.status == S.INVALID_REQUEST and "below 64" in bits.retMsg
        assert (await stub.registerShuffle(_register(APP, 2, [(0, 63)],
                                                     {"spark.rss.client.blockId.partitionIdBits": "6"}))).status == 0
        # a read naming more partitions than a shuffle may have is refused before it is walked
        many = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
            appId=APP, shuffleId=0, partitions=list(range(1001))))
        assert many.status == S.INVALID_REQUEST and "partition_number_max_limit" in many.retMsg
        await _another_app_works(client)


# ---------------------------------------------------------------------------- requireBuffer
async def test_no_ticket_without_a_registered_app_shuffle_and_partitions(server_factory):
    srv: ShuffleServer = await server_factory(capacity="8M")
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        stub = client.stub
        anonymous = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=1 << 20))
        assert (anonymous.status, anonymous.requireBufferId) == (S.INVALID_REQUEST, -1)
        assert "appId" in anonymous.retMsg and "empty" in anonymous.retMsg
        stranger = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=1 << 20, appId="nobody"))
        assert stranger.status == S.NO_REGISTER
        await client.register_shuffle(APP, 0, range(4))
        other_shuffle = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=1 << 20, appId=APP, shuffleId=9))
        assert other_shuffle.status == S.NO_REGISTER and "shuffle 9" in other_shuffle.retMsg
        other_partition = await stub.requireBuffer(pb.RequireBufferRequest(
            requireSize=1 << 20, appId=APP, shuffleId=0, partitionIds=[1, 4]))
        assert other_partition.status == S.NO_REGISTER and "partition 4 " in other_partition.retMsg
        assert budget_figures(srv) == (0, 0, 0) and len(srv.tickets) == 0
        await _another_app_works(client)


async def test_one_app_cannot_hold_the_whole_budget_in_tickets_even_by_renewing_them(server_factory):
    clock = ManualClock()
    srv: ShuffleServer = await server_factory(clock=clock, capacity="32M",
                                              memory_store={"app_buffer_ticket_max_number": 40})
    timeout = srv.cfg.memory_store.buffer_ticket_timeout_sec
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        stub = client.stub
        await client.register_shuffle(APP, 0, range(1))

        async def grab(size: int) -> tuple[int, str]:
            n = 0
            while True:
                resp = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=size, appId=APP, shuffleId=0))
                if resp.status != S.SUCCESS:
                    assert resp.status == S.NO_BUFFER and resp.requireBufferId == -1
                    return n, resp.retMsg
                n += 1

        taken, why = await grab(8 << 20)  # 8 MiB tickets, never used
        assert taken == 2 and "app_buffer_ticket_max_ratio" in why  # half of 32M, not all of it
        for _ in range(3):  # renewing them after their expiry gives no more than the same share
            clock.advance(timeout + 1)
            await poll_until(lambda: len(srv.tickets) == 0)
            assert await grab(8 << 20) == (2, why)
            assert srv.budget.allocated == 16 << 20
        # another app gets its tickets meanwhile and writes and reads back byte-exact
        await _another_app_works(client)
        # free tickets are counted too: size-0 tickets cost an entry each
        clock.advance(timeout + 1)
        await poll_until(lambda: len(srv.tickets) == 0)
        count, why = await grab(0)
        assert count == 40 and "app_buffer_ticket_max_number" in why and "40 unused buffer tickets" in why


# ---------------------------------------------------------------------------- reads
async def test_reads_past_the_end_and_unknown_storage_ids_are_invalid_requests(server_factory):
    srv: ShuffleServer = await server_factory(**URPC)
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        stub = client.stub
        await client.register_shuffle(APP, 0, range(1))
        await client.send_blocks(APP, 0, make_blocks(0, 1, 3, 1000))
        await stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=0))
        index = await stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(appId=APP, shuffleId=0, partitionId=0))
        size, (storage,) = index.dataFileLen, index.storageIds
        assert size == 3000

        def data_req(offset: int, length: int, storage_id: int) -> pb.GetLocalShuffleDataRequest:
            return pb.GetLocalShuffleDataRequest(appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1,
                                                 partitionNum=1, offset=offset, length=length, storageId=storage_id)

        past = await stub.getLocalShuffleData(data_req(size - 1, 2, storage))
        assert past.status == S.INVALID_REQUEST and "past the end of the data file of partition 0 (3000 bytes)" \
            in past.retMsg and str(srv.cfg.localfile_store.data_paths[0]) not in past.retMsg
        for bad in (2, 7, -2, 1 << 30):
            resp = await stub.getLocalShuffleData(data_req(0, 10, bad))
            assert resp.status == S.INVALID_REQUEST and f"storageId {bad} is not a storage" in resp.retMsg
        assert (await stub.getLocalShuffleData(data_req(0, 3000, storage))).status == S.SUCCESS

        conn = await UrpcConnection.open("127.0.0.1", srv.urpc_port)
        try:
            for frame_args, expect in (((size - 1, 2), "past the end"), ((0, 10, 5), "storageId 5")):
                rid = conn.next_id()
                storage_id = frame_args[2] if len(frame_args) > 2 else None
                r = await conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, frame_args[0], frame_args[1],
                                                                  storage_id=storage_id), rid)
                assert r.type == urpc.MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE
                assert r.status == S.INVALID_REQUEST and expect in r.ret_msg
            rid = conn.next_id()
            r = await conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, 0, 3000, storage_id=storage), rid)
            assert r.status == S.SUCCESS and len(r.body) == 3000
        finally:
            await conn.close()
        await _another_app_works(client)


# ---------------------------------------------------------------------------- ids, every handler
BAD_APP = "app\nINFO forged log line"


def _grpc_requests(app_id: str, shuffle_id: int = 0, partition_id: int = 0) -> dict[str, object]:
    """One request of every ShuffleServer RPC, with these ids."""
    a, s, p = app_id, shuffle_id, partition_id
    return {
        "registerShuffle": _register(a, s, [(p, p)]),
        "requireBuffer": pb.RequireBufferRequest(appId=a, shuffleId=s, requireSize=10, partitionIds=[p]),
        "sendShuffleData": pb.SendShuffleDataRequest(appId=a, shuffleId=s, requireBufferId=1, shuffleData=[
            pb.ShuffleData(partitionId=p, block=[pb.ShuffleBlock(blockId=1, length=1, data=b"x")])]),
        "reportShuffleResult": _report(a, s, {p: [1]}),
        "commitShuffleTask": pb.ShuffleCommitRequest(appId=a, shuffleId=s),
        "finishShuffle": pb.FinishShuffleRequest(appId=a, shuffleId=s),
        "getShuffleResult": pb.GetShuffleResultRequest(appId=a, shuffleId=s, partitionId=p),
        "getShuffleResultForMultiPart": pb.GetShuffleResultForMultiPartRequest(appId=a, shuffleId=s,
                                                                                partitions=[p]),
        "getMemoryShuffleData": pb.GetMemoryShuffleDataRequest(appId=a, shuffleId=s, partitionId=p, lastBlockId=-1,
                                                               readBufferSize=100),
        "getLocalShuffleIndex": pb.GetLocalShuffleIndexRequest(appId=a, shuffleId=s, partitionId=p),
        "getLocalShuffleData": pb.GetLocalShuffleDataRequest(appId=a, shuffleId=s, partitionId=p, length=10),
        "appHeartbeat": pb.AppHeartBeatRequest(appId=a),
        "unregisterShuffle": pb.ShuffleUnregisterRequest(appId=a, shuffleId=s),
        "unregisterShuffleByAppId": pb.ShuffleUnregisterByAppIdRequest(appId=a),
        "startSortMerge": pb.StartSortMergeRequest(appId=a, shuffleId=s, partitionId=p),
        "getSortedShuffleData": pb.GetSortedShuffleDataRequest(appId=a, shuffleId=s, partitionId=p),
    }


async def test_bad_ids_are_refused_by_every_grpc_and_urpc_handler(server_factory):
    srv: ShuffleServer = await server_factory(**URPC)
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["ShuffleServer"].methods}
    async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
        await client.register_shuffle(APP, 0, range(1))  # the good ids exist: only the bad field is refused
        cases = [(_grpc_requests(BAD_APP), "appId"), (_grpc_requests(""), "appId"),
                 (_grpc_requests(APP, shuffle_id=-1), "shuffleId"),
                 (_grpc_requests(APP, partition_id=-1), "partitionId")]
        for requests, field in cases:
            assert set(requests) == methods  # every RPC of the service is covered
            for name, request in requests.items():
                if field in ("shuffleId", "partitionId") and name in ("appHeartbeat", "unregisterShuffleByAppId"):
                    continue  # these carry no shuffle or partition id
                if field == "partitionId" and name in ("commitShuffleTask", "finishShuffle", "unregisterShuffle"):
                    continue
                resp = await getattr(client.stub, name)(request)
                assert resp.status == S.INVALID_REQUEST, (name, field, resp)
                assert resp.retMsg.startswith(f"invalid {field}"), (name, resp.retMsg)
        conn = await UrpcConnection.open("127.0.0.1", srv.urpc_port)
        try:
            frames = {
                "send": lambda rid, a, s, p: urpc.encode_send_shuffle_data(rid, a, s, 1, [(p, [Block(1, 1, 1, 0, 1, b"x")])], 0),
                "index": lambda rid, a, s, p: urpc.encode_get_local_index(rid, a, s, p),
                "data": lambda rid, a, s, p: urpc.encode_get_local_data(rid, a, s, p, 0, 10),
                "data_v2": lambda rid, a, s, p: urpc.encode_get_local_data(rid, a, s, p, 0, 10, storage_id=0),
                "memory": lambda rid, a, s, p: urpc.encode_get_memory_data(rid, a, s, p, -1, 100),
            }
            for name, frame in frames.items():
                for ids, field in (((BAD_APP, 0, 0), "appId"), ((APP, -1, 0), "shuffleId"),
                                   ((APP, 0, -1), "partitionId")):
                    rid = conn.next_id()
                    r = await conn.request(frame(rid, *ids), rid)
                    assert r.status == S.INVALID_REQUEST, (name, field, r)
                    assert r.ret_msg.startswith(f"invalid {field}"), (name, r.ret_msg)
            assert not conn.closed.is_set()  # refusals, not violations: the connection goes on
        finally:
            await conn.close()
        await _another_app_works(client)
