#!/usr/bin/env python3
"""Serving-stack floor: what the gRPC layer alone costs a server per send, grpc.aio against a minimal HTTP/2.

Issue 19 asks to decide with figures whether another serving option for the gRPC port pays. This
benchmark measures the floor under any shuffle server written on each stack: a **do-nothing** server
that answers registerShuffle, requireBuffer, sendShuffleData and reportShuffleResult SUCCESS and keeps
nothing, served

- by grpc.aio (``bench_ingest.run_null_server``, the stack ``riffle-server`` uses),
- by grpcio's synchronous server (``run_null_sync_server``: handlers on a thread pool), and
- by ``NullH2``, below: a minimal HTTP/2 server protocol on the event loop (frames parsed by hand,
  request headers decoded by ``hpack.Decoder``, fixed HPACK literals out, one asyncio task per call
  as our urpc server does, protobuf messages parsed and built as a real handler would).

The same clients (``bench_ingest.run_clients``: 2 processes x 8 senders, 64 partitions, 4-64 KiB
blocks, each send = requireBuffer + sendShuffleData, or + a urpc frame with ``--transport urpc``)
write to each, rounds interleaved; it prints the server CPU ms per send, write MB/s and the ratios
to grpc.aio per transport (medians over ``--rounds``).

``NullH2`` is a measuring device, not a server: it trusts its peer (no header validation, no limits
on streams or header sizes, no outbound flow control: its answers are a few bytes), answers every
path SUCCESS and listens on 127.0.0.1 only. What a real one needs is in docs/performance.md
("Serving gRPC: grpc.aio against a minimal HTTP/2").

    python scripts/bench_serving.py [--transport grpc urpc] [--request-kib 64] [--total-mib 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_ingest import MIB, run_clients, run_null_server, serve_null_urpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x3, 0x4
WINDOW = 16 << 20  # every stream's receive window: a request up to this size needs no WINDOW_UPDATE
_U32 = struct.Struct(">I")


def frame(type_: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16, n >> 8 & 0xFF, n & 0xFF, type_, flags)) + _U32.pack(stream_id) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal without indexing, new name, no Huffman (RFC 7541 §6.2.2; lengths below 127)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


# ":status: 200" is static entry 8; "content-type" is static name 31 (a literal without indexing of it)
ANSWER_HEADERS = b"\x88" + b"\x0f\x10" + bytes((16,)) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")


class _Call:
    __slots__ = ("block", "body", "end_stream", "path")

    def __init__(self) -> None:
        self.path = b""
        self.body = bytearray()
        self.block = b""
        self.end_stream = False


class NullH2(asyncio.Protocol):
    """One HTTP/2 connection of the do-nothing gRPC server (see the module docstring)."""

    def __init__(self) -> None:
        import hpack

        self.decoder = hpack.Decoder()
        self.buf = bytearray()
        self.preface = False
        self.calls: dict[int, _Call] = {}
        self.unacked = 0  # DATA bytes received since the last connection WINDOW_UPDATE

    def connection_made(self, transport) -> None:
        self.t = transport
        settings = struct.pack(">HI", SETTINGS_MAX_CONCURRENT_STREAMS, 100) + struct.pack(
            ">HI", SETTINGS_INITIAL_WINDOW_SIZE, WINDOW)
        transport.write(frame(SETTINGS, 0, 0, settings) + frame(0x8, 0, 0, _U32.pack(1 << 30)))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        if not self.preface:
            if len(buf) < len(PREFACE):
                return
            if bytes(buf[:len(PREFACE)]) != PREFACE:
                self.t.close()
                return
            self.preface, pos = True, len(PREFACE)
        out = []
        end = len(buf)
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if end - pos < 9 + length:
                break
            type_, flags = buf[pos + 3], buf[pos + 4]
            stream_id = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            if type_ == DATA:
                self._data(stream_id, flags, payload, out)
            elif type_ in (HEADERS, CONTINUATION):
                self._headers(type_, stream_id, flags, payload)
            elif type_ == SETTINGS and not flags & ACK:
                out.append(frame(SETTINGS, ACK, 0))
            elif type_ == PING and not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
            elif type_ == RST_STREAM:
                self.calls.pop(stream_id, None)
        del buf[:pos]
        if out:
            self.t.write(b"".join(out))

    def _data(self, stream_id: int, flags: int, payload: bytes, out: list[bytes]) -> None:
        self.unacked += len(payload)
        if self.unacked > 1 << 29:
            out.append(frame(0x8, 0, 0, _U32.pack(self.unacked)))
            self.unacked = 0
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        call = self.calls.get(stream_id)
        if call is not None:
            call.body += payload
            if flags & END_STREAM:
                self._start(stream_id)

    def _headers(self, type_: int, stream_id: int, flags: int, payload: bytes) -> None:
        if type_ == HEADERS:
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            call = self.calls[stream_id] = _Call()
            call.end_stream = bool(flags & END_STREAM)
            call.block = payload
        else:
            call = self.calls[stream_id]
            call.block += payload
        if flags & END_HEADERS:
            for name, value in self.decoder.decode(call.block, raw=True):
                if name == b":path":
                    call.path = value
            call.block = b""
            if call.end_stream:
                self._start(stream_id)

    def _start(self, stream_id: int) -> None:
        call = self.calls.pop(stream_id)
        asyncio.get_running_loop().create_task(self._serve(stream_id, call.path, bytes(call.body)))

    async def _serve(self, stream_id: int, path: bytes, body: bytes) -> None:
        from riffle_actors.protocol.proto import uniffle_pb2 as pb

        message = body[5:]
        method = path.rsplit(b"/", 1)[-1]
        if method == b"requireBuffer":
            pb.RequireBufferRequest.FromString(message)
            answer = pb.RequireBufferResponse(status=0, requireBufferId=1)
        elif method == b"sendShuffleData":
            pb.SendShuffleDataRequest.FromString(message)
            answer = pb.SendShuffleDataResponse(status=0)
        elif method == b"registerShuffle":
            answer = pb.ShuffleRegisterResponse(status=0)
        else:
            answer = pb.ReportShuffleResultResponse(status=0)
        raw = answer.SerializeToString()
        self.t.write(frame(HEADERS, END_HEADERS, stream_id, ANSWER_HEADERS)
                     + frame(DATA, 0, stream_id, b"\0" + _U32.pack(len(raw)) + raw)
                     + frame(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS))


def run_null_h2_server(transport: str, port_q: mp.Queue) -> None:
    """``run_null_server``'s counterpart on ``NullH2`` (the same do-nothing urpc port with ``urpc``)."""
    import uvloop

    async def main() -> None:
        srv = await asyncio.get_running_loop().create_server(NullH2, "127.0.0.1", 0)
        urpc_port = await serve_null_urpc() if transport == "urpc" else 0
        port_q.put((srv.sockets[0].getsockname()[1], urpc_port))
        await asyncio.Event().wait()

    uvloop.run(main())


