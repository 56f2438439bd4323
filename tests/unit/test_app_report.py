"""``app_report``: the ``/apps`` figures of one app, built from its ``AppState`` alone (no actor, no loop).

The size table is filled as the partition actors would (their ``PartitionFigures``), the
routing marks as the AppActor would (``starting``); each figure of the report is checked
against the numbers put in, shuffle by shuffle and for the app.
"""

from __future__ import annotations

from riffle_actors.runtime import ManualClock
from riffle_actors.state.app_report import AppInfo, ShuffleInfo, app_report
from riffle_actors.state.app_state import AppState


def filled_state(clock: ManualClock) -> AppState:
    state = AppState("app_f", clock, 60.0)
    state.user = "bob"
    state.register_shuffle(0, [(0, 99)], False)
    state.register_shuffle(1, [(0, 9), (50, 59)], True)
    s0 = state.shuffles[0]
    for pid, (staging, in_flight, total, disk, disks, hdfs, huge) in {
        3: (100, 20, 5000, 4880, ("/d1",), 0, True),
        4: (0, 0, 300, 0, ("/d0",), 300, False),
        5: (7, 0, 7, 0, (), 0, False),
    }.items():
        f = s0.partition(pid).figures
        f.staging_bytes, f.in_flight_bytes, f.total_bytes, f.disk_bytes = staging, in_flight, total, disk
        f.disks, f.hdfs_bytes, f.huge = disks, hdfs, huge
    s0.partition(5).starting = True  # its actor is starting
    s0.reported.update_and_count(3, [1, 2, 3])
    s0.reported.update_and_count(4, [])
    s0.lost_blocks = 2
    state.shuffles[1].partition(55).figures.total_bytes = 10
    return state


def test_the_report_adds_up_the_size_table() -> None:
    clock = ManualClock()
    state = filled_state(clock)
    clock.advance(12.5)
    info = app_report(state)
    assert isinstance(info, AppInfo)
    assert info.shuffles[0] == ShuffleInfo(
        ranges=1, partitions=3, partition_actors=1, memory_bytes=127, disk_bytes=4880, received_bytes=5307,
        reported_partitions=2, disks=("/d0", "/d1"), huge_partitions=1, lost_blocks=2,
        huge_partition_bytes=(5000,), hdfs_bytes=300, reported_block_ids=3)
    assert info.shuffles[1] == ShuffleInfo(
        ranges=2, partitions=1, partition_actors=0, memory_bytes=0, disk_bytes=0, received_bytes=10,
        reported_partitions=0, disks=(), huge_partitions=0)
    assert (info.app_id, info.user, info.idle_s) == ("app_f", "bob", 12.5)
    assert info.registered_epoch_ms == state.registered_epoch_ms
    assert (info.partition_count, info.memory_bytes, info.in_flight_bytes, info.received_bytes) == (4, 127, 20, 5317)
    assert (info.partition_actors, info.lost_blocks, info.recovered, info.partition_split_triggered) == (
        1, 2, False, False)


def test_purged_shuffles_still_count_in_received_bytes_and_the_split_mark_is_sticky() -> None:
    state = filled_state(ManualClock())
    state.shuffles[1].partition(55).figures.split = True
    assert app_report(state).partition_split_triggered  # from the size table
    state.split_triggered = True  # the AppActor marks it when requireBuffer names a split partition
    state.drop_shuffle(1)
    state.drop_shuffle(0)
    info = app_report(state)
    assert info.shuffles == {} and info.partition_count == 0 and info.memory_bytes == 0
    assert info.received_bytes == 5317 and info.partition_split_triggered
