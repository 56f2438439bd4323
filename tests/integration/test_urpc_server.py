"""The urpc listener (GRPC_NETTY data transport) against a real in-process server: every message, error paths.

Each test runs a fresh server (port 0, 2 disks, 4 MiB of memory) with ``urpc_port = 0``; the
``urpc_client`` drives it like ``ShuffleServerGrpcNettyClient`` (control on gRPC, data on urpc).
Cleanup is checked at the end of the data-path tests: purging every app leaves the server clean.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from riffle_actors.errors import StatusCode
from riffle_actors.protocol import urpc
from riffle_actors.protocol.index import decode_index as index_entries
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.records import Block
from riffle_actors.server import ShuffleServer
from riffle_actors.transport.listen import ListenError
from tests.conftest import stop_server
from tests.helpers import poll_until, wait_server_clean
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks, require_size
from tests.helpers.urpc_client import UrpcClient, UrpcConnection

pytestmark = pytest.mark.integration

S = StatusCode
T = urpc.MessageType
APP = "application_1700000000000_0002_1700000000001"
URPC = {"urpc_port": 0, "urpc_bind_address": "127.0.0.1"}
NO_READ_CHECK = {"read_crc_check_enable": False}  # the sendfile path (the check sends the bytes it read)


@pytest_asyncio.fixture
async def userver(server_factory) -> ShuffleServer:
    return await server_factory(**URPC)


@pytest_asyncio.fixture
async def uclient(userver: ShuffleServer) -> AsyncIterator[UrpcClient]:
    c = await UrpcClient(f"127.0.0.1:{userver.grpc_port}", userver.urpc_port).connect()
    yield c
    await c.close()


async def conn_to(server: ShuffleServer) -> UrpcConnection:
    return await UrpcConnection.open("127.0.0.1", server.urpc_port)


async def write_and_read(client: UniffleClient, app_id: str = APP, partitions=range(3), count: int = 12,
                         size: int = 3000, task: int = 1) -> list:
    await client.register_shuffle(app_id, 0, partitions)
    blocks = [b for p in partitions for b in make_blocks(p, task, count, size)]
    for i in range(0, len(blocks), 7):
        await client.send_blocks(app_id, 0, blocks[i:i + 7])
    await client.report(app_id, 0, task, blocks)
    ids = await client.get_shuffle_result(app_id, 0, partitions)
    for p in partitions:
        assert_read_matches(await client.read_partition(app_id, 0, p, ids), [b for b in blocks if b.partition_id == p])
    return blocks


async def purge_and_check_clean(server: ShuffleServer, client: UniffleClient) -> None:
    for app_id in list(server.directory):
        await client.unregister_app(app_id)
    await wait_server_clean(server)


# ---------------------------------------------------------------------------- the data path
async def test_write_then_read_from_memory_and_local_files_over_urpc(userver: ShuffleServer,
                                                                      uclient: UrpcClient) -> None:
    # 4 MiB of memory, 1M single-buffer spill size: part of every partition is on disk, part in memory
    blocks = await write_and_read(uclient, count=120, size=12_000)
    assert uclient.stub.index_types and set(uclient.stub.index_types) == {T.GET_LOCAL_SHUFFLE_INDEX_RESPONSE}
    info = {a["app_id"]: a for a in await userver.admin.apps()}[APP]
    assert info["disk_bytes"] > 0, "nothing was spilled: the local-file path was not exercised"
    assert info["received_bytes"] == require_size(blocks)  # data + 32 bytes a block
    assert 'rpc="urpc:sendShuffleData",status="SUCCESS"' in userver.metrics.render().decode()
    await purge_and_check_clean(userver, uclient)


async def test_grpc_reader_reads_what_urpc_wrote_and_back(userver: ShuffleServer, uclient: UrpcClient) -> None:
    blocks = await write_and_read(uclient, partitions=[0, 1], count=10)
    grpc_client = UniffleClient(f"127.0.0.1:{userver.grpc_port}")
    try:
        ids = await grpc_client.get_shuffle_result(APP, 0, [0, 1])
        for p in (0, 1):
            assert_read_matches(await grpc_client.read_partition(APP, 0, p, ids),
                                [b for b in blocks if b.partition_id == p])
        other = "app_written_over_grpc"
        written = await write_and_read(grpc_client, other, partitions=[2])
        ids = await uclient.get_shuffle_result(other, 0, [2])
        assert_read_matches(await uclient.read_partition(other, 0, 2, ids), written)
    finally:
        await grpc_client.close()
    await purge_and_check_clean(userver, uclient)


async def test_index_v2_and_data_v2_v3_requests(server_factory) -> None:
    srv = await server_factory(**URPC, urpc_config={"get_index_rpc_version": "V2"},
                               hybrid_store={"memory_single_buffer_max_spill_size": "1K"})
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        blocks = await write_and_read(c, partitions=[0], count=20)
        assert set(c.stub.index_types) == {T.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE}
        await poll_until(lambda: srv.budget.in_flight == 0 and srv.budget.used == 0, message="spills did not finish")
        conn = c.conn
        rid = conn.next_id()
        index = await conn.request(urpc.encode_get_local_index(rid, APP, 0, 0), rid)
        assert index.type == T.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE and len(index.storage_ids) == 1
        length = sum(len(b.data) for b in blocks[:3])
        for kw in ({"storage_id": index.storage_ids[0]},
                   {"storage_id": index.storage_ids[0], "next_segments": [(length, 100)], "task_attempt_id": 1}):
            rid = conn.next_id()
            r = await conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, 0, length, **kw), rid)
            assert (r.type, r.status) == (T.GET_LOCAL_SHUFFLE_DATA_RESPONSE, S.SUCCESS), r.ret_msg
            assert bytes(r.body) == b"".join(b.data for b in blocks[:3])
    finally:
        await c.close()


async def test_many_requests_in_flight_on_one_connection_are_answered_by_request_id(
        userver: ShuffleServer, uclient: UrpcClient) -> None:
    await uclient.register_shuffle(APP, 0, range(8))
    blocks = [b for p in range(8) for b in make_blocks(p, 1, 5, 2000)]
    conn = uclient.conn
    sends = []
    for p in range(8):
        mine = [b for b in blocks if b.partition_id == p]
        ticket = await uclient.require_buffer(APP, 0, uclient.send_require_size(APP, 0, mine))
        rid = conn.next_id()
        parts = [(p, [Block(b.block_id, len(b.data), b.uncompress_length, b.crc, b.task_attempt_id, b.data)
                      for b in mine])]
        sends.append(conn.request(urpc.encode_send_shuffle_data(rid, APP, 0, ticket, parts, 0), rid))
    # all eight frames are written before any reply is awaited
    replies = await asyncio.gather(*sends)
    assert [(r.type, r.status) for r in replies] == [(T.RPC_RESPONSE, S.SUCCESS)] * 8
    reads = []
    for p in range(8):
        rid = conn.next_id()
        reads.append((p, rid, conn.request(urpc.encode_get_memory_data(rid, APP, 0, p, -1, 1 << 20), rid)))
    results = await asyncio.gather(*(r for _, _, r in reads))
    for (p, rid, _), r in zip(reads, results):
        assert r.request_id == rid and r.type == T.GET_MEMORY_SHUFFLE_DATA_RESPONSE
        assert [s[0] for s in r.segments] == [b.block_id for b in blocks if b.partition_id == p]
    assert not conn.unmatched
    await purge_and_check_clean(userver, uclient)


async def _spilled_partition(srv: ShuffleServer, c: UrpcClient, count: int, size: int) -> bytes:
    """Write one partition that ends up wholly on disk; its data file's bytes, in index order."""
    await c.register_shuffle(APP, 0, [0])
    blocks = make_blocks(0, 1, count, size)
    for i in range(0, len(blocks), 8):
        await c.send_blocks(APP, 0, blocks[i:i + 8])
    await poll_until(lambda: srv.budget.in_flight == 0 and srv.budget.used == 0, message="spills did not finish")
    rid = c.conn.next_id()
    index = await c.conn.request(urpc.encode_get_local_index(rid, APP, 0, 0), rid)
    by_id = {b.block_id: b.data for b in blocks}
    entries = index_entries(bytes(index.body))
    assert sum(e.length for e in entries) == index.data_file_len == len(blocks) * size
    return b"".join(by_id[e.block_id] for e in entries)


