#!/usr/bin/env python3
"""reportShuffleResult latency: what waiting for the metadata log's append costs a map task's report.

Starts a ``riffle-server`` (in this process, gRPC on loopback, one data path in a temporary dir) from
the checkout given by ``--repo`` (default: this one), registers one shuffle and sends ``--reports``
reports one after another, each naming ``--partitions`` partitions with ``--ids`` block ids each (a map
task's report). Prints p50 / p90 / p99 / max latency in ms. Compare two checkouts in one session:

    python scripts/bench_report.py --repo /path/to/main/export
    python scripts/bench_report.py
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(args: argparse.Namespace) -> None:
    import grpc

    from riffle_actors.config import ServerConfig, validate_config
    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
    from riffle_actors.server import ShuffleServer

    root = Path(tempfile.mkdtemp(prefix="riffle-bench-report-"))
    cfg = validate_config(ServerConfig, {"grpc_port": 0, "http_port": 0, "grpc_bind_address": "127.0.0.1",
                                         "http_bind_address": "127.0.0.1", "grace_period_sec": 0,
                                         "localfile_store": {"data_paths": [str(root / "d1")]}})
    srv = ShuffleServer(cfg)
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
            stub = pbg.ShuffleServerStub(ch)
            r = await stub.registerShuffle(pb.ShuffleRegisterRequest(
                appId="bench", shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=args.partitions)]))
            assert r.status == 0, r.retMsg
            lat = []
            for task in range(args.warmup + args.reports):
                req = pb.ReportShuffleResultRequest(
                    appId="bench", shuffleId=0, taskAttemptId=task, bitmapNum=1,
                    partitionToBlockIds=[pb.PartitionToBlockIds(
                        partitionId=p, blockIds=[(s << 45) | (p << 21) | task for s in range(args.ids)])
                        for p in range(args.partitions)])
                t = time.perf_counter()
                r = await stub.reportShuffleResult(req)
                if task >= args.warmup:
                    lat.append((time.perf_counter() - t) * 1000)
                assert r.status == 0, r.retMsg
        print(f"{args.repo}: {args.reports} reports of {args.partitions} partitions x {args.ids} ids: "
              f"p50 {percentile(lat, 0.5):.2f} ms  p90 {percentile(lat, 0.9):.2f} ms  "
              f"p99 {percentile(lat, 0.99):.2f} ms  max {max(lat):.2f} ms")
    finally:
        await srv.stop(0)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--reports", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--ids", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, args.repo)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
