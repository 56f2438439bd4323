"""A small gRPC client for unary calls over one HTTP/2 connection, on the event loop (``h2`` + asyncio).

This module owns the server's outgoing control connection to a coordinator (the heartbeat). Why
not grpc.aio: grpc's C core hands every call to its own threads and keeps them busy for a while
after it, so an idle server paid ~2 ms of CPU per heartbeat and ~0.5 ms/s between heartbeats
(``scripts/bench_idle.py``: 0.004 CPU s/s at a 1 s heartbeat against Riffle's 0.0012). This client
does the same call in ~1.1 ms and nothing between calls: no thread, one socket, one loop.

What it speaks (gRPC over HTTP/2, "PROTOCOL-HTTP2" of grpc/grpc, unary only):

- request: HEADERS ``:method POST``, ``:scheme http``, ``:path /<service>/<method>``,
  ``content-type application/grpc``, ``te trailers``, ``grpc-timeout <n>m``; one DATA message with
  the 5-byte prefix (flag 0 = uncompressed, big-endian length), split by the peer's flow-control
  window and frame size;
- response: HEADERS (``:status`` 200), one length-prefixed message (at most ``max_response_bytes``),
  then trailers with ``grpc-status`` and ``grpc-message``; a "trailers-only" answer (status in the
  first HEADERS, end of stream) is an error without a message.
- Errors are ``UnaryCallError(code, details)`` with gRPC's code names: ``UNAVAILABLE`` (no connection,
  reset, GOAWAY, protocol error), ``DEADLINE_EXCEEDED`` (the stream is reset with CANCEL),
  ``RESOURCE_EXHAUSTED`` (an oversized answer), ``INTERNAL`` (a malformed answer), or the peer's.

The connection is opened at the first call and again at the next call after it failed or the
peer went away; calls never retry (the caller decides). It does not cover: streaming calls,
compression, TLS or authentication (a coordinator link is plaintext, as grpc.aio's insecure
channel was), or which messages go over it (``riffle_actors.transport.coordinator_client``).
"""

from __future__ import annotations

import asyncio
import struct
import urllib.parse
from typing import cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

#: gRPC status codes (grpc/grpc doc/statuscodes.md) by number, for error messages.
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
                "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")

DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # grpc's default max receive message size


