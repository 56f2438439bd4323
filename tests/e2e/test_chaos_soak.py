"""The chaos soak, short: ``scripts/chaos_soak.py`` for ~2 minutes with a fixed seed (issue 21, part 2).

A coordinator pair and three servers (tmpfs data paths), Spark applications of the e2e job set with
``spark.rss.data.replica=2`` (write 2, read 1) back to back, and a schedule that, for this seed and gap,
injects every fault kind at least once (checked on the printed schedule first, without Spark). The run
must end with 0 failed jobs, 0 results differing from Spark's sort shuffle, every kill's loss reported,
every fault injected and undone, and the script's exit status 0 -- or 3 when the only target it could not
measure is the bit-flip accounting (no server exports a corrupt-block counter yet; exit 3 is "not
measured", never a pass of that target). Needs root, java, pyspark 3.5 and the client jar: without them
the e2e conftest skips, which ``RIFFLE_TESTS_REQUIRE_ALL=1`` (CI) turns into a failure; without root the
test skips the same way. About 3.5 minutes on 2 quiet cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "chaos_soak.py"
SEED, DURATION, GAP = 21, 120, 12
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ARGS = ["--seed", str(SEED), "--duration", str(DURATION), "--fault-gap", str(GAP)]


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
    r = subprocess.run([sys.executable, str(SCRIPT), *ARGS, "--json", str(out)], capture_output=True, text=True,
                       env=ENV, timeout=540)
    log = r.stdout[-12000:] + "\n--- stderr:\n" + r.stderr[-6000:]
    assert out.exists(), f"no figures (exit {r.returncode}):\n{log}"
    fig = json.loads(out.read_text())
    assert fig["jobs_run"] >= 3, log
    assert set(fig["faults"]) == {
        "server_sigkill", "server_sigterm", "disk_eio", "disk_readonly", "disk_full", "bit_flip",
        "coordinator_sigkill", "memory_pressure"}, log
    assert not fig["errors"], log
    assert not fig["jobs_failed"], log
    assert not fig["results_differ"], log
    assert all(x["reported"] for x in fig["losses"]), log
    for line in ("jobs run:", "faults injected:", "jobs failed: 0", "results differing from sort shuffle: 0",
                 "stages recomputed:", "blocks lost", "worst recovery time:"):
        assert line in r.stdout, f"{line!r} not printed:\n{log}"
    if fig["integrity"].get("measured"):
        assert r.returncode == 0, log
    else:  # the only target it may miss: bit-flip detection, while the servers export no corrupt-block counter
        assert r.returncode == 3, log
    # nothing left behind: no mount under the run's temp dirs, no daemon of the soak
    mounts = Path("/proc/mounts").read_text()
    assert "riffle-soak-" not in mounts, mounts
    left = subprocess.run(["pgrep", "-f", f"{SCRIPT} _server"], capture_output=True, text=True).stdout.split()
    assert not left, f"soak servers still running: {left}"
