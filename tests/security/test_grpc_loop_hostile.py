"""The LOOP gRPC engine (``riffle_actors.transport.grpc_loop``) against hostile HTTP/2 clients.

Each test drives an in-process ``LoopGrpcServer`` on 127.0.0.1 with hand-built frames (our own
encoding, not the module's) and proves one refusal exactly: the GOAWAY or RST_STREAM code, the
trailers-only ``grpc-status``, the connection closed. Afterwards the server must still answer a
well-formed grpc.aio unary call over a fresh connection, with no request bytes left counted in
``inflight_bytes``.

- Connection errors: no preface, SETTINGS not first, a frame above MAX_FRAME_BYTES, header blocks
  interrupted / flooded / undecodable / too large, stream ids backwards or even, DATA on an idle
  stream, PUSH_PROMISE, a connection window overflow (GOAWAY); a stream window overflow (RST_STREAM).
- Calls: unknown method, a message over ``max_message_bytes`` (refused from its prefix), compressed,
  two messages, truncated, none, not POST, not application/grpc (trailers-only answers).
- Bounds: ``max_concurrent_streams`` (REFUSED_STREAM), a frame / preface / request body cut short
  (``frame_timeout_s``), an idle connection (``idle_timeout_s``), ``max_connections`` and
  ``max_connections_per_address``, the in-flight budget (pause_reading, resume), a reply under the
  client's flow control.
- Cancellation (client RST_STREAM, ``grpc-timeout``) and ``stop(grace)``.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import grpc
import hpack
import pytest
import pytest_asyncio

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.transport.grpc_loop import (
    MAX_FRAME_BYTES,
    LoopConnection,
    LoopContext,
    LoopGrpcServer,
    LoopMethod,
)
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 5, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
S_INITIAL_WINDOW_SIZE = 0x4

ECHO, BLOCK, BIG = b"/t.T/Echo", b"/t.T/Block", b"/t.T/Big"
MiB = 1 << 20
BIG_REPLY = bytes(range(256)) * (4 * MiB // 256)
HEADER_LIMIT = 4096
# timeouts not under test are long, so a slow machine never trips them; the timeout tests set 0.5 s
LIMITS: dict[str, Any] = {"max_message_bytes": 4 * MiB, "max_concurrent_streams": 4, "frame_timeout_s": 5.0,
                          "idle_timeout_s": 5.0, "max_connections": 3, "max_connections_per_address": 2,
                          "max_inflight_bytes": MiB, "max_header_list_bytes": HEADER_LIMIT}


def frame(type_: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((type_, flags)) + struct.pack(">I", stream) + payload


def message(payload: bytes, compressed: int = 0) -> bytes:
    """One length-prefixed gRPC message."""
    return struct.pack(">BI", compressed, len(payload)) + payload


def request(size: int = 7, app: str = "app", compressed: int = 0) -> bytes:
    return message(pb.RequireBufferRequest(requireSize=size, appId=app).SerializeToString(), compressed)


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes((value,)))


@dataclass
class Frame:
    type: int
    flags: int
    stream: int
    payload: bytes


@dataclass
class Reply:
    headers: list[dict[bytes, bytes]] = field(default_factory=list)  # one dict per HEADERS block
    data: bytes = b""
    rst: int | None = None

    @property
    def status(self) -> int | None:
        for block in reversed(self.headers):
            if b"grpc-status" in block:
                return int(block[b"grpc-status"])
        return None


class Peer:
    """A hand-driven HTTP/2 client on one TCP connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.next_id = 1
        self.local_port: int = writer.get_extra_info("sockname")[1]

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    def close(self) -> None:
        self.writer.close()

    async def read(self, timeout: float = 5.0) -> Frame | None:
        """The next frame; None once the server closed (or reset) the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(9), timeout)
            payload = await asyncio.wait_for(self.reader.readexactly(int.from_bytes(head[:3], "big")), timeout)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return Frame(head[3], head[4], int.from_bytes(head[5:], "big") & 0x7FFFFFFF, payload)

    async def until(self, pred: Callable[[Frame], bool], timeout: float = 5.0) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            f = await self.read(max(0.01, deadline - time.monotonic()))
            assert f is not None, "the server closed the connection first"
            if pred(f):
                return f

    async def closed(self, timeout: float = 5.0) -> list[Frame]:
        """Every frame until the server closes the connection (fails if it does not within ``timeout``)."""
        deadline, seen = time.monotonic() + timeout, []
        while (f := await self.read(max(0.01, deadline - time.monotonic()))) is not None:
            seen.append(f)
        return seen

    async def goaway(self, timeout: float = 5.0) -> tuple[int, int]:
        """(last stream id, error code) of the server's GOAWAY, which must be followed by the close."""
        frames = await self.closed(timeout)
        goaways = [struct.unpack(">II", f.payload[:8]) for f in frames if f.type == GOAWAY]
        assert len(goaways) == 1, f"expected one GOAWAY before the close, got {frames}"
        return goaways[0]

    async def ping(self, data: bytes = b"pingpong") -> list[Frame]:
        """A PING round trip: every frame the server wrote before its ACK."""
        self.send(frame(PING, 0, 0, data))
        seen = []
        while not ((f := await self.until(lambda f: True)).type == PING and f.flags & ACK and f.payload == data):
            seen.append(f)
        return seen

    def call(self, path: bytes = ECHO, body: bytes | None = None, *, end: bool = True, method: bytes = b"POST",
             content_type: bytes = b"application/grpc", extra: tuple[tuple[bytes, bytes], ...] = ()) -> int:
        """HEADERS (and ``body`` in DATA frames of at most MAX_FRAME_BYTES) of a new stream; its id."""
        sid, self.next_id = self.next_id, self.next_id + 2
        block = self.encoder.encode([(b":method", method), (b":scheme", b"http"), (b":path", path),
                                     (b":authority", b"t"), (b"content-type", content_type), (b"te", b"trailers"),
                                     *extra])
        flags = END_HEADERS | (END_STREAM if body is None and end else 0)
        frames = [frame(HEADERS, flags, sid, block)]
        if body is not None:
            parts = [body[i:i + MAX_FRAME_BYTES] for i in range(0, len(body), MAX_FRAME_BYTES)] or [b""]
            frames += [frame(DATA, END_STREAM if end and i == len(parts) - 1 else 0, sid, part)
                       for i, part in enumerate(parts)]
        self.send(*frames)
        return sid

    async def reply(self, sid: int, timeout: float = 5.0) -> Reply:
        """The frames of stream ``sid`` up to its END_STREAM or RST_STREAM."""
        r = Reply()
        while True:
            f = await self.until(lambda f: f.stream == sid, timeout)
            if f.type == RST_STREAM:
                r.rst = struct.unpack(">I", f.payload)[0]
                return r
            if f.type == HEADERS:
                r.headers.append(dict(self.decoder.decode(f.payload, raw=True)))
            elif f.type == DATA:
                r.data += f.payload
            if f.flags & END_STREAM:
                return r


