"""Issue 17's transport-level exhaustion attacks against a real server process, each with its bound.

- Partial frames: connections that send only the header of a 60 MiB SendShuffleData reserve the
  shared ``max_inflight_bytes``; ``frame_read_timeout_sec`` closes them and another client's large
  send then completes. A frame dripping in below ``frame_read_min_bytes_per_sec`` is closed too.
- Idle sockets: a flood that takes every ``max_connections`` slot (some never send a frame, some
  send one and go quiet) is closed after ``frame_read_timeout_sec`` / ``idle_timeout_sec``, and a
  new client is then served. One source address gets at most ``max_connections_per_address`` of them.
- Replies nobody takes: a urpc client pipelining GetLocalShuffleData and never reading its socket,
  and an HTTP/2 client opening many getLocalShuffleData streams and never granting flow-control
  window, grow the server's peak RSS by less than 150 MB (replies are bounded per connection by
  ``[urpc_config] max_reply_bytes_per_connection`` / ``grpc_max_reply_bytes_per_connection``), and
  another app still reads byte-exact meanwhile.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from riffle_actors.errors import StatusCode
from riffle_actors.protocol import urpc
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.daemon import ServerProcess, server_process
from tests.helpers.urpc_client import UrpcClient

pytestmark = pytest.mark.integration

APP = "application_1700000000000_0017_1700000000001"
MiB = 1 << 20
T = urpc.MessageType


Server = ServerProcess


@contextmanager
def server(tmp_path: Path, top: str = "", urpc_config: str = "") -> Iterator[Server]:
    """A ``riffle_actors.server`` process (MEMORY_LOCALFILE, everything spilled at once, urpc on)."""
    with server_process(tmp_path, top=top, urpc_config=urpc_config, urpc=True,
                        memory_store="app_buffer_ticket_max_ratio = 1.0  # the test app may reserve the whole budget",
                        tables='[hybrid_store]\nmemory_single_buffer_max_spill_size = "1K"') as srv:
        yield srv


async def _spilled_partition(srv: Server, app_id: str, count: int, size: int) -> tuple[list, int]:
    """One partition written over gRPC and wholly on disk; its blocks and data file length."""
    async with UniffleClient(srv.target) as c:
        await c.register_shuffle(app_id, 0, [0])
        blocks = make_blocks(0, 1, count, size)
        for i in range(0, len(blocks), 8):
            await c.send_blocks(app_id, 0, blocks[i:i + 8])

        async def on_disk() -> bool:
            r = await c.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
                appId=app_id, shuffleId=0, partitionId=0, partitionNumPerRange=1, partitionNum=1))
            return r.status == StatusCode.SUCCESS and r.dataFileLen == count * size
        await poll_until(on_disk, timeout=60, interval=0.05, message="the partition did not reach the disk")
    return blocks, count * size


async def _bystander_reads(srv: Server, app_id: str, blocks: list, *, over_urpc: bool) -> None:
    """Another app (or the same data by another client) reads back byte-exact."""
    c = (await UrpcClient(srv.target, srv.urpc_port).connect()) if over_urpc else UniffleClient(srv.target)
    try:
        await c.report(app_id, 0, 1, blocks)
        ids = await c.get_shuffle_result(app_id, 0, [0])
        assert_read_matches(await c.read_partition(app_id, 0, 0, ids), blocks)
    finally:
        await c.close()


async def _closed_by_server(sock: socket.socket, timeout: float) -> None:
    """Wait until the server closed ``sock`` (EOF or reset), discarding whatever it sent before."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)

    async def eof() -> None:
        while True:
            try:
                if not await loop.sock_recv(sock, 1 << 16):
                    return
            except ConnectionError:
                return
    await asyncio.wait_for(eof(), timeout)


# ---------------------------------------------------------------------------- partial frames
async def test_partial_headers_are_cut_off_and_a_large_send_then_completes(tmp_path: Path) -> None:
    with server(tmp_path, urpc_config='frame_read_timeout_sec = 2\nmax_inflight_bytes = "256M"') as srv:
        # 5 headers of 60 MiB frames: 4 of them take 240 of the 256 MiB, the fifth waits
        attackers = [socket.create_connection(("127.0.0.1", srv.urpc_port)) for _ in range(5)]
        try:
            for s in attackers:
                s.sendall(urpc.HEADER.pack(60 * MiB, T.SEND_SHUFFLE_DATA_REQUEST, 0) + struct.pack(">q", 1))
            c = await UrpcClient(srv.target, srv.urpc_port).connect()
            try:
                await c.register_shuffle(APP, 0, [0])
                blocks = make_blocks(0, 1, 24, 1 * MiB)  # one 24 MiB frame: needs the budget the headers hold
                await asyncio.wait_for(c.send_blocks(APP, 0, blocks), 30)
                await c.report(APP, 0, 1, blocks)
                ids = await c.get_shuffle_result(APP, 0, [0])
                assert_read_matches(await c.read_partition(APP, 0, 0, ids), blocks)
            finally:
                await c.close()
            for s in attackers:
                await _closed_by_server(s, 30)
            assert srv.metric("riffle_server_rpc_total", rpc="urpc:frame_timeout", status="CLOSED") >= 4
            assert "frame_read_timeout_sec" in srv.log.read_text()
        finally:
            for s in attackers:
                s.close()


