"""gRPC served on the event loop: a small HTTP/2 server for unary and one-reply calls (``grpc_engine = "LOOP"``).

This module owns the ``LOOP`` engine of the shuffle server's gRPC port: the listener, its HTTP/2
connections and their streams. It knows nothing of shuffles: it is given a table of methods
(``LoopMethod``: request parser, handler, reply serializer, unary or one-reply stream) and calls
the handler with the parsed request and a ``LoopContext`` (``peer()``, ``invocation_metadata()``,
``await write(reply)``), as grpc.aio would. Why it exists: grpc.aio hands every call through
grpc's C core threads and back to the loop, about 0.45 ms of server CPU per unary call on this
box; the same call here costs about a third of that (``scripts/bench_serving.py``,
docs/performance.md "Serving gRPC"). ``GRPCIO`` (grpc.aio) stays the default.

What it speaks (RFC 9113 and grpc/grpc "PROTOCOL-HTTP2"), and what it refuses:

- **Connection.** The client preface, then SETTINGS; ours announce ``max_concurrent_streams``,
  a stream window of ``STREAM_WINDOW`` bytes, frames up to ``MAX_FRAME_BYTES`` and a header list
  of at most ``max_header_list_bytes``; the connection window is opened to ``CONNECTION_WINDOW``.
  PING is answered, PRIORITY and unknown frame types are ignored, a peer's GOAWAY lets its open
  calls finish and then closes. A frame above our frame size, a HEADERS or CONTINUATION block
  out of order or above the header limit, an HPACK error, a window overflow, PUSH_PROMISE or a
  stream id going backwards is a connection error: GOAWAY with its code and a reason, then close.
- **Calls.** ``POST`` with ``:path /<service>/<method>`` and ``content-type application/grpc``;
  one length-prefixed, uncompressed message. An unknown method is answered UNIMPLEMENTED, a
  message above ``max_message_bytes`` RESOURCE_EXHAUSTED (from its prefix, before its body is
  read), a second message or a compressed one INTERNAL / UNIMPLEMENTED, a stream above
  ``max_concurrent_streams`` is reset REFUSED_STREAM; ``grpc-timeout`` cancels the handler with
  DEADLINE_EXCEEDED; RST_STREAM from the client cancels it. Replies: HEADERS, one DATA message
  (split by the client's windows and frame size; the handler's ``write`` returns once it is handed
  to the socket under the client's flow control), trailers with ``grpc-status`` and a
  percent-encoded ``grpc-message``; errors before a reply are "trailers-only". A handler's
  exception is UNKNOWN (logged); it never reaches the connection. What a connection sends during
  one loop turn (replies, resets) goes out in one write at the end of the turn (``_send`` /
  ``_flush``), in order: calls answered in the same turn share a socket send. Frames answering what
  was just read (window updates, settings and ping acks) are written at once, with whatever the
  turn queued before them.
- **Bounds.** ``max_connections`` and ``max_connections_per_address`` (more are closed at once,
  logged); request bytes received and not yet handled, over all connections, count against
  ``max_inflight_bytes``: above it connections stop reading until handlers finish (TCP pushes
  back); a connection with a frame or a request body cut short for ``frame_read_timeout_sec``,
  or no preface within it, is closed; one with no call for ``idle_timeout_sec`` gets GOAWAY; a
  reply the client takes nothing of for ``reply_stall_timeout_sec`` (no HTTP/2 window granted:
  the stream is reset CANCEL; its socket not read: the connection is closed) is given up and its
  bytes released.
  These checks run on one ticker that sleeps while there is no connection.
- **Stop.** ``stop(grace)`` closes the listener, sends GOAWAY (no new calls; the client retries
  them elsewhere), lets calls in progress finish for ``grace`` seconds, then cancels and closes.

Not covered: TLS, compression, client or bidirectional streaming, server push, HTTP/1.1 upgrade.
Headers are decoded by ``protocol.header_block.HeaderDecoder`` (its table bounded by our
SETTINGS_HEADER_TABLE_SIZE; 4-7x faster than ``hpack.Decoder``, which it is tested against);
answers use only the static table and literals without indexing, so the client's table size
never matters.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger

from riffle_actors.log import RateLimitedLog
from riffle_actors.protocol.header_block import HeaderBlockError, HeaderDecoder, HeaderListTooLarge
from riffle_actors.transport.conn_ticker import ConnectionTicker
from riffle_actors.transport.listen import create_tcp_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (RFC 9113 §6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

# gRPC status codes used here
OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 0, 1, 2, 4, 8
UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 12, 13, 14

MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_BYTES = 16384
# Frames we accept (SETTINGS_MAX_FRAME_SIZE). A frame cut short waits in the connection's buffer, outside
# max_inflight_bytes (as urpc frames of 64 KiB and less do), so this bounds that buffer: 64 KiB per connection,
# for frame_read_timeout_sec at most. Four times the HTTP/2 default: a quarter of the frames to parse.
MAX_FRAME_BYTES = 64 << 10
STREAM_WINDOW = 1 << 20  # each stream's receive window until its message prefix is read (then: the message)
CONNECTION_WINDOW = 1 << 30  # memory is bounded by max_inflight_bytes and pausing reads, not by this window
HEADER_TABLE_BYTES = 4096  # the HPACK table the client may use for what it sends us (the default)
MAX_TICK_S = 1.0
WRITE_HIGH_WATER_BYTES = 4 << 20

_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length

# ":status: 200" (static index 8) and "content-type: application/grpc" (a literal without indexing,
# static name index 31)
_REPLY_HEADERS = b"\x88\x0f\x10\x10application/grpc"


def _frame_head(length: int, type_: int, flags: int, stream_id: int) -> bytes:
    return bytes((length >> 16 & 0xFF, length >> 8 & 0xFF, length & 0xFF, type_, flags)) + _U32.pack(stream_id)


def _frame(type_: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _frame_head(len(payload), type_, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) in a first byte whose high bits are ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


def percent_encode(message: str) -> bytes:
    """``grpc-message``: UTF-8, with bytes outside printable ASCII and ``%`` as ``%XX``."""
    out = bytearray()
    for b in message.encode("utf-8", "replace"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


_MAX_GRPC_MESSAGE_BYTES = 4096  # a longer status message is cut (headers must stay small)


def _trailers(status: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(status).encode())
    if message:
        block += _literal(b"grpc-message", percent_encode(message)[:_MAX_GRPC_MESSAGE_BYTES])
    return block


_OK_TRAILERS = _trailers(OK)

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` (1-8 digits and a unit) in seconds; None if malformed."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 1 <= len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit


class ConnectionProblem(Exception):
    """A connection error: GOAWAY with ``code`` and ``reason``, then close."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LoopMethod:
    """One RPC: ``parse(bytes-like) -> request``, ``handler(request, context)``, ``serialize(reply) -> bytes``.

    ``streamed``: the handler writes its one reply itself (``await context.write``) and returns None;
    otherwise it returns the reply."""

    parse: Callable[[Any], Any]
    handler: Callable[[Any, LoopContext], Awaitable[Any]]
    serialize: Callable[[Any], bytes]
    streamed: bool = False