class Harness:
    """One ``LoopGrpcServer`` with Echo / Block / Big methods, its raw peers, and the sanity check."""

    def __init__(self, limits: dict[str, Any]):
        self.entered = 0
        self.cancelled = 0
        self.gate = asyncio.Event()  # Block's handlers wait on it
        self.written = asyncio.Event()  # Big's handler returned from its write
        self.write_failed = 0  # Big's write raised (its reply was given up)
        self.refused: list[str] = []
        self.peers: list[Peer] = []
        methods = {
            ECHO.decode(): LoopMethod(pb.RequireBufferRequest.FromString, self._echo, _ser),
            BLOCK.decode(): LoopMethod(pb.RequireBufferRequest.FromString, self._block, _ser),
            BIG.decode(): LoopMethod(pb.RequireBufferRequest.FromString, self._big, _ser, streamed=True),
        }
        self.server = LoopGrpcServer(methods, on_refused=self.refused.append, **limits)
        self.port = 0

    async def _echo(self, req: pb.RequireBufferRequest, ctx: LoopContext) -> pb.RequireBufferResponse:
        return pb.RequireBufferResponse(requireBufferId=req.requireSize, retMsg=ctx.peer())

    async def _block(self, req: pb.RequireBufferRequest, ctx: LoopContext) -> pb.RequireBufferResponse:
        self.entered += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return pb.RequireBufferResponse(requireBufferId=req.requireSize)

    async def _big(self, req: pb.RequireBufferRequest, ctx: LoopContext) -> None:
        self.entered += 1
        try:
            await ctx.write(pb.GetLocalShuffleDataResponse(data=BIG_REPLY))
        except ConnectionError:
            self.write_failed += 1
            raise
        self.written.set()

    async def peer(self, *, preface: bool = True, settings: tuple[tuple[int, int], ...] = (),
                   local_host: str | None = None) -> Peer:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, local_addr=(local_host, 0) if local_host else None)
        p = Peer(reader, writer)
        self.peers.append(p)
        if preface:
            p.send(PREFACE, frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings)))
        return p

    def conn_of(self, p: Peer) -> LoopConnection:
        return next(c for c in self.server.connections if c.peer == f"ipv4:127.0.0.1:{p.local_port}")

    async def close_peers(self) -> None:
        for p in self.peers:
            p.close()
            with suppress(ConnectionError):
                await asyncio.wait_for(p.writer.wait_closed(), 5)
        self.peers.clear()

    async def sane(self) -> None:
        """The hostile peers gone, the server holds no request bytes and answers a normal call."""
        await self.close_peers()
        await poll_until(lambda: not self.server.connections, timeout=5, message="a connection was not forgotten")
        assert self.server.inflight_bytes == 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}",
                                             options=[("grpc.enable_http_proxy", 0)]) as channel:
            echo = channel.unary_unary(ECHO.decode(), request_serializer=pb.RequireBufferRequest.SerializeToString,
                                       response_deserializer=pb.RequireBufferResponse.FromString)
            r = await echo(pb.RequireBufferRequest(requireSize=4242, appId="sane"), timeout=5)
        assert r.requireBufferId == 4242 and r.retMsg.startswith("ipv4:127.0.0.1:")
        assert self.server.inflight_bytes == 0


