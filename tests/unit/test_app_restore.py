"""``restore_app``: a restart's ``RecoveredApp`` applied to a fresh ``AppState``, and the plan it returns.

No event loop, no actor: the state step alone. Each test builds what recovery hands over (the
registrations, reported ids, the disks and bytes of each partition, the lost blocks) and checks
both halves of the step: what the state holds afterwards (what the AppActor then serves) and the
``RestorePlan`` the actor carries out (the metadata log's home and registration records, the
lost-block summary it logs).
"""

from __future__ import annotations

from array import array

from riffle_actors.protocol.bitmap import BlockIdSetMap
from riffle_actors.protocol.shuffle_meta import encode_register
from riffle_actors.runtime import ManualClock
from riffle_actors.state.app_report import app_report
from riffle_actors.state.app_restore import LOST_PARTITIONS_NAMED, RestoredRegistration, restore_app
from riffle_actors.state.app_state import AppState
from riffle_actors.state.recovery import RecoveredApp, RecoveredPartition, RecoveredShuffle

PROPS = {"spark.rss.blockId.maxPartitions": "4096", "spark.app.name": "restore"}


def reported(parts: dict[int, list[int]]) -> BlockIdSetMap:
    sets = BlockIdSetMap()
    for pid, ids in parts.items():
        sets.update_ids(pid, array("Q", ids))
    return sets


def recovered_app() -> RecoveredApp:
    s0 = RecoveredShuffle(
        shuffle_id=0, ranges=[(0, 9), (20, 29)], local_order=False, remote_storage="",
        reported=reported({1: [11, 12], 2: [21], 21: [31, 32, 33]}),
        partitions={1: RecoveredPartition(("/d0",), 1000, 2), 2: RecoveredPartition(("/d1", "/d0"), 500, 1)})
    s3 = RecoveredShuffle(
        shuffle_id=3, ranges=[(0, 99)], local_order=True, remote_storage="hdfs://nn/base",
        reported=reported({p: [100 + p] for p in range(30)}),
        partitions={0: RecoveredPartition(("/d1",), 70, 1)},
        lost_blocks=29, lost_partitions=tuple(range(1, 30)))
    return RecoveredApp("app_r", "/d1", user="alice", properties=dict(PROPS), shuffles={0: s0, 3: s3})


def test_the_state_holds_the_recovered_registrations_ids_and_size_table() -> None:
    state = AppState("app_r", ManualClock(), 60.0)
    restore_app(state, recovered_app())
    assert state.recovered and state.user == "alice" and state.properties == PROPS
    assert sorted(state.shuffles) == [0, 3]
    s0, s3 = state.shuffles[0], state.shuffles[3]
    assert [s0.is_registered(p) for p in (0, 9, 10, 19, 20, 29, 30)] == [True, True, False, False, True, True, False]
    assert s0.range_count == 2 and not s0.local_order and s3.local_order
    assert sorted(s0.reported[1]) == [11, 12] and sorted(s0.reported[21]) == [31, 32, 33]
    assert s3.reported.id_count() == 30 and s0.lost_blocks == 0 and s3.lost_blocks == 29
    f1, f2 = s0.partitions[1].figures, s0.partitions[2].figures
    assert (f1.disks, f1.disk_bytes, f1.total_bytes) == (("/d0",), 1000, 1000)
    assert (f2.disks, f2.disk_bytes, f2.total_bytes) == (("/d1", "/d0"), 500, 500)
    assert f1.memory_bytes == 0 and not f1.huge
    assert sorted(s0.partitions) == [1, 2] and sorted(s3.partitions) == [0]  # a line per partition with files
    assert not any(e.has_actor for s in (s0, s3) for e in s.partitions.values())  # nothing started
    # served as any registered shuffle: a later report and result see the recovered ids
    assert state.report(0, [(1, [13])]) == 1
    assert state.received_bytes() == 1570 and state.partition_count() == 3


def test_the_plan_names_the_home_disk_the_registration_records_and_the_loss() -> None:
    state = AppState("app_r", ManualClock(), 60.0)
    plan = restore_app(state, recovered_app())
    assert plan.home == "/d1"
    props = tuple(PROPS.items())
    assert plan.registrations == (
        RestoredRegistration(0, state.shuffles[0].epoch, encode_register(
            [(0, 9), (20, 29)], local_order=False, user="alice", remote_storage="", properties=props)),
        RestoredRegistration(3, state.shuffles[3].epoch, encode_register(
            [(0, 99)], local_order=True, user="alice", remote_storage="hdfs://nn/base", properties=props)),
    )
    assert [r.epoch for r in plan.registrations] == [1, 2] and state.last_epoch == 2
    assert (plan.shuffles, plan.partitions, plan.reported_partitions, plan.lost_blocks) == (2, 3, 33, 29)
    named = list(range(1, 1 + LOST_PARTITIONS_NAMED))
    assert plan.lost_summary == f"shuffle 3: 29 blocks of partitions {named} ..."


def test_a_restart_that_lost_nothing_has_an_empty_summary_and_a_report_that_says_recovered() -> None:
    clock = ManualClock()
    state = AppState("app_r", clock, 60.0)
    rec = recovered_app()
    rec.shuffles[3].lost_blocks, rec.shuffles[3].lost_partitions = 0, ()
    plan = restore_app(state, rec)
    assert plan.lost_blocks == 0 and plan.lost_summary == ""
    info = app_report(state)
    assert info.recovered and info.lost_blocks == 0 and info.user == "alice"
    assert info.shuffles[0].disks == ("/d0", "/d1") and info.shuffles[0].disk_bytes == 1500
    assert info.shuffles[0].reported_block_ids == 6 and info.shuffles[3].reported_partitions == 30


def test_a_registration_that_came_first_is_extended_not_replaced() -> None:
    state = AppState("app_r", ManualClock(), 60.0)
    state.register_shuffle(0, [(40, 49)], False)
    epoch = state.shuffles[0].epoch
    state.report(0, [(40, [7])])
    plan = restore_app(state, recovered_app())
    s0 = state.shuffles[0]
    assert s0.epoch == epoch == plan.registrations[0].epoch  # the same incarnation
    assert s0.is_registered(45) and s0.is_registered(5) and s0.range_count == 3
    assert sorted(s0.reported[40]) == [7] and sorted(s0.reported[1]) == [11, 12]