class LoopContext:
    """What a handler sees of its call (the part of ``grpc.aio.ServicerContext`` our servicers use)."""

    __slots__ = ("_conn", "_stream")

    def __init__(self, conn: LoopConnection, stream: _Stream):
        self._conn = conn
        self._stream = stream

    def peer(self) -> str:
        return self._conn.peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._stream.metadata

    async def write(self, reply: Any) -> None:
        await self._conn.send_reply(self._stream, reply)


class _Stream:
    __slots__ = ("body", "cancelled", "closed_remote", "deadline", "got", "headers_sent", "id", "inflight", "metadata",
                 "method", "progress", "recv_window", "replied", "send_window", "task", "want")

    def __init__(self, stream_id: int, send_window: int, now: float):
        self.id = stream_id
        self.method: LoopMethod | None = None
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.body = bytearray()
        self.got = 0  # bytes of the body received
        self.want = -1  # bytes of the message with its prefix, once the prefix is read
        self.inflight = 0  # of the body, counted in the server's max_inflight_bytes
        self.recv_window = STREAM_WINDOW
        self.send_window = send_window
        self.closed_remote = False  # END_STREAM received
        self.headers_sent = False
        self.replied = False  # the one reply message is out
        self.cancelled = False
        self.task: asyncio.Task | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.progress = now  # when its last request bytes arrived (its body timeout counts from it)


