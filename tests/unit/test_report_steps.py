"""Reports and shuffle results computed in steps give exactly what the straightforward computation gives.

Covers ``id_array`` / ``BlockIdSet.update`` with arrays, ``union_serialize_steps`` (a pairwise
union) against the one-by-one fold the server used before, and ``AppState.report_steps`` /
``shuffle_result_steps`` driven one step at a time, with tiny chunk and step budgets so that
every partition is split and every step boundary is exercised: byte-identical results over
several high-32-bit buckets and bitset containers, empty requests, all-or-nothing rejection of
a bad id in a late chunk, and reports interleaved with a get losing no id.

The canonical bytes of a set are ``BlockIdSet(sorted(ids)).serialize()``: ``test_bitmap`` checks
them against a pure-Python encoder of Java's format.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riffle_actors.runtime import ManualClock
from riffle_actors.errors import InvalidRequestError, NoRegisterError
from riffle_actors.protocol.bitmap import MAX_ID, STEP_IDS, BlockIdSet, id_array, union_serialize_steps
from riffle_actors.protocol.blockid import SPARK_DEFAULT
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.state import app_state
from riffle_actors.state.app_state import AppState, drain

T = TypeVar("T")
EMPTY_MAP = b"\x00\x00\x00\x00\x00"


def canonical(ids: Iterable[int]) -> bytes:
    return BlockIdSet(sorted(set(ids))).serialize()


def fold_serialize(sets: Iterable[BlockIdSet]) -> bytes:
    """What shuffle_result did before: fold every set into one accumulator, then serialize."""
    acc = BlockIdSet()
    for s in sets:
        acc.union_update(s)
    return acc.serialize()


def step_by_step(steps: Generator[None, None, T],
                 between: Callable[[int], None] | None = None) -> tuple[T, int]:
    """Run ``steps`` one ``next()`` at a time, calling ``between(step number)`` after each.

    Returns (result, number of steps)."""
    n = 0
    try:
        while True:
            next(steps)
            n += 1
            if between is not None:
                between(n)
    except StopIteration as done:
        return done.value, n


@pytest.fixture
def tiny_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split every partition into chunks of 7 ids and end a step after every chunk or partition."""
    monkeypatch.setattr(app_state, "_IDS_PER_CHUNK", 7)
    monkeypatch.setattr(app_state, "_STEP_WORK", 1)


def new_state(*shuffles: int) -> AppState:
    state = AppState("app", ManualClock(), 60.0)
    for sid in shuffles:
        state.register_shuffle(sid, [(0, 100_000)], local_order=False)
    return state


# Spark-layout ids: sequence numbers up to 3000 put them in several high-32-bit buckets (high =
# seq << 10 | partition >> 10), tasks < 65536 keep each (seq, partition) in one container.
spark_ids = st.builds(SPARK_DEFAULT.get_block_id, st.integers(0, 3000), st.integers(0, 2047),
                      st.integers(0, 9000))


def _run(high: int, low: int, length: int) -> list[int]:
    start = (high << 32) | low
    return list(range(start, start + length))


# dense runs in a few buckets: containers with more than 4096 values are bitsets
dense_ids = st.builds(_run, st.sampled_from([0, 5, 0x7FFFFFFF]), st.integers(0, 0xFFFF_FFFF - 9000),
                      st.integers(1, 9000))
id_lists = st.one_of(st.lists(spark_ids, max_size=300), dense_ids, st.just([]),
                     st.lists(st.integers(0, MAX_ID), max_size=50))


# ---------------------------------------------------------------------------- id_array, update
def test_id_array_accepts_the_whole_range_and_rejects_everything_else() -> None:
    assert list(id_array([0, 7, MAX_ID])) == [0, 7, MAX_ID]
    assert list(id_array(range(3))) == [0, 1, 2]
    assert len(id_array(())) == 0
    long_tail = list(range(100))  # past the short-array check: the bad id is found in the bytes
    for bad in ([-1], [MAX_ID + 1], [1 << 64], [1.5], ["x"], [None],
                [*long_tail, MAX_ID + 1], [*long_tail, -1]):
        with pytest.raises(ProtocolError) as info:
            id_array(bad)
        assert info.value.field == "block_id"