def _ser(m: Any) -> bytes:
    return m.SerializeToString()


@pytest_asyncio.fixture
async def make() -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    """``await make(**limit_overrides)``: a started harness, always stopped at teardown."""
    made: list[Harness] = []

    async def start(**overrides: Any) -> Harness:
        h = Harness(LIMITS | overrides)
        made.append(h)
        h.port = await h.server.start("127.0.0.1", 0)
        return h
    try:
        yield start
    finally:
        for h in made:
            await h.close_peers()
            await h.server.stop(0.5)


@pytest_asyncio.fixture
async def h(make: Callable[..., Awaitable[Harness]]) -> Harness:
    return await make()


# ----------------------------------------------------------------- connection errors (GOAWAY)
@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"],
                         ids=["http1", "tls"])
async def test_no_preface_is_closed(h: Harness, garbage: bytes):
    p = await h.peer(preface=False)
    p.send(garbage)
    assert (await p.goaway())[1] == PROTOCOL_ERROR
    assert h.server.closed_by == {f"protocol:{PROTOCOL_ERROR}": 1}
    await h.sane()


def _header_block_of(n_bytes: int) -> bytes:
    return b"\x00\x01x" + hpack_int(n_bytes, 7, 0) + b"y" * n_bytes  # one literal, no Huffman


async def _backwards(p: Peer) -> None:
    p.next_id = 3
    assert (await p.reply(p.call(ECHO, request()))).status == 0
    p.next_id = 1
    p.call(ECHO, request())


