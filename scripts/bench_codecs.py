"""Micro-benchmarks of the byte codecs in ``riffle_actors.protocol`` (not run in CI).

Prints ns/op (and ns per id / record where that is the useful unit) for:
BlockIdSet.update of 10k ids, serialize / deserialize of 1M ids, TaskIdFilter lookups,
build_index of 1000 blocks and decode_index of 1000 records, and the urpc decoding of a
sendShuffleData frame as the Uniffle client sends them (64 KiB and 1 MiB, one or three replica
servers per block). A ``dict[high -> BitMap]`` baseline is timed next to BlockIdSet to keep the
storage choice honest.

    python scripts/bench_codecs.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyroaring import BitMap

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from riffle_actors.protocol import urpc
from riffle_actors.protocol.bitmap import BlockIdSet, TaskIdFilter
from riffle_actors.protocol.blockid import SPARK_DEFAULT
from riffle_actors.protocol.index import build_index, decode_index
from riffle_actors.records import Block


def bench(
    label: str, fn: Callable[[], object], *, per: int = 1, unit: str = "", min_time_s: float = 0.5
) -> None:
    """Best-of-5 timing of ``fn``; prints ns/op and, when ``per`` > 1, ns per item."""
    fn()  # warm up
    loops = 1
    while True:
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter_ns() - start
        if elapsed >= min_time_s * 1e9 / 5 or loops >= 1 << 20:
            break
        loops *= 2
    best = elapsed / loops
    for _ in range(4):
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / loops)
    line = f"{label:<58} {best:>14,.0f} ns/op"
    if per > 1:
        line += f"   {best / per:>8,.1f} ns/{unit}"
    print(line)


class DictBitmapBaseline:
    """The ``dict[high32 -> BitMap]`` design, grouping by high with arithmetic."""

    def __init__(self) -> None:
        self.buckets: dict[int, BitMap] = {}

    def _bucket(self, high: int) -> BitMap:
        bitmap = self.buckets.get(high)
        if bitmap is None:
            bitmap = self.buckets[high] = BitMap()
        return bitmap

    def update(self, ids: list[int]) -> None:
        lo, hi = min(ids), max(ids)
        if lo >> 32 == hi >> 32:
            high = lo >> 32
            self._bucket(high).update(ids if high == 0 else [i & 0xFFFFFFFF for i in ids])
            return
        groups: dict[int, list[int]] = {}
        for i in ids:
            groups.setdefault(i >> 32, []).append(i & 0xFFFFFFFF)
        for high, lows in groups.items():
            self._bucket(high).update(lows)

    def serialize(self) -> bytes:
        parts = [struct.pack(">Bi", 0, len(self.buckets))]
        for high in sorted(self.buckets):
            parts.append(struct.pack(">I", high))
            parts.append(self.buckets[high].serialize())
        return b"".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    args = parser.parse_args()
    min_time_s = 0.1 if args.quick else 0.5
    rng = random.Random(42)
    layout = SPARK_DEFAULT
    print(f"python {sys.version.split()[0]}, min {min_time_s}s per line, best of 5\n")

    # -- BlockIdSet.update: one report of 10k ids ---------------------------------------
    one_high = [layout.get_block_id(0, 3, t) for t in range(10_000)]  # seq 0: one bucket
    many_highs = [layout.get_block_id(s, 3, t) for t in range(2_500) for s in range(4)]  # 4 buckets
    shuffled = many_highs[:]
    rng.shuffle(shuffled)
    for name, ids in (
        ("1 bucket, ascending", one_high),
        ("4 buckets, ascending", many_highs),
        ("4 buckets, shuffled", shuffled),
    ):
        bench(
            f"BlockIdSet.update(10k ids, {name})",
            lambda ids=ids: BlockIdSet().update(ids),
            per=len(ids),
            unit="id",
            min_time_s=min_time_s,
        )
        bench(
            f"  baseline dict[high->BitMap].update ({name})",
            lambda ids=ids: DictBitmapBaseline().update(ids),
            per=len(ids),
            unit="id",
            min_time_s=min_time_s,
        )
    existing = BlockIdSet(layout.get_block_id(s, 3, t) for s in range(4) for t in range(2_500, 100_000))
    bench(
        "BlockIdSet.update(10k ids) into a set of 390k",
        lambda: existing.copy().update(shuffled),
        per=10_000,
        unit="id",
        min_time_s=min_time_s,
    )
    small = [layout.get_block_id(0, 3, 77), layout.get_block_id(1, 3, 77)]
    target = BlockIdSet()
    bench(
        "BlockIdSet.update(2 ids)  (one task's report)", lambda: target.update(small), min_time_s=min_time_s
    )

    # -- serialize / deserialize 1M ids -------------------------------------------------
    structured = [layout.get_block_id(s, 7, t) for s in range(10) for t in range(100_000)]  # 10 buckets
    # getShuffleResultForMultiPart over 1000 partitions x 1000 map tasks: 1 bucket, 1000 containers
    many_partitions = [layout.get_block_id(0, p, t) for p in range(1000) for t in range(1000)]
    # pathological for any roaring layout: ~1M single-value containers in 256 buckets
    sparse = rng.sample(range(1 << 40), 1_000_000)
    for name, ids in (
        ("1M ids, 10 buckets (Spark layout)", structured),
        ("1M ids, 1000 partitions x 1000 tasks", many_partitions),
        ("1M random ids < 2^40", sparse),
    ):
        block_set = BlockIdSet(ids)
        encoded = block_set.serialize()
        bench(
            f"BlockIdSet.serialize({name})",
            block_set.serialize,
            per=len(ids),
            unit="id",
            min_time_s=min_time_s,
        )
        bench(
            f"BlockIdSet.deserialize({name}, {len(encoded):,} B)",
            lambda encoded=encoded: BlockIdSet.deserialize(encoded),
            per=len(ids),
            unit="id",
            min_time_s=min_time_s,
        )
        baseline = DictBitmapBaseline()
        baseline.update(ids)
        assert baseline.serialize() == encoded
        bench(
            f"  baseline dict[high->BitMap].serialize({name})",
            baseline.serialize,
            per=len(ids),
            unit="id",
            min_time_s=min_time_s,
        )
    small_set = BlockIdSet([1, 2, 3])
    bench("BlockIdSet.serialize({1,2,3})", small_set.serialize, min_time_s=min_time_s)
    empty_bytes = b""
    bench("BlockIdSet.deserialize(b'')", lambda: BlockIdSet.deserialize(empty_bytes), min_time_s=min_time_s)

    # -- TaskIdFilter -------------------------------------------------------------------
    task_bytes = BlockIdSet(range(0, 20_000, 2)).serialize()
    bench(
        "TaskIdFilter.from_bytes(10k task ids)",
        lambda: TaskIdFilter.from_bytes(task_bytes),
        min_time_s=min_time_s,
    )
    task_filter = TaskIdFilter.from_bytes(task_bytes)
    assert task_filter is not None
    probes = list(range(1000))
    bench(
        "1000 x `task_id in TaskIdFilter`",
        lambda: [p for p in probes if p in task_filter],
        per=1000,
        unit="lookup",
        min_time_s=min_time_s,
    )

    # -- index records --------------------------------------------------------------------
    blocks = [
        Block(layout.get_block_id(0, 3, t), 4096, 8192, rng.getrandbits(32), t, b"x" * 4096)
        for t in range(1000)
    ]
    records, _ = build_index(blocks, 1 << 30)
    bench(
        "build_index(1000 blocks)",
        lambda: build_index(blocks, 1 << 30),
        per=1000,
        unit="record",
        min_time_s=min_time_s,
    )
    bench(
        f"decode_index({len(records):,} B = 1000 records)",
        lambda: decode_index(records),
        per=1000,
        unit="record",
        min_time_s=min_time_s,
    )

    # -- urpc sendShuffleData frames ---------------------------------------------------------
    for label, partitions, blocks_each, size, servers in (("64 KiB: 2 partitions x 1 block", 2, 1, 32 << 10, 1),
                                                         ("1 MiB: 16 partitions x 2 blocks", 16, 2, 32 << 10, 1),
                                                         ("1 MiB, 3 replicas per block", 16, 2, 32 << 10, 3)):
        parts = [(p, [Block(p * 1000 + i, size, size, 7, 3, b"x" * size) for i in range(blocks_each)])
                 for p in range(partitions)]
        frame = urpc.encode_send_shuffle_data(1, "application_1700000000000_0001", 0, 5, parts, 0, servers)
        header = urpc.decode_header(frame, 0)
        region = memoryview(frame)[urpc.HEADER_SIZE:]
        bench(
            f"urpc decode_request(send, {label})",
            lambda h=header, r=region: urpc.decode_request(h.type, r, h.msg_len),
            per=partitions * blocks_each,
            unit="block",
            min_time_s=min_time_s,
        )


if __name__ == "__main__":
    main()