@pytest.mark.parametrize("sendfile, checked", [(True, False), (False, False), (True, True)])
async def test_local_data_replies_are_byte_exact_by_sendfile_and_by_copy(server_factory, sendfile: bool,
                                                                         checked: bool) -> None:
    # read_crc_check_enable (default on) reads and checks the bytes it sends: no sendfile then
    srv = await server_factory(**URPC, urpc_config={"sendfile_enable": sendfile}, memory_store={"capacity": "16M"},
                               hybrid_store={"memory_single_buffer_max_spill_size": "1K"},
                               localfile_store={"read_crc_check_enable": checked})
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        data = await _spilled_partition(srv, c, count=160, size=50_000)  # 8 MB: above the socket's buffer
        conn = c.conn
        ranges = [(0, len(data)), (0, 0), (1, 4095), (4097, 3 << 20), (len(data) - 7, 7), (12345, 1 << 20)] * 3
        calls = []
        for offset, length in ranges:  # all written before any reply is read: several in flight at once
            rid = conn.next_id()
            calls.append(conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, offset, length), rid))
            rid = conn.next_id()  # replies of other types interleave with the file sends
            calls.append(conn.request(urpc.encode_get_memory_data(rid, APP, 0, 0, -1, 1 << 20), rid))
        replies = await asyncio.gather(*calls)
        for (offset, length), r in zip(ranges, replies[::2]):
            assert (r.type, r.status) == (T.GET_LOCAL_SHUFFLE_DATA_RESPONSE, S.SUCCESS), r.ret_msg
            assert bytes(r.body) == data[offset:offset + length]
        assert all(r.type == T.GET_MEMORY_SHUFFLE_DATA_RESPONSE for r in replies[1::2])
        assert not conn.unmatched
        u = srv._urpc
        if sendfile and not checked:
            assert u.sendfile_replies > 0
        else:
            assert u.sendfile_replies == u.copied_replies == 0  # read by the disk actor, as over gRPC
        # a range beyond the file is an error reply, and the connection goes on
        rid = conn.next_id()
        r = await conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, len(data) - 1, 2), rid)
        assert r.type == T.GET_LOCAL_SHUFFLE_DATA_RESPONSE and r.status == S.INVALID_REQUEST and "past the end" in r.ret_msg
        rid = conn.next_id()
        r = await conn.request(urpc.encode_get_local_data(rid, APP, 0, 0, 0, 10), rid)
        assert r.status == S.SUCCESS and bytes(r.body) == data[:10]
        await purge_and_check_clean(srv, c)
    finally:
        await c.close()


