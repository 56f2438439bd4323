"""Deterministic simulation: seeded schedules of actor crashes, disk faults and clock jumps.

Each seed builds a workload (writes that spill, reads, commit + finish) and a schedule of events
(``tests.sim.harness.make_schedule``), runs them against a fresh in-process server (every 8th seed
with a coordinator too, so that the heartbeat can crash) and checks the invariants
(``World.check_invariants``). CI runs ``RIFFLE_SIM_SEEDS`` seeds (default 200) from
``RIFFLE_SIM_FIRST`` (default 0). A failing seed is printed with its replay command::

    RIFFLE_SIM_SEED=123 python3 -m pytest tests/sim -k replay

Without ``RIFFLE_SIM_SEED``, ``test_replay`` replays ``REPLAY_SEEDS``: a fixed list of seeds that
together cover every kind of event of the schedules (``test_the_replay_seeds_cover_every_event_kind``).
A seed fixes the workload and the events at their steps (``World.trace``), not the interleaving of
threads and sockets (see ``tests/sim/harness.py``).

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


#: Seeds that together hold every (event, kind) of the schedules of seeds 0..199: each crash kind
#: injected, killed and stalled, each disk fault, a clock jump, a kill during the purge
REPLAY_SEEDS = (4, 5, 6, 7, 9, 10, 14, 20, 34, 72, 128, 153)


def _features(seed: int) -> set[tuple[str, str]]:
    steps, events = make_schedule(seed, KINDS if seed % HEARTBEAT_EVERY == 0 else SIM_KINDS)
    out = {(e.what, e.kind) for e in events}
    out |= {("kill during the purge", "") for e in events if e.step >= len(steps)}
    return out


def _replay_seeds() -> list[int]:
    chosen = os.environ.get("RIFFLE_SIM_SEED", "").strip()
    if not chosen:
        return list(REPLAY_SEEDS)
    try:
        return [int(s) for s in chosen.split(",")]
    except ValueError:
        raise pytest.UsageError(f"RIFFLE_SIM_SEED={chosen!r}: a seed or a comma-separated list of seeds") from None


@pytest.mark.parametrize("seed", _replay_seeds())
async def test_replay(tmp_path: Path, seed: int) -> None:
    """The seed(s) in ``RIFFLE_SIM_SEED`` (``123`` or ``5,9``), else ``REPLAY_SEEDS``."""
    await _run(tmp_path, seed)


def test_the_replay_seeds_cover_every_event_kind() -> None:
    every = set().union(*(_features(s) for s in range(200)))
    assert ("kill during the purge", "") in every and ("kill", "heartbeat") in every
    assert set().union(*(_features(s) for s in REPLAY_SEEDS)) == every


async def test_the_same_seed_applies_the_same_trace(tmp_path: Path) -> None:
    """Twice the same seed: the same events at the same steps, every one of the schedule, in order."""
    seed = 196  # no coordinator; a kill of the AppActor, a jump, a stall, a disk fault, a kill during the purge
    steps, events = make_schedule(seed)
    first = await run_seed(tmp_path / "first", seed)
    second = await run_seed(tmp_path / "second", seed)
    assert first.trace == second.trace
    assert [ev for _, ev in first.trace] == events and all(step == ev.step for step, ev in first.trace)
    assert {ev.what for ev in events} >= {"kill", "stall", "jump", "disk"} and events[-1].step == len(steps)


def test_schedules_are_a_function_of_the_seed() -> None:
    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)
    kinds = {e.kind for s in range(200) for e in make_schedule(s, KINDS if s % HEARTBEAT_EVERY == 0 else SIM_KINDS)[1]
             if e.what in ("inject", "kill", "stall")}
    assert set(KINDS) <= kinds
    whats = {e.what for s in range(200) for e in make_schedule(s)[1]}
    assert whats == {"inject", "kill", "stall", "disk", "jump"}
