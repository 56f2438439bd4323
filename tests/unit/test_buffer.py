"""PartitionBuffer: de-duplication, staging/in-flight batches and the lastBlockId cursor (spec §2.6)."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.records import Block
from riffle_actors.state.buffer import BLOCK_OVERHEAD_BYTES, PartitionBuffer, block_size


def blk(block_id: int, size: int = 10, task: int = 0) -> Block:
    data = bytes([block_id % 251]) * size
    return Block(block_id, size, size, zlib.crc32(data), task, data)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def read_all(buf: PartitionBuffer, budget: int = 1, task_filter=None) -> list[int]:
    """The client's loop: cursor from -1 until an empty answer."""
    out: list[int] = []
    last = -1
    for _ in range(10_000):
        got = buf.read(last, budget, task_filter)
        if not got:
            return out
        out.extend(ids(got))
        last = got[-1].block_id
    raise AssertionError("cursor loop did not terminate")


def test_append_counts_uniffle_sizes() -> None:
    buf = PartitionBuffer()
    assert buf.append([blk(1, 100), blk(2, 50)]) == 150 + 2 * BLOCK_OVERHEAD_BYTES
    assert buf.staging_bytes == buf.memory_bytes == buf.total_bytes == 214
    assert buf.block_count == 2
    assert block_size(blk(3, 7)) == 7 + BLOCK_OVERHEAD_BYTES


def test_duplicates_are_dropped_everywhere() -> None:
    buf = PartitionBuffer()
    assert buf.append([blk(1), blk(1), blk(2)]) == 2 * (10 + BLOCK_OVERHEAD_BYTES)
    flight = buf.start_flight()
    assert flight is not None
    assert buf.append([blk(2), blk(3)]) == 10 + BLOCK_OVERHEAD_BYTES  # 2 is in flight
    buf.complete_flight(flight.flight_id)
    assert buf.append([blk(1)]) == 0  # 1 is on disk: still a duplicate
    assert read_all(buf) == [3]
    assert buf.contains_block(1) and not buf.contains_block(99)


def test_read_from_start_and_cursor() -> None:
    buf = PartitionBuffer()
    buf.append([blk(i) for i in (5, 3, 9, 1)])  # arrival order, not id order
    assert ids(buf.read(-1, 25)) == [5, 3, 9]  # stops once >= 25 bytes
    assert ids(buf.read(9, 25)) == [1]
    assert buf.read(1, 25) == []
    assert read_all(buf) == [5, 3, 9, 1]


def test_at_least_one_block_even_if_bigger_than_budget() -> None:
    buf = PartitionBuffer()
    buf.append([blk(1, 1000), blk(2, 1000)])
    assert ids(buf.read(-1, 10)) == [1]
    assert ids(buf.read(-1, 0)) == [1]


def test_unknown_last_block_restarts_from_the_beginning() -> None:
    buf = PartitionBuffer()
    buf.append([blk(1), blk(2)])
    assert ids(buf.read(777, 1000)) == [1, 2]


def test_flights_then_staging_in_arrival_order() -> None:
    buf = PartitionBuffer()
    buf.append([blk(1), blk(2)])
    f1 = buf.start_flight()
    buf.append([blk(3)])
    f2 = buf.start_flight()
    buf.append([blk(4), blk(5)])
    assert f1 is not None and f2 is not None and f1.flight_id < f2.flight_id
    assert ids(f1.blocks) == [1, 2] and f1.size == 2 * (10 + BLOCK_OVERHEAD_BYTES) and f1.data_bytes == 20
    assert read_all(buf) == [1, 2, 3, 4, 5]
    assert buf.in_flight_bytes == 3 * (10 + BLOCK_OVERHEAD_BYTES)
    assert buf.staging_bytes == 2 * (10 + BLOCK_OVERHEAD_BYTES)
    assert buf.in_flight_ids() == [f1.flight_id, f2.flight_id]
    assert buf.flight(f2.flight_id).blocks == f2.blocks
    # the newer batch lands first: the order of what is left does not change
    assert buf.complete_flight(f2.flight_id) == 10 + BLOCK_OVERHEAD_BYTES
    assert read_all(buf) == [1, 2, 4, 5]
    assert ids(buf.read(2, 1000)) == [4, 5]
    assert buf.complete_flight(f1.flight_id) == f1.size
    assert buf.complete_flight(f1.flight_id) == 0  # already done
    assert read_all(buf) == [4, 5]
    assert buf.in_flight_bytes == 0 and buf.memory_bytes == buf.staging_bytes