def test_update_with_arrays_is_all_or_nothing_and_counts_new_ids() -> None:
    ids = BlockIdSet([1])
    for bad in (array("Q", [2, MAX_ID + 1]), array("Q", [*range(2, 200), 1 << 63])):
        with pytest.raises(ProtocolError):
            ids.update(bad)
    assert list(ids) == [1]
    assert ids.update_and_count(id_array([1, 2, 3, 3])) == 2
    assert ids.update_and_count(array("Q", [3, 1 << 40])) == 1
    assert ids.update_and_count([4, 5, 1]) == 2
    assert ids.update_and_count(BlockIdSet([5, 6])) == 1
    assert list(ids) == [1, 2, 3, 4, 5, 6, 1 << 40]


# ---------------------------------------------------------------------------- union_serialize_steps
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(id_lists, max_size=9))
def test_the_sliced_union_has_the_bytes_of_the_fold(lists: list[list[int]]) -> None:
    sets = [BlockIdSet(ids) for ids in lists]
    before = [s.serialize() for s in sets]
    expected = canonical(i for ids in lists for i in ids)
    assert fold_serialize(sets) == expected
    result, steps = step_by_step(union_serialize_steps(sets))
    assert result == expected
    assert steps >= sum(len(s) for s in sets) // STEP_IDS  # a step handles at most STEP_IDS ids
    assert [s.serialize() for s in sets] == before  # inputs untouched


def test_union_of_no_set_one_set_and_the_same_set_twice() -> None:
    assert drain(union_serialize_steps([])) == EMPTY_MAP
    one = BlockIdSet([1, 1 << 33, 1 << 62])
    assert drain(union_serialize_steps([one])) == one.serialize()
    assert drain(union_serialize_steps([one, one, BlockIdSet()])) == one.serialize()


def test_a_union_spanning_many_buckets_and_bitset_containers() -> None:
    lists = [[SPARK_DEFAULT.get_block_id(seq, p, t) for seq in range(0, 3000, 97) for t in range(5)]
             for p in range(0, 2048, 37)]
    lists.append(list(range(3 << 32, (3 << 32) + 70_000)))  # one full bitset container and then some
    sets = [BlockIdSet(ids) for ids in lists]
    expected = canonical(i for ids in lists for i in ids)
    assert len({i >> 32 for ids in lists for i in ids}) > 50
    assert drain(union_serialize_steps(sets)) == fold_serialize(sets) == expected


# ---------------------------------------------------------------------------- AppState steps
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.integers(0, 40), id_lists, max_size=6), min_size=1, max_size=5),
       st.lists(st.integers(0, 45), max_size=12))
def test_steps_give_the_results_of_the_straightforward_calls(reports: list[dict[int, list[int]]],
                                                             asked: list[int]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_state, "_IDS_PER_CHUNK", 7)
        mp.setattr(app_state, "_STEP_WORK", 1)
        stepped = new_state(0)
        stepped_counts = [step_by_step(stepped.report_steps(0, tuple(r.items())))[0] for r in reports]
        stepped_result, _ = step_by_step(stepped.shuffle_result_steps(0, asked))
    plain = new_state(0)
    plain_counts = [plain.report(0, tuple(r.items())) for r in reports]
    model: dict[int, set[int]] = {}
    model_counts = []
    for r in reports:
        new = 0
        for pid, ids in r.items():
            seen = model.setdefault(pid, set())
            new += len(set(ids) - seen)
            seen.update(ids)
        model_counts.append(new)
    assert stepped_counts == plain_counts == model_counts
    # a shuffle nobody reported anything for answers empty bytes, like Java's server
    expected = canonical(i for pid in asked for i in model.get(pid, ())) if model else b""
    assert stepped_result == plain.shuffle_result(0, asked) == expected
    if model:
        assert stepped_result == fold_serialize(plain.shuffles[0].reported[p] for p in asked
                                                if p in plain.shuffles[0].reported)


def test_a_large_partition_is_reported_in_chunks_with_the_same_result(tiny_steps: None) -> None:
    # 2000 ids in 40 buckets
    ids = [SPARK_DEFAULT.get_block_id(seq, 3, t) for seq in range(40) for t in range(50)]
    ids += ids[:100]  # duplicates, some in later chunks
    state = new_state(0)
    new, steps = step_by_step(state.report_steps(0, [(3, tuple(ids)), (4, ids[:10])]))
    assert new == 2010
    assert steps > 2 * len(ids) // 7  # every chunk was a step of its own, checked and then added
    result, _ = step_by_step(state.shuffle_result_steps(0, [3, 4]))
    assert result == canonical(ids)
    assert state.report(0, [(3, ids[:5])]) == 0


