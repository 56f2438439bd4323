"""Deterministic simulation: seeded schedules of actor crashes, disk faults and clock jumps.

Each seed builds a workload (writes that spill, reads, commit + finish) and a schedule of events
(``tests.sim.harness.make_schedule``), runs them against a fresh in-process server (every 8th seed
with a coordinator too, so that the heartbeat can crash) and checks the invariants
(``World.check_invariants``). CI runs ``RIFFLE_SIM_SEEDS`` seeds (default 200) from
``RIFFLE_SIM_FIRST`` (default 0). A failing seed is printed with its replay command::

    RIFFLE_SIM_SEED=123 python3 -m pytest tests/sim -k replay

More seeds locally (any range, stops at the first failure)::

    RIFFLE_SIM_FIRST=200 RIFFLE_SIM_SEEDS=5000 python3 -m pytest tests/sim -k seed -x -q
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sim.harness import HEARTBEAT_EVERY, KINDS, SIM_KINDS, make_schedule, run_seed

FIRST = int(os.environ.get("RIFFLE_SIM_FIRST", "0"))
COUNT = int(os.environ.get("RIFFLE_SIM_SEEDS", "200"))


async def _run(tmp_path: Path, seed: int) -> None:
    try:
        await run_seed(tmp_path, seed)
    except BaseException as e:
        e.add_note(f"replay: RIFFLE_SIM_SEED={seed} python3 -m pytest tests/sim -k replay")
        raise


@pytest.mark.parametrize("seed", range(FIRST, FIRST + COUNT))
async def test_seed(tmp_path: Path, seed: int) -> None:
    await _run(tmp_path, seed)


async def test_replay(tmp_path: Path) -> None:
    """The seed in ``RIFFLE_SIM_SEED`` (seed 0 when unset, so the test always runs something)."""
    await _run(tmp_path, int(os.environ.get("RIFFLE_SIM_SEED", "0")))


def test_schedules_are_a_function_of_the_seed() -> None:
    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)
    kinds = {e.kind for s in range(200) for e in make_schedule(s, KINDS if s % HEARTBEAT_EVERY == 0 else SIM_KINDS)[1]
             if e.what in ("inject", "kill", "stall")}
    assert set(KINDS) <= kinds
    whats = {e.what for s in range(200) for e in make_schedule(s)[1]}
    assert whats == {"inject", "kill", "stall", "disk", "jump"}
