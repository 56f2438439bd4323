"""The two-action Spark driver (tests/e2e/restart_job.py) seen from a test: launch it, wait for its
phases, and check its second action re-read the first one's shuffle exactly, without recomputing a map
stage. Used by the tests that do something to the cluster between the two actions (restart every
server, rot one replica).

The driver writes ``result.json`` after each phase and pauses after the first until the ``go`` file
exists; ``error`` in the result is the driver's own exception.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import TIME_SCALE, base_conf, tail

JOB = Path(__file__).resolve().parent / "restart_job.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONUNBUFFERED="1")
    return env


def launch(run_dir: Path, conf: dict[str, str]) -> tuple[subprocess.Popen, Path, Path, Path]:
    """Start the driver with ``conf`` over the e2e base conf; (process, result file, go file, log)."""
    run_dir.mkdir(parents=True)
    (run_dir / "local").mkdir()
    out, go, log = run_dir / "result.json", run_dir / "go", run_dir / "driver.log"
    spec = {"conf": {**base_conf(run_dir / "local"), **conf}, "out": str(out), "go": str(go),
            "wait_s": 600 * TIME_SCALE}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, str(JOB), "--spec", str(run_dir / "spec.json")], cwd=run_dir,
                                env=_env(), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc, out, go, log


def _result(out: Path) -> dict:
    try:
        return json.loads(out.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def wait_phase(proc: subprocess.Popen, out: Path, log: Path, phase: str, timeout: float) -> dict:
    """The driver's figures of ``phase`` (``phase1`` / ``phase2``) once written; fails on its error or exit."""
    deadline = time.monotonic() + timeout * TIME_SCALE
    while True:
        res = _result(out)
        if "error" in res:
            raise AssertionError(f"driver failed:\n{res['error'][-4000:]}")
        if phase in res:
            return res[phase]
        if proc.poll() is not None:
            raise AssertionError(f"driver exited with {proc.returncode} before {phase}:\n{tail(log, 80)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {phase} within {timeout:.0f} s:\n{tail(log, 80)}")
        time.sleep(0.2)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in a /metrics text whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+([-+0-9.eE]+)$", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    return total


def stop_driver(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def assert_reread_exactly(first: dict, second: dict, vanilla: tuple[subprocess.Popen, Path, Path]) -> None:
    """The second action's answer equals the first's and Spark's own sort shuffle's (``vanilla``: the
    oracle driver, its result file and log), and no map stage ran again: the map function's accumulator
    did not move and the second job's map stage shows no completed task (skipped)."""
    assert second["digest"] == first["digest"] and second["rows"] == first["rows"]
    assert second["map_records"] == first["map_records"]
    stages = second["stages"]
    assert len(stages) >= 2, stages
    assert any(st["completed_tasks"] == 0 and st["num_tasks"] for st in stages), stages
    assert sum(st["completed_tasks"] or 0 for st in stages) == 16, stages  # the 16 reduce tasks only
    proc, out, log = vanilla
    oracle = wait_phase(proc, out, log, "phase2", 400)
    assert proc.wait(120) == 0, tail(log, 80)
    assert second["digest"] == oracle["digest"] and second["rows"] == oracle["rows"]
