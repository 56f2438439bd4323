"""Reported block ids cost the cyclic GC nothing per partition (issue 17: full collections stalled the loop).

A full collection walks every GC-tracked object; with one tracked ``BlockIdSet`` per reported
partition it took 17-205 ms at 200k partitions and up to 350 ms at 1M. These tests count the tracked
objects alive (``gc.get_objects()``) while a shuffle of ``PARTITIONS`` partitions is reported, asked for,
written to the metadata log and recovered, and require the growth to be bounded by a constant, not by
the partition count: the reported sets live in a ``BlockIdSetMap`` (CRoaring bitmaps in an untracked
dict, counts in arrays), a report's checked ids in columnar ``_Batches``.
"""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator
from typing import TypeVar

from riffle_actors.protocol.bitmap import (
    BlockIdSet,
    BlockIdSetMap,
    deserialize_block_ids,
    id_array,
    release_steps,
)
from riffle_actors.protocol.blockid import SPARK_DEFAULT
from riffle_actors.protocol.shuffle_meta import encode_block_ids_steps
from riffle_actors.runtime import ManualClock
from riffle_actors.state.app_state import AppState, drain

T = TypeVar("T")
PARTITIONS = 20_000
IDS = 3
BOUND = 200  # tracked objects a shuffle's reported ids may add, whatever its partition count


def tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def ids_of(partition_id: int) -> list[int]:
    return [SPARK_DEFAULT.get_block_id(seq, partition_id, partition_id % 1000) for seq in range(IDS)]


def report_source(first: int, stop: int) -> Iterator[tuple[int, list[int]]]:
    """A lazy report, as the gRPC adapter gives it: nothing of it is alive before it is read."""
    return ((p, ids_of(p)) for p in range(first, stop))


def stepped_peak(steps: Generator[None, None, T], before: int) -> tuple[T, int]:
    """Run ``steps``; (their result, the most tracked objects above ``before`` seen between two steps)."""
    peak = 0
    n = 0
    try:
        while True:
            next(steps)
            n += 1
            if n % 16 == 0:  # gc.get_objects() is O(heap): look every few steps
                peak = max(peak, tracked() - before)
    except StopIteration as done:
        return done.value, max(peak, tracked() - before)


def test_reported_partitions_keep_no_tracked_object_each() -> None:
    state = AppState("gc_app", ManualClock(), 60.0)
    state.register_shuffle(0, [(0, PARTITIONS - 1)], False)
    before = tracked()
    sink: list = []
    half = PARTITIONS // 2
    new, peak = stepped_peak(state.report_steps(0, report_source(0, half), sink), before)
    assert new == half * IDS
    assert peak < BOUND, f"a report of {half} partitions kept {peak} tracked objects alive while it ran"
    # the metadata log's body of the report (the sink holds the batches until it is written)
    body, peak = stepped_peak(encode_block_ids_steps(sink[0]), before)
    assert peak < BOUND, f"encoding the report's log record kept {peak} tracked objects alive"
    del sink
    assert state.report(0, report_source(half, PARTITIONS)) == (PARTITIONS - half) * IDS
    grown = tracked() - before
    assert grown < BOUND, f"{PARTITIONS} reported partitions keep {grown} GC-tracked objects"
    assert not gc.is_tracked(state.shuffles[0].reported._bitmaps)

    result, peak = stepped_peak(state.shuffle_result_steps(0, range(PARTITIONS)), before)
    assert peak < BOUND + 16, f"a shuffle result over {PARTITIONS} partitions made {peak} tracked objects"
    assert len(deserialize_block_ids(result)) == PARTITIONS * IDS
    assert state.shuffles[0].reported.id_count() == PARTITIONS * IDS
    assert sorted(state.shuffles[0].reported[7]) == sorted(ids_of(7))
    assert len(body) > half * IDS * 8


def test_recovered_and_released_sets_keep_no_tracked_object_each() -> None:
    before = tracked()
    sets = BlockIdSetMap()
    for p in range(PARTITIONS):  # what restart recovery does per BLOCK_IDS part
        sets.update_ids(p, id_array(ids_of(p)))
    sets.add_empty(PARTITIONS)
    grown = tracked() - before
    assert grown < BOUND, f"{PARTITIONS} recovered partitions keep {grown} GC-tracked objects"
    assert len(sets) == PARTITIONS + 1 and sets.id_count() == PARTITIONS * IDS
    state = AppState("gc_app", ManualClock(), 60.0)
    state.register_shuffle(0, [(0, PARTITIONS)], False)
    state.shuffles[0].reported.update(sets)  # what restore_app does (riffle_actors.state.app_restore)
    assert tracked() - before < BOUND
    assert state.shuffles[0].reported == sets and state.shuffles[0].reported[PARTITIONS] == BlockIdSet()
    del state
    drain(release_steps(sets))
    assert not sets and sets.id_count() == 0
