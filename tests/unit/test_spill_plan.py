"""SpillPlan and SpillQueue: disk choice, re-routes, capped backoff, stuck batches; no event loop."""

from __future__ import annotations

import pytest

from riffle_actors.state.spill_plan import (
    BatchKey,
    SpillPlan,
    SpillQueue,
    SpillRetryPolicy,
    WaitFor,
    WriteTo,
    choose_disk,
)

DISKS = ["/d0", "/d1", "/d2"]
KEY = BatchKey("app-1", 0, 3, 1)


def everything(_disk: str) -> bool:
    return True


def plan(**policy: float) -> SpillPlan:
    return SpillPlan(DISKS, SpillRetryPolicy(**policy))  # type: ignore[arg-type]


def test_choose_disk_prefers_the_partitions_disk_else_hashes_the_partition() -> None:
    assert choose_disk(KEY, "/d1", DISKS) == "/d1"
    hashed = choose_disk(KEY, None, DISKS)
    assert hashed in DISKS
    assert choose_disk(KEY, "/gone", DISKS) == hashed  # stable: the same partition lands together
    assert choose_disk(KEY, "/d1", []) is None


def test_an_io_error_moves_the_batch_to_another_disk_at_once() -> None:
    p = plan()
    a = p.begin(KEY, "/d0", 100, now=0.0)
    assert p.next_step(a, DISKS) == WriteTo("/d0")
    assert p.write_failed(a, "/d0", "EIO", disk_fault=True) == 0.0
    step = p.next_step(a, DISKS)
    assert isinstance(step, WriteTo) and step.disk != "/d0"
    landed = p.landed(a, step.disk)
    assert landed.moved_from == "/d0" and landed.moved_so_far == 1 and landed.log_move
    assert p.moved_from("/d0") == {step.disk: 1}
    p.end(a)
    assert p.in_flight() == 0


def test_when_every_disk_failed_once_the_batch_pauses_and_starts_over() -> None:
    p = plan()
    a = p.begin(KEY, None, 100, now=0.0)
    for _ in DISKS:
        step = p.next_step(a, DISKS)
        assert isinstance(step, WriteTo)
        p.write_failed(a, step.disk, "EIO", disk_fault=True)
    assert p.next_step(a, DISKS) == WaitFor(0.05, no_disk=False)
    assert isinstance(p.next_step(a, DISKS), WriteTo)  # every disk is a candidate again


def test_pauses_double_up_to_the_cap_and_never_end_the_batch() -> None:
    p = plan(first_backoff_s=0.1, max_backoff_s=1.0, stuck_after_retries=1000)
    a = p.begin(KEY, None, 100, now=0.0)
    delays = []
    for _ in range(8):
        step = p.next_step(a, [])  # no disk at all
        assert isinstance(step, WaitFor) and step.no_disk
        delays.append(step.delay_s)
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0])
    assert p.next_step(a, ["/d2"]) == WriteTo("/d2")  # re-routed to whatever became healthy


def test_a_crashed_disk_actor_is_retried_after_a_pause_then_left_for_another_disk() -> None:
    p = plan(crash_retries_per_disk=2)
    a = p.begin(KEY, "/d0", 100, now=0.0)
    assert p.write_failed(a, "/d0", "ActorDeadError", disk_fault=False) == pytest.approx(0.05)
    assert p.next_step(a, DISKS) == WriteTo("/d0")  # same disk: its supervisor restarts it
    assert p.write_failed(a, "/d0", "ActorDeadError", disk_fault=False) == pytest.approx(0.1)
    step = p.next_step(a, DISKS)
    assert isinstance(step, WriteTo) and step.disk != "/d0"


def test_held_out_disks_are_not_placeable_until_readmitted() -> None:
    p = plan()
    p.hold_out("/d1", "taken out by an operator")
    assert p.placeable(everything) == ["/d0", "/d2"]
    assert p.placeable(lambda d: d != "/d0") == ["/d2"]
    p.readmit("/d1")
    assert p.placeable(everything) == DISKS


