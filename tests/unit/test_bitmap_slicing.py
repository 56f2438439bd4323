"""Sliced bitmap work inside one partition: same bytes as the one-shot codec, bounded steps.

``union_serialize_steps`` (and the report steps before it) must cut the work of *one* partition
into steps of at most ``STEP_IDS`` ids, whatever the ids' layout, and give exactly the bytes of
``BlockIdSet.serialize()`` (CRoaring's own serialization, re-framed). ``TaskIdFilter`` must load a
client bitmap of many buckets in bounded pieces. Nothing here is timed: steps are counted, either
directly or through a ``SliceLane`` whose clock moves one slice per step.
"""

from __future__ import annotations

import asyncio
import random
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riffle_actors.protocol.bitmap import (
    _FILTER_PIECE_BUCKETS,
    MAX_ID,
    STEP_IDS,
    BlockIdSet,
    TaskIdFilter,
    _LegacyWriter,
    union_serialize_steps,
)
from riffle_actors.runtime.clock import ManualClock
from riffle_actors.runtime.slicing import SliceLane
from riffle_actors.state.app_state import AppLimits, AppState, drain


def count_steps(steps) -> tuple[bytes, int]:
    n = 0
    try:
        while True:
            next(steps)
            n += 1
    except StopIteration as done:
        return done.value, n


# ---------------------------------------------------------------------------- layouts
def layout_ids(kind: str, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    if kind == "distinct":  # one id per high word: one bucket each
        return [(h << 32) | rng.randrange(1 << 32) for h in rng.sample(range(1 << 31), n)]
    if kind == "equal":  # one high word, sparse lows
        return [(9 << 32) | rng.randrange(1 << 32) for _ in range(n)]
    if kind == "dense":  # one high word, bitset containers
        start = rng.randrange(1 << 20)
        return list(range(start, start + n))
    if kind == "few":  # a few ids per high, some highs with one
        return [(rng.randrange(max(1, n // 3)) << 32) | rng.randrange(1 << 18) for _ in range(n)]
    return [rng.randrange(MAX_ID + 1) for _ in range(n)]  # "random"


KINDS = ("distinct", "equal", "dense", "few", "random")
layouts = st.tuples(st.sampled_from(KINDS), st.integers(0, 3 * STEP_IDS), st.integers(0, 1 << 30))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(layouts, min_size=1, max_size=4))
def test_slice_encoded_equals_one_shot_encoded(parts: list[tuple[str, int, int]]) -> None:
    sets = [BlockIdSet(layout_ids(kind, n, seed)) for kind, n, seed in parts]
    union = BlockIdSet()
    for s in sets:
        union.update(s)
    expected = union.serialize()  # one shot: CRoaring's serialization, re-framed
    got, _ = count_steps(union_serialize_steps(sets))
    assert got == expected
    assert drain(union_serialize_steps([union])) == expected
    assert BlockIdSet.deserialize(got) == union


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.lists(st.integers(1, 3000), min_size=1, max_size=12))
def test_any_chunking_of_the_ids_gives_the_same_bytes(layout: tuple[str, int, int], cuts: list[int]) -> None:
    ids = sorted(set(layout_ids(*layout)))
    writer = _LegacyWriter()
    pos = 0
    for cut in cuts * (len(ids) // max(1, sum(cuts)) + 1):
        writer.feed(array("Q", ids[pos : pos + cut]))
        pos += cut
        if pos >= len(ids):
            break
    assert writer.finish() == BlockIdSet(ids).serialize()


def test_len_is_kept_exact_across_reports_and_other_mutators() -> None:
    ids = BlockIdSet()
    assert ids.update_and_count([1, 2, 3, 3]) == 3
    assert ids.update_and_count([(5 << 32) | 1, 2]) == 1
    assert len(ids) == 4
    ids.discard_many([1, 99])
    assert len(ids) == 3
    ids.add(7)
    ids.add(7)
    assert ids.update_and_count(BlockIdSet([7, 8])) == 1
    assert len(ids) == 5 == len(list(ids))
    assert len(ids.copy()) == 5


# ---------------------------------------------------------------------------- inside one partition
@pytest.mark.parametrize("kind, n", [("equal", 2_000_000), ("distinct", 60_000)])
def test_one_partition_is_reported_and_encoded_in_many_bounded_steps(kind: str, n: int) -> None:
    state = AppState("app", ManualClock(), heartbeat_timeout_s=60)
    state.register_shuffle(0, [(0, 0)], local_order=False)
    ids = layout_ids(kind, n, 5)
    per_report = AppLimits().report_max_partition_ids  # one report carries at most this many per partition
    report_steps = 0
    for start in range(0, n, per_report):  # a hot partition fills up over several reports
        report_steps += count_steps(state.report_steps(0, [(0, ids[start:start + per_report])]))[1]
    assert report_steps >= n // STEP_IDS  # not one step per partition (or per report)
    got, result_steps = count_steps(state.shuffle_result_steps(0, [0]))
    assert result_steps >= n // STEP_IDS
    assert got == BlockIdSet(ids).serialize()


class StepClock:
    """A lane clock that moves one slice on every read: each slice runs exactly one step."""

    def __init__(self, slice_s: float) -> None:
        self.t = 0.0
        self.slice_s = slice_s

    def __call__(self) -> float:
        self.t += self.slice_s
        return self.t


@pytest.mark.asyncio
async def test_a_lane_gives_the_loop_turns_while_it_encodes_one_2m_id_partition() -> None:
    state = AppState("app", ManualClock(), heartbeat_timeout_s=60)
    state.register_shuffle(0, [(0, 0)], local_order=False)
    ids = layout_ids("equal", 2_000_000, 3)
    per_report = AppLimits().report_max_partition_ids
    for start in range(0, len(ids), per_report):  # a hot partition filled by several reports
        state.report(0, [(0, ids[start:start + per_report])])
    lane = SliceLane(slice_s=0.001, now=StepClock(0.001))
    turns = 0

    async def other_work() -> None:  # another app's messages, between the slices
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.get_running_loop().create_task(other_work())
    try:
        pending = lane.submit(state.shuffle_result_steps(0, [0]))
        assert isinstance(pending, asyncio.Task)  # 2M ids do not fit one slice
        got = await pending
    finally:
        other.cancel()
    assert lane.slices > 2_000_000 // STEP_IDS
    assert turns > 2_000_000 // STEP_IDS
    assert got == BlockIdSet(ids).serialize()


# ---------------------------------------------------------------------------- decode side
def test_a_client_bitmap_of_many_buckets_loads_in_bounded_pieces() -> None:
    ids = layout_ids("distinct", 5 * _FILTER_PIECE_BUCKETS + 7, 11)
    wire = BlockIdSet(ids).serialize()
    task_filter = TaskIdFilter.from_bytes(wire)
    assert task_filter is not None
    pieces = task_filter._pieces
    assert len(pieces) >= 5
    assert all(len(p) <= _FILTER_PIECE_BUCKETS for p in pieces)  # one id per bucket here
    assert len(task_filter) == len(ids)
    assert sorted(task_filter) == sorted(ids)
    assert all(i in task_filter for i in ids)
    assert not any(i + 1 in task_filter for i in ids if i + 1 not in set(ids))
    assert -1 not in task_filter and (1 << 64) not in task_filter and "x" not in task_filter
    assert 0 not in task_filter
