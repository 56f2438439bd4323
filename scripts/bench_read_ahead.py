#!/usr/bin/env python3
"""Read benchmark of local (spilled) partitions with and without read-ahead, in one run.

For each variant (``none``: no ``[localfile_store.read_ahead_options]``; ``read_ahead``: Riffle's
defaults, 14M x 4; more with ``--variant NAME:section.key=value,...``) it starts ``riffle-server``
(``scripts/bench_ingest.start_server``), writes ``--partitions`` partitions of ``--partition-mib``
MiB over gRPC (registration properties ``spark.rss.riffle.readAheadEnabled = true``, as a Riffle
client asking for read-ahead sends them), waits until they are spilled, drops the data files from the
page cache (``POSIX_FADV_DONTNEED``) and reads every partition back the way the Uniffle client does:
memory cursor without a task filter, index, then one getLocalShuffleData per ``--read-buffer-mib``
segment, ``--readers`` partitions at once, every byte checked. ``--consume-ms-per-mib`` adds the
reader's own work per segment (decompression, deserialisation), during which read-ahead can run.
Variants alternate within each of ``--rounds`` rounds; ratios are against ``none`` of the same round.

    python scripts/bench_read_ahead.py [--partitions 8] [--partition-mib 48] [--readers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_ingest import cpu_s, parse_variant, start_server, stop

MIB = 1 << 20
APP = "application_1764547200000_0077_1764547200001"
PROPS = {"spark.rss.riffle.readAheadEnabled": "true"}
BLOCK = 256 << 10


async def write(port: int, partitions: int, partition_mib: int, payload: bytes) -> dict[int, list[tuple[int, int]]]:
    import grpc

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    blocks: dict[int, list[tuple[int, int]]] = {}  # partition -> (block id, payload offset)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", 256 * MIB), ("grpc.max_receive_message_length", 256 * MIB)]) as ch:
        stub = pbg.ShuffleServerStub(ch)
        r = await stub.registerShuffle(pb.ShuffleRegisterRequest(
            appId=APP, shuffleId=0, user="bench", properties=PROPS,
            partitionRanges=[pb.ShufflePartitionRange(start=p, end=p) for p in range(partitions)]))
        assert r.status == 0, r.retMsg
        per = partition_mib * MIB // BLOCK
        rng = random.Random(1)
        seq = 0
        for _ in range(per // 4):
            for p in range(partitions):
                shuffle_blocks = []
                for _ in range(4):
                    off = rng.randrange(len(payload) - BLOCK)
                    data = payload[off:off + BLOCK]
                    bid = (seq << 20) | p
                    seq += 1
                    blocks.setdefault(p, []).append((bid, off))
                    shuffle_blocks.append(pb.ShuffleBlock(blockId=bid, length=BLOCK, uncompressLength=BLOCK,
                                                          crc=zlib.crc32(data), data=data, taskAttemptId=1))
                while True:
                    t = await stub.requireBuffer(pb.RequireBufferRequest(
                        requireSize=4 * (BLOCK + 32), appId=APP, shuffleId=0, partitionIds=[p]))
                    if t.status == 0:
                        break
                    await asyncio.sleep(0.01)  # NO_BUFFER: the client's back-off
                s = await stub.sendShuffleData(pb.SendShuffleDataRequest(
                    appId=APP, shuffleId=0, requireBufferId=t.requireBufferId,
                    shuffleData=[pb.ShuffleData(partitionId=p, block=shuffle_blocks)]))
                assert s.status == 0, s.retMsg
    return blocks


async def read(port: int, partitions: int, readers: int, rbs: int, consume_s_per_mib: float,
               payload: bytes, blocks: dict[int, list[tuple[int, int]]]) -> tuple[int, float]:
    import grpc

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    offsets = {bid: off for p in blocks.values() for bid, off in p}
    total = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", 256 * MIB), ("grpc.max_receive_message_length", 256 * MIB)]) as ch:
        stub = pbg.ShuffleServerStub(ch)

        def check(bid: int, data: bytes) -> None:
            off = offsets[bid]
            if data != payload[off:off + len(data)]:
                raise AssertionError(f"block {bid} differs")

        async def one(p: int) -> None:
            nonlocal total
            last = -1
            while True:
                m = await stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
                    appId=APP, shuffleId=0, partitionId=p, lastBlockId=last, readBufferSize=rbs))
                if not m.shuffleDataBlockSegments:
                    break
                for s in m.shuffleDataBlockSegments:
                    check(s.blockId, m.data[s.offset:s.offset + s.length])
                    total += s.length
                last = m.shuffleDataBlockSegments[-1].blockId
            ix = await stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
                appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=partitions))
            records = [struct.unpack_from(">qiiqqq", ix.indexData, i) for i in range(0, len(ix.indexData), 40)]
            i = 0
            while i < len(records):
                start, seg = records[i][0], []
                while i < len(records) and records[i][0] + records[i][1] - start <= rbs:
                    seg.append(records[i])
                    i += 1
                length = seg[-1][0] + seg[-1][1] - start
                d = await stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
                    appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=partitions,
                    offset=start, length=length))
                assert d.status == 0 and len(d.data) == length, d.retMsg
                for off, n, _u, _c, bid, _t in seg:
                    check(bid, d.data[off - start:off - start + n])
                total += length
                if consume_s_per_mib:
                    await asyncio.sleep(consume_s_per_mib * length / MIB)  # the reader's own work

        todo = list(range(partitions))
        t0 = time.perf_counter()

        async def worker() -> None:
            while todo:
                await one(todo.pop(0))

        await asyncio.gather(*(worker() for _ in range(readers)))
        return total, time.perf_counter() - t0


async def wait_spilled(http_port: int, partitions: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for _ in range(6000):
            async with http.get(f"http://127.0.0.1:{http_port}/metrics") as r:
                text = await r.text()
            vals = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                    if line.startswith(("riffle_memory_used_bytes ", "riffle_memory_in_flight_bytes "))}
            if vals.get("riffle_memory_in_flight_bytes", 1) == 0 and vals.get("riffle_memory_used_bytes", 1) <= partitions * MIB:
                return
            await asyncio.sleep(0.05)
    raise SystemExit("spills did not finish")


def evict(data_dir: Path) -> None:
    for f in data_dir.rglob("*.data"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_ahead_loaded(http_port: int) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics").read().decode()
    return sum(float(line.split()[1]) for line in text.splitlines()
               if line.startswith("riffle_localfile_read_ahead_bytes_total{"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--partition-mib", type=int, default=48)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--read-buffer-mib", type=int, default=14)
    ap.add_argument("--consume-ms-per-mib", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variant", action="append", default=None)
    a = ap.parse_args()
    variants = [parse_variant(v) for v in (a.variant or [
        "none", "read_ahead:localfile_store.read_ahead_options={ batch_size = \"14M\" }"])]
    payload = random.Random(7).randbytes(8 * MIB)
    work = Path(tempfile.mkdtemp(prefix="bench-ra-"))
    rows = []
    try:
        for rnd in range(a.rounds):
            base = None
            for name, overrides in variants:
                overrides = {k: dict(v) for k, v in overrides.items()}
                overrides.setdefault("hybrid_store", {})["memory_single_buffer_max_spill_size"] = '"1M"'
                label = f"{name}-{rnd}"
                proc, port, _ = start_server(work, label, "256M", "grpc", {}, overrides)
                import json
                http_port = json.loads((work / f"{label}.ports.json").read_text())["http_port"]
                try:
                    blocks = asyncio.run(write(port, a.partitions, a.partition_mib, payload))
                    asyncio.run(wait_spilled(http_port, a.partitions))
                    evict(work / f"data-{label}")
                    c0 = cpu_s(proc.pid)
                    nbytes, secs = asyncio.run(read(port, a.partitions, a.readers, a.read_buffer_mib * MIB,
                                                    a.consume_ms_per_mib / 1000, payload, blocks))
                    cpu = cpu_s(proc.pid) - c0
                    loaded = read_ahead_loaded(http_port)
                finally:
                    stop(proc)
                mbs = nbytes / MIB / secs
                base = base or mbs
                rows.append((rnd, name, nbytes / MIB, secs, mbs, mbs / base, cpu / (nbytes / 1e9), loaded / MIB))
                print(f"round {rnd} {name:12s} {nbytes / MIB:8.0f} MiB in {secs:6.2f}s = {mbs:7.1f} MB/s "
                      f"(x{mbs / base:.2f} of none), server CPU {cpu / (nbytes / 1e9):5.2f} s/GB, "
                      f"read ahead {loaded / MIB:.0f} MiB", flush=True)
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    for name, _ in variants:
        ratios = [r[5] for r in rows if r[1] == name]
        print(f"{name:12s} mean ratio to none: x{sum(ratios) / len(ratios):.2f} over {len(ratios)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
