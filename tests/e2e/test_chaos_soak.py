"""The chaos soak, short: ``scripts/chaos_soak.py`` for ~2 minutes with a fixed seed (issue 21, part 2).

A coordinator pair and three servers (two tmpfs data paths each), Spark applications of the e2e job set
with ``spark.rss.data.replica=2`` (write 2, read 1) and 4 task attempts back to back, and a schedule that,
for this seed and gap, injects every fault kind at least once (checked on the printed schedule first,
without Spark). The run must end with 0 results differing from Spark's sort shuffle, every
kill's loss reported, every flipped block found by a scrubber, every fault injected and undone, and the
script's exit status 0 (1 when jobs failed loudly: counted and printed here, the 30-minute run's
target). Needs root, java, pyspark 3.5 and the client jar: without them the e2e conftest
skips, which ``RIFFLE_TESTS_REQUIRE_ALL=1`` (CI) turns into a failure; without root the test skips the
same way. About 3.5 minutes on 2 quiet cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1000)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "chaos_soak.py"
SEED, DURATION, GAP = 21, 120, 12
JOBS = "rdd_basic,groupby_agg,join"  # one application's worth: the oracle runs each once
LIMIT_S = 840  # the soak's own wall-clock limit here (it stretches on a loaded machine: faults wait for recovery)
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ARGS = ["--seed", str(SEED), "--duration", str(DURATION), "--fault-gap", str(GAP), "--jobs", JOBS]


def test_schedule_is_a_function_of_the_seed_and_covers_every_kind() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import chaos_soak
    finally:
        sys.path.remove(str(REPO / "scripts"))
    a = chaos_soak.draw_schedule(SEED, DURATION, 3, GAP)
    assert a == chaos_soak.draw_schedule(SEED, DURATION, 3, GAP)
    assert a != chaos_soak.draw_schedule(SEED + 1, DURATION, 3, GAP)
    assert {f.kind for f in a} == set(chaos_soak.FAULT_KINDS)
    printed = subprocess.run([sys.executable, str(SCRIPT), *ARGS, "--print-schedule"], capture_output=True,
                             text=True, env=ENV, timeout=60, check=True).stdout
    assert printed.splitlines() == [f.describe() for f in a]


def test_short_chaos_soak_with_replica_2(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the chaos soak needs root (tmpfs data paths, read-only remounts)")
    out = tmp_path / "figures.json"
    work = tmp_path / "soak"
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout, "wb") as o, open(stderr, "wb") as e:
        p = subprocess.Popen([sys.executable, str(SCRIPT), *ARGS, "--json", str(out), "--workdir", str(work)],
                             stdout=o, stderr=e, env=ENV, start_new_session=True)
    try:
        p.wait(LIMIT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also on a pytest timeout: SIGTERM lets the soak remove its processes and mounts
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    out_text = stdout.read_text(errors="replace")
    log = out_text[-12000:] + "\n--- stderr:\n" + stderr.read_text(errors="replace")[-6000:]
    assert p.returncode != -signal.SIGTERM and p.returncode != 130, f"the soak ran out of {LIMIT_S} s:\n{log}"

    assert out.exists(), f"no figures (exit {p.returncode}):\n{log}"
    fig = json.loads(out.read_text())
    assert fig["jobs_run"] >= 3, log
    assert set(fig["faults"]) == {
        "server_sigkill", "server_sigterm", "disk_eio", "disk_readonly", "disk_full", "bit_flip",
        "coordinator_sigkill", "memory_pressure"}, log
    assert not fig["errors"], log
    # replica 2/2/1, two data paths per server, 4 task attempts and client retries beyond a server's
    # outage (docs/faults.md "Settings, and which gives which guarantee"): the 30-minute run holds the
    # target of no failed job. Here a job that fails loudly (the client's exception, printed) is counted
    # and shown, not fatal: a flaky CI would hide every other result. What must never happen is checked
    # hard: a wrong result, an unreported loss, a flipped block no scrubber finds, a fault left in place.
    print(f"jobs failed: {len(fig['jobs_failed'])} of {fig['jobs_run']}: {fig['jobs_failed']}")
    assert len(fig["jobs_failed"]) < fig["jobs_run"], log
    assert not fig["results_differ"], log
    assert all(x["reported"] for x in fig["losses"]), log
    for line in ("jobs run:", "faults injected:", "jobs failed:", "results differing from sort shuffle: 0",
                 "stages recomputed:", "blocks lost", "worst recovery time:"):
        assert line in out_text, f"{line!r} not printed:\n{log}"
    # every flipped byte found by the servers' scrubbers (riffle_scrub_corrupt_blocks_total)
    assert fig["integrity"].get("measured"), log
    assert fig["integrity"]["ok"], log
    assert p.returncode == (1 if fig["jobs_failed"] else 0), log  # 1: the failed-jobs target only
    # nothing left behind: no mount under the run's directory, no process started there
    mounts = Path("/proc/mounts").read_text()
    assert str(work) not in mounts, mounts
    left = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True, check=False).stdout.split()
    assert not left, f"processes of the soak still running: {left}"