class LoopGrpcServer:
    """The listener: methods, limits, the shared in-flight budget, the ticker, start and stop."""

    def __init__(self, methods: dict[str, LoopMethod], *, max_message_bytes: int, max_concurrent_streams: int = 100,
                 max_connections: int = 4096, max_connections_per_address: int = 1024,
                 max_inflight_bytes: int = 256 << 20, max_header_list_bytes: int = 16 << 10,
                 frame_timeout_s: float = 60.0, idle_timeout_s: float = 900.0, reply_stall_s: float = 60.0,
                 on_refused: Callable[[str], None] | None = None):
        self.methods = {path.encode(): m for path, m in methods.items()}
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_streams = max_concurrent_streams
        self.max_connections = max_connections
        self.max_connections_per_address = max_connections_per_address
        self.max_inflight_bytes = max_inflight_bytes
        self.max_header_list_bytes = max_header_list_bytes
        self.frame_timeout_s = frame_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.reply_stall_s = reply_stall_s
        self.on_refused = on_refused or (lambda what: None)
        self.connections: set[LoopConnection] = set()
        self._per_address: dict[str, int] = {}
        self.inflight_bytes = 0
        self._waiting: deque[LoopConnection] = deque()  # paused for the in-flight budget, in order
        self.closed_by: dict[str, int] = {}  # connections this server closed, by reason (tests, logs)
        self.refused_streams = 0
        self.stalled_replies = 0  # replies given up after reply_stall_s (tests, logs)
        self.log_limiter = RateLimitedLog(10.0)
        self._ticker = ConnectionTicker(self.connections, max(0.05, min(MAX_TICK_S, frame_timeout_s / 4,
                                                                       idle_timeout_s / 4)), "grpc-loop-timeouts")
        self._server: asyncio.AbstractServer | None = None
        self._stopping = False
        self.port = 0
        settings = [(S_MAX_CONCURRENT_STREAMS, max_concurrent_streams), (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                    (S_MAX_FRAME_SIZE, MAX_FRAME_BYTES), (S_MAX_HEADER_LIST_SIZE, max_header_list_bytes),
                    (S_ENABLE_PUSH, 0), (S_HEADER_TABLE_SIZE, HEADER_TABLE_BYTES)]
        self.greeting = (_frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings))
                         + _frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))

    async def start(self, host: str, port: int, *, keys: str = "grpc_port / grpc_bind_address") -> int:
        self._server, self.port = await create_tcp_server(
            lambda: LoopConnection(self), what="gRPC", keys=keys, host=host, port=port)
        self._ticker.start()
        return self.port

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, GOAWAY every connection, let calls finish within ``grace_s``, then close."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.goaway(NO_ERROR, "server stopping")
            if not conn.streams:
                conn.close("stopped")
        tasks = [s.task for c in self.connections for s in c.streams.values() if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self.connections):
            conn.close("stopped")
        self._ticker.stop()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def warn(self, key: str, text: str, *args: object) -> None:
        ok, suppressed = self.log_limiter.should_log(key)
        if ok:
            logger.warning("gRPC (loop): " + text + (f" ({suppressed} more like it suppressed)" if suppressed
                                                     else ""), *args)

    # ------------------------------------------------------------- connections
    def admit(self, conn: LoopConnection) -> bool:
        if self._stopping:
            return False
        if len(self.connections) >= self.max_connections:
            self.on_refused("grpc:connection")
            self.warn("max_connections", "refused a connection from {}: {} connections open "
                      "([grpc_loop_config] max_connections)", conn.peer, len(self.connections))
            return False
        here = self._per_address.get(conn.address, 0)
        if here >= self.max_connections_per_address:
            self.on_refused("grpc:connection_per_address")
            self.warn("max_connections_per_address", "refused a connection from {}: {} connections open from {} "
                      "([grpc_loop_config] max_connections_per_address)", conn.peer, here, conn.address)
            return False
        self._per_address[conn.address] = here + 1
        self.connections.add(conn)
        self._ticker.connected()
        return True

    def forget(self, conn: LoopConnection) -> None:
        if conn in self.connections:
            left = self._per_address.get(conn.address, 0) - 1
            if left > 0:
                self._per_address[conn.address] = left
            else:
                self._per_address.pop(conn.address, None)
            self.connections.discard(conn)
        try:
            self._waiting.remove(conn)
        except ValueError:
            pass

    def count_closed(self, reason: str) -> None:
        self.closed_by[reason] = self.closed_by.get(reason, 0) + 1

    # ------------------------------------------------------------- request bytes not yet handled
    def take(self, conn: LoopConnection, n: int) -> None:
        """Count ``n`` received request bytes; over the budget, ``conn`` stops reading until some are done."""
        self.inflight_bytes += n
        # (a connection holding all of it reads on: one request always gets through)
        if self.inflight_bytes > self.max_inflight_bytes and conn.inflight < self.inflight_bytes \
                and not conn.paused_for_budget:
            conn.pause_for_budget()
            self._waiting.append(conn)

    def release(self, n: int) -> None:
        self.inflight_bytes -= n
        while self._waiting and self.inflight_bytes <= self.max_inflight_bytes:
            self._waiting.popleft().resume_for_budget()