async def test_a_frame_dripping_in_below_the_minimum_rate_is_closed(tmp_path: Path) -> None:
    with server(tmp_path, urpc_config='frame_read_timeout_sec = 120\nframe_read_min_bytes_per_sec = "64K"') as srv:
        sock = socket.create_connection(("127.0.0.1", srv.urpc_port))
        closed = threading.Event()
        try:
            sock.sendall(urpc.HEADER.pack(4 * MiB, T.SEND_SHUFFLE_DATA_REQUEST, 0))

            def drip() -> None:  # 1 KiB every 50 ms: 20 KiB/s, far below 64 KiB/s
                with suppress(OSError):
                    while not closed.wait(0.05):
                        sock.send(bytes(1024))
            t = threading.Thread(target=drip, daemon=True)
            t.start()
            await poll_until(lambda: srv.metric("riffle_server_rpc_total", rpc="urpc:frame_slow", status="CLOSED"),
                             timeout=30, interval=0.2, message="the slow frame was not closed")
            closed.set()
            t.join(10)
            await _closed_by_server(sock, 10)
            assert "frame_read_min_bytes_per_sec" in srv.log.read_text()
        finally:
            closed.set()
            sock.close()


# ---------------------------------------------------------------------------- idle sockets
async def test_an_idle_socket_flood_is_closed_and_new_clients_are_served(tmp_path: Path) -> None:
    with server(tmp_path, urpc_config="max_connections = 32\nframe_read_timeout_sec = 2\nidle_timeout_sec = 2") as srv:
        socks = [socket.create_connection(("127.0.0.1", srv.urpc_port)) for _ in range(32)]
        try:
            for s in socks[:16]:  # half do one real request, then go quiet
                s.sendall(urpc.encode_get_memory_data(1, APP, 0, 0, -1, 1024))
                head = s.recv(urpc.HEADER_SIZE, socket.MSG_WAITALL)
                assert len(head) == urpc.HEADER_SIZE
            extra = socket.create_connection(("127.0.0.1", srv.urpc_port))  # every slot is taken
            await _closed_by_server(extra, 10)
            extra.close()
            for s in socks:
                await _closed_by_server(s, 30)
            assert srv.metric("riffle_server_rpc_total", rpc="urpc:idle", status="CLOSED") == 16
            assert srv.metric("riffle_server_rpc_total", rpc="urpc:no_frame", status="CLOSED") == 16
            blocks, _ = await _spilled_partition(srv, APP, 8, 10_000)
            await _bystander_reads(srv, APP, blocks, over_urpc=True)
        finally:
            for s in socks:
                s.close()


def _served(sock: socket.socket) -> bool:
    """Whether the server answers one urpc request on ``sock`` (a memory read of an unknown app)."""
    sock.settimeout(30)
    sock.sendall(urpc.encode_get_memory_data(1, APP, 0, 0, -1, 1024))
    return len(sock.recv(urpc.HEADER_SIZE, socket.MSG_WAITALL)) == urpc.HEADER_SIZE


async def test_one_address_cannot_take_every_connection_slot(tmp_path: Path) -> None:
    with server(tmp_path, urpc_config="max_connections = 16\nmax_connections_per_address = 4") as srv:
        mine = [socket.create_connection(("127.0.0.1", srv.urpc_port)) for _ in range(4)]
        others: list[socket.socket] = []
        try:
            assert all(_served(s) for s in mine)
            extra = socket.create_connection(("127.0.0.1", srv.urpc_port))  # a fifth from 127.0.0.1
            await _closed_by_server(extra, 10)
            extra.close()
            assert srv.metric("riffle_server_rpc_total", rpc="urpc:connection_per_address", status="REFUSED") == 1
            assert "max_connections_per_address" in srv.log.read_text()
            # another source address still gets its connections (the server's slots are not all taken)
            for _ in range(4):
                other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                others.append(other)
                other.bind(("127.0.0.2", 0))
                other.connect(("127.0.0.1", srv.urpc_port))
                assert _served(other)
            # a slot given back is free for that address again
            mine.pop().close()

            def admitted() -> bool:
                again = socket.create_connection(("127.0.0.1", srv.urpc_port))
                try:
                    if _served(again):
                        mine.append(again)
                        return True
                except OSError:
                    pass  # refused: the server has not seen the close yet
                again.close()
                return False
            await poll_until(admitted, timeout=30, interval=0.1, message="the closed connection's slot was not given back")
        finally:
            for s in mine + others:
                s.close()