# each sends one hostile sequence whose last byte is the offending one (so the server reads it all)
HOSTILE: dict[str, tuple[Callable[[Peer], Awaitable[None] | None], int]] = {
    "settings_not_first": (lambda p: p.send(PREFACE, frame(PING, 0, 0, b"12345678")), PROTOCOL_ERROR),
    "frame_too_large": (lambda p: p.send(struct.pack(">I", MAX_FRAME_BYTES + 1)[1:] + b"\x00\x00\x00\x00\x00\x01"),
                        FRAME_SIZE_ERROR),
    "headers_interrupted": (lambda p: p.send(frame(HEADERS, 0, 1, _header_block_of(10)), frame(PING, 0, 0, b"8bytes!!")),
                            PROTOCOL_ERROR),
    "continuation_flood": (lambda p: p.send(frame(HEADERS, 0, 1, b"\x00" * 1000),
                                            *[frame(CONTINUATION, 0, 1, b"\x00" * 1000)] * 5), ENHANCE_YOUR_CALM),
    "continuation_alone": (lambda p: p.send(frame(CONTINUATION, END_HEADERS, 1, b"\x82")), PROTOCOL_ERROR),
    "hpack_index_0": (lambda p: p.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x80")), COMPRESSION_ERROR),
    "hpack_table_above_settings": (lambda p: p.send(frame(HEADERS, END_HEADERS | END_STREAM, 1,
                                                          hpack_int(MiB, 5, 0x20) + b"\x82")), COMPRESSION_ERROR),
    "header_list_over_limit": (lambda p: p.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x00\x03x-a\x01b" * 300)),
                               ENHANCE_YOUR_CALM),
    "header_block_over_limit": (lambda p: p.send(frame(HEADERS, END_HEADERS | END_STREAM, 1,
                                                       _header_block_of(HEADER_LIMIT + 2000))), ENHANCE_YOUR_CALM),
    "stream_id_backwards": (_backwards, PROTOCOL_ERROR),
    "even_stream_id": (lambda p: p.send(frame(HEADERS, END_HEADERS | END_STREAM, 2, b"\x83\x86\x84")), PROTOCOL_ERROR),
    "data_on_idle_stream": (lambda p: p.send(frame(DATA, END_STREAM, 5, request())), PROTOCOL_ERROR),
    "push_promise": (lambda p: p.send(frame(PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2) + b"\x82")),
                     PROTOCOL_ERROR),
    "connection_window_overflow": (lambda p: p.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF))),
                                   FLOW_CONTROL_ERROR),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_connection_error_is_goaway_with_its_code(h: Harness, case: str):
    send, code = HOSTILE[case]
    p = await h.peer(preface=case != "settings_not_first")
    result = send(p)
    if result is not None:
        await result
    last, got = await p.goaway()
    assert got == code, f"GOAWAY code {got:#x}, expected {code:#x}"
    assert last == (3 if case == "stream_id_backwards" else 0)
    assert h.server.closed_by == {f"protocol:{code}": 1}
    assert h.entered == 0
    await h.sane()


async def test_stream_window_overflow_resets_only_that_stream(h: Harness):
    p = await h.peer()
    sid = p.call(BLOCK, request())
    await poll_until(lambda: h.entered == 1, timeout=5)
    p.send(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 0x7FFFFFFF)))
    assert (await p.reply(sid)).rst == FLOW_CONTROL_ERROR
    await poll_until(lambda: h.cancelled == 1, timeout=5, message="the reset stream's handler was not cancelled")
    r = await p.reply(p.call(ECHO, request(size=9)))  # the connection serves on
    assert r.status == 0 and pb.RequireBufferResponse.FromString(r.data[5:]).requireBufferId == 9
    await h.sane()


# ----------------------------------------------------------------- calls refused (trailers-only)
CALLS: dict[str, tuple[dict[str, Any], int, bytes]] = {  # Peer.call kwargs, grpc-status, :status
    "unknown_method": ({"path": b"/t.T/Nope", "body": request()}, 12, b"200"),
    "message_over_max": ({"body": struct.pack(">BI", 0, 4 * MiB + 1), "end": False}, 8, b"200"),
    "compressed": ({"body": request(compressed=1)}, 12, b"200"),
    "two_messages": ({"body": request() + request()}, 13, b"200"),
    "truncated_message": ({"body": struct.pack(">BI", 0, 100) + b"x" * 10}, 13, b"200"),
    "no_message": ({"body": None}, 13, b"200"),
    "not_post": ({"body": request(), "method": b"GET"}, 13, b"405"),
    "not_grpc": ({"body": request(), "content_type": b"text/plain"}, 13, b"415"),
}


@pytest.mark.parametrize("case", list(CALLS))
async def test_bad_call_is_answered_trailers_only(h: Harness, case: str):
    kwargs, status, http_status = CALLS[case]
    p = await h.peer()
    sid = p.call(**({"path": BLOCK} | kwargs))
    r = await p.reply(sid)
    assert len(r.headers) == 1 and r.data == b"" and r.rst is None, r  # trailers-only, END_STREAM
    assert r.headers[0][b":status"] == http_status and r.status == status, r.headers
    if not kwargs.get("end", True):  # the client was still sending: the rest of its request is refused
        assert (await p.reply(sid)).rst == NO_ERROR
    assert h.entered == 0 and h.server.inflight_bytes == 0
    r = await p.reply(p.call(ECHO, request()))  # the connection serves on
    assert r.status == 0
    await h.sane()