class LoopConnection(asyncio.Protocol):
    """One HTTP/2 connection (see the module docstring)."""

    def __init__(self, server: LoopGrpcServer):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"
        self.buf = bytearray()
        self.preface_seen = False
        self.settings_seen = False
        self.decoder = HeaderDecoder(HEADER_TABLE_BYTES, server.max_header_list_bytes)
        self.streams: dict[int, _Stream] = {}
        self.last_stream_id = 0  # the highest stream id the client opened
        self.header_block: bytearray | None = None  # a HEADERS block waiting for its CONTINUATION frames
        self.header_stream = 0
        self.header_flags = 0
        self.send_window = DEFAULT_WINDOW  # connection-level, for our DATA
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME_BYTES
        self.recv_window = CONNECTION_WINDOW
        self.recv_unacked = 0
        self.inflight = 0  # this connection's bytes in the server's in-flight budget
        self.paused_for_budget = False
        self.budget_mark = 0.0  # when it was last paused or resumed for the budget
        self.write_paused = False
        self._out: list[bytes | memoryview] = []  # frames sent during this loop turn (``_send``), not written yet
        self._out_bytes = 0
        self._window_open = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self.closed = False
        self.goaway_sent = False
        self.peer_goaway = False
        now = time.monotonic()
        self.partial_since: float | None = now  # the preface is due within frame_read_timeout_sec
        self.idle_since: float | None = now

    # ------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host, port = peer[0], peer[1]
            self.address = str(host)
            self.peer = f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
        else:
            self.address = self.peer = str(peer)
        if not self.server.admit(self):
            self.closed = True
            transport.abort()  # type: ignore[attr-defined]
            return
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)  # type: ignore[attr-defined]
        transport.write(self.server.greeting)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.forget(self)
        for stream in list(self.streams.values()):
            self._drop(stream, cancel_task=True)
        self._window_open.set()
        self._writable.set()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._writable.set()

    def pause_for_budget(self) -> None:
        self.paused_for_budget = True
        self.budget_mark = time.monotonic()
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_for_budget(self) -> None:
        self.paused_for_budget = False
        self.budget_mark = time.monotonic()
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self._receive(data)
        except ConnectionProblem as e:
            self.goaway(e.code, e.reason)
            self.close(f"protocol:{e.code}")

    # ------------------------------------------------------------- frames in
    def _receive(self, data: bytes) -> None:
        buf = self.buf
        if buf:
            buf += data
            view = memoryview(buf)
        else:
            view = memoryview(data)
        pos = 0
        end = len(view)
        if not self.preface_seen:
            if end < len(PREFACE):
                if PREFACE[:end] != view:
                    raise ConnectionProblem(PROTOCOL_ERROR, "not an HTTP/2 client (no connection preface)")
                if not buf:
                    buf += data
                return
            if view[:len(PREFACE)] != PREFACE:
                raise ConnectionProblem(PROTOCOL_ERROR, "not an HTTP/2 client (no connection preface)")
            self.preface_seen = True
            pos = len(PREFACE)
        out: list[bytes] = []
        start = pos
        payload = None
        try:
            while end - pos >= 9:
                length = view[pos] << 16 | view[pos + 1] << 8 | view[pos + 2]
                if length > MAX_FRAME_BYTES:
                    raise ConnectionProblem(FRAME_SIZE_ERROR, f"a frame of {length} bytes, above our "
                                                              f"SETTINGS_MAX_FRAME_SIZE {MAX_FRAME_BYTES}")
                if end - pos < 9 + length:
                    break
                type_ = view[pos + 3]
                flags = view[pos + 4]
                stream_id = (view[pos + 5] << 24 | view[pos + 6] << 16 | view[pos + 7] << 8 | view[pos + 8]) \
                    & 0x7FFFFFFF
                payload = view[pos + 9:pos + 9 + length]
                pos += 9 + length
                self._frame_in(type_, flags, stream_id, payload, out)
                if self.closed:
                    return
        finally:
            payload = None  # no view of buf may outlive this call (buf is resized below)
            if out and not self.closed:
                # at once (after what this turn sent before): a WINDOW_UPDATE that waits for the end of
                # the turn holds a large upload back (1 MiB sends measured 10 % dearer per GB)
                self._send(out)
                self._flush()
        if pos < end:
            rest = bytes(view[pos:]) if not buf else b""
            view.release()
            if buf:
                del buf[:pos]
            else:
                buf += rest
            if self.partial_since is None or pos > start:  # a frame cut short: timed from the last whole one
                self.partial_since = time.monotonic()
        else:
            view.release()
            if buf:
                buf.clear()
            if self.settings_seen:
                self.partial_since = None

    def _frame_in(self, type_: int, flags: int, stream_id: int, payload: memoryview, out: list[bytes]) -> None:
        if self.header_block is not None and (type_ != CONTINUATION or stream_id != self.header_stream):
            raise ConnectionProblem(PROTOCOL_ERROR, "a header block was interrupted before its END_HEADERS")
        if not self.settings_seen and type_ != SETTINGS:
            raise ConnectionProblem(PROTOCOL_ERROR, "the client preface must end with a SETTINGS frame")
        if type_ == DATA:
            self._data(flags, stream_id, payload, out)
        elif type_ == HEADERS:
            self._headers(flags, stream_id, payload, out)
        elif type_ == CONTINUATION:
            self._continuation(flags, stream_id, payload, out)
        elif type_ == SETTINGS:
            self._settings(flags, stream_id, payload, out)
        elif type_ == WINDOW_UPDATE:
            self._window_update(stream_id, payload, out)
        elif type_ == PING:
            if stream_id or len(payload) != 8:
                raise ConnectionProblem(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "malformed PING")
            if not flags & ACK:
                out.append(_frame(PING, ACK, 0, bytes(payload)))
        elif type_ == RST_STREAM:
            if not stream_id or len(payload) != 4:
                raise ConnectionProblem(PROTOCOL_ERROR if not stream_id else FRAME_SIZE_ERROR, "malformed RST_STREAM")
            if stream_id > self.last_stream_id:
                raise ConnectionProblem(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._drop(stream, cancel_task=True)
        elif type_ == GOAWAY:
            self.peer_goaway = True
            if not self.streams:
                self.close("client GOAWAY")
        elif type_ == PRIORITY:
            if len(payload) != 5:
                raise ConnectionProblem(FRAME_SIZE_ERROR, "malformed PRIORITY")
        elif type_ == PUSH_PROMISE:
            raise ConnectionProblem(PROTOCOL_ERROR, "a client must not send PUSH_PROMISE")
        # other types are ignored (RFC 9113 §5.5)

    def _unpad(self, flags: int, payload: memoryview) -> memoryview:
        if flags & PADDED:
            if not payload:
                raise ConnectionProblem(PROTOCOL_ERROR, "a padded frame without its pad length")
            pad = payload[0]
            if pad >= len(payload):
                raise ConnectionProblem(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - pad]
        return payload

    def _data(self, flags: int, stream_id: int, payload: memoryview, out: list[bytes]) -> None:
        if not stream_id:
            raise ConnectionProblem(PROTOCOL_ERROR, "DATA on stream 0")
        flow = len(payload)
        self.recv_window -= flow
        if self.recv_window < 0:
            raise ConnectionProblem(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self.recv_unacked += flow
        if self.recv_unacked >= CONNECTION_WINDOW // 2:
            out.append(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionProblem(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream we reset or answered: its bytes still counted for the connection window
        if stream.closed_remote:
            self._reset(stream, STREAM_CLOSED, out)
            return
        data = self._unpad(flags, payload)
        stream.recv_window -= flow
        if stream.recv_window < 0:
            self._reset(stream, FLOW_CONTROL_ERROR, out)
            return
        if data:
            n = len(data)
            stream.progress = time.monotonic()
            stream.inflight += n
            self.inflight += n
            self.server.take(self, n)
            got = stream.got
            if stream.want >= 0:  # the message's buffer exists: one copy of each byte into it
                if got + n > stream.want:
                    self._answer_early(stream, INTERNAL, "more than one request message in a unary call", out)
                    return
                stream.body[got:got + n] = data
                stream.got = got + n
            elif got + n < 5:  # the prefix is not whole yet (a peer splitting it: rare)
                stream.body += data
                stream.got = got + n
            else:
                head = bytes(stream.body) + bytes(data[:5 - got]) if got else data[:5]
                compressed, size = _PREFIX.unpack_from(head)
                if compressed:
                    self._answer_early(stream, UNIMPLEMENTED, "compressed messages are not supported", out)
                    return
                if size > self.server.max_message_bytes:
                    self._answer_early(stream, RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. "
                                       f"{self.server.max_message_bytes}; grpc_max_message_size)", out)
                    return
                want = size + 5
                if got + n > want:
                    self._answer_early(stream, INTERNAL, "more than one request message in a unary call", out)
                    return
                # the whole message's buffer at once: growing it frame by frame re-copied it (a fifth of
                # the loop's time on 1 MiB sends)
                body = bytearray(want)
                body[:got] = stream.body
                body[got:got + n] = data
                stream.body, stream.got, stream.want = body, got + n, want
                more = want - STREAM_WINDOW
                if more > 0:  # let the whole message in
                    stream.recv_window += more
                    out.append(_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(more)))
        if flags & END_STREAM:
            stream.closed_remote = True
            self._dispatch(stream, out)

    def _headers(self, flags: int, stream_id: int, payload: memoryview, out: list[bytes]) -> None:
        if not stream_id:
            raise ConnectionProblem(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionProblem(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        self.header_stream, self.header_flags = stream_id, flags
        if flags & END_HEADERS:
            self._header_block(bytes(block), out)
        else:
            self._check_block_size(len(block))
            self.header_block = bytearray(block)

    def _continuation(self, flags: int, stream_id: int, payload: memoryview, out: list[bytes]) -> None:
        if self.header_block is None:
            raise ConnectionProblem(PROTOCOL_ERROR, "CONTINUATION without a HEADERS frame before it")
        self.header_block += payload
        self._check_block_size(len(self.header_block))
        if flags & END_HEADERS:
            block, self.header_block = bytes(self.header_block), None
            self._header_block(block, out)

    def _check_block_size(self, n: int) -> None:
        # an HPACK block can be at most about as large as the list it decodes to (plus its framing)
        if n > self.server.max_header_list_bytes + 1024:
            raise ConnectionProblem(ENHANCE_YOUR_CALM, f"a header block above {self.server.max_header_list_bytes} "
                                                       f"bytes ([grpc_loop_config] max_header_list_bytes)")

    def _header_block(self, block: bytes, out: list[bytes]) -> None:
        self._check_block_size(len(block))
        stream_id, flags = self.header_stream, self.header_flags
        try:
            fields = self.decoder.decode(block)
        except HeaderListTooLarge:
            raise ConnectionProblem(ENHANCE_YOUR_CALM, f"a header list above {self.server.max_header_list_bytes} "
                                                       f"bytes ([grpc_loop_config] max_header_list_bytes)") from None
        except HeaderBlockError as e:
            raise ConnectionProblem(COMPRESSION_ERROR, f"undecodable header block: {e}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: only as the end of its request
            if not flags & END_STREAM or stream.closed_remote:
                self._reset(stream, PROTOCOL_ERROR, out)
                return
            stream.closed_remote = True
            self._dispatch(stream, out)
            return
        if stream_id <= self.last_stream_id or not stream_id & 1:
            raise ConnectionProblem(PROTOCOL_ERROR, f"stream {stream_id} is not a new client stream "
                                                    f"(last {self.last_stream_id})")
        self.last_stream_id = stream_id
        if self.goaway_sent or self.peer_goaway:
            out.append(_frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        if len(self.streams) >= self.server.max_concurrent_streams:
            self.server.refused_streams += 1
            self.server.on_refused("grpc:stream")
            self.server.warn("max_concurrent_streams", "refused a stream of {}: {} open (grpc_max_concurrent_streams)",
                             self.peer, len(self.streams))
            out.append(_frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        now = time.monotonic()
        stream = self.streams[stream_id] = _Stream(stream_id, self.peer_initial_window, now)
        self.idle_since = None
        path = b""
        method_ok = False
        content_type = b""
        timeout: bytes | None = None
        metadata = []
        for name, value in fields:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method_ok = value == b"POST"
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            else:
                try:
                    metadata.append((name.decode("ascii"), value.decode("latin-1")))
                except UnicodeDecodeError:
                    pass  # a binary (-bin) or non-ASCII name: not used by any method here
        stream.metadata = tuple(metadata)
        if flags & END_STREAM:
            stream.closed_remote = True
        if not method_ok or not content_type.startswith(b"application/grpc"):
            self._answer_early(stream, INTERNAL, "not a gRPC request (POST with content-type application/grpc)",
                               out, http_status=b"415" if method_ok else b"405")
            return
        method = self.server.methods.get(path)
        if method is None:
            self._answer_early(stream, UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')[:200]}", out)
            return
        stream.method = method
        if timeout is not None:
            seconds = parse_timeout(timeout)
            if seconds is not None:
                stream.deadline = asyncio.get_running_loop().call_later(seconds, self._deadline, stream)
        if stream.closed_remote:
            self._dispatch(stream, out)

    def _settings(self, flags: int, stream_id: int, payload: memoryview, out: list[bytes]) -> None:
        if stream_id:
            raise ConnectionProblem(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionProblem(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionProblem(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for i in range(0, len(payload), 6):
            key = payload[i] << 8 | payload[i + 1]
            value = _U32.unpack_from(payload, i + 2)[0]
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionProblem(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionProblem(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
                if delta > 0:
                    self._window_open.set()
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_BYTES <= value <= (1 << 24) - 1:
                    raise ConnectionProblem(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionProblem(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH above 1")
            # HEADER_TABLE_SIZE: our answers never use the dynamic table; the others limit what we would push
        self.settings_seen = True
        out.append(_frame(SETTINGS, ACK, 0))

    def _window_update(self, stream_id: int, payload: memoryview, out: list[bytes]) -> None:
        if len(payload) != 4:
            raise ConnectionProblem(FRAME_SIZE_ERROR, "malformed WINDOW_UPDATE")
        inc = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not inc:
                raise ConnectionProblem(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ConnectionProblem(FLOW_CONTROL_ERROR, "the connection window above 2^31-1")
            self._window_open.set()
            return
        if stream_id > self.last_stream_id:
            raise ConnectionProblem(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not inc:
            self._reset(stream, PROTOCOL_ERROR, out)
            return
        stream.send_window += inc
        if stream.send_window > MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR, out)
            return
        self._window_open.set()

    # ------------------------------------------------------------- calls
    def _dispatch(self, stream: _Stream, out: list[bytes]) -> None:
        """The request is complete: check it, then run its handler in a task of its own."""
        if stream.want < 0 or stream.got != stream.want:
            self._answer_early(stream, INTERNAL, "the request ended inside its message"
                               if stream.got else "a unary call without its request message", out)
            return
        stream.task = asyncio.get_running_loop().create_task(self._run(stream))

    async def _run(self, stream: _Stream) -> None:
        method = stream.method
        assert method is not None
        try:
            try:
                request = method.parse(memoryview(stream.body)[5:])
            except Exception as e:  # noqa: BLE001 - a malformed message is the client's error
                self._end(stream, INTERNAL, f"cannot parse the request message: {e}")
                return
            reply = await method.handler(request, LoopContext(self, stream))
            if method.streamed:
                self._end(stream, OK)
            else:
                await self.send_reply(stream, reply, end=True)
        except asyncio.CancelledError:
            if not stream.cancelled:  # not ours: the server is going away
                self._end(stream, UNAVAILABLE, "the server is stopping")
            raise
        except Exception as e:  # noqa: BLE001 - a handler's bug answers UNKNOWN, never breaks the connection
            if stream.cancelled or self.closed:
                return  # nobody to answer
            logger.opt(exception=e).warning("gRPC (loop): {} from {} failed", type(e).__name__, self.peer)
            self._end(stream, UNKNOWN, f"Unexpected error: {type(e).__name__}: {e}")

    async def send_reply(self, stream: _Stream, reply: Any, *, end: bool = False) -> None:
        """The call's one reply message: HEADERS (the first time), then DATA under the client's windows and
        frame size, then (``end``) the OK trailers. Returns once every byte is handed to the socket and the
        socket's buffer is below its high-water mark."""
        if stream.replied:
            raise RuntimeError("a call has one reply message here")
        method = stream.method
        if method is None or self.closed or stream.cancelled:
            raise ConnectionError("the call was cancelled or its connection closed")
        wire = method.serialize(reply)
        self._release_body(stream)  # the request's bytes are done with once its reply exists
        stream.replied = True
        size = len(wire)
        parts: list[bytes | memoryview] = []
        if not stream.headers_sent:
            stream.headers_sent = True
            parts.append(_frame(HEADERS, END_HEADERS, stream.id, _REPLY_HEADERS))
        total = size + 5
        if total <= min(self.send_window, stream.send_window, self.peer_max_frame):
            # the common case: one DATA frame, in one write with the headers (and trailers)
            self.send_window -= total
            stream.send_window -= total
            parts.append(_frame_head(total, DATA, 0, stream.id) + _PREFIX.pack(0, size))
            parts.append(wire)
            if end:
                parts.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, _OK_TRAILERS))
                if not stream.closed_remote:
                    parts.append(_frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
                self._write_parts(parts)
                self._drop(stream, cancel_task=False)
            else:
                self._write_parts(parts)
            if self.write_paused and not self.closed:
                await self._wait_or_stall(stream, self._writable, time.monotonic())
            return
        prefix = _PREFIX.pack(0, size)
        message = memoryview(prefix + wire) if size < 1 << 16 else None
        view = memoryview(wire)
        stalled: float | None = None  # since when the client's windows have held this reply back
        sent = 0  # of the message with its prefix
        while sent < total:
            if self.closed or stream.cancelled:
                raise ConnectionError("the call was cancelled or its connection closed")
            avail = min(self.send_window, stream.send_window)
            if avail <= 0:
                if parts:
                    self._write_parts(parts)
                    parts = []
                if stalled is None:
                    stalled = time.monotonic()
                await self._wait_or_stall(stream, self._window_open, stalled)
                continue
            stalled = None
            while avail > 0 and sent < total:
                n = min(avail, self.peer_max_frame, total - sent)
                parts.append(_frame_head(n, DATA, 0, stream.id))
                if message is not None:
                    parts.append(message[sent:sent + n])
                else:  # the prefix, then views of the reply: no copy of a large one
                    if sent < 5:
                        parts.append(prefix[sent:min(5, sent + n)])
                    if sent + n > 5:
                        parts.append(view[max(0, sent - 5):sent + n - 5])
                sent += n
                self.send_window -= n
                stream.send_window -= n
                avail -= n
            if self.write_paused:
                self._write_parts(parts)
                parts = []
                await self._wait_or_stall(stream, self._writable, time.monotonic())
        if parts:
            self._write_parts(parts)
        if self.write_paused and not self.closed:
            await self._wait_or_stall(stream, self._writable, time.monotonic())
        if end:
            self._end(stream, OK)

    async def _wait_or_stall(self, stream: _Stream, event: asyncio.Event, since: float) -> None:
        """Wait for ``event`` (window granted, or the socket writable again); a reply held back for
        ``reply_stall_s`` since ``since`` is given up: a stream the client grants no window is reset
        (CANCEL), a connection whose client does not read its socket is closed. Either way the reply's
        bytes and its budgets are released (the handler sees ``ConnectionError``)."""
        if event is self._window_open:
            event.clear()
        left = since + self.server.reply_stall_s - time.monotonic()
        if left > 0:
            try:
                await asyncio.wait_for(event.wait(), left)
                return
            except TimeoutError:
                pass
        srv = self.server
        srv.stalled_replies += 1
        stream.cancelled = True  # nobody to answer: the handler ends quietly
        if event is self._writable:
            srv.warn("reply_stall_socket", "closing the connection of {}: it read no reply bytes for {} s "
                     "([grpc_loop_config] reply_stall_timeout_sec)", self.peer, srv.reply_stall_s)
            self.close("reply stall")
        else:
            srv.warn("reply_stall_window", "reset a reply to {}: no HTTP/2 window granted for {} s "
                     "([grpc_loop_config] reply_stall_timeout_sec)", self.peer, srv.reply_stall_s)
            if not self.closed:
                self._send((_frame(RST_STREAM, 0, stream.id, _U32.pack(CANCEL)),))
            self._drop(stream, cancel_task=False)
        raise ConnectionError("the client took no reply bytes for reply_stall_timeout_sec")

    def _write_parts(self, parts: list[bytes | memoryview]) -> None:
        if not self.closed:
            self._send(parts)

    def _send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Queue frames for the socket; the first of a loop turn schedules ``_flush`` at its end."""
        if self.transport is None:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.extend(parts)
        self._out_bytes += sum(map(len, parts))

    def _flush(self) -> None:
        """Write what this loop turn sent, in one call (small frames joined, a large reply's views as they are)."""
        out, self._out = self._out, []
        size, self._out_bytes = self._out_bytes, 0
        t = self.transport
        if not out or t is None or t.is_closing():
            return
        if size <= 256 << 10:
            t.write(out[0] if len(out) == 1 else b"".join(out))
        else:
            t.writelines(out)

    def _end(self, stream: _Stream, status: int, message: str = "") -> None:
        """Trailers (or trailers-only), then the stream is done for us."""
        if self.streams.get(stream.id) is not stream:
            return
        if not self.closed and self.transport is not None:
            if stream.headers_sent:
                block = _OK_TRAILERS if status == OK else _trailers(status, message)
            else:
                block = _REPLY_HEADERS + _trailers(status, message)
            frames = _frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block)
            if not stream.closed_remote:  # the client is still sending: it need not (RFC 9113 §8.1)
                frames += _frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR))
            self._send((frames,))
        self._drop(stream, cancel_task=False)

    def _answer_early(self, stream: _Stream, status: int, message: str, out: list[bytes],
                      http_status: bytes = b"200") -> None:
        """Answer a call before its handler runs (trailers-only); the rest of its request is discarded."""
        # ":status" 200 is static entry 8; another value is a literal of that entry's name
        headers = b"\x88" if http_status == b"200" else b"\x08" + _hpack_int(len(http_status), 7, 0) + http_status
        block = headers + b"\x0f\x10\x10application/grpc" + _trailers(status, message)
        out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))
        if not stream.closed_remote:
            out.append(_frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
        self._drop(stream, cancel_task=True)

    def _reset(self, stream: _Stream, code: int, out: list[bytes]) -> None:
        out.append(_frame(RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._drop(stream, cancel_task=True)

    def _deadline(self, stream: _Stream) -> None:
        stream.deadline = None
        if self.streams.get(stream.id) is stream:
            self._end(stream, DEADLINE_EXCEEDED, "Deadline Exceeded")
            if stream.task is not None:
                stream.cancelled = True
                stream.task.cancel()

    def _release_body(self, stream: _Stream) -> None:
        if stream.inflight:
            n, stream.inflight = stream.inflight, 0
            self.inflight -= n
            self.server.release(n)
        stream.body = bytearray()
        stream.got = 0

    def _drop(self, stream: _Stream, *, cancel_task: bool) -> None:
        """Forget ``stream``: its budget goes back, its timer stops, its handler is cancelled if asked."""
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        self._release_body(stream)
        stream.method = None
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None
        if cancel_task and stream.task is not None and not stream.task.done():
            stream.cancelled = True
            stream.task.cancel()
        if not self.streams:
            self.idle_since = time.monotonic()
            if (self.peer_goaway or self.goaway_sent) and not self.closed:
                self.close("GOAWAY: done")
        self._window_open.set()  # a writer waiting on a window sees the cancellation

    # ------------------------------------------------------------- timeouts, GOAWAY, close
    def tick(self, now: float) -> None:
        """The timeouts: a frame cut short (or no preface), a request body that stopped arriving, idleness.

        A paused connection (``max_inflight_bytes``) cannot receive: its frame is not timed while it is
        paused, and its bodies are timed from the pause at the latest, so bodies that never finish cannot
        hold the budget (and every connection waiting for it) for longer than ``frame_read_timeout_sec``."""
        srv = self.server
        limit = srv.frame_timeout_s
        if self.partial_since is not None and not self.paused_for_budget \
                and now - max(self.partial_since, self.budget_mark) > limit:
            self.goaway(PROTOCOL_ERROR, "a frame cut short (or no preface) for frame_read_timeout_sec")
            self.close("frame timeout")
            return
        for stream in list(self.streams.values()):
            if stream.task is None and not stream.closed_remote and now - max(stream.progress, self.budget_mark) > limit:
                srv.warn("stream_timeout", "reset a request of {} whose body stopped arriving for {} s "
                         "([grpc_loop_config] frame_read_timeout_sec)", self.peer, limit)
                self._send((_frame(RST_STREAM, 0, stream.id, _U32.pack(CANCEL)),))
                self._drop(stream, cancel_task=True)
        if self.idle_since is not None and not self.streams and now - self.idle_since > srv.idle_timeout_s:
            self.goaway(NO_ERROR, "idle")
            self.close("idle")

    def goaway(self, code: int, reason: str) -> None:
        """Send GOAWAY once: no new streams; the caller closes (or the last stream's end does)."""
        if self.goaway_sent or self.closed or self.transport is None:
            return
        self.goaway_sent = True
        if code != NO_ERROR:
            self.server.warn(f"goaway:{code}", "closing the connection of {}: {} (HTTP/2 error {})",
                             self.peer, reason, code)
        debug = reason.encode("utf-8", "replace")[:256]
        self._send((_frame(GOAWAY, 0, 0, _U32.pack(self.last_stream_id) + _U32.pack(code) + debug),))

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.count_closed(reason)
        for stream in list(self.streams.values()):
            self._drop(stream, cancel_task=True)
        if self.transport is not None:
            self._flush()  # what was sent before the close (a GOAWAY) goes first
            self.transport.close()