def test_empty_and_never_reported_results(tiny_steps: None) -> None:
    state = new_state(0, 1)
    assert drain(state.shuffle_result_steps(0, [0, 1])) == b""  # never reported: empty bytes, like Java
    assert drain(state.shuffle_result_steps(9, [0])) == b""  # unknown shuffle
    assert drain(state.report_steps(0, [(5, [])])) == 0  # an empty list still counts as a report
    assert drain(state.shuffle_result_steps(0, [5])) == EMPTY_MAP
    assert drain(state.report_steps(0, [(6, [1, 2])])) == 2
    assert drain(state.shuffle_result_steps(0, [])) == EMPTY_MAP
    assert drain(state.shuffle_result_steps(0, [7, 8])) == EMPTY_MAP
    assert drain(state.shuffle_result_steps(0, [6, 6, 7])) == canonical([1, 2])
    with pytest.raises(NoRegisterError):
        next(state.report_steps(3, [(0, [1])]))


@pytest.mark.parametrize("bad", [-1, MAX_ID + 1, 1 << 64, 2.5, "7"])
def test_a_bad_id_in_a_late_chunk_rejects_the_whole_report(tiny_steps: None, bad: Any) -> None:
    state = new_state(0)
    state.report(0, [(1, [10, 11])])
    before = drain(state.shuffle_result_steps(0, range(5)))
    good = list(range(100, 200))
    report = [(2, good), (3, [*good, bad, 5]), (4, good)]  # the bad id sits in the 15th chunk of partition 3
    steps = state.report_steps(0, report)
    with pytest.raises(InvalidRequestError, match="partition 3"):
        step_by_step(steps)
    assert sorted(state.shuffles[0].reported) == [1]
    assert drain(state.shuffle_result_steps(0, range(5))) == before


def test_report_sources_protobuf_fields_generators_sets_and_ranges(tiny_steps: None) -> None:
    request = pb.ReportShuffleResultRequest(partitionToBlockIds=[
        pb.PartitionToBlockIds(partitionId=p, blockIds=[(p << 22) | t for t in range(30)]) for p in range(4)])
    from_proto = new_state(0)
    # exactly what the gRPC adapter hands over: a generator of the repeated fields
    lazy = ((e.partitionId, e.blockIds) for e in request.partitionToBlockIds)
    count = drain(from_proto.report_steps(0, lazy))
    assert count == 120
    other = new_state(0)
    other.report(0, [(0, [(0 << 22) | t for t in range(30)]),
                     (1, {(1 << 22) | t for t in range(30)}),
                     (2, ((2 << 22) | t for t in range(30))),
                     (3, range(3 << 22, (3 << 22) + 30))])
    assert drain(from_proto.shuffle_result_steps(0, range(4))) == other.shuffle_result(0, range(4))


def test_reports_between_the_steps_of_a_get_lose_no_id(tiny_steps: None) -> None:
    state = new_state(0)
    reported: set[int] = set()
    for p in range(30):
        ids = [SPARK_DEFAULT.get_block_id(seq, p, 1) for seq in range(0, 2000, 150)]
        state.report(0, [(p, ids)])
        reported.update(ids)
    before_get = set(reported)
    task = [2]

    def report_more(step: int) -> None:
        # existing partitions grow, new ones appear (some requested, some not)
        task[0] += 1
        batch = [(p, [SPARK_DEFAULT.get_block_id(step % 7, p, task[0])]) for p in (step % 30, 30 + step % 5)]
        state.report(0, batch)
        reported.update(i for _, ids in batch for i in ids)

    asked = list(range(35))
    result, steps = step_by_step(state.shuffle_result_steps(0, asked), report_more)
    assert steps > 30
    got = set(BlockIdSet.deserialize(result))
    assert before_get <= got <= reported  # everything reported before the get, nothing invented
    assert set(BlockIdSet.deserialize(state.shuffle_result(0, asked))) == reported  # and nothing lost
