#!/usr/bin/env python3
"""Serving-stack floor: what the gRPC layer alone costs a server per send, on each stack the port can use.

Issue 19 asked whether another serving option for the gRPC port pays; the answer was this benchmark,
and then ``transport/grpc_loop.py`` (``grpc_engine = "LOOP"``, now the default). It measures the
floor under any shuffle server written on each stack: a **do-nothing** server that answers
registerShuffle, requireBuffer, sendShuffleData and reportShuffleResult SUCCESS and keeps nothing,
served

- by grpc.aio (``bench_ingest.run_null_aio_server``; ``grpc_engine = "GRPCIO"``),
- by grpcio's synchronous server (``run_null_sync_server``: handlers on a thread pool), and
- by ``transport.grpc_loop`` (``bench_ingest.run_null_server``; ``grpc_engine = "LOOP"``: our HTTP/2
  on the event loop, with all its checks and bounds).

The same clients (``bench_ingest.run_clients``: 2 processes x 8 senders, 64 partitions, 4-64 KiB
blocks, each send = requireBuffer + sendShuffleData, or + a urpc frame with ``--transport urpc``)
write to each, rounds interleaved; it prints the server CPU ms per send, write MB/s and the ratios
to grpc.aio per transport (medians over ``--rounds``).

    python scripts/bench_serving.py [--transport grpc urpc] [--request-kib 64] [--total-mib 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_ingest import MIB, run_clients, run_null_aio_server, run_null_server, serve_null_urpc


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
    servers = {"grpc.aio": run_null_aio_server, "grpcio sync": run_null_sync_server, "grpc_loop": run_null_server}
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
        for name in ("grpcio sync", "grpc_loop"):
            cpu, mbps = medians[name]
            print(f"{transport:9} {name} / grpc.aio: CPU per send x{cpu / a_cpu:.2f}, write MB/s x{mbps / a_mbps:.2f}; "
                  f"saved per send {a_cpu - cpu:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
