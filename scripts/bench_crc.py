#!/usr/bin/env python3
"""Block CRC cost: CPU seconds per GB of the ingest check, ISA-L against CPython's zlib, in one run.

Checks realistic sends (blocks of 4 KiB to 3 MiB, as the Uniffle client cuts them) with
``riffle_actors.protocol.find_bad_block`` (the function the service runs on every sendShuffleData)
and with the same loop over ``zlib.crc32``, and prints CPU seconds per GB (``time.process_time``) and
the ratio of each to ISA-L. The server-level cost (check on against check off, whole ingest path)
is ``scripts/bench_ingest.py --variant on --variant off:app_config.block_crc_check_enable=false``.

    python scripts/bench_crc.py [--mib 512] [--rounds 3]

The box is shared: compare the ratios of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from riffle_actors.protocol.crc import CRC_IMPL, find_bad_block
from riffle_actors.records import Block, BlockBatch


def sends(total: int, block: int) -> list[BlockBatch]:
    pool = os.urandom(max(block, 1 << 20))
    mv = memoryview(pool)
    out, made, pid = [], 0, 0
    while made < total:
        blocks = []
        for i in range(max(1, (1 << 20) // block)):  # ~1 MiB per partition of a send
            data = mv[(i * 4099) % (len(pool) - block + 1):][:block]
            blocks.append(Block(made + i, block, block, zlib.crc32(data), 1, data))
        out.append(BlockBatch.of(pid, blocks))
        made += block * len(blocks)
        pid += 1
    return out


def zlib_check(partitions: list[BlockBatch]) -> object:
    for batch in partitions:
        for _, crc, data in batch.id_crc_data():
            if zlib.crc32(data) != crc:
                return batch.partition_id
    return None


def cpu_per_gb(fn, parts, total: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        assert fn(parts) is None
        best = min(best, time.process_time() - t)
    return best / (total / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--mib", type=int, default=512, help="bytes checked per block size and round")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many rounds")
    args = ap.parse_args()
    total = args.mib << 20
    print(f"crc implementation: {CRC_IMPL}; {args.mib} MiB per size, best of {args.rounds}")
    print(f"{'block':>8} {'isal s/GB':>10} {'zlib s/GB':>10} {'zlib/isal':>10}")
    worst = 0.0
    for block in (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 3 << 20):
        parts = sends(total, block)
        fast = cpu_per_gb(find_bad_block, parts, total, args.rounds)
        slow = cpu_per_gb(zlib_check, parts, total, args.rounds)
        worst = max(worst, fast)
        print(f"{block >> 10:>6}Ki {fast:>10.3f} {slow:>10.3f} {slow / fast:>10.2f}")
    print(f"worst ingest check cost: {worst:.3f} CPU s/GB (target <= 0.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
