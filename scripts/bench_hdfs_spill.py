#!/usr/bin/env python3
"""Spill benchmark of the HDFS tier: HDFS (a MiniDFSCluster on this box) vs local disk, in one run.

For each tier an in-process ``ShuffleServer`` receives ``--total-mib`` of shuffle data over gRPC into
memory (``--partitions`` partitions, 64 KiB blocks; the memory budget holds it all, so nothing spills
while it arrives), then is told to flush everything (``FlushAllApps``, what a graceful shutdown does):
each partition's buffer becomes one spill batch. The figure is the flush's MB/s: bytes spilled divided
by the time until memory is empty. Tier ``local``: ``store_type = MEMORY_LOCALFILE`` on a temporary
directory. Tier ``hdfs``: ``MEMORY_LOCALFILE_HDFS`` with ``memory_spill_to_cold_threshold_size = 0``,
so every batch goes through the HdfsWriter (hdfs-native) to the MiniDFSCluster (one DataNode; its
block files sit on the same disk). The tiers alternate for ``--repeat`` rounds; medians are printed
with the ratio hdfs/local. Every block is checked afterwards (read back from the local files / from
HDFS as the client does) in round 1.

    python scripts/bench_hdfs_spill.py [--total-mib 256] [--partitions 16] [--repeat 3]

Needs Java 17 and the jars of ``scripts/e2e_setup.sh`` (the MiniDFSCluster). Figures vary 15-30 %
run to run on a shared 2-core box (the JVM of the MiniDFSCluster shares the cores); compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIB = 1 << 20


async def one_round(tier: str, hdfs_url: str, total: int, partitions: int, workdir: Path, rnd: int,
                    verify: bool) -> dict:
    from riffle_actors.actors.app_manager import FlushAllApps
    from riffle_actors.actors.hdfs_writer import GetHdfsStats
    from riffle_actors.config import ServerConfig, validate_config
    from riffle_actors.server import ShuffleServer
    from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
    from tests.helpers.hdfs_read import read_hdfs_partition

    cfg = {
        "store_type": "MEMORY_LOCALFILE" if tier == "local" else "MEMORY_LOCALFILE_HDFS",
        "grpc_port": 0, "grpc_bind_address": "127.0.0.1", "http_port": 0, "http_bind_address": "127.0.0.1",
        "grace_period_sec": 0,
        "memory_store": {"capacity": total * 2 + 64 * MIB},
        "localfile_store": {"data_paths": [str(workdir / f"{tier}-{rnd}")]},
        "hybrid_store": {"memory_single_buffer_max_spill_size": None, "memory_spill_high_watermark": 0.99,
                         "memory_spill_low_watermark": 0.5},
    }
    if tier == "hdfs":
        cfg["hybrid_store"]["memory_spill_to_cold_threshold_size"] = 0
        cfg["hdfs_store"] = {"remote_storage": [{"path": f"{hdfs_url}/bench"}]}
    srv = ShuffleServer(validate_config(ServerConfig, cfg))
    await srv.start()
    app = f"application_bench_{tier}_{rnd}"
    remote = f"{hdfs_url}/bench" if tier == "hdfs" else ""
    block = 64 << 10
    per_partition = max(1, total // partitions // block)
    written = []
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(app, 0, range(partitions), remote_storage=remote)
            for p in range(partitions):
                blocks = make_blocks(p, 1, per_partition, block)
                for i in range(0, len(blocks), 32):
                    await client.send_blocks(app, 0, blocks[i:i + 32])
                written += blocks if verify else []
            size = per_partition * block * partitions
            t = time.perf_counter()
            await srv.app_manager.ask(FlushAllApps())
            while srv.budget.used:
                await asyncio.sleep(0.001)
            seconds = time.perf_counter() - t
            if tier == "hdfs":
                stats = await srv.hdfs.ask(GetHdfsStats())
                assert stats.written_bytes >= size and stats.write_failures == 0, stats
            if verify:
                ids_all = {b.block_id for b in written}
                for p in range(partitions):
                    want = [b for b in written if b.partition_id == p]
                    ids = {b.block_id for b in want}
                    local = await client.read_partition(app, 0, p, ids_all, partition_num=partitions,
                                                        check_complete=False)
                    got = {}
                    if tier == "hdfs":
                        got = await asyncio.to_thread(read_hdfs_partition, remote, app, 0, p, srv.server_id, ids)
                    assert_read_matches({**got, **local}, want)
            await client.unregister_app(app)
    finally:
        await srv.stop(0)
    return {"tier": tier, "bytes": size, "seconds": seconds, "mb_s": size / MIB / seconds}


async def main_async(args) -> int:
    from tests.helpers.minihdfs import MiniHdfs, hdfs_prerequisite

    reason = hdfs_prerequisite()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    total = args.total_mib * MIB
    with tempfile.TemporaryDirectory(prefix="bench-hdfs-") as tmp:
        work = Path(tmp)
        hdfs = MiniHdfs.start(work / "minihdfs")
        try:
            print(f"MiniDFSCluster {hdfs.url}; {args.total_mib} MiB in {args.partitions} partitions per round, "
                  f"{args.repeat} rounds per tier (alternating)")
            results: dict[str, list[float]] = {"local": [], "hdfs": []}
            for rnd in range(args.repeat):
                for tier in ("local", "hdfs") if rnd % 2 == 0 else ("hdfs", "local"):
                    r = await one_round(tier, hdfs.url, total, args.partitions, work, rnd, verify=rnd == 0)
                    results[tier].append(r["mb_s"])
                    print(f"  round {rnd + 1} {tier:5s}: {r['bytes'] / MIB:7.1f} MiB in {r['seconds']:6.2f} s "
                          f"= {r['mb_s']:7.1f} MB/s")
        finally:
            hdfs.stop()
    med = {t: statistics.median(v) for t, v in results.items()}
    print(f"median spill throughput: local {med['local']:.1f} MB/s, hdfs {med['hdfs']:.1f} MB/s, "
          f"hdfs/local = {med['hdfs'] / med['local']:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    try:
        import uvloop
        return uvloop.run(main_async(args))
    except ImportError:
        return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