def test_a_batch_becomes_stuck_after_n_retries_and_is_reported_at_n_2n_4n() -> None:
    p = plan(stuck_after_retries=3)
    a = p.begin(KEY, None, 4096, now=10.0)
    reports = []
    for retry in range(1, 13):
        p.next_step(a, [])
        if p.should_report_stuck(a):
            reports.append(retry)
    assert reports == [3, 6, 12]
    assert a.stuck and p.stuck_total == 1 and p.retries_total == 12
    (stuck,) = p.stuck(now=25.0)
    assert (stuck.app_id, stuck.partition_id, stuck.flight_id) == ("app-1", 3, 1)
    assert stuck.retries == 12 and stuck.waiting_s == 15.0 and stuck.data_bytes == 4096
    landed = p.landed(a, "/d0")
    assert landed.was_stuck and landed.retries == 12
    p.end(a)
    assert p.stuck(now=26.0) == []


def test_failed_writes_are_remembered_for_the_report() -> None:
    p = plan(stuck_after_retries=2)
    a = p.begin(KEY, "/d0", 1, now=0.0)
    p.write_failed(a, "/d0", "spill write failed (EIO): boom", disk_fault=True)
    p.write_failed(a, "/d1", "spill write failed (ENOSPC): full", disk_fault=True)
    (stuck,) = p.stuck(now=1.0)
    assert stuck.failed_writes == 2 and stuck.last_error == "/d1: spill write failed (ENOSPC): full"


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        SpillRetryPolicy(first_backoff_s=3.0, max_backoff_s=2.0)
    with pytest.raises(ValueError):
        SpillRetryPolicy(stuck_after_retries=0)


def test_queue_admits_up_to_the_concurrency_in_order() -> None:
    q: SpillQueue[str] = SpillQueue(2)
    assert q.push("a") == ["a"]
    assert q.push("b") == ["b"]
    assert q.push("c") == [] and q.push("d") == []
    assert (q.pending, q.running) == (2, 2)
    assert q.finished("a") == ["c"]
    assert q.finished("b") == ["d"]
    assert q.finished("c") == [] and q.finished("d") == []
    assert (q.pending, q.running) == (0, 0)
    with pytest.raises(ValueError):
        SpillQueue(0)


def test_queue_restart_runs_the_running_table_again_first() -> None:
    jobs = [object() for _ in range(5)]
    q: SpillQueue[object] = SpillQueue(2)
    for j in jobs:
        q.push(j)
    assert q.finished(jobs[0]) == [jobs[2]]
    assert q.running_items() == [jobs[1], jobs[2]]
    # the runner crashed: what was running starts again, before what waited
    assert q.restart() == [jobs[1], jobs[2]]
    assert (q.pending, q.running) == (2, 2)
    assert q.finished(jobs[2]) == [jobs[3]]
    assert q.finished(jobs[2]) == []  # finishing twice frees one slot only
    assert q.running_items() == [jobs[1], jobs[3]]


def test_a_batch_never_goes_back_to_an_earlier_disk_of_its_partition_until_it_is_stuck() -> None:
    """Issue 21: the partition's files form one virtual data file; its earlier files must not grow."""
    p = plan(stuck_after_retries=4)
    a = p.begin(KEY, "/d1", 100, now=0.0, earlier_disks=("/d0",))
    assert p.write_failed(a, "/d1", "EIO", disk_fault=True) == 0.0
    assert p.next_step(a, DISKS) == WriteTo("/d2")  # not /d0, whatever the hash says
    assert p.write_failed(a, "/d2", "EIO", disk_fault=True) == 0.0
    assert isinstance(p.next_step(a, DISKS), WaitFor) and not a.stuck  # only /d0 left: wait, retry
    assert isinstance(p.next_step(a, ["/d0"]), WaitFor) and a.stuck
    assert p.next_step(a, ["/d0"]) == WriteTo("/d0")  # stuck: the partition keeps working