async def test_a_client_that_stops_reading_holds_its_sendfile_reply_until_it_reads(server_factory) -> None:
    srv = await server_factory(**URPC, memory_store={"capacity": "16M"},
                               hybrid_store={"memory_single_buffer_max_spill_size": "1K"},
                               localfile_store=NO_READ_CHECK)
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    try:
        data = await _spilled_partition(srv, c, count=100, size=60_000)
        # a raw socket with a small receive buffer that reads nothing until the server is stuck on it
        sock = socket.create_connection(("127.0.0.1", srv.urpc_port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        try:
            sock.sendall(urpc.encode_get_local_data(7, APP, 0, 0, 0, len(data)))
            await poll_until(lambda: srv._urpc.sendfile_replies == 1, message="no sendfile reply started")
            got = bytearray()
            loop = asyncio.get_running_loop()
            sock.setblocking(False)
            while True:
                chunk = await loop.sock_recv(sock, 1 << 20)
                assert chunk, "the server closed the connection"
                got += chunk
                if len(got) >= urpc.HEADER_SIZE:
                    h = urpc.decode_header(bytes(got[:urpc.HEADER_SIZE]))
                    if len(got) >= urpc.HEADER_SIZE + h.frame_len:
                        break
            r = urpc.decode_response(h.type, bytes(got[urpc.HEADER_SIZE:]), h.msg_len)
            assert (r.request_id, r.status) == (7, S.SUCCESS) and bytes(r.body) == data
        finally:
            sock.close()
        await purge_and_check_clean(srv, c)
    finally:
        await c.close()


async def test_stopping_the_server_ends_a_sendfile_stuck_on_a_client_that_reads_nothing(server_factory) -> None:
    srv = await server_factory(**URPC, memory_store={"capacity": "16M"},
                               hybrid_store={"memory_single_buffer_max_spill_size": "1K"},
                               localfile_store=NO_READ_CHECK)
    c = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    sock = socket.create_connection(("127.0.0.1", srv.urpc_port))
    try:
        data = await _spilled_partition(srv, c, count=100, size=60_000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.sendall(urpc.encode_get_local_data(7, APP, 0, 0, 0, len(data)))
        await poll_until(lambda: srv._urpc.sendfile_replies == 1, message="no sendfile reply started")

        def senders() -> list[threading.Thread]:
            return [t for t in threading.enumerate() if t.name.startswith("urpc-sendfile")]

        assert senders()
        await c.close()
        await stop_server(srv)  # the stall timeout is 60 s: only the socket's shutdown can end it this soon
        await poll_until(lambda: not any(t.is_alive() and _busy(t) for t in senders()),
                         message="a send-pool thread is still blocked on the socket")
    finally:
        sock.close()


def _busy(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "_send_frame":
            return True
        frame = frame.f_back
    return False


# ---------------------------------------------------------------------------- error statuses, typed replies
async def test_unknown_app_gets_no_register_in_the_reply_type_of_each_request(userver: ShuffleServer) -> None:
    conn = await conn_to(userver)
    try:
        frames = {
            T.RPC_RESPONSE: lambda rid: urpc.encode_send_shuffle_data(
                rid, "nobody", 0, 1, [(0, [Block(1, 3, 3, 0, 1, b"abc")])], 0),
            T.GET_LOCAL_SHUFFLE_INDEX_RESPONSE: lambda rid: urpc.encode_get_local_index(rid, "nobody", 0, 0),
            T.GET_LOCAL_SHUFFLE_DATA_RESPONSE: lambda rid: urpc.encode_get_local_data(rid, "nobody", 0, 0, 0, 10),
            T.GET_MEMORY_SHUFFLE_DATA_RESPONSE: lambda rid: urpc.encode_get_memory_data(rid, "nobody", 0, 0, -1, 100),
        }
        for want_type, make in frames.items():
            rid = conn.next_id()
            r = await conn.request(make(rid), rid)
            assert (r.type, r.request_id, r.status) == (want_type, rid, S.NO_REGISTER), r.ret_msg
            assert len(r.body) == 0 and "nobody" in r.ret_msg
        rid = conn.next_id()
        sorted_req = urpc.HEADER.pack(8 + 4 + 1, T.GET_SORTED_SHUFFLE_DATA_REQUEST, 0) + struct.pack(
            ">qi", rid, 1) + b"a"
        r = await conn.request(sorted_req, rid)
        assert (r.type, r.status, r.ret_msg) == (T.GET_SORTED_SHUFFLE_DATA_RESPONSE, S.INTERNAL_ERROR,
                                                 "Remote merge is disabled")
    finally:
        await conn.close()


async def test_bad_and_small_tickets_are_refused_and_nothing_is_stored(userver: ShuffleServer,
                                                                      uclient: UrpcClient) -> None:
    await uclient.register_shuffle(APP, 0, [0])
    conn = uclient.conn
    blocks = make_blocks(0, 1, 4, 5000)
    parts = [(0, [Block(b.block_id, len(b.data), b.uncompress_length, b.crc, b.task_attempt_id, b.data)
                  for b in blocks])]
    rid = conn.next_id()
    r = await conn.request(urpc.encode_send_shuffle_data(rid, APP, 0, 987654, parts, 0), rid)
    assert (r.type, r.status) == (T.RPC_RESPONSE, S.INTERNAL_ERROR), r.ret_msg
    ticket = await uclient.require_buffer(APP, 0, require_size(blocks) - 1)
    rid = conn.next_id()
    r = await conn.request(urpc.encode_send_shuffle_data(rid, APP, 0, ticket, parts, 0), rid)
    assert (r.type, r.status) == (T.RPC_RESPONSE, S.INVALID_REQUEST), r.ret_msg
    # exactly Σ(len + 32) is enough; the client's netty ticket (+ message size) is too (other tests)
    ticket = await uclient.require_buffer(APP, 0, require_size(blocks))
    rid = conn.next_id()
    r = await conn.request(urpc.encode_send_shuffle_data(rid, APP, 0, ticket, parts, 0), rid)
    assert r.status == S.SUCCESS, r.ret_msg
    await purge_and_check_clean(userver, uclient)


async def test_undecodable_request_is_answered_invalid_request_and_the_connection_stays(
        userver: ShuffleServer, uclient: UrpcClient) -> None:
    conn = uclient.conn
    rid = conn.next_id()
    good = urpc.encode_send_shuffle_data(rid, APP, 0, 1, [(0, [Block(1, 3, 3, 0, 1, b"abc")])], 0)
    msg = bytearray(good[urpc.HEADER_SIZE:])
    struct.pack_into(">i", msg, 8 + 4 + len(APP) + 4 + 8, 1_000_000)  # partitionCount that cannot fit
    r = await conn.request(urpc.HEADER.pack(len(msg), T.SEND_SHUFFLE_DATA_REQUEST, 0) + bytes(msg), rid)
    assert (r.type, r.status) == (T.RPC_RESPONSE, S.INVALID_REQUEST) and "partitionCount" in r.ret_msg
    await write_and_read(uclient, partitions=[0], count=3)
    await purge_and_check_clean(userver, uclient)


async def test_large_frames_reuse_pooled_receive_buffers_and_every_block_reads_back_intact(
        userver: ShuffleServer, uclient: UrpcClient) -> None:
    # 7 blocks of 30 KB per send: every frame (~210 KB) is larger than the connection's 64 KiB buffer,
    # so it is received into a pooled buffer; one-partition and three-partition frames alternate
    u = userver._urpc
    await uclient.register_shuffle(APP, 0, range(3))
    blocks = [b for p in range(3) for b in make_blocks(p, 1, 14, 30_000)]
    one = [blocks[i:i + 7] for i in range(0, 42, 7)]  # each of one partition
    mixed = [[b for p in range(3) for b in make_blocks(p, 2, 3, 30_000, seq_start=10 * k)] for k in range(4)]
    for group in one + mixed:
        await uclient.send_blocks(APP, 0, group)
        assert u.inflight_bytes + u.pool.idle_bytes <= u.max_inflight_bytes
    assert u.pool.reused >= 8 and u.pool.allocated <= 2  # one buffer, reused (two if a send overlapped)
    await poll_until(lambda: u.inflight_bytes == 0, message="budget not released")
    written = blocks + [b for g in mixed for b in g]
    await uclient.report(APP, 0, 1, blocks)
    await uclient.report(APP, 0, 2, [b for g in mixed for b in g])
    ids = await uclient.get_shuffle_result(APP, 0, range(3))
    for p in range(3):  # byte-exact: a reused buffer overwrote nothing a partition still holds
        assert_read_matches(await uclient.read_partition(APP, 0, p, ids), [b for b in written if b.partition_id == p])
    await purge_and_check_clean(userver, uclient)


async def test_oversized_frame_is_answered_and_skipped_without_being_buffered(server_factory) -> None:
    srv = await server_factory(**URPC, grpc_max_message_size="1M")
    conn = await conn_to(srv)
    try:
        rid = conn.next_id()
        size = 3 << 20
        head = urpc.HEADER.pack(size, T.SEND_SHUFFLE_DATA_REQUEST, 0) + struct.pack(">q", rid)
        fut = asyncio.ensure_future(conn.request(head, rid))
        r = await fut  # answered as soon as the requestId arrived
        assert (r.type, r.status) == (T.RPC_RESPONSE, S.INVALID_REQUEST) and "1048576" in r.ret_msg
        await conn.send_raw(bytes(size - 8))  # the rest of that frame is skipped
        assert srv._urpc.inflight_bytes == 0
        rid = conn.next_id()
        r = await conn.request(urpc.encode_get_memory_data(rid, "nobody", 0, 0, -1, 100), rid)
        assert (r.request_id, r.status) == (rid, S.NO_REGISTER)
    finally:
        await conn.close()


@pytest.mark.parametrize("garbage", [
    b"\xff" * 64,  # negative msgLen
    urpc.HEADER.pack(10, 99, 0) + bytes(10),  # unknown type
    urpc.HEADER.pack(0, 3, 0),  # empty frame
    urpc.HEADER.pack(20, T.GET_LOCAL_SHUFFLE_INDEX_RESPONSE, 0) + bytes(20),  # a response type
])
async def test_garbage_closes_that_connection_and_a_new_one_works(userver: ShuffleServer, garbage: bytes) -> None:
    bad = await conn_to(userver)
    try:
        await bad.send_raw(garbage)
        await asyncio.wait_for(bad.closed.wait(), 10)
    finally:
        await bad.close()
    c = await UrpcClient(f"127.0.0.1:{userver.grpc_port}", userver.urpc_port).connect()
    try:
        await write_and_read(c, partitions=[1], count=3)
        await purge_and_check_clean(userver, c)
    finally:
        await c.close()
    assert userver.escalated is None


async def test_connections_above_the_limit_are_closed_and_the_others_keep_working(server_factory) -> None:
    srv = await server_factory(**URPC, urpc_config={"max_connections": 2})
    c1 = await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect()
    c2 = await conn_to(srv)
    extra = await conn_to(srv)
    try:
        await asyncio.wait_for(extra.closed.wait(), 10)
        assert srv._urpc.refused_connections == 1
        await write_and_read(c1, partitions=[0], count=3)
    finally:
        for c in (c1, c2, extra):
            await c.close()
    await poll_until(lambda: not srv._urpc.connections, message="connections not released")
    again = await conn_to(srv)  # slots are given back
    try:
        rid = again.next_id()
        r = await again.request(urpc.encode_get_local_index(rid, "nobody", 0, 0), rid)
        assert r.status == S.NO_REGISTER
    finally:
        await again.close()


async def test_large_frames_beyond_the_inflight_budget_wait_then_succeed(server_factory) -> None:
    srv = await server_factory(**URPC, capacity="64M", urpc_config={"max_inflight_bytes": "1M"})
    clients = [await UrpcClient(f"127.0.0.1:{srv.grpc_port}", srv.urpc_port).connect() for _ in range(4)]
    try:
        await clients[0].register_shuffle(APP, 0, range(4))
        per_client = [[b for b in make_blocks(p, p + 1, 6, 200_000)] for p in range(4)]  # 1.2 MB frames

        async def push(c: UrpcClient, blocks: list) -> None:
            for i in range(0, len(blocks), 3):
                await c.send_blocks(APP, 0, blocks[i:i + 3])

        # a half-received 500 KB frame holds half the budget: the next 600 KB frame must wait for it
        holder = await conn_to(srv)
        await holder.send_raw(urpc.HEADER.pack(500_000, T.SEND_SHUFFLE_DATA_REQUEST, 0) + bytes(100_000))
        await poll_until(lambda: srv._urpc.inflight_bytes == 500_000, message="the holding frame not started")
        waits = srv._urpc.budget_waits
        first = asyncio.ensure_future(clients[0].send_blocks(APP, 0, per_client[0][:3]))
        await poll_until(lambda: srv._urpc.budget_waits == waits + 1, message="the second frame did not wait")
        assert not first.done() and srv._urpc.inflight_bytes == 500_000  # it waits, holding nothing
        await holder.close()  # the budget comes back: the waiting frame goes on
        await asyncio.wait_for(first, 30)
        await poll_until(lambda: srv._urpc.inflight_bytes == 0, message="budget not released")
        await push(clients[0], per_client[0][3:])
        await asyncio.gather(*(push(c, b) for c, b in zip(clients[1:], per_client[1:])))
        assert srv._urpc.inflight_bytes == 0
        for p, blocks in enumerate(per_client):
            await clients[0].report(APP, 0, p + 1, blocks)
        ids = await clients[0].get_shuffle_result(APP, 0, range(4))
        for p, blocks in enumerate(per_client):
            assert_read_matches(await clients[p].read_partition(APP, 0, p, ids), blocks)
        await purge_and_check_clean(srv, clients[0])
    finally:
        for c in clients:
            await c.close()


async def test_a_connection_closed_mid_frame_gives_its_budget_back(userver: ShuffleServer) -> None:
    conn = await conn_to(userver)
    await conn.send_raw(urpc.HEADER.pack(500_000, T.SEND_SHUFFLE_DATA_REQUEST, 0) + bytes(100_000))
    await poll_until(lambda: userver._urpc.inflight_bytes == 500_000, message="frame not started")
    await conn.close()
    await poll_until(lambda: userver._urpc.inflight_bytes == 0, message="budget of a cut frame not released")


# ---------------------------------------------------------------------------- listener and advertising
async def test_urpc_port_in_use_names_its_config_keys(server_factory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ListenError, match="urpc_port / urpc_bind_address") as e:
            await server_factory(urpc_port=port, urpc_bind_address="127.0.0.1")
        assert "address already in use" in str(e.value)


async def test_urpc_is_off_unless_configured_and_advertised_when_on(server_factory) -> None:
    off = await server_factory()
    assert off.urpc_port == 0 and off._urpc is None
    snap = off.admin.heartbeat_snapshot()
    assert snap.netty_port == 0 and "GRPC_NETTY" not in snap.all_tags
    on = await server_factory(**URPC)
    snap = on.admin.heartbeat_snapshot()
    assert snap.netty_port == on.urpc_port > 0
    assert {"GRPC", "GRPC_NETTY", "ss_v5"} <= set(snap.all_tags)
    assert snap.server_id == f"{snap.ip}-{on.grpc_port}-{on.urpc_port}"


async def test_grpc_still_serves_everything_when_urpc_is_on(userver: ShuffleServer) -> None:
    c = UniffleClient(f"127.0.0.1:{userver.grpc_port}")
    try:
        await write_and_read(c, partitions=[0, 1], count=4)
        resp = await c.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
            appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=2))
        assert resp.status == S.SUCCESS
        await purge_and_check_clean(userver, c)
    finally:
        await c.close()


async def test_a_memory_read_over_urpc_keeps_only_the_expected_tasks_blocks(userver: ShuffleServer,
                                                                             uclient: UrpcClient) -> None:
    """``expectedTaskIds`` on the urpc memory read is a Roaring64 bitmap, decoded as over gRPC (it was
    once used as raw bytes: task ids above 255 failed, smaller ones matched bytes of the bitmap)."""
    from riffle_actors.protocol.bitmap import serialize_block_ids

    await uclient.register_shuffle(APP, 0, [1])
    t7, t300, t1000 = (make_blocks(1, task, 2, 200) for task in (7, 300, 1000))
    await uclient.send_blocks(APP, 0, [t7[0], t300[0], t1000[0], t7[1], t300[1], t1000[1]])

    async def read(task_ids: list[int] | None) -> tuple[int, list[int]]:
        extra = {} if task_ids is None else {"serializedExpectedTaskIdsBitmap": serialize_block_ids(task_ids)}
        resp = await uclient.stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
            appId=APP, shuffleId=0, partitionId=1, lastBlockId=-1, readBufferSize=1 << 20, **extra))
        return resp.status, [s.blockId for s in resp.shuffleDataBlockSegments]

    assert await read([300, 1000]) == (S.SUCCESS, [b.block_id for b in (t300[0], t1000[0], t300[1], t1000[1])])
    assert await read([7]) == (S.SUCCESS, [t7[0].block_id, t7[1].block_id])
    assert (await read(None))[1] == [b.block_id for b in (t7[0], t300[0], t1000[0], t7[1], t300[1], t1000[1])]
    await purge_and_check_clean(userver, uclient)
