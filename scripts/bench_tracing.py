"""Cost of ``[tracing]`` per RPC: the same RPC mix against two in-process servers, one without tracing
and one exporting every span (sample_ratio 1.0) to a local OTLP/HTTP receiver, in alternating rounds
within one run, so a loaded box shifts both alike. Prints the per-RPC mean of each round and the
median ratio traced/untraced per RPC kind, and the spans the receiver got.

    PYTHONPATH=$PWD python3 scripts/bench_tracing.py [--rounds 5] [--rpcs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from riffle_actors.config import ServerConfig, validate_config
from riffle_actors.server import ShuffleServer
from tests.helpers.client import UniffleClient, make_blocks


def receiver() -> tuple[ThreadingHTTPServer, dict]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    got = {"spans": 0, "posts": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            req = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
            got["posts"] += 1
            got["spans"] += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, got


def config(tmp: Path, name: str, tracing: dict | None) -> ServerConfig:
    raw = {"grpc_port": 0, "grpc_bind_address": "127.0.0.1", "http_port": 0, "http_bind_address": "127.0.0.1",
           "grace_period_sec": 0, "memory_store": {"capacity": "256M"},
           "localfile_store": {"data_paths": [str(tmp / name)]}}
    if tracing:
        raw["tracing"] = tracing
    return validate_config(ServerConfig, raw)


async def one_round(client: UniffleClient, app: str, n: int, round_no: int) -> dict[str, float]:
    """Mean seconds per RPC of each kind for ``n`` of each."""
    out: dict[str, float] = {}
    t = time.perf_counter()
    for i in range(n):  # requireBuffer + sendShuffleData, one 1 KiB block each
        await client.send_blocks(app, 0, make_blocks(i % 4, round_no + 1, 1, 1024, seq_start=i))
    out["requireBuffer+sendShuffleData"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for i in range(n):
        await client.get_shuffle_result(app, 0, [i % 4])
    out["getShuffleResultForMultiPart"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for i in range(n):
        await client.stub.getMemoryShuffleData(client.pb.GetMemoryShuffleDataRequest(
            appId=app, shuffleId=0, partitionId=i % 4, lastBlockId=-1, readBufferSize=64 << 10))
    out["getMemoryShuffleData"] = (time.perf_counter() - t) / n
    return out


def loop_cost(port: int, n: int = 20_000) -> tuple[float, float]:
    """Seconds per ``Metrics.on_rpc`` (what each RPC adds on the loop) with tracing off and on."""
    from riffle_actors.metrics import Metrics
    from riffle_actors.tracing import Tracer

    res = []
    for tracer in (Tracer.off(), Tracer.start(f"http://127.0.0.1:{port}", "bench-micro", max_queue_size=n)):
        m = Metrics()
        m.tracer = tracer
        started = time.perf_counter()
        t = time.perf_counter()
        for _ in range(n):
            m.on_rpc("sendShuffleData", "SUCCESS", started, "application_1")
        res.append((time.perf_counter() - t) / n)
        tracer.shutdown()
    return res[0], res[1]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rpcs", type=int, default=300, help="RPCs of each kind per round and server")
    args = ap.parse_args()
    httpd, got = receiver()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        off = ShuffleServer(config(tmp, "off", None))
        on = ShuffleServer(config(tmp, "on", {"jaeger_reporter_endpoint": f"http://127.0.0.1:{httpd.server_port}",
                                              "jaeger_service_name": "bench"}))
        await off.start()
        await on.start()
        try:
            async with UniffleClient(f"127.0.0.1:{off.grpc_port}") as c_off, \
                    UniffleClient(f"127.0.0.1:{on.grpc_port}") as c_on:
                for c in (c_off, c_on):
                    await c.register_shuffle("application_bench_1", 0, range(4))
                await one_round(c_off, "application_bench_1", 50, 99)  # warm-up, both
                await one_round(c_on, "application_bench_1", 50, 99)
                ratios: dict[str, list[float]] = {}
                for r in range(args.rounds):
                    a = await one_round(c_off, "application_bench_1", args.rpcs, r)
                    b = await one_round(c_on, "application_bench_1", args.rpcs, r)
                    for k in a:
                        ratios.setdefault(k, []).append(b[k] / a[k])
                        print(f"round {r} {k:32s} off {a[k] * 1e6:8.1f} us  on {b[k] * 1e6:8.1f} us  "
                              f"ratio {b[k] / a[k]:.3f}")
            tracer = on.metrics.tracer
            recorded, dropped = tracer.recorded, tracer.dropped
            await asyncio.get_running_loop().run_in_executor(None, tracer.flush)
        finally:
            await on.stop()
            await off.stop()
    off_s, on_s = loop_cost(httpd.server_port)
    httpd.shutdown()
    print(f"on the loop per RPC (Metrics.on_rpc, 20000 calls): off {off_s * 1e6:.1f} us, on {on_s * 1e6:.1f} us "
          f"(+{(on_s - off_s) * 1e6:.1f} us, ratio {on_s / off_s:.2f})")
    print("median ratio traced/untraced (same run; the box is shared, so compare ratios only):")
    for k, v in ratios.items():
        print(f"  {k:32s} {statistics.median(v):.3f}  (rounds: {', '.join(f'{x:.3f}' for x in v)})")
    print(f"spans recorded {recorded}, dropped {dropped}, received {got['spans']} in {got['posts']} posts")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