# ---------------------------------------------------------------------------- replies nobody takes
READS = 64  # requests per attacking connection


def _completed_reads(srv: Server, rpc: str) -> float:
    return srv.metric("riffle_server_rpc_total", rpc=rpc, status="SUCCESS")


async def test_a_urpc_client_that_never_reads_its_replies_is_bounded(tmp_path: Path) -> None:
    with server(tmp_path, urpc_config='max_reply_bytes_per_connection = "32M"') as srv:
        blocks, length = await _spilled_partition(srv, APP, 56, 256 << 10)  # 14 MiB, the client's read size
        before = srv.vm_hwm()
        attackers = []
        try:
            for _ in range(2):
                s = socket.create_connection(("127.0.0.1", srv.urpc_port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
                s.sendall(b"".join(urpc.encode_get_local_data(i, APP, 0, 0, 0, length) for i in range(READS)))
                attackers.append(s)
            # the server did all it will do: each connection holds its limit (or, unbounded, every read was served)
            await poll_until(lambda: srv.metric("riffle_server_held_reply_bytes") >= 2 * 28 * MiB
                             or _completed_reads(srv, "urpc:getLocalShuffleData") >= 2 * READS,
                             timeout=120, interval=0.2, message="the reads did not start")
            await _bystander_reads(srv, APP, blocks, over_urpc=True)
            grown = srv.vm_hwm() - before
            print(f"peak RSS grew by {grown / MiB:.0f} MiB for replies nobody reads")
            assert grown < 150 * MiB, f"peak RSS grew by {grown >> 20} MiB for replies nobody reads"
            assert _completed_reads(srv, "urpc:getLocalShuffleData") < 2 * READS
        finally:
            for s in attackers:
                s.close()
        await poll_until(lambda: srv.metric("riffle_server_held_reply_bytes") == 0, timeout=30, interval=0.2,
                         message="the closed connections' reply bytes were not given back")


def _h2_streams(port: int, path: str, body: bytes, n: int) -> tuple[socket.socket, threading.Thread]:
    """An HTTP/2 client that opens ``n`` gRPC streams and never grants flow-control window (stream window
    0; the connection's 64 KiB is never topped up). It keeps answering SETTINGS and PINGs."""
    sock = socket.create_connection(("127.0.0.1", port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    conn.initiate_connection()
    message = b"\0" + struct.pack(">I", len(body)) + body
    for _ in range(n):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
                                ("te", "trailers")])
        conn.send_data(sid, message, end_stream=True)
    sock.sendall(conn.data_to_send())

    def pump() -> None:
        with suppress(Exception):  # ends when the socket is closed
            while data := sock.recv(1 << 16):
                conn.receive_data(data)
                if out := conn.data_to_send():
                    sock.sendall(out)
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return sock, t


async def test_an_http2_client_that_never_grants_window_is_bounded(tmp_path: Path) -> None:
    top = 'reply_wait_timeout_sec = 2'  # grpc_max_reply_bytes_per_connection: the default (64M)
    with server(tmp_path, top=top) as srv:
        blocks, length = await _spilled_partition(srv, APP, 56, 256 << 10)
        before = srv.vm_hwm()
        request = pb.GetLocalShuffleDataRequest(appId=APP, shuffleId=0, partitionId=0, partitionNumPerRange=1,
                                                partitionNum=1, offset=0, length=length).SerializeToString()
        sock, pump = _h2_streams(srv.grpc_port, "/rss.common.ShuffleServer/getLocalShuffleData", request, 100)
        try:
            await poll_until(lambda: srv.metric("riffle_server_held_reply_bytes") >= 4 * length  # 2 replies, 2 copies each
                             or _completed_reads(srv, "getLocalShuffleData") >= 100,
                             timeout=120, interval=0.2, message="the reads did not start")
            await _bystander_reads(srv, APP, blocks, over_urpc=False)
            grown = srv.vm_hwm() - before
            print(f"peak RSS grew by {grown / MiB:.0f} MiB for replies nobody acknowledges")
            assert grown < 150 * MiB, f"peak RSS grew by {grown >> 20} MiB for replies nobody acknowledges"
            # the streams beyond the connection's budget were answered NO_BUFFER (queued behind the window)
            await poll_until(lambda: srv.metric("riffle_server_rpc_total", rpc="getLocalShuffleData",
                                                status="NO_BUFFER") >= 90,
                             timeout=60, interval=0.2, message="the waiting reads were not refused")
        finally:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the pump thread's recv; close alone would not
            sock.close()
            pump.join(10)
        await poll_until(lambda: srv.metric("riffle_server_held_reply_bytes") == 0, timeout=30, interval=0.2,
                         message="the closed connection's reply bytes were not given back")
