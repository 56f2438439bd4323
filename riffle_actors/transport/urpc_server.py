"""The urpc adapter: Uniffle's Netty data transport (client type ``GRPC_NETTY``) on ``urpc_port``.

Thin like the gRPC adapter: frames are decoded by ``riffle_actors.protocol.urpc``, every request
calls the same ``ShuffleService`` method as its gRPC twin, and every failure becomes a status
through ``transport.rpc_answer.failure_status``. The reply always has the response type the client expects for its
request (spec §6.5), errors included. Served: SendShuffleData (3), GetLocalShuffleIndex (4; reply
14, or 23 with ``[urpc_config] get_index_rpc_version = "V2"``), GetLocalShuffleData (5, 24, 25;
reply 15), GetMemoryShuffleData (6; reply 16); GetSortedShuffleData (21) is answered 22
INTERNAL_ERROR "Remote merge is disabled", as the Java server without remote merge does.

One ``UrpcConnection`` (an ``asyncio.BufferedProtocol``) per TCP connection:

- Frames are read into preallocated memory. Small frames land in a 64 KiB buffer reused for the
  life of the connection; a frame that does not fit is read by the kernel straight into a receive
  buffer taken from the server's ``RecvPool`` (reused across frames and connections, so it is
  neither zero-filled nor faulted in again). A SendShuffleData is decoded columnar
  (``records.BlockBatch``) as soon as its last byte arrived, and each partition's payloads are
  copied once into a buffer of exactly their size (``protocol.urpc.detach_partitions``): nothing
  refers to the receive buffer afterwards, so it goes back to the pool at once, and a partition
  left in memory never keeps more resident than the memory budget counts. The pool's idle buffers
  count in ``max_inflight_bytes`` with the frames being received (it drops idle buffers to make
  room), and a buffer is reused only for a frame at most ~1/4 smaller than it.
- Each request runs as a task, so several requests of one connection are served at once and
  answered by ``requestId`` in completion order (the client matches them by id).
- Bounded input: a connection stops reading while ``max_requests_per_connection`` of its
  requests are in progress, or while its replies wait in the socket's write buffer; all
  connections together hold at most ``max_inflight_bytes`` of large frames (received and not
  yet served), and a connection that would go above it stops reading until memory is freed.
- Bad input never reaches the service: a frame above ``grpc_max_message_size`` is answered
  INVALID_REQUEST (with its requestId when the first 8 bytes of the message arrived) and its bytes
  are skipped unread; a request that does not decode is answered INVALID_REQUEST; an unknown type
  or a negative length cannot be skipped safely, so the connection is closed (the client then
  fails its outstanding requests at once instead of waiting for its timeout). Each is logged
  with the peer (rate limited) and counted in ``riffle_server_urpc_refused_total``-style RPC
  metrics under ``rpc="urpc:<reason>"``.
- At most ``max_connections`` connections, and at most ``max_connections_per_address`` from one source
  address (so one host cannot take every slot); an extra one is closed at once and logged.
- Timeouts, checked by one ticker task for all connections (``UrpcConnection.tick``): a frame whose
  bytes do not all arrive within ``frame_read_timeout_sec`` of the first (or that arrives slower
  than ``frame_read_min_bytes_per_sec`` once it has been arriving ``RATE_GRACE_S``), a new
  connection without a frame within ``frame_read_timeout_sec``, a connection idle for
  ``idle_timeout_sec``, replies in the write buffer not read for ``sendfile_stall_timeout_sec``:
  each closes the connection (releasing what it reserved) and is counted as ``urpc:<reason>``.
  Time during which this server paused reading does not count against the client.
- Held replies: a read reserves its expected reply bytes before it runs. One connection holds at
  most ``max_reply_bytes_per_connection`` (reservations plus its transport's write buffer; one
  reply always goes through): above it, the read waits and the connection stops reading requests
  until its client reads. The same bytes are counted in the server-wide ``ReplyBudget``
  (``max_reply_bytes``, shared with gRPC), where a read waits ``reply_wait_timeout_sec`` and is
  then answered NO_BUFFER. The write buffer's share is re-counted on every write, drain
  notification and tick.
- Replies of one loop turn share a write: the first one schedules a flush at the end of the turn
  (``call_soon``), which writes every reply the connection produced meanwhile with one call; its
  reserved bytes stay held until then. Under load most replies share their turn with another.

- GetLocalShuffleData replies go from the data file to the socket with ``sendfile`` (zero copies
  through Python): the disk actor opens the file (``ReadData(as_file=True)``), and a thread of the
  listener's small ``urpc-sendfile`` pool writes the frame head and then ``os.sendfile`` on a
  duplicate of the socket's descriptor, waiting with ``poll`` while the socket is full (flow
  control by the client's reading; no progress for ``sendfile_stall_timeout_sec`` closes the
  connection). A frame must never be interleaved with another, so a connection runs one such send
  at a time, only when its transport has nothing buffered; replies ready meanwhile are held and
  written right after it, in order. Otherwise (a send already running, bytes buffered, no socket
  descriptor, ``sendfile_enable = false``) the range is read into memory and written as before.
  An error after the first byte of a frame left cannot be answered (the frame is torn): the
  connection is closed, and the client fails its requests at once.

Decoding a SendShuffleData runs on the event loop: it costs about 2 us per block (a 16 MiB send
of 3 KiB blocks is about 10 ms), the same order as protobuf's work on the gRPC path.

See also: ``riffle_actors.service`` (the use cases), ``riffle_actors.transport.grpc_server``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from loguru import logger

from riffle_actors.errors import StatusCode
from riffle_actors.io.localfile import DataFile
from riffle_actors.log import RateLimitedLog
from riffle_actors.metrics import Metrics
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.urpc import (
    HEADER_SIZE,
    RESPONSE_TYPE,
    FrameHeader,
    GetLocalShuffleData,
    GetLocalShuffleIndex,
    GetMemoryShuffleData,
    GetSortedShuffleData,
    MessageType,
    SendShuffleData,
    decode_header,
    decode_request,
    detach_partitions,
    encode_data_response,
    encode_index_response,
    encode_memory_response,
    encode_rpc_response,
    encode_sorted_response,
    peek_request_id,
)
from riffle_actors.service import ShuffleService
from riffle_actors.transport.conn_ticker import ConnectionTicker
from riffle_actors.transport.decode import decode_task_filter
from riffle_actors.transport.listen import create_tcp_server
from riffle_actors.transport.reply_budget import ReplyBudget
from riffle_actors.transport.rpc_answer import failure_status

SMALL_BUFFER_BYTES = 64 << 10
RECV_POOL_MAX_BYTES = 64 << 20  # idle receive buffers kept (and at most half of max_inflight_bytes)
WRITE_HIGH_WATER_BYTES = 8 << 20
SENDFILE_THREADS = 4
RATE_GRACE_S = 5.0  # a frame's average arrival rate is judged once it has been arriving this long
MAX_TICK_S = 0.5
_SEND = MessageType.SEND_SHUFFLE_DATA_REQUEST
_RPC_NAMES: dict[int, str] = {
    MessageType.SEND_SHUFFLE_DATA_REQUEST: "urpc:sendShuffleData",
    MessageType.GET_LOCAL_SHUFFLE_INDEX_REQUEST: "urpc:getLocalShuffleIndex",
    MessageType.GET_LOCAL_SHUFFLE_DATA_REQUEST: "urpc:getLocalShuffleData",
    MessageType.GET_LOCAL_SHUFFLE_DATA_V2_REQUEST: "urpc:getLocalShuffleDataV2",
    MessageType.GET_LOCAL_SHUFFLE_DATA_V3_REQUEST: "urpc:getLocalShuffleDataV3",
    MessageType.GET_MEMORY_SHUFFLE_DATA_REQUEST: "urpc:getMemoryShuffleData",
    MessageType.GET_SORTED_SHUFFLE_DATA_REQUEST: "urpc:getSortedShuffleData",
}


class RecvPool:
    """Receive buffers of large frames, reused (see the module docstring); the event loop's only.

    ``take(n)`` returns a free buffer of at least ``n`` bytes and not much more (the smallest that
    fits within ``n + n/4 + 64 KiB``), else a new ``bytearray(n)``; ``give`` takes a buffer back once
    nothing refers to it, keeping at most ``limit`` idle bytes (oldest dropped first); ``shrink``
    drops idle buffers (the in-flight budget needs the room). ``idle_bytes``: what it holds now.
    """

    __slots__ = ("_free", "allocated", "idle_bytes", "limit", "reused")

    SLACK = 64 << 10

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: list[bytearray] = []
        self.idle_bytes = 0
        self.reused = 0  # frames received into a reused buffer / into a new one (tests, benchmarks)
        self.allocated = 0

    def take(self, n: int) -> bytearray:
        best = -1
        most = n + (n >> 2) + self.SLACK
        free = self._free
        for i, b in enumerate(free):
            cap = len(b)
            if n <= cap <= most and (best < 0 or cap < len(free[best])):
                best = i
        if best >= 0:
            buf = free.pop(best)
            self.idle_bytes -= len(buf)
            self.reused += 1
            return buf
        self.allocated += 1
        return bytearray(n)

    def give(self, buf: bytearray) -> None:
        if len(buf) > self.limit:
            return
        self._free.append(buf)
        self.idle_bytes += len(buf)
        if self.idle_bytes > self.limit:
            self.shrink(self.idle_bytes - self.limit)

    def shrink(self, n: int) -> None:
        free = self._free
        while n > 0 and free:
            b = free.pop(0)
            self.idle_bytes -= len(b)
            n -= len(b)


class UrpcServer:
    """The listener: connection limit, the shared in-flight byte budget, start and stop."""

    def __init__(self, service: ShuffleService, metrics: Metrics, *, max_frame_bytes: int,
                 max_connections: int = 4096, max_connections_per_address: int = 1024,
                 max_inflight_bytes: int = 256 << 20,
                 max_requests_per_connection: int = 64, index_v2: bool = False, sendfile: bool = True,
                 sendfile_stall_s: float = 60.0, idle_timeout_s: float = 900.0, frame_timeout_s: float = 60.0,
                 frame_min_rate: int = 64 << 10, max_reply_bytes_per_connection: int = 64 << 20,
                 replies: ReplyBudget | None = None):
        self.service = service
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.max_connections_per_address = max_connections_per_address
        self._per_address: dict[str, int] = {}  # source address (no port) -> its open connections
        self.max_inflight_bytes = max_inflight_bytes
        self.max_requests_per_connection = max_requests_per_connection
        self.index_v2 = index_v2
        self.sendfile = sendfile and hasattr(os, "sendfile")
        self.sendfile_stall_s = sendfile_stall_s
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.frame_min_rate = frame_min_rate
        self.max_reply_bytes_per_connection = max_reply_bytes_per_connection
        self.replies = replies if replies is not None else ReplyBudget(1 << 30, 10.0)
        self.closed_by: dict[str, int] = {}  # connections this server closed, by reason (tests, /metrics)
        self.sendfile_replies = 0  # replies sent with sendfile / read into memory (for tests and benchmarks)
        self.copied_replies = 0
        self._send_pool: ThreadPoolExecutor | None = None
        self.connections: set[UrpcConnection] = set()
        # each connection's timeouts and reply accounting; it sleeps while there is no connection (idle is free)
        self._ticker = ConnectionTicker(self.connections, max(0.05, min(
            MAX_TICK_S, idle_timeout_s / 4, frame_timeout_s / 4, sendfile_stall_s / 4)), "urpc-timeouts")
        self.inflight_bytes = 0
        # idle receive buffers: counted with inflight_bytes against max_inflight_bytes (see reserve)
        self.pool = RecvPool(min(RECV_POOL_MAX_BYTES, max_inflight_bytes // 2))
        self._budget_waiters: deque[UrpcConnection] = deque()
        self.budget_waits = 0  # large frames that had to wait for the in-flight budget (for tests)
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self.refused_connections = 0
        self.log_limiter = RateLimitedLog(10.0)

    async def start(self, host: str, port: int) -> int:
        self._server, self.port = await create_tcp_server(
            lambda: UrpcConnection(self), what="urpc", keys="urpc_port / urpc_bind_address", host=host, port=port)
        self._ticker.start()
        return self.port

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in progress finish within ``grace_s``, then close every connection."""
        if self._server is not None:
            self._server.close()
        self._ticker.stop()
        tasks = [t for c in self.connections for t in c.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._send_pool is not None:
            self._send_pool.shutdown(wait=False)
            self._send_pool = None

    @property
    def send_pool(self) -> ThreadPoolExecutor:
        if self._send_pool is None:
            self._send_pool = ThreadPoolExecutor(SENDFILE_THREADS, thread_name_prefix="urpc-sendfile")
        return self._send_pool

    def warn(self, key: str, text: str, *args) -> None:
        ok, suppressed = self.log_limiter.should_log(key)
        if ok:
            logger.warning("urpc: " + text + (f" ({suppressed} more like it suppressed)" if suppressed else ""), *args)

    # ------------------------------------------------------------- the shared budget of large frames
    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes of the in-flight budget; always granted when nothing else is in flight.

        Idle pooled receive buffers count in the same budget: they are dropped to make room."""
        if self.inflight_bytes and self.inflight_bytes + n > self.max_inflight_bytes:
            return False
        self.inflight_bytes += n
        over = self.inflight_bytes + self.pool.idle_bytes - self.max_inflight_bytes
        if over > 0:
            self.pool.shrink(over)
        return True

    def release(self, n: int) -> None:
        if not n:
            return
        self.inflight_bytes -= n
        while self._budget_waiters:
            conn = self._budget_waiters[0]
            if not conn.try_resume_frame():
                return
            self._budget_waiters.popleft()

    def wait_budget(self, conn: UrpcConnection) -> None:
        self.budget_waits += 1
        self._budget_waiters.append(conn)

    def admit(self, conn: UrpcConnection, address: str) -> bool:
        """Count a new connection from ``address``, or refuse it (False) when one of the limits is reached."""
        if len(self.connections) >= self.max_connections:
            self.refused_connections += 1
            self.metrics.rpc_total.labels("urpc:connection", "REFUSED").inc()
            self.warn("max_connections", "refused a connection from {}: {} connections open "
                      "([urpc_config] max_connections)", conn.peer, len(self.connections))
            return False
        open_here = self._per_address.get(address, 0)
        if open_here >= self.max_connections_per_address:
            self.refused_connections += 1
            self.metrics.rpc_total.labels("urpc:connection_per_address", "REFUSED").inc()
            self.warn("max_connections_per_address", "refused a connection from {}: {} connections open from "
                      "{} ([urpc_config] max_connections_per_address)", conn.peer, open_here, address)
            return False
        self._per_address[address] = open_here + 1
        self.connections.add(conn)
        self._ticker.connected()
        return True

    def forget(self, conn: UrpcConnection) -> None:
        if conn in self.connections:
            address = conn.address
            left = self._per_address.get(address, 0) - 1
            if left > 0:
                self._per_address[address] = left
            else:
                self._per_address.pop(address, None)
        self.connections.discard(conn)
        try:
            self._budget_waiters.remove(conn)
        except ValueError:
            pass


class UrpcConnection(asyncio.BufferedProtocol):
    """One client connection: frame reading, request tasks, replies (see the module docstring)."""

    def __init__(self, server: UrpcServer):
        self.server = server
        self.service = server.service
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"  # the peer's address without its port (``max_connections_per_address``)
        self.tasks: set[asyncio.Task] = set()
        self._buf = bytearray(SMALL_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0  # unparsed bytes of the small buffer: [_start, _end)
        self._end = 0
        self._frame: bytearray | None = None  # a large frame being received into its own buffer
        self._frame_got = 0
        self._frame_header: FrameHeader | None = None
        self._waiting_header: FrameHeader | None = None  # a large frame waiting for the byte budget
        self._skip = 0  # bytes of a refused (oversized) frame still to skip
        self._paused: set[str] = set()
        self._closed = False
        self._file_busy = False  # a sendfile reply is being written by a thread: hold other replies
        self._held: list[tuple[list, int]] = []  # (reply parts, their reserved bytes) waiting for _file_busy
        # replies written during this loop turn, sent as one write at its end (``_flush``), with their
        # reserved bytes (still held until then)
        self._out: list = []
        self._out_reserved = 0
        # timeouts (see tick): bytes received, frames received, when this connection last did anything
        self._rx = 0
        self._frames = 0
        self._last_active = time.monotonic()
        self._partial: tuple[float, int, int] | None = None  # (since, _rx then, _frames then) of a frame arriving
        self._stall: tuple[int, float] | None = None  # (write buffer size, since) while replies wait to be read
        # replies: bytes reserved for replies not yet written to the transport (counted in this
        # connection's limit and, once granted, in the server-wide budget), and the part of the
        # transport's write buffer last counted in the server-wide budget
        self._reply_reserved = 0
        self._reply_global = 0
        self._buffered = 0
        self._reply_waiters: deque[tuple[int, asyncio.Future]] = deque()

    # ------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        srv = self.server
        if not srv.admit(self, self.address):
            self._closed = True
            transport.abort()
            return
        transport.set_write_buffer_limits(high=min(WRITE_HIGH_WATER_BYTES, srv.max_reply_bytes_per_connection))

    def connection_lost(self, exc) -> None:
        self._closed = True
        self.server.forget(self)
        if self._frame is not None:  # a frame cut short: its buffer and budget go back
            frame, self._frame = self._frame, None
            self.server.pool.give(frame)
            self.server.release(len(frame))
        # every reply byte this connection held goes back; requests still running see _closed
        self.server.replies.release(self._reply_global + self._buffered)
        self._reply_global = self._buffered = 0
        waiters, self._reply_waiters = self._reply_waiters, deque()
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(ConnectionError("the connection was closed"))

    def pause_writing(self) -> None:
        self._pause("writing")

    def resume_writing(self) -> None:
        self._sync_buffered()
        self._unpause("writing")

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_got:self._frame_header.frame_len]  # type: ignore[union-attr]
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < 8192 and self._start:
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start:self._end]
            self._start, self._end = 0, n
        if self._end == len(self._buf):  # only while paused with a full buffer; never drop bytes
            bigger = bytearray(len(self._buf) * 2)
            bigger[:self._end] = self._buf[:self._end]
            self._buf, self._view = bigger, memoryview(bigger)
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._rx += nbytes
        if self._frame is not None:
            self._frame_got += nbytes
            header = self._frame_header
            assert header is not None  # set with _frame
            if self._frame_got == header.frame_len:
                frame = self._frame
                self._frame, self._frame_header = None, None
                self._dispatch(header, memoryview(frame)[:header.frame_len].toreadonly(),
                               reserved=len(frame), buf=frame)
            return
        self._end += nbytes
        self._parse()

    def eof_received(self) -> bool:
        return False  # close; requests in progress still finish (their replies are dropped)

    # ------------------------------------------------------------- framing
    def _parse(self) -> None:
        srv = self.server
        while not self._closed and self._waiting_header is None:
            avail = self._end - self._start
            if self._skip:
                k = min(self._skip, avail)
                self._start += k
                self._skip -= k
                if self._skip:
                    return
                continue
            if avail < HEADER_SIZE:
                return
            if len(self.tasks) >= srv.max_requests_per_connection:
                self._pause("requests")
                return
            try:
                header = decode_header(self._view, self._start)
            except ProtocolError as e:
                self._violation("bad_header", str(e))
                return
            if header.type not in RESPONSE_TYPE:
                self._violation("unknown_type", f"message type {header.type} is not a request this server serves")
                return
            total = header.frame_len
            if total > srv.max_frame_bytes:
                if header.msg_len >= 8 and avail < HEADER_SIZE + 8:
                    return  # wait for the requestId
                self._refuse_oversized(header)
                continue
            if avail >= HEADER_SIZE + total:
                begin = self._start + HEADER_SIZE
                region = self._view[begin:begin + total]  # decoded (sends: copied out) before it is reused
                self._start = begin + total
                self._dispatch(header, region, reserved=0)
                continue
            if header.type != _SEND and HEADER_SIZE + total <= len(self._buf):
                return  # a small frame: the rest arrives in this buffer
            frame = srv.pool.take(total)
            if not srv.reserve(len(frame)):
                srv.pool.give(frame)
                self._waiting_header = header
                self._pause("budget")
                srv.wait_budget(self)
                return
            self._begin_frame(header, frame)
            return

    def _begin_frame(self, header: FrameHeader, frame: bytearray) -> None:
        """Receive the rest of this frame straight into ``frame`` (its budget is reserved)."""
        got = self._end - self._start - HEADER_SIZE
        frame[:got] = self._view[self._start + HEADER_SIZE:self._end]
        self._start = self._end = 0
        self._frame, self._frame_header, self._frame_got = frame, header, got

    def try_resume_frame(self) -> bool:
        """Called by the server when budget was released: take it and go on reading, or keep waiting."""
        header = self._waiting_header
        if self._closed or header is None:
            return True
        frame = self.server.pool.take(header.frame_len)
        if not self.server.reserve(len(frame)):
            self.server.pool.give(frame)
            return False
        self._waiting_header = None
        self._begin_frame(header, frame)
        self._unpause("budget")
        return True

    def _refuse_oversized(self, header: FrameHeader) -> None:
        srv = self.server
        begin = self._start + HEADER_SIZE
        request_id = peek_request_id(self._view[begin:self._end], header.msg_len)
        reason = (f"frame of {header.frame_len} bytes is above the {srv.max_frame_bytes} this server accepts "
                  f"(grpc_max_message_size)")
        srv.warn("oversized", "{} from {}: {}; answered INVALID_REQUEST, its bytes skipped", _type_name(header.type),
                 self.peer, reason)
        srv.metrics.rpc_total.labels("urpc:oversized", StatusCode.INVALID_REQUEST.name).inc()
        self._start = begin
        self._skip = header.frame_len
        self._frames += 1
        if request_id is not None:
            self._write([self._error_reply(header.type, request_id, StatusCode.INVALID_REQUEST, reason)])

    def _violation(self, kind: str, reason: str) -> None:
        """Bytes that cannot be skipped safely: log, count and close the connection."""
        self.server.warn(kind, "closing the connection from {}: {}", self.peer, reason)
        self.server.metrics.rpc_total.labels(f"urpc:{kind}", "CLOSED").inc()
        self.close()

    def close(self) -> None:
        self._closed = True
        if self._file_busy:
            self._shutdown_socket()  # a send-pool thread waiting on this socket gives up at once
        if self.transport is not None:
            self.transport.close()

    def _shutdown_socket(self) -> None:
        fd = self._socket_fd()
        if fd < 0:
            return
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _pause(self, reason: str) -> None:
        if not self._paused and self.transport is not None and not self._closed:
            self.transport.pause_reading()
        self._paused.add(reason)

    def _unpause(self, reason: str) -> None:
        if reason not in self._paused:
            return
        self._paused.discard(reason)
        if not self._paused and self.transport is not None and not self._closed:
            self.transport.resume_reading()
            self._parse()  # bytes that arrived before the pause

    def _write(self, parts: list, reserved: int = 0) -> None:
        """Write a reply's frame; ``reserved``: its bytes' reservation, handed over to the write buffer.

        The replies of one loop turn go out together: the first schedules ``_flush`` (``call_soon``), which
        writes them all with one call, so requests answered in the same turn cost one send on the socket
        (under load most replies share a turn with another on their connection)."""
        if self._file_busy:
            self._held.append((parts, reserved))
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out += parts
        self._out_reserved += reserved

    def _flush(self) -> None:
        """Write the replies of this loop turn (``_write``) and hand their reservations to the write buffer."""
        out, self._out = self._out, []
        reserved, self._out_reserved = self._out_reserved, 0
        if out and not self._closed and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)
            self._last_active = time.monotonic()
        self._unreserve(reserved)
        self._sync_buffered()

    # ------------------------------------------------------------- reply bytes held (module docstring)
    def _held_bytes(self) -> int:
        return self._reply_reserved + self._buffered

    def _sync_buffered(self) -> None:
        """Count the transport's write buffer, as it is now, in the server-wide reply budget."""
        if self._closed:
            return
        t = self.transport
        size = t.get_write_buffer_size() if t is not None else 0
        delta, self._buffered = size - self._buffered, size
        if delta > 0:
            self.server.replies.take(delta)
        elif delta < 0:
            self.server.replies.release(-delta)
            self._wake_replies()

    async def _reserve_reply(self, n: int) -> None:
        """Reserve ``n`` bytes for a reply before it is read: wait (reading paused) while this connection
        holds more than ``max_reply_bytes_per_connection``, then take them from the server-wide budget
        (NoBufferError after ``reply_wait_timeout_sec``)."""
        srv = self.server
        self._sync_buffered()
        held = self._held_bytes()
        if self._reply_waiters or (held and held + n > srv.max_reply_bytes_per_connection):
            fut = asyncio.get_running_loop().create_future()
            self._reply_waiters.append((n, fut))
            self._pause("replies")
            await fut  # granted by _wake_replies: n is in _reply_reserved
        else:
            self._reply_reserved += n
        try:
            await srv.replies.acquire_or_refuse(n)
        except BaseException:
            self._reply_reserved -= n
            self._wake_replies()
            raise
        if self._closed:  # closed while waiting: connection_lost already gave back what it held
            srv.replies.release(n)
        else:
            self._reply_global += n

    def _unreserve(self, n: int) -> None:
        if n <= 0:
            return
        self._reply_reserved -= n
        if not self._closed:
            self._reply_global -= n
            self.server.replies.release(n)
            self._wake_replies()

    def _reserve_more(self, n: int) -> None:
        """A reply found larger than reserved: count the difference at once (never waits)."""
        if n <= 0:
            return
        self._reply_reserved += n
        if not self._closed:
            self._reply_global += n
            self.server.replies.take(n)

    def _wake_replies(self) -> None:
        limit = self.server.max_reply_bytes_per_connection
        while self._reply_waiters:
            n, fut = self._reply_waiters[0]
            if fut.done():
                self._reply_waiters.popleft()
                continue
            held = self._held_bytes()
            if held and held + n > limit:
                return
            self._reply_waiters.popleft()
            self._reply_reserved += n
            fut.set_result(None)
        self._unpause("replies")

    # ------------------------------------------------------------- timeouts
    def tick(self, now: float) -> None:
        """Called by the server every tick: reply accounting, then the partial-frame, write-stall and
        idle timeouts (each closes the connection with a logged reason)."""
        if self._closed:
            return
        srv = self.server
        self._sync_buffered()
        if self._reply_waiters:
            self._wake_replies()
        arriving = self._frame is not None or self._end > self._start or self._skip > 0
        if not arriving or self._paused or self._waiting_header is not None:
            self._partial = None  # nothing arriving, or this server is the one not reading
        elif self._partial is None or self._partial[2] != self._frames:
            self._partial = (now, self._rx, self._frames)
        else:
            since, rx0, _ = self._partial
            elapsed = now - since
            if elapsed > srv.frame_timeout_s:
                return self._close_for("frame_timeout", f"a frame did not arrive whole within "
                                       f"{srv.frame_timeout_s:g}s (frame_read_timeout_sec)")
            rate = (self._rx - rx0) / elapsed if elapsed > 0 else 0.0
            if srv.frame_min_rate and elapsed >= RATE_GRACE_S and rate < srv.frame_min_rate:
                return self._close_for("frame_slow", f"a frame arrived at {rate:.0f} bytes/s, below "
                                       f"{srv.frame_min_rate} (frame_read_min_bytes_per_sec)")
        size = self._buffered
        if size == 0 or self._file_busy:
            self._stall = None
        elif self._stall is None or size < self._stall[0]:
            self._stall = (size, now)
        elif size > self._stall[0]:
            self._stall = (size, self._stall[1])
        elif now - self._stall[1] > srv.sendfile_stall_s:
            return self._close_for("write_stall", f"the client read none of {size} bytes of replies for "
                                   f"{srv.sendfile_stall_s:g}s (sendfile_stall_timeout_sec)")
        if arriving or self.tasks or size or self._file_busy or self._held or self._out:
            return
        if self._frames == 0:
            if now - self._last_active > srv.frame_timeout_s:
                self._close_for("no_frame", f"no frame within {srv.frame_timeout_s:g}s of connecting "
                                "(frame_read_timeout_sec)")
        elif now - self._last_active > srv.idle_timeout_s:
            self._close_for("idle", f"idle for {srv.idle_timeout_s:g}s (idle_timeout_sec)", quiet=True)

    def _close_for(self, kind: str, reason: str, quiet: bool = False) -> None:
        srv = self.server
        srv.closed_by[kind] = srv.closed_by.get(kind, 0) + 1
        srv.metrics.rpc_total.labels(f"urpc:{kind}", "CLOSED").inc()
        if quiet:  # an idle pooled connection: normal, the client reconnects on its next request
            logger.debug("urpc: closing the connection from {}: {}", self.peer, reason)
        else:
            srv.warn(kind, "closing the connection from {}: {}", self.peer, reason)
        self.close()

    def _socket_fd(self) -> int:
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        try:
            return sock.fileno() if sock is not None else -1
        except (OSError, AttributeError):
            return -1

    async def _write_file(self, head: bytes, data: DataFile, reserved: int) -> None:
        """A reply whose body is a data-file range: sendfile when the connection is idle, else read + write."""
        srv = self.server
        loop = asyncio.get_running_loop()
        t = self.transport
        fd = -1
        if self._out:  # the replies written before this one go first
            self._flush()
        if (srv.sendfile and not self._file_busy and not self._closed and t is not None and not t.is_closing()
                and t.get_write_buffer_size() == 0):
            fd = self._socket_fd()
        if fd < 0:
            srv.copied_replies += 1
            try:
                body = await loop.run_in_executor(srv.send_pool, _read_and_close, data)
            except BaseException:
                self._unreserve(reserved)
                raise
            self._write([head, body], reserved)
            return
        srv.sendfile_replies += 1
        self._file_busy = True
        try:
            await loop.run_in_executor(srv.send_pool, _send_frame, fd, head, data, srv.sendfile_stall_s)
        except Exception as e:  # noqa: BLE001 - a torn frame: the connection cannot go on
            srv.warn("sendfile", "closing the connection from {}: a data reply could not be sent: {!r}",
                     self.peer, e)
            srv.metrics.rpc_total.labels("urpc:sendfile", "CLOSED").inc()
            self.close()
        finally:
            self._file_busy = False
            self._last_active = time.monotonic()
            self._unreserve(reserved)
            held, self._held = self._held, []
            for parts, n in held:
                self._write(parts, n)

    # ------------------------------------------------------------- requests
    def _dispatch(self, header: FrameHeader, region: memoryview, reserved: int,
                  buf: bytearray | None = None) -> None:
        """Decode a whole frame and start its request. Nothing of the request refers to ``region``
        afterwards (a send's payloads are copied out), so its buffer is reusable on return: ``buf``
        (a pooled receive buffer) goes back to the pool; ``reserved`` stays taken until served."""
        self._frames += 1
        self._last_active = time.monotonic()
        try:
            request = decode_request(header.type, region, header.msg_len)
            if isinstance(request, SendShuffleData):
                request = request._replace(partitions=detach_partitions(request.partitions))
        except ProtocolError as e:
            self.server.release(reserved)
            request_id = peek_request_id(region, header.msg_len)
            del region
            if buf is not None:
                self.server.pool.give(buf)
            self.server.warn("undecodable", "{} from {} does not decode: {}", _type_name(header.type), self.peer, e)
            self.server.metrics.rpc_total.labels(_RPC_NAMES.get(header.type, "urpc:unknown"),
                                                 StatusCode.INVALID_REQUEST.name).inc()
            if request_id is None:
                self.close()
            else:
                self._write([self._error_reply(header.type, request_id, StatusCode.INVALID_REQUEST,
                                               f"undecodable {_type_name(header.type)}: {e}")])
            return
        del region
        if buf is not None:
            self.server.pool.give(buf)
        task = asyncio.get_running_loop().create_task(self._serve(header.type, request, reserved))
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if "requests" in self._paused and len(self.tasks) < self.server.max_requests_per_connection:
            self._unpause("requests")

    async def _serve(self, type_: int, request, reserved: int) -> None:
        started = time.perf_counter()
        rpc = _RPC_NAMES[type_]
        file_reply: tuple[bytes, DataFile] | None = None
        want = self._expected_reply(request)
        got = 0  # reply bytes reserved
        try:
            if want:
                await self._reserve_reply(want)
                got = want
            parts = await self._call(request)
            if isinstance(parts, tuple):
                file_reply, parts = parts, []
            status = StatusCode.SUCCESS
        except Exception as e:  # noqa: BLE001 - every failure becomes a status; the server goes on
            # not logged once the connection went away meanwhile: nobody gets the answer
            status, msg = failure_status(rpc, e, getattr(request, "app_id", ""), log=not self._closed)
            parts = [self._error_reply(type_, request.request_id, status, msg)]
        finally:
            self.server.release(reserved)
        size = len(file_reply[0]) + file_reply[1].length if file_reply is not None else sum(len(p) for p in parts)
        if size > got:
            self._reserve_more(size - got)
        else:
            self._unreserve(got - size)
        if file_reply is not None:
            await self._write_file(*file_reply, size)
        else:
            self._write(parts, size)
        self.server.metrics.on_rpc(rpc, status.name, started, getattr(request, "app_id", ""))

    def _expected_reply(self, request) -> int:
        """Bytes to reserve before a read: its requested length (capped at the largest read served)."""
        cap = self.server.max_frame_bytes
        if isinstance(request, GetLocalShuffleData):
            return request.length if 0 < request.length <= cap else 0
        if isinstance(request, GetMemoryShuffleData):
            return min(max(1, request.read_buffer_size), cap)
        return 0

    async def _call(self, request) -> list | tuple[bytes, DataFile]:
        """The use case of ``request`` and its reply frame as buffers (head first, then body parts), or
        ``(head, DataFile)`` for a body to send from a data file."""
        svc = self.service
        rid = request.request_id
        if isinstance(request, SendShuffleData):
            # the payloads were copied out of the frame at decoding (_dispatch, detach_partitions)
            await svc.send_data(request.app_id, request.shuffle_id, request.require_buffer_id, request.partitions)
            return [encode_rpc_response(rid, StatusCode.SUCCESS, "")]
        if isinstance(request, GetMemoryShuffleData):
            blocks = await svc.get_memory_data(request.app_id, request.shuffle_id, request.partition_id,
                                               request.last_block_id, request.read_buffer_size,
                                               await decode_task_filter(request.expected_task_ids))
            return [encode_memory_response(rid, StatusCode.SUCCESS, "", blocks), *(b.data for b in blocks)]
        if isinstance(request, GetLocalShuffleData):
            data = await svc.get_local_data(request.app_id, request.shuffle_id, request.partition_id,
                                            request.storage_id, request.offset, request.length,
                                            as_file=self.server.sendfile, next_segments=request.next_segments,
                                            task_attempt_id=request.task_attempt_id)
            if isinstance(data, DataFile):
                return encode_data_response(rid, StatusCode.SUCCESS, "", data.length), data
            return [encode_data_response(rid, StatusCode.SUCCESS, "", len(data)), data]
        if isinstance(request, GetLocalShuffleIndex):
            index, data_len, storage_ids = await svc.get_local_index(request.app_id, request.shuffle_id,
                                                                     request.partition_id)
            head = encode_index_response(rid, StatusCode.SUCCESS, "", data_len, len(index),
                                         storage_ids if self.server.index_v2 else None)
            return [head, index]
        if isinstance(request, GetSortedShuffleData):
            return await svc.remote_merge(request.app_id)  # the app id checked, then INTERNAL_ERROR
        raise AssertionError(f"unhandled request {type(request).__name__}")

    def _error_reply(self, type_: int, request_id: int, status: int, msg: str) -> bytes:
        reply = RESPONSE_TYPE[MessageType(type_)]
        if reply == MessageType.RPC_RESPONSE:
            return encode_rpc_response(request_id, status, msg)
        if reply == MessageType.GET_LOCAL_SHUFFLE_INDEX_RESPONSE:
            return encode_index_response(request_id, status, msg, 0, 0, () if self.server.index_v2 else None)
        if reply == MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE:
            return encode_data_response(request_id, status, msg, 0)
        if reply == MessageType.GET_MEMORY_SHUFFLE_DATA_RESPONSE:
            return encode_memory_response(request_id, status, msg, ())
        return encode_sorted_response(request_id, status, msg)


def _read_and_close(data: DataFile) -> bytes:
    """The range's bytes (the sendfile fallback); closes the file. Runs on a send-pool thread."""
    try:
        parts, got = [], 0
        while got < data.length:
            chunk = os.pread(data.fd, data.length - got, data.offset + got)
            if not chunk:
                raise OSError(errno.ENODATA, "data file ended before the range")
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(data.fd)


def _wait_writable(poller: select.poll, stall_s: float) -> None:
    events = poller.poll(stall_s * 1000)
    if not events:
        raise TimeoutError(f"the client read nothing for {stall_s:g}s (sendfile_stall_timeout_sec)")
    if events[0][1] & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
        raise ConnectionError("the connection was closed")


def _send_frame(sock_fd: int, head: bytes, data: DataFile, stall_s: float) -> None:
    """Write ``head`` then the file range to the (non-blocking) socket; runs on a send-pool thread.

    Works on a duplicate of the socket's descriptor, so the transport closing its own descriptor
    meanwhile cannot make this write to a reused number; closes the data file."""
    out = -1
    try:
        out = os.dup(sock_fd)
        poller = select.poll()
        poller.register(out, select.POLLOUT)
        view = memoryview(head)
        while view:
            try:
                view = view[os.write(out, view):]
            except BlockingIOError:
                _wait_writable(poller, stall_s)
        offset, left = data.offset, data.length
        while left:
            try:
                n = os.sendfile(out, data.fd, offset, left)
            except BlockingIOError:
                _wait_writable(poller, stall_s)
                continue
            if n == 0:
                raise OSError(errno.ENODATA, "data file ended before the range")
            offset += n
            left -= n
    finally:
        if out >= 0:
            os.close(out)
        os.close(data.fd)


def _type_name(type_: int) -> str:
    try:
        return MessageType(type_).name
    except ValueError:
        return f"type {type_}"