async def test_streams_above_max_concurrent_are_refused(h: Harness):
    p = await h.peer()
    admitted = [p.call(BLOCK, request(size=i)) for i in range(4)]
    await poll_until(lambda: h.entered == 4, timeout=5)
    extra = p.call(BLOCK, request())
    assert (await p.reply(extra)).rst == REFUSED_STREAM
    assert h.server.refused_streams == 1 and h.entered == 4
    h.gate.set()
    for i, sid in enumerate(admitted):
        r = await p.reply(sid)
        assert r.status == 0 and pb.RequireBufferResponse.FromString(r.data[5:]).requireBufferId == i
    await h.sane()


# ----------------------------------------------------------------- timeouts
@pytest.mark.parametrize("sent", [b"", PREFACE[:10], PREFACE + frame(SETTINGS, 0, 0) + b"\x00\x03\xe8\x00\x00\x00\x00\x00\x00"
                                  + b"x" * 10], ids=["nothing", "half_preface", "partial_frame"])
async def test_cut_short_connection_is_closed_after_frame_timeout(make: Callable[..., Awaitable[Harness]],
                                                                   sent: bytes):
    h = await make(frame_timeout_s=0.5, idle_timeout_s=30)
    start = time.monotonic()
    p = await h.peer(preface=False)
    p.send(sent)
    assert (await p.goaway())[1] == PROTOCOL_ERROR
    assert time.monotonic() - start >= 0.5
    assert h.server.closed_by == {"frame timeout": 1}
    await h.sane()


async def test_unfinished_request_body_is_reset_and_released(make: Callable[..., Awaitable[Harness]]):
    h = await make(frame_timeout_s=0.5, idle_timeout_s=30)
    p = await h.peer()
    start = time.monotonic()
    sid = p.call(BLOCK, struct.pack(">BI", 0, 100) + b"x" * 10, end=False)
    await poll_until(lambda: h.server.inflight_bytes == 15, timeout=5)
    assert (await p.reply(sid)).rst == CANCEL
    assert time.monotonic() - start >= 0.5
    assert h.server.inflight_bytes == 0 and h.entered == 0
    assert (await p.reply(p.call(ECHO, request()))).status == 0  # the connection itself was fine
    await h.sane()


async def test_a_body_still_arriving_is_not_reset(make: Callable[..., Awaitable[Harness]]):
    """The body timeout counts from the last bytes of the body, not from its start: a slow upload that keeps
    arriving (here for three timeouts) is served."""
    h = await make(frame_timeout_s=0.5, idle_timeout_s=30)
    p = await h.peer()
    body = request(app="slow-" * 8)
    sid = p.call(ECHO, end=False)
    start = time.monotonic()
    pieces = [body[i:i + 4] for i in range(0, len(body), 4)]
    for i, piece in enumerate(pieces):  # the client's pace, not a wait for the server
        p.send(frame(DATA, END_STREAM if i == len(pieces) - 1 else 0, sid, piece))
        await asyncio.sleep(1.5 / len(pieces))
    assert time.monotonic() - start >= 1.5
    r = await p.reply(sid)
    assert r.rst is None and r.status == 0
    await h.sane()


async def test_idle_connection_gets_goaway_no_error(make: Callable[..., Awaitable[Harness]]):
    h = await make(frame_timeout_s=30, idle_timeout_s=0.5)
    p = await h.peer()
    assert (await p.reply(p.call(ECHO, request()))).status == 0
    start = time.monotonic()
    assert await p.goaway() == (1, NO_ERROR)
    assert time.monotonic() - start >= 0.4  # idle since the reply left the server, a moment before start
    await h.sane()


