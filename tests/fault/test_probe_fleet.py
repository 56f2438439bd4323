"""ProbeFleet: real thespian worker processes (multiprocTCPBase, spawn), real hangs, real kills."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import psutil
import pytest

from riffle_actors.io.probe import probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet, ProbeTarget
from tests.fault.probes import HANG, scripted_probe
from tests.fault.scenario import child_processes, process_gone

pytestmark = pytest.mark.fault


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


def test_a_hung_probe_times_out_its_worker_is_killed_and_replaced(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    before = child_processes()
    fleet = ProbeFleet()
    targets = [ProbeTarget("a", str(a), scripted_probe), ProbeTarget("b", str(b), probe_disk)]
    try:
        first = fleet.probe(targets, timeout_s=20)
        assert first["a"] is not None and first["a"].ok and first["b"] is not None and first["b"].ok
        pids = fleet.worker_pids()
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()

        (a / HANG).touch()
        hung = fleet.probe(targets, timeout_s=0.5)
        assert hung["a"] is not None and not hung["a"].ok and hung["a"].kind == "TIMEOUT"
        assert "probe process" in hung["a"].detail and "killed" in hung["a"].detail
        assert hung["b"] is not None and hung["b"].ok  # the other disk's probe is not held up
        assert fleet.killed_pids == [pids["a"]]
        assert "a" not in fleet.worker_pids()
        assert process_gone(pids["a"])

        (a / HANG).unlink()
        again = fleet.probe(targets, timeout_s=20)
        assert again["a"] is not None and again["a"].ok
        assert fleet.worker_pids()["a"] != pids["a"] and fleet.worker_pids()["b"] == pids["b"]
        assert fleet.starts == 1
    finally:
        fleet.shutdown()
    # the thespian admin, its logger and every worker are gone
    leftover = {pid for pid in child_processes() - before if not process_gone(pid)}
    assert not leftover, f"processes left behind: {leftover}"


def test_a_worker_that_died_is_replaced_before_the_next_probe(tmp_path: Path):
    fleet = ProbeFleet()
    targets = [ProbeTarget("a", str(tmp_path), probe_disk)]
    try:
        assert fleet.probe(targets, timeout_s=20)["a"].ok
        pid = fleet.worker_pids()["a"]
        psutil.Process(pid).kill()
        assert process_gone(pid)
        # not blamed on the disk: a new worker answers within the normal timeout
        result = fleet.probe(targets, timeout_s=20)["a"]
        assert result is not None and result.ok
        assert fleet.worker_pids()["a"] != pid
    finally:
        fleet.shutdown()


def test_shutdown_is_idempotent_and_a_fleet_restarts_lazily(tmp_path: Path):
    fleet = ProbeFleet()
    fleet.shutdown()
    assert not fleet.running
    try:
        assert fleet.probe([ProbeTarget("a", str(tmp_path), probe_disk)], timeout_s=20)["a"].ok
        assert fleet.running
    finally:
        fleet.shutdown()
        fleet.shutdown()
    assert not fleet.running


ORPHAN_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from riffle_actors.io.probe import probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet, ProbeTarget

if __name__ == "__main__":
    fleet = ProbeFleet()
    assert fleet.probe([ProbeTarget("a", {root!r}, probe_disk)], timeout_s=30)["a"].ok
    print(fleet.worker_pids()["a"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the owner dies without shutdown()
"""


def test_probe_processes_do_not_outlive_an_owner_killed_without_shutdown(tmp_path: Path):
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "owner.py"
    script.write_text(ORPHAN_SCRIPT.format(repo=repo, root=str(tmp_path)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         check=False)
    worker = int(out.stdout.split()[0])
    try:
        admin = psutil.Process(worker).ppid()
        group = [p for p in (worker, admin) if p > 1]
    except psutil.NoSuchProcess:
        group = [worker]
    for pid in group:
        assert process_gone(pid, wait_s=15), f"probe fleet process {pid} outlived its owner"
