"""PartitionState without a loop: appends and their sizes, de-duplication, spill decisions, huge
partitions, LOCAL_ORDER batches, spill completion, purge, and the figures of the app's size table."""

from __future__ import annotations

import zlib

from riffle_actors.records import Block
from riffle_actors.state.buffer import BLOCK_OVERHEAD_BYTES as OVH
from riffle_actors.state.partition import PartitionFigures, PartitionState, SpillLimits


def blk(block_id: int, size: int = 100, task: int = 0) -> Block:
    data = bytes([block_id % 251]) * size
    return Block(block_id, size, size, zlib.crc32(data), task, data)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def test_append_reports_accepted_and_dropped_bytes_and_keeps_the_figures_current() -> None:
    figures = PartitionFigures()
    p = PartitionState(figures)
    assert p.append([blk(1), blk(2, 50)]) == (150 + 2 * OVH, 0, False)
    assert p.append([blk(2, 50), blk(3)]) == (100 + OVH, 50 + OVH, False)  # 2 is a duplicate
    held = 3 * OVH + 250
    assert (figures.staging_bytes, figures.in_flight_bytes, figures.total_bytes) == (held, 0, held)
    assert figures.memory_bytes == figures.staging_bytes
    assert p.figures is figures


def test_duplicates_stay_duplicates_after_their_first_copy_is_on_disk() -> None:
    p = PartitionState(limits=SpillLimits(single_buffer_bytes=1))
    p.append([blk(1), blk(2)])
    assert p.should_spill()
    flight = p.start_spill()
    assert flight is not None and ids(flight.blocks) == [1, 2]
    assert p.complete_spill(flight.flight_id, "/d0", flight.data_bytes) == flight.size
    assert p.append([blk(1), blk(2)]) == (0, 2 * (100 + OVH), False)
    assert p.read(-1, 1 << 20) == []


def test_spill_decision_follows_the_single_buffer_size() -> None:
    p = PartitionState(limits=SpillLimits(single_buffer_bytes=300))
    p.append([blk(1), blk(2)])
    assert not p.should_spill()  # 264 bytes
    p.append([blk(3)])
    assert p.should_spill()
    assert not PartitionState().should_spill()  # no limit: only rounds and flushes spill it


def test_a_partition_becomes_huge_once_and_then_spills_at_the_huge_size() -> None:
    limits = SpillLimits(single_buffer_bytes=10_000, huge_threshold_bytes=250, huge_spill_bytes=100)
    p = PartitionState(limits=limits)
    assert p.append([blk(1), blk(2)])[2] is True  # 264 > 250 received: huge at once
    assert p.figures.huge
    p2 = PartitionState(limits=limits)
    assert p2.append([blk(1)]) == (132, 0, False)
    assert p2.append([blk(2)]) == (132, 0, True)
    assert p2.append([blk(3)])[2] is False  # reported once
    assert p2.should_spill()  # 396 >= the huge spill size 100, far below 10_000


def test_spill_moves_staging_in_flight_and_local_order_sorts_by_task() -> None:
    p = PartitionState(local_order=True)
    p.append([blk(1, task=3), blk(2, task=1), blk(3, task=2), blk(4, task=1)])
    flight = p.start_spill()
    assert flight is not None
    assert [b.task_attempt_id for b in flight.blocks] == [1, 1, 2, 3]
    assert ids(flight.blocks) == [2, 4, 3, 1]  # stable within a task
    assert (p.figures.staging_bytes, p.figures.in_flight_bytes) == (0, 4 * (100 + OVH))
    assert flight.data_bytes == 400 and flight.size == 400 + 4 * OVH
    assert p.start_spill() is None  # nothing staged


def test_reads_walk_in_flight_then_staging_after_the_cursor_with_the_task_filter() -> None:
    p = PartitionState()
    p.append([blk(1, task=1), blk(2, task=2)])
    p.start_spill()
    p.append([blk(3, task=1), blk(4, task=2)])
    assert ids(p.read(-1, 1 << 20)) == [1, 2, 3, 4]
    assert ids(p.read(2, 1 << 20)) == [3, 4]
    assert ids(p.read(-1, 150)) == [1, 2]  # up to readBufferSize
    assert ids(p.read(-1, 1 << 20, {1})) == [1, 3]
    assert ids(p.read(999, 1 << 20)) == [1, 2, 3, 4]  # an id no longer in memory restarts


def test_spill_completion_records_disks_once_and_releases_the_batch() -> None:
    p = PartitionState()
    p.append([blk(1)])
    first = p.start_spill()
    p.append([blk(2)])
    second = p.start_spill()
    assert first is not None and second is not None
    assert p.in_flight_ids() == [first.flight_id, second.flight_id]
    assert p.complete_spill(second.flight_id, "/d1", 100) == 100 + OVH  # out of order is fine
    assert p.complete_spill(first.flight_id, "/d0", 100) == 100 + OVH
    assert p.complete_spill(first.flight_id, "/d0", 100) == 0  # acknowledged twice: released once
    p.append([blk(3)])
    third = p.start_spill()
    assert third is not None
    assert p.complete_spill(third.flight_id, "/d1", 100) == 100 + OVH
    f = p.figures
    assert (f.disks, f.disk_bytes, f.in_flight_bytes) == (("/d1", "/d0"), 300, 0)


def test_an_abandoned_spill_leaves_memory_without_a_disk() -> None:
    p = PartitionState()
    p.append([blk(1)])
    flight = p.start_spill()
    assert flight is not None
    assert p.complete_spill(flight.flight_id, None, 0) == 100 + OVH
    assert (p.figures.disks, p.figures.disk_bytes, p.figures.memory_bytes) == ((), 0, 0)


def test_release_all_gives_back_staging_and_in_flight_and_forgets_the_blocks() -> None:
    p = PartitionState()
    p.append([blk(1)])
    p.start_spill()
    p.append([blk(2), blk(3)])
    assert p.release_all() == (2 * (100 + OVH), 100 + OVH)
    assert p.figures.memory_bytes == 0 and p.read(-1, 1 << 20) == [] and p.in_flight_ids() == []
    assert p.release_all() == (0, 0)
    assert p.figures.total_bytes == 3 * (100 + OVH)  # what was received stays counted