def run_null_sync_server(transport: str, port_q: mp.Queue) -> None:
    """The do-nothing servicer on grpcio's synchronous server (a thread pool of 16 handlers); with ``urpc``
    the do-nothing urpc port on an event loop in the main thread. A real server on it would also pay a
    hop from each handler thread to the loop that owns the actors; this floor leaves that out."""
    from concurrent import futures

    import grpc
    import uvloop

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    class Null(pbg.ShuffleServerServicer):
        def registerShuffle(self, request, context):
            return pb.ShuffleRegisterResponse(status=0)

        def requireBuffer(self, request, context):
            return pb.RequireBufferResponse(status=0, requireBufferId=1)

        def sendShuffleData(self, request, context):
            return pb.SendShuffleDataResponse(status=0)

        def reportShuffleResult(self, request, context):
            return pb.ReportShuffleResultResponse(status=0)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.max_receive_message_length", 1 << 30),
                                  ("grpc.max_send_message_length", 1 << 30)])
    pbg.add_ShuffleServerServicer_to_server(Null(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def main() -> None:
        urpc_port = await serve_null_urpc() if transport == "urpc" else 0
        port_q.put((port, urpc_port))
        await asyncio.Event().wait()

    uvloop.run(main())


def measure(target, transport: str, args: dict) -> tuple[float, float]:
    """(server CPU ms per send, write MB/s) of one run of the clients against a fresh ``target`` server."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=target, args=(transport, q))
    proc.start()
    try:
        port, urpc_port = q.get(timeout=60)
        r = run_clients(target.__name__, proc.pid, port, urpc_port, args)
    finally:
        proc.kill()
        proc.join()
    return r["write_cpu_s"] * 1e3 / max(1, len(r["send_lat"])), r["write_bytes"] / MIB / r["write_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", nargs="+", choices=("grpc", "urpc"), default=["grpc", "urpc"])
    ap.add_argument("--request-kib", type=int, default=64)
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    args = {"clients": opts.clients, "total_mib": opts.total_mib, "partitions": 64, "senders": opts.senders,
            "request_bytes": opts.request_kib * 1024, "read_back": False}
    servers = {"grpc.aio": run_null_server, "grpcio sync": run_null_sync_server,
               "minimal HTTP/2": run_null_h2_server}
    print(f"do-nothing servers, {opts.total_mib} MiB per run, {opts.request_kib} KiB per send, {opts.clients} "
          f"client processes x {opts.senders} senders, {opts.rounds} rounds interleaved (medians)", flush=True)
    print(f"{'transport':9} {'stack':15} {'CPU ms/send':>11} {'write MB/s':>10}   rounds (CPU ms/send)")
    for transport in opts.transport:
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
        for _ in range(opts.rounds):
            for name, target in servers.items():
                results[name].append(measure(target, transport, args))
        medians = {}
        for name, values in results.items():
            cpu = statistics.median(v[0] for v in values)
            mbps = statistics.median(v[1] for v in values)
            medians[name] = (cpu, mbps)
            print(f"{transport:9} {name:15} {cpu:11.3f} {mbps:10.1f}   {', '.join(f'{v[0]:.3f}' for v in values)}",
                  flush=True)
        a_cpu, a_mbps = medians["grpc.aio"]
        for name in ("grpcio sync", "minimal HTTP/2"):
            cpu, mbps = medians[name]
            print(f"{transport:9} {name} / grpc.aio: CPU per send x{cpu / a_cpu:.2f}, write MB/s x{mbps / a_mbps:.2f}; "
                  f"saved per send {a_cpu - cpu:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