# ----------------------------------------------------------------- connection limits
async def test_connection_limits_close_the_extra_ones_at_once(make: Callable[..., Awaitable[Harness]]):
    h = await make(frame_timeout_s=30, idle_timeout_s=30)

    async def admitted(host: str) -> Peer:
        p = await h.peer(preface=False, local_host=host)
        f = await p.read()  # an admitted connection is greeted with our SETTINGS at once
        assert f is not None and f.type == SETTINGS
        return p

    async def refused(host: str, why: str) -> None:
        p = await h.peer(preface=False, local_host=host)
        assert await p.read() is None, "a connection over the limit was served"
        assert h.refused[-1] == why

    a1, _a2 = await admitted("127.0.0.1"), await admitted("127.0.0.1")
    await refused("127.0.0.1", "grpc:connection_per_address")
    b1 = await admitted("127.0.0.2")
    await refused("127.0.0.3", "grpc:connection")
    assert len(h.server.connections) == 3
    a1.close()
    await poll_until(lambda: len(h.server.connections) == 2, timeout=5)
    await admitted("127.0.0.3")
    b1.close()
    await poll_until(lambda: len(h.server.connections) == 2, timeout=5)
    await admitted("127.0.0.1")
    assert h.refused == ["grpc:connection_per_address", "grpc:connection"]
    await h.sane()


# ----------------------------------------------------------------- the in-flight budget
def _framed_body(sid: int, body: bytes, *, end: bool = True, chunk: int = 16384) -> list[bytes]:
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)]
    return [frame(DATA, END_STREAM if end and i == len(parts) - 1 else 0, sid, part) for i, part in enumerate(parts)]


async def test_inflight_budget_pauses_a_connection_until_handlers_finish(h: Harness):
    body = request(size=1, app="a" * 900_000)
    first, second = await h.peer(), await h.peer()
    sid1 = first.call(BLOCK, body)
    await poll_until(lambda: h.entered == 1 and h.server.inflight_bytes == len(body), timeout=5)
    sid2 = second.call(BLOCK, end=False)  # HEADERS only: its body follows in 16 KiB frames
    second.send(*_framed_body(sid2, body))
    await poll_until(lambda: h.conn_of(second).paused_for_budget, timeout=5,
                     message="the connection over the budget was not paused")
    assert h.server.inflight_bytes > MiB and h.entered == 1 and not h.conn_of(first).paused_for_budget
    h.gate.set()  # the first handler finishes: its bytes go back, the second connection reads on
    assert (await first.reply(sid1)).status == 0
    assert (await second.reply(sid2)).status == 0
    assert h.entered == 2
    await poll_until(lambda: h.server.inflight_bytes == 0, timeout=5)
    await h.sane()


async def test_cut_short_bodies_over_the_budget_are_still_reset(make: Callable[..., Awaitable[Harness]]):
    h = await make(frame_timeout_s=0.5, idle_timeout_s=30)
    announced = struct.pack(">BI", 0, 900_000)
    first, second = await h.peer(), await h.peer()
    sid1 = first.call(BLOCK, end=False)
    first.send(*_framed_body(sid1, announced + b"a" * 600_000, end=False))
    await poll_until(lambda: h.server.inflight_bytes == 600_005, timeout=5)
    sid2 = second.call(BLOCK, end=False)
    second.send(*_framed_body(sid2, announced + b"b" * 600_000, end=False))
    await poll_until(lambda: h.conn_of(second).paused_for_budget, timeout=5)
    first.send(frame(DATA, 0, sid1, b"a" * 1000))  # now the first is over the budget too: both paused
    await poll_until(lambda: h.conn_of(first).paused_for_budget, timeout=5)
    # documented bound: a request body cut short for frame_timeout_s is reset and its bytes released
    await poll_until(lambda: h.server.inflight_bytes == 0, timeout=3,
                     message="two cut-short bodies hold the in-flight budget past frame_timeout_s")
    await h.sane()


async def test_partial_frames_are_bounded_by_the_frame_size_and_timed_out(
        make: Callable[..., Awaitable[Harness]]):
    """A frame cut short waits in its connection's buffer, outside max_inflight_bytes: at most one frame
    (SETTINGS_MAX_FRAME_SIZE) per connection, and only for frame_timeout_s."""
    h = await make(frame_timeout_s=0.5, idle_timeout_s=30)
    peers = [await h.peer(), await h.peer()]
    for p in peers:  # all but the last byte of a DATA frame of the largest size we accept
        p.send(struct.pack(">I", MAX_FRAME_BYTES)[1:] + b"\x00\x00\x00\x00\x00\x01" + b"z" * (MAX_FRAME_BYTES - 1))
    await poll_until(lambda: sum(len(c.buf) for c in h.server.connections) == 2 * (MAX_FRAME_BYTES + 8), timeout=5)
    await poll_until(lambda: h.server.closed_by.get("frame timeout") == 2, timeout=5)
    await h.sane()


