"""The admin service's health policy and disk reports, as pure functions (no actors, no loop)."""

from __future__ import annotations

from riffle_actors.actors.storage_messages import DiskInfo
from riffle_actors.admin import HealthRules, disk_report
from riffle_actors.io.probe import ProbeResult
from riffle_actors.reports import DiskReport, HealthReport, MemoryReport
from riffle_actors.runtime import ManualClock
from riffle_actors.state.disk_health import DiskHealthBoard, HealthPolicy

RULES = HealthRules(min_available_disks=1, memory_stuck_s=120.0)


def disk(name: str, healthy: bool = True, reason: str = "") -> DiskReport:
    return DiskReport(name=name, healthy=healthy, status="HEALTHY" if healthy else "QUARANTINED", reason=reason,
                      capacity=100, used=10)


def test_healthy_when_nothing_is_wrong():
    assert RULES.reasons(escalated=None, disks=[disk("a")], above_high_watermark_since=None, now=0.0) == ()


def test_too_few_healthy_disks_lists_each_bad_disk():
    reasons = RULES.reasons(escalated=None, disks=[disk("a", False, "EIO on spill write; quarantined"),
                                                   disk("b", False, "TIMEOUT on write probe; quarantined")],
                            above_high_watermark_since=None, now=0.0)
    assert reasons == ("0 healthy disks, fewer than min_number_of_available_disks=1",
                       "a: EIO on spill write; quarantined", "b: TIMEOUT on write probe; quarantined")
    # one healthy disk is enough for min_available_disks=1: the bad one is not a reason then
    assert RULES.reasons(escalated=None, disks=[disk("a", False, "x"), disk("b")], above_high_watermark_since=None,
                         now=0.0) == ()


def test_memory_stuck_above_the_high_watermark_counts_only_after_the_limit():
    clock = ManualClock()
    since = clock.monotonic()
    clock.advance(120)
    assert RULES.reasons(escalated=None, disks=[disk("a")], above_high_watermark_since=since,
                         now=clock.monotonic()) == ()
    clock.advance(0.5)
    assert RULES.reasons(escalated=None, disks=[disk("a")], above_high_watermark_since=since,
                         now=clock.monotonic()) == ("memory above the spill high watermark for more than 120.0s",)


def test_stuck_spill_batches_are_a_reason_naming_the_longest_one():
    from riffle_actors.state.spill_plan import StuckSpill

    stuck = (StuckSpill(app_id="app_7", shuffle_id=1, partition_id=3, flight_id=9, data_bytes=4096, retries=12,
                        failed_writes=8, waiting_s=31.2, last_error="EIO on spill write"),
             StuckSpill(app_id="app_8", shuffle_id=0, partition_id=0, flight_id=2, data_bytes=10, retries=10,
                        failed_writes=10, waiting_s=5.0, last_error="EIO on spill write"))
    reasons = RULES.reasons(escalated=None, disks=[disk("a")], above_high_watermark_since=None, now=0.0,
                            stuck_spills=stuck)
    assert reasons == ("2 spill batches cannot reach a disk (still in memory, still retried); longest: app app_7 "
                       "shuffle 1 partition 3, 4096 bytes, 12 retries over 31s, last error: EIO on spill write",)


def test_an_escalation_comes_first():
    reasons = RULES.reasons(escalated=RuntimeError("boom"), disks=[], above_high_watermark_since=None, now=0.0)
    assert reasons == ("supervisor tree gave up: RuntimeError('boom')",
                       "0 healthy disks, fewer than min_number_of_available_disks=1")


def test_health_report_json_keeps_the_http_shape():
    report = HealthReport(reasons=("r",), disks=(disk("a"),), memory=MemoryReport(capacity=8, used=1, allocated=2,
                                                                                   in_flight=0))
    assert report.status == "UNHEALTHY" and not report.healthy
    assert report.to_json() == {
        "status": "UNHEALTHY", "reasons": ["r"],
        "disks": [{"name": "a", "healthy": True, "status": "HEALTHY", "reason": "", "capacity": 100, "used": 10,
                   "written_bytes": 0, "write_failures": 0, "quarantines": 0, "probe_failures": 0,
                   "last_probe_age_s": None, "spills_moved_away": 0}],
        "memory": {"capacity": 8, "used": 1, "allocated": 2, "in_flight": 0}}


def test_disk_report_from_the_board_the_dispatcher_and_the_disk_actor():
    board = DiskHealthBoard([("d", "/d")], HealthPolicy())
    policy = board.policy
    info = DiskInfo("d", "/d", capacity=1000, used=100, written_bytes=7, write_failures=1)
    # before any probe: usage from the Disk actor's statvfs
    r = disk_report(board["d"], policy, override=None, moved={}, now=5.0, info=info)
    assert (r.healthy, r.status, r.capacity, r.used, r.written_bytes, r.write_failures) == (
        True, "HEALTHY", 1000, 100, 7, 1)
    assert r.last_probe_age_s is None
    board.on_probe("d", ProbeResult(True, capacity_bytes=2000, used_bytes=200), now=10.0)
    board.on_io_failure("d", "ENOSPC", "spill write", "No space left", now=11.0)
    r = disk_report(board["d"], policy, override=None, moved={"e": 2}, now=12.5, info=info)
    assert not r.healthy and r.status == "QUARANTINED" and (r.capacity, r.used) == (2000, 200)
    assert r.reason == "ENOSPC on spill write (No space left); quarantined; 2 pending spills moved to e"
    assert r.last_probe_age_s == 2.5 and r.spills_moved_away == 2 and r.quarantines == 1


def test_disk_report_override_and_a_silent_disk_actor():
    board = DiskHealthBoard([("d", "/d")], HealthPolicy())
    r = disk_report(board["d"], board.policy, override="taken out by a test", moved={}, now=0.0, info=None,
                    info_error="TimeoutError()")
    assert not r.healthy and r.status == "QUARANTINED"
    assert r.reason == "taken out by a test; disk actor: TimeoutError()"
