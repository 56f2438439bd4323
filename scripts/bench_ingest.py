#!/usr/bin/env python3
"""Ingest benchmark: riffle-server against a do-nothing grpc.aio server, same client, same run.

Starts ``riffle-server`` as a daemon process on a temporary data dir, then runs a separate
client process that pushes realistic shuffle traffic (many partitions, 4-64 KiB blocks,
several concurrent senders; each send is requireBuffer + sendShuffleData, like the Uniffle
client) and then reads every partition back (memory cursor, then index + data segments).
The same client then writes to a do-nothing grpc.aio server (answers SUCCESS without
keeping anything). Prints write and read MB/s, p50/p99 latency and the write ratio
ours / do-nothing.

    python scripts/bench_ingest.py [--total-mib 1024] [--capacity 512M] [--senders 8]

Numbers vary 15-30 % run to run on a shared 2-core box; compare ratios from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

APP = "bench_app"
MIB = 1 << 20


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ----------------------------------------------------------------------------- do-nothing server
def run_null_server(port_q: mp.Queue) -> None:
    import grpc
    import uvloop

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    class Null(pbg.ShuffleServerServicer):
        ticket = 0

        async def registerShuffle(self, request, context):
            return pb.ShuffleRegisterResponse(status=0)

        async def requireBuffer(self, request, context):
            self.ticket += 1
            return pb.RequireBufferResponse(status=0, requireBufferId=self.ticket)

        async def sendShuffleData(self, request, context):
            return pb.SendShuffleDataResponse(status=0)

        async def reportShuffleResult(self, request, context):
            return pb.ReportShuffleResultResponse(status=0)

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30),
                                          ("grpc.max_send_message_length", 1 << 30)])
        pbg.add_ShuffleServerServicer_to_server(Null(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(port)
        await server.wait_for_termination()

    uvloop.run(main())


# ----------------------------------------------------------------------------- client
def run_client(port: int, args: dict, result_q: mp.Queue, read_back: bool) -> None:
    import grpc
    import uvloop

    from riffle_actors.protocol.index import decode_index
    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    rng = random.Random(7)
    # a pool of payloads reused by every request keeps the client's own CPU small
    pool = [os.urandom(rng.choice((4, 8, 16, 32, 64)) * 1024) for _ in range(256)]
    pool_crc = [zlib.crc32(p) for p in pool]
    partitions = args["partitions"]
    per_request = args["request_bytes"]
    total = args["total_mib"] * MIB

    async def main() -> dict:
        opts = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
        stub = pbg.ShuffleServerStub(channel)
        await stub.registerShuffle(pb.ShuffleRegisterRequest(
            appId=APP, shuffleId=0,
            partitionRanges=[pb.ShufflePartitionRange(start=p, end=p) for p in range(partitions)]))
        sent = 0
        next_block = [0]
        latencies: list[float] = []
        lock = asyncio.Lock()
        expected: dict[int, dict[int, int]] = {p: {} for p in range(partitions)}  # partition -> block -> pool idx

        async def sender(sender_id: int) -> None:
            nonlocal sent
            r = random.Random(sender_id)
            while True:
                async with lock:
                    if sent >= total:
                        return
                    sent += per_request
                by_partition: dict[int, list] = {}
                size = 0
                nbytes = 0
                while nbytes < per_request:
                    i = r.randrange(len(pool))
                    p = r.randrange(partitions)
                    next_block[0] += 1
                    bid = next_block[0]
                    data = pool[i]
                    by_partition.setdefault(p, []).append(pb.ShuffleBlock(
                        blockId=bid, length=len(data), uncompressLength=len(data), crc=pool_crc[i], data=data,
                        taskAttemptId=sender_id))
                    expected[p][bid] = i
                    nbytes += len(data)
                    size += len(data) + 32
                req_data = [pb.ShuffleData(partitionId=p, block=b) for p, b in by_partition.items()]
                t0 = time.perf_counter()
                while True:
                    rb = await stub.requireBuffer(pb.RequireBufferRequest(
                        requireSize=size, appId=APP, shuffleId=0, partitionIds=list(by_partition)))
                    if rb.status == 0:
                        break
                    await asyncio.sleep(0.02)
                resp = await stub.sendShuffleData(pb.SendShuffleDataRequest(
                    appId=APP, shuffleId=0, requireBufferId=rb.requireBufferId, shuffleData=req_data))
                if resp.status != 0:
                    raise RuntimeError(f"send failed: {resp.status} {resp.retMsg}")
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(sender(i) for i in range(args["senders"])))
        write_s = time.perf_counter() - t0
        written = sum(len(pool[i]) for blocks in expected.values() for i in blocks.values())
        out = {"write_mib": written / MIB, "write_s": write_s, "write_mbps": written / MIB / write_s,
               "send_p50_ms": percentile(latencies, 0.5) * 1000, "send_p99_ms": percentile(latencies, 0.99) * 1000,
               "sends": len(latencies)}
        if read_back:
            read_lat: list[float] = []
            read_bytes = 0
            bad = 0
            t1 = time.perf_counter()

            async def read_partition(p: int) -> None:
                nonlocal read_bytes, bad
                got: set[int] = set()
                last = -1
                while True:
                    ts = time.perf_counter()
                    m = await stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
                        appId=APP, shuffleId=0, partitionId=p, lastBlockId=last, readBufferSize=14 * MIB))
                    read_lat.append(time.perf_counter() - ts)
                    if m.status != 0 or not m.shuffleDataBlockSegments:
                        break
                    for seg in m.shuffleDataBlockSegments:
                        if seg.blockId not in got:
                            got.add(seg.blockId)
                            read_bytes += seg.length
                            bad += m.data[seg.offset:seg.offset + seg.length] != pool[expected[p][seg.blockId]]
                    last = m.shuffleDataBlockSegments[-1].blockId
                ix = await stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
                    appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=partitions))
                entries = decode_index(ix.indexData)
                seg_start = 0
                while seg_start < len(entries):  # contiguous segments of about 14 MiB
                    seg_end, length = seg_start, 0
                    while seg_end < len(entries) and length < 14 * MIB:
                        length += entries[seg_end].length
                        seg_end += 1
                    ts = time.perf_counter()
                    d = await stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
                        appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=partitions,
                        offset=entries[seg_start].offset, length=length, storageId=-1))
                    read_lat.append(time.perf_counter() - ts)
                    pos = 0
                    for e in entries[seg_start:seg_end]:
                        if e.block_id not in got:
                            got.add(e.block_id)
                            read_bytes += e.length
                            bad += d.data[pos:pos + e.length] != pool[expected[p][e.block_id]]
                        pos += e.length
                    seg_start = seg_end
                missing = set(expected[p]) - got
                bad += len(missing)

            sem = asyncio.Semaphore(4)

            async def guarded(p: int) -> None:
                async with sem:
                    await read_partition(p)

            await asyncio.gather(*(guarded(p) for p in range(partitions)))
            read_s = time.perf_counter() - t1
            out.update({"read_mib": read_bytes / MIB, "read_s": read_s, "read_mbps": read_bytes / MIB / read_s,
                        "read_p50_ms": percentile(read_lat, 0.5) * 1000,
                        "read_p99_ms": percentile(read_lat, 0.99) * 1000, "bad_or_missing_blocks": bad})
        await channel.close()
        return out

    result_q.put(uvloop.run(main()))


def client_process(port: int, args: dict, read_back: bool) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=run_client, args=(port, args, q, read_back))
    p.start()
    result = q.get(timeout=1800)
    p.join(60)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--total-mib", type=int, default=1024, help="data written per run")
    ap.add_argument("--capacity", default="512M", help="server memory capacity")
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--senders", type=int, default=8, help="concurrent requireBuffer+send loops")
    ap.add_argument("--request-kib", type=int, default=1024, help="payload bytes per sendShuffleData")
    ap.add_argument("--data-dir", default=None, help="where the server spills (default: a temp dir)")
    opts = ap.parse_args()
    args = {"total_mib": opts.total_mib, "partitions": opts.partitions, "senders": opts.senders,
            "request_bytes": opts.request_kib * 1024}

    work = Path(tempfile.mkdtemp(prefix="riffle-bench-"))
    data_dir = Path(opts.data_dir) if opts.data_dir else work / "data"
    cfg = work / "server.toml"
    cfg.write_text(f"""grpc_port = 0