def test_cursor_inside_a_completed_flight_restarts() -> None:
    buf = PartitionBuffer()
    buf.append([blk(1), blk(2)])
    f = buf.start_flight()
    buf.append([blk(3)])
    assert ids(buf.read(-1, 10)) == [1]
    buf.complete_flight(f.flight_id)  # 1 and 2 are on disk now: the client reads them from the files
    assert ids(buf.read(1, 1000)) == [3]


def test_empty_flight_is_none() -> None:
    buf = PartitionBuffer()
    assert buf.start_flight() is None
    buf.append([blk(1)])
    assert buf.start_flight() is not None
    assert buf.start_flight() is None


def test_task_filter_skips_blocks_but_not_the_cursor() -> None:
    buf = PartitionBuffer()
    buf.append([blk(1, task=1), blk(2, task=2), blk(3, task=1), blk(4, task=2)])
    assert read_all(buf, 1, {2}) == [2, 4]
    assert read_all(buf, 1000, {1}) == [1, 3]
    # the cursor may point at a block the filter rejects (it was returned to another reader)
    assert ids(buf.read(2, 1000, {1})) == [3]
    assert read_all(buf, 1000, set()) == []


def test_budget_counts_only_returned_blocks() -> None:
    buf = PartitionBuffer()
    buf.append([blk(1, 100, task=9), blk(2, 5, task=1), blk(3, 5, task=1), blk(4, 5, task=1)])
    assert ids(buf.read(-1, 10, {1})) == [2, 3]


# ---------------------------------------------------------------------------- model-based
ops_strategy = st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 40), max_size=6)),
    st.tuples(st.just("flight"), st.just(0)),
    st.tuples(st.just("complete"), st.integers(0, 10)),
    st.tuples(st.just("read"), st.integers(1, 60)),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops_strategy)
def test_memory_sequence_matches_a_model(ops) -> None:
    """S is the arrival order of the blocks still in memory; ids are unique; bytes add up."""
    buf = PartitionBuffer()
    seen: set[int] = set()
    arrival: list[int] = []  # every accepted id, in arrival order
    on_disk: set[int] = set()
    flights: dict[int, list[int]] = {}
    for op, arg in ops:
        if op == "append":
            new = []
            for i in arg:
                if i not in seen:
                    seen.add(i)
                    new.append(i)
            accepted = buf.append([blk(i) for i in arg])
            arrival.extend(new)
            assert accepted == len(new) * (10 + BLOCK_OVERHEAD_BYTES)
        elif op == "flight":
            f = buf.start_flight()
            if f is not None:
                flights[f.flight_id] = ids(f.blocks)
        elif op == "complete":
            if flights:
                fid = sorted(flights)[arg % len(flights)]
                assert buf.complete_flight(fid) == len(flights[fid]) * (10 + BLOCK_OVERHEAD_BYTES)
                on_disk.update(flights.pop(fid))
        else:
            in_memory = [i for i in arrival if i not in on_disk]
            assert read_all(buf, arg) == in_memory
        in_memory = [i for i in arrival if i not in on_disk]
        assert buf.memory_bytes == len(in_memory) * (10 + BLOCK_OVERHEAD_BYTES)
        assert buf.in_flight_bytes == sum(len(v) for v in flights.values()) * (10 + BLOCK_OVERHEAD_BYTES)
        assert buf.total_bytes == len(arrival) * (10 + BLOCK_OVERHEAD_BYTES)
    assert read_all(buf, 7) == [i for i in arrival if i not in on_disk]