class UnaryCallError(Exception):
    """A call that did not return a message: ``code`` is a gRPC status name."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def _split_target(target: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    parsed = urllib.parse.urlsplit("//" + target)
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"a coordinator address must be host:port, got {target!r}")
    return parsed.hostname, parsed.port


class _Stream:
    __slots__ = ("body", "done", "headers", "status", "trailers")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.done: asyncio.Future[None] = loop.create_future()
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.body = bytearray()
        self.status: UnaryCallError | None = None

    def fail(self, error: UnaryCallError) -> None:
        if not self.done.done():
            self.status = error
            self.done.set_result(None)


class _Connection(asyncio.Protocol):
    """One HTTP/2 client connection; owned by a ``UnaryChannel``."""

    def __init__(self, authority: str, max_response_bytes: int) -> None:
        self.authority = authority
        self.max_response_bytes = max_response_bytes
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.window_open: asyncio.Event = asyncio.Event()
        self.closed: UnaryCallError | None = None

    # ------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not a subclass of asyncio.Transport; it has the same methods
        self.transport = cast(asyncio.Transport, transport)
        self.h2.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            self._close(UnaryCallError("UNAVAILABLE", f"HTTP/2 protocol error from the peer: {e!r}"))
            return
        for event in events:
            self._on_event(event)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._close(UnaryCallError("UNAVAILABLE", f"connection closed ({exc!r})" if exc else "connection closed"))

    # ------------------------------------------------------------- HTTP/2 events
    def _on_event(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            stream.headers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.TrailersReceived) and stream is not None:
            stream.trailers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream is not None and stream.status is None:
                stream.body += event.data
                if len(stream.body) > self.max_response_bytes + 5:
                    stream.fail(UnaryCallError("RESOURCE_EXHAUSTED",
                                               f"answer over {self.max_response_bytes} bytes"))
                    self._reset(event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            if not stream.done.done():
                stream.done.set_result(None)
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            stream.fail(UnaryCallError("UNAVAILABLE", f"stream reset by the peer (error code {event.error_code})"))
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window_open.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._close(UnaryCallError("UNAVAILABLE", f"the peer closed the connection (GOAWAY, error code "
                                                      f"{event.error_code})"))

    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)

    def _reset(self, stream_id: int) -> None:
        try:
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.H2Error:
            pass  # already closed
        self._flush()

    def _close(self, error: UnaryCallError) -> None:
        if self.closed is None:
            self.closed = error
        for stream in self.streams.values():
            stream.fail(error)
        self.window_open.set()
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------- one call
    async def call(self, path: str, message: bytes, timeout_s: float) -> bytes:
        if self.closed is not None:
            raise self.closed
        loop = asyncio.get_running_loop()
        stream_id = self.h2.get_next_available_stream_id()
        stream = self.streams[stream_id] = _Stream(loop)
        try:
            async with asyncio.timeout(timeout_s):
                self.h2.send_headers(stream_id, [
                    (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
                    ("content-type", "application/grpc"), ("te", "trailers"),
                    ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m")])
                await self._send_body(stream_id, stream, b"\0" + struct.pack(">I", len(message)) + message)
                await stream.done
        except TimeoutError:
            self._reset(stream_id)
            raise UnaryCallError("DEADLINE_EXCEEDED", f"no answer within {timeout_s:g}s") from None
        except h2.exceptions.H2Error as e:
            self._close(UnaryCallError("UNAVAILABLE", f"HTTP/2 state error: {e!r}"))
            raise self.closed or UnaryCallError("UNAVAILABLE", repr(e)) from None
        finally:
            del self.streams[stream_id]
        if stream.status is not None:
            raise stream.status
        return _decode_answer(stream)

    async def _send_body(self, stream_id: int, stream: _Stream, body: bytes) -> None:
        view = memoryview(body)
        while True:
            if self.closed is not None:
                raise self.closed
            if stream.status is not None:
                return  # failed meanwhile: the caller reports it
            size = min(len(view), self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            if size > 0 or not view:
                self.h2.send_data(stream_id, bytes(view[:size]), end_stream=size == len(view))
                self._flush()
                view = view[size:]
                if not view:
                    return
                continue
            self.window_open.clear()
            await self.window_open.wait()


def _decode_answer(stream: _Stream) -> bytes:
    headers = stream.headers
    if headers.get(":status") != "200":
        raise UnaryCallError("UNAVAILABLE" if headers.get(":status") in ("502", "503", "504") else "UNKNOWN",
                             f"HTTP status {headers.get(':status')!r}")
    status_source = stream.trailers or headers  # trailers-only answers carry the status in the headers
    raw = status_source.get("grpc-status")
    if raw is None:
        raise UnaryCallError("INTERNAL", "the answer has no grpc-status")
    try:
        code = int(raw)
    except ValueError:
        raise UnaryCallError("INTERNAL", f"grpc-status {raw!r} is not a number") from None
    if code != 0:
        name = STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"
        raise UnaryCallError(name, urllib.parse.unquote(status_source.get("grpc-message", "")))
    body = stream.body
    if len(body) < 5:
        raise UnaryCallError("INTERNAL", f"an answer of {len(body)} bytes has no message")
    compressed, length = body[0], struct.unpack_from(">I", body, 1)[0]
    if compressed:
        raise UnaryCallError("INTERNAL", "a compressed answer, and none was asked for")
    if length != len(body) - 5:
        raise UnaryCallError("INTERNAL", f"a message of {length} bytes announced, {len(body) - 5} received")
    return bytes(body[5:])


class UnaryChannel:
    """Unary gRPC calls to one ``host:port`` over one HTTP/2 connection, opened when first needed."""

    def __init__(self, target: str, *, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.target = target
        self.host, self.port = _split_target(target)
        self.max_response_bytes = max_response_bytes
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None
        self.connects = 0

    async def call(self, path: str, message: bytes, timeout_s: float) -> bytes:
        """The answer's message bytes, or ``UnaryCallError``; the connect counts in ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = await self._connection(timeout_s)
        return await conn.call(path, message, max(0.001, deadline - loop.time()))

    async def _connection(self, timeout_s: float) -> _Connection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            conn = self._conn
            if conn is not None and conn.closed is None:
                return conn
            authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            try:
                async with asyncio.timeout(timeout_s):
                    _, conn = await asyncio.get_running_loop().create_connection(
                        lambda: _Connection(authority, self.max_response_bytes), self.host, self.port)
            except TimeoutError:
                raise UnaryCallError("DEADLINE_EXCEEDED", f"could not connect to {self.target} within "
                                                          f"{timeout_s:g}s") from None
            except OSError as e:
                raise UnaryCallError("UNAVAILABLE", f"cannot connect to {self.target}: {e}") from None
            self._conn = conn
            self.connects += 1
            return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn._close(UnaryCallError("CANCELLED", "the channel was closed"))