http_port = 0
[memory_store]
capacity = "{opts.capacity}"
[localfile_store]
data_paths = ["{data_dir}"]
[log]
path = "{work / 'server.log'}"
level = "WARNING"
""")
    port_file = work / "ports.json"
    server = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(cfg),
                               "--port-file", str(port_file)], cwd=REPO)
    ctx = mp.get_context("spawn")
    null_q = ctx.Queue()
    null = ctx.Process(target=run_null_server, args=(null_q,), daemon=True)
    null.start()
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start; log: {work / 'server.log'}")
            time.sleep(0.05)
        ours_port = json.loads(port_file.read_text())["grpc_port"]
        null_port = null_q.get(timeout=30)
        print(f"workload: {opts.total_mib} MiB, {opts.partitions} partitions, 4-64 KiB blocks, "
              f"{opts.request_kib} KiB per send, {opts.senders} senders; server capacity {opts.capacity}")
        base = client_process(null_port, args, read_back=False)
        ours = client_process(ours_port, args, read_back=True)
        rows = [("do-nothing grpc.aio", base), ("riffle-server", ours)]
        print(f"{'server':22} {'write MB/s':>10} {'send p50 ms':>11} {'send p99 ms':>11} {'read MB/s':>10} "
              f"{'read p50 ms':>11} {'read p99 ms':>11}")
        for name, r in rows:
            print(f"{name:22} {r['write_mbps']:10.1f} {r['send_p50_ms']:11.2f} {r['send_p99_ms']:11.2f} "
                  f"{r.get('read_mbps', float('nan')):10.1f} {r.get('read_p50_ms', float('nan')):11.2f} "
                  f"{r.get('read_p99_ms', float('nan')):11.2f}")
        print(f"write ratio riffle/do-nothing: {ours['write_mbps'] / base['write_mbps']:.2f}")
        print(f"read back: {ours['read_mib']:.0f} MiB, bad or missing blocks: {ours['bad_or_missing_blocks']}")
        return 0 if ours["bad_or_missing_blocks"] == 0 else 1
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        null.terminate()
        null.join(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
