"""ProbeFleet: real worker processes on pipes, real hangs, real kills.

A SIGKILLed owner leaving no worker behind, and the absence of any listener, are checked in
``tests/security/test_no_stray_listeners.py``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from riffle_actors.io.probe import ProbeResult, probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet, ProbeTarget
from tests.fault.probes import DIE, HANG, HANGING, announced_hang, scripted_probe
from tests.fault.scenario import child_processes, process_gone
from tests.helpers import wait_for

pytestmark = pytest.mark.fault


@pytest.fixture
def fleets() -> Iterator[list[ProbeFleet]]:
    """Fleets a test makes; each is shut down afterwards, and no process of theirs may be left."""
    before = child_processes()
    made: list[ProbeFleet] = []
    try:
        yield made
    finally:
        for fleet in made:
            fleet.shutdown()
        leftover = {pid for pid in child_processes() - before if not process_gone(pid)}
        for pid in leftover:  # clean up, then fail
            psutil.Process(pid).kill()
        assert not leftover, f"probe processes left behind: {leftover}"


@pytest.fixture
def disks(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    return a, b


def ok(result: ProbeResult | None) -> bool:
    return result is not None and result.ok


def test_probe_disk_reports_capacity_and_cleans_up(tmp_path: Path):
    r = probe_disk(str(tmp_path))
    assert r.ok and r.capacity_bytes > 0 and 0 < r.used_ratio < 1
    assert os.listdir(tmp_path) == []


def test_probe_disk_classifies_a_missing_root(tmp_path: Path):
    r = probe_disk(str(tmp_path / "absent"))
    assert not r.ok and r.kind == "OTHER" and r.op == "usage" and "No such file" in r.detail


def test_probe_disk_reports_erofs_on_a_read_only_mount(mounts):
    path = mounts.tmpfs("ro", size="1m")
    mounts.remount(path, "ro")
    r = probe_disk(str(path))
    assert not r.ok and (r.kind, r.op) == ("EROFS", "write"), r
    assert errno.errorcode[errno.EROFS] in r.detail or "Read-only" in r.detail


def test_a_probe_function_must_be_importable_by_the_worker(tmp_path: Path):
    with pytest.raises(ValueError, match="module level"):
        ProbeTarget("a", str(tmp_path), lambda root: probe_disk(root))


def test_a_probe_round_runs_each_disk_in_its_own_child_process(fleets, disks):
    fleet = ProbeFleet()
    fleets.append(fleet)
    a, b = disks
    results = fleet.probe([ProbeTarget("a", str(a), probe_disk), ProbeTarget("b", str(b), probe_disk)], 20)
    assert ok(results["a"]) and ok(results["b"]) and results["a"].capacity_bytes > 0
    pids = fleet.worker_pids()
    assert fleet.running and fleet.starts == 2
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    assert {p.pid for p in psutil.Process().children()} >= set(pids.values())
    assert os.listdir(a) == [] and os.listdir(b) == []  # the probe file is removed
    again = fleet.probe([ProbeTarget("a", str(a), probe_disk), ProbeTarget("b", str(b), probe_disk)], 20)
    assert ok(again["a"]) and ok(again["b"]) and fleet.worker_pids() == pids  # the workers are reused


def test_a_hung_probe_times_out_its_worker_is_killed_and_replaced(fleets, disks):
    a, b = disks
    fleet = ProbeFleet()
    fleets.append(fleet)
    targets = [ProbeTarget("a", str(a), scripted_probe), ProbeTarget("b", str(b), probe_disk)]
    first = fleet.probe(targets, timeout_s=20)
    assert ok(first["a"]) and ok(first["b"])
    pids = fleet.worker_pids()

    (a / HANG).touch()
    hung = fleet.probe(targets, timeout_s=0.5)
    assert hung["a"] is not None and not hung["a"].ok and hung["a"].kind == "TIMEOUT"
    assert f"probe process {pids['a']} killed" in hung["a"].detail
    assert ok(hung["b"])  # the other disk's probe is not held up
    assert fleet.killed_pids == [pids["a"]]
    assert process_gone(pids["a"])
    replacement = fleet.worker_pids()["a"]  # started at once, before the next round
    assert replacement != pids["a"] and fleet.worker_pids()["b"] == pids["b"]

    (a / HANG).unlink()
    again = fleet.probe(targets, timeout_s=20)
    assert ok(again["a"]) and ok(again["b"])
    assert fleet.worker_pids() == {"a": replacement, "b": pids["b"]}
    assert fleet.starts == 3 and fleet.killed_pids == [pids["a"]]


def test_a_worker_that_died_is_replaced_before_the_next_probe(fleets, tmp_path: Path):
    fleet = ProbeFleet()
    fleets.append(fleet)
    targets = [ProbeTarget("a", str(tmp_path), probe_disk)]
    assert ok(fleet.probe(targets, timeout_s=20)["a"])
    pid = fleet.worker_pids()["a"]
    psutil.Process(pid).kill()
    assert process_gone(pid)
    # not blamed on the disk: a new worker answers within the normal timeout
    assert ok(fleet.probe(targets, timeout_s=20)["a"])
    assert fleet.worker_pids()["a"] != pid and fleet.killed_pids == []


def test_a_worker_dying_in_its_probe_gives_no_verdict_and_is_replaced(fleets, disks):
    a, b = disks
    fleet = ProbeFleet()
    fleets.append(fleet)
    targets = [ProbeTarget("a", str(a), scripted_probe), ProbeTarget("b", str(b), probe_disk)]
    assert ok(fleet.probe(targets, timeout_s=20)["a"])
    pid = fleet.worker_pids()["a"]
    (a / DIE).touch()
    results = fleet.probe(targets, timeout_s=20)
    assert results["a"] is None and ok(results["b"])  # the machinery failed, not the disk
    assert process_gone(pid) and fleet.killed_pids == []
    (a / DIE).unlink()
    assert ok(fleet.probe(targets, timeout_s=20)["a"])
    assert fleet.worker_pids()["a"] != pid


def test_a_worker_that_cannot_start_gives_no_verdict(fleets, tmp_path: Path):
    fleet = ProbeFleet(python="/bin/false")  # exits at once, never says ready
    fleets.append(fleet)
    results = fleet.probe([ProbeTarget("a", str(tmp_path), probe_disk)], timeout_s=20)
    assert results == {"a": None}
    assert fleet.worker_pids() == {} and not fleet.running


def test_a_round_ended_by_stop_requested_gives_no_verdict_and_late_answers_are_ignored(fleets, disks):
    a, b = disks
    fleet = ProbeFleet()
    fleets.append(fleet)
    fleet.stop_requested = threading.Event()
    targets = [ProbeTarget("a", str(a), announced_hang), ProbeTarget("b", str(b), probe_disk)]
    assert ok(fleet.probe(targets, timeout_s=20)["a"])
    pids = fleet.worker_pids()

    (a / HANG).touch()
    fleet.stop_requested.set()
    assert fleet.probe(targets, timeout_s=20) == {"a": None, "b": None}  # returns without waiting
    wait_for(lambda: (a / HANGING).exists(), what="worker a stuck in its probe")
    fleet.stop_requested.clear()
    (a / HANG).unlink()
    (a / HANGING).unlink()
    # each worker first answers the request of the abandoned round, then this one's
    again = fleet.probe(targets, timeout_s=20)
    assert ok(again["a"]) and ok(again["b"]) and fleet.worker_pids() == pids and fleet.killed_pids == []


def test_shutdown_kills_a_worker_stuck_in_its_probe(fleets, disks):
    a, b = disks
    fleet = ProbeFleet(exit_grace_s=0.2)
    fleets.append(fleet)
    fleet.stop_requested = threading.Event()
    targets = [ProbeTarget("a", str(a), announced_hang), ProbeTarget("b", str(b), probe_disk)]
    assert ok(fleet.probe(targets, timeout_s=20)["a"])
    pids = fleet.worker_pids()
    (a / HANG).touch()
    fleet.stop_requested.set()  # as the DiskMonitor does when it stops
    fleet.probe(targets, timeout_s=20)
    wait_for(lambda: (a / HANGING).exists(), what="worker a stuck in its probe")
    fleet.shutdown()
    assert pids["a"] in fleet.killed_pids  # it could not read the end of its request pipe
    assert process_gone(pids["a"]) and process_gone(pids["b"])
    assert not fleet.running and fleet.worker_pids() == {}


def test_shutdown_is_idempotent_and_a_fleet_restarts_lazily(fleets, tmp_path: Path):
    fleet = ProbeFleet(exit_grace_s=30)  # shutdown returns as soon as the worker has exited
    fleets.append(fleet)
    fleet.shutdown()
    assert not fleet.running
    assert ok(fleet.probe([ProbeTarget("a", str(tmp_path), probe_disk)], timeout_s=20)["a"])
    assert fleet.running
    pid = fleet.worker_pids()["a"]
    fleet.shutdown()
    fleet.shutdown()
    assert not fleet.running and process_gone(pid)
    assert fleet.killed_pids == []  # an idle worker exits by itself when its request pipe closes
