"""Longer atheris runs of the protocol fuzz harnesses (a benchmark-style tool, not a test).

Runs one or all harnesses of ``tests/fuzz/harnesses.py``, one after the other (one core at a
time), each for ``--seconds``, and prints per harness the executions, executions per second,
the corpus growth and the path of any crashing input (with the command that replays it).
Exits 1 if any harness crashed, timed out or ran out of memory.

    python scripts/fuzz.py                                  # every harness, 60 s each
    python scripts/fuzz.py --harness block_id_set --seconds 300 --corpus-dir .cache/fuzz

With ``--corpus-dir`` each harness keeps its corpus in ``<dir>/<harness>/`` across runs (seeded
with valid encodings when empty) and its crashes in ``<dir>/artifacts/<harness>/``; without it both live in
a temporary directory that is removed unless something crashed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fuzz.harnesses import HARNESSES, write_seed_corpus


@dataclass
class Outcome:
    name: str
    returncode: int
    executions: int
    per_second: int
    new_units: int
    corpus_files: int
    artifacts: list[Path]


def _stat(output: str, key: str) -> int:
    match = re.search(rf"stat::{key}:\s*(\d+)", output)
    return int(match.group(1)) if match else -1


def run_one(name: str, corpus: Path, artifacts: Path, seconds: int, seed: int, timeout_s: int) -> Outcome:
    if not corpus.is_dir() or not any(corpus.iterdir()):
        write_seed_corpus(name, corpus)
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=python_path)
    command = [
        sys.executable, "-m", "tests.fuzz.run", name, str(corpus),
        f"-max_total_time={seconds}", f"-seed={seed}", f"-timeout={timeout_s}",
        f"-artifact_prefix={artifacts}{os.sep}", "-print_final_stats=1",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    found = sorted(set(artifacts.iterdir()) - before)
    if result.returncode != 0:
        print(output[-4000:], file=sys.stderr)
    return Outcome(
        name=name,
        returncode=result.returncode,
        executions=_stat(output, "number_of_executed_units"),
        per_second=_stat(output, "average_exec_per_sec"),
        new_units=_stat(output, "new_units_added"),
        corpus_files=sum(1 for _ in corpus.iterdir()),
        artifacts=found,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--harness",
        action="append",
        choices=sorted(HARNESSES),
        help="harness to run (repeatable; default: all)",
    )
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time per harness (default 60)")
    parser.add_argument("--corpus-dir", type=Path, help="keep corpora and crashes here across runs")
    parser.add_argument("--seed", type=int, default=0, help="libFuzzer -seed (0 = from the clock)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take (default 10)")
    args = parser.parse_args()

    names = args.harness or sorted(HARNESSES)
    scratch = None
    if args.corpus_dir is None:
        scratch = Path(tempfile.mkdtemp(prefix="riffle-fuzz-"))
        root = scratch
    else:
        root = args.corpus_dir.resolve()
    artifacts = root / "artifacts"

    print(f"{'harness':<20} {'runs':>12} {'exec/s':>10} {'new':>6} {'corpus':>7}  result")
    outcomes = []
    for name in names:
        outcome = run_one(name, root / name, artifacts / name, args.seconds, args.seed, args.timeout)
        outcomes.append(outcome)
        crashed = outcome.returncode != 0 or outcome.artifacts
        result = "CRASH" if crashed else "ok"
        print(
            f"{name:<20} {outcome.executions:>12,} {outcome.per_second:>10,} {outcome.new_units:>6} "
            f"{outcome.corpus_files:>7}  {result}",
            flush=True,
        )
        for path in outcome.artifacts:
            print(f"    input: {path}\n    replay: python3 -m tests.fuzz.run {name} {path}", flush=True)

    failed = [o for o in outcomes if o.returncode != 0 or o.artifacts]
    if scratch is not None:
        if failed:
            print(f"kept {scratch} (crash inputs under {artifacts})")
        else:
            shutil.rmtree(scratch)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