# ----------------------------------------------------------------- replies under flow control
async def test_reply_waits_for_the_clients_window(h: Harness):
    window = 1000
    p = await h.peer(settings=((S_INITIAL_WINDOW_SIZE, window),))
    sid = p.call(BIG, request())
    got = bytearray()
    while len(got) < window:
        f = await p.until(lambda f: f.stream == sid and f.type == DATA)
        got += f.payload
    got += b"".join(f.payload for f in await p.ping() if f.stream == sid and f.type == DATA)
    assert len(got) == window, "the server sent beyond the stream window"
    assert h.entered == 1 and not h.written.is_set(), "write() returned before the reply was sent"
    more = len(BIG_REPLY) + 100
    p.send(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", more)), frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", more)))
    r = await p.reply(sid, timeout=20)
    assert r.status == 0 and r.rst is None
    wire = bytes(got) + r.data
    assert struct.unpack(">BI", wire[:5]) == (0, len(wire) - 5)
    assert pb.GetLocalShuffleDataResponse.FromString(wire[5:]).data == BIG_REPLY
    await poll_until(h.written.is_set, timeout=5)
    await h.sane()


async def test_a_reply_held_back_by_the_client_is_given_up(make: Callable[..., Awaitable[Harness]]):
    """A client that grants a 4 MiB reply no window: after reply_stall_s the stream is reset (CANCEL), the
    handler's write raises (so its reply budgets are released) and the connection serves on."""
    h = await make(reply_stall_s=0.5)
    p = await h.peer(settings=((S_INITIAL_WINDOW_SIZE, 1000),))
    start = time.monotonic()
    sid = p.call(BIG, request())
    r = await p.reply(sid, timeout=10)
    assert r.rst == CANCEL and r.status is None
    assert time.monotonic() - start >= 0.5
    await poll_until(lambda: h.write_failed == 1, timeout=5)
    assert not h.written.is_set() and h.server.stalled_replies == 1
    assert (await p.reply(p.call(ECHO, request()))).status == 0
    await h.sane()


# ----------------------------------------------------------------- cancellation, deadlines, stop
async def test_client_rst_stream_cancels_the_handler(h: Harness):
    p = await h.peer()
    sid = p.call(BLOCK, request())
    await poll_until(lambda: h.entered == 1, timeout=5)
    p.send(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
    await poll_until(lambda: h.cancelled == 1, timeout=5, message="the handler was not cancelled")
    assert not [f for f in await p.ping() if f.stream == sid], "the server answered a reset stream"
    assert (await p.reply(p.call(ECHO, request()))).status == 0
    await h.sane()


async def test_grpc_timeout_is_deadline_exceeded_and_cancels(h: Harness):
    p = await h.peer()
    start = time.monotonic()
    sid = p.call(BLOCK, request(), extra=((b"grpc-timeout", b"100m"),))
    r = await p.reply(sid)
    assert r.status == 4 and r.headers[-1][b"grpc-message"] == b"Deadline Exceeded"
    assert time.monotonic() - start >= 0.1
    await poll_until(lambda: h.cancelled == 1, timeout=5, message="the handler outlived its deadline")
    await h.sane()


async def test_stop_lets_calls_in_progress_finish_and_refuses_new_ones(h: Harness):
    p = await h.peer()
    sid = p.call(BLOCK, request(size=5))
    await poll_until(lambda: h.entered == 1, timeout=5)
    stopping = asyncio.create_task(h.server.stop(5.0))
    try:
        f = await p.until(lambda f: f.type == GOAWAY)
        assert struct.unpack(">II", f.payload[:8]) == (sid, NO_ERROR)
        assert (await p.reply(p.call(ECHO, request()))).rst == REFUSED_STREAM
        assert not stopping.done()
        h.gate.set()
        r = await p.reply(sid)
        assert r.status == 0 and pb.RequireBufferResponse.FromString(r.data[5:]).requireBufferId == 5
        await asyncio.wait_for(stopping, 5)
    finally:
        h.gate.set()
        await asyncio.wait_for(stopping, 10)
    await p.closed()
    assert h.cancelled == 0 and h.server.inflight_bytes == 0
    with pytest.raises(OSError):  # stopped: nothing listens any more
        await asyncio.open_connection("127.0.0.1", h.port)
