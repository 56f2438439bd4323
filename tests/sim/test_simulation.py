"""Deterministic simulation: seeded schedules of actor crashes, disk faults and clock jumps.

Each seed builds a workload (writes that spill, reads, commit + finish) and a schedule of events
(``tests.sim.harness.make_schedule``), runs them against a fresh in-process server on the
simulation's loop (``tests.sim.loop``: virtual time, disk IO on the loop, gRPC handlers without a
socket) and checks the invariants (``World.check_invariants``). A seed replays exactly: the same
event trace (``World.event_trace``: every event, crash, retry and RPC status, stamped with the
loop's and the server's time), byte for byte, in any process. CI runs ``RIFFLE_SIM_SEEDS`` seeds
(default 500) from ``RIFFLE_SIM_FIRST`` (default 0). A failing seed is printed with its replay
command::

    RIFFLE_SIM_SEED=123 python3 -m pytest tests/sim -k replay

``test_replay`` runs each of its seeds twice and checks that both runs have the same trace, so a
replay also shows that the failure is the seed's. Without ``RIFFLE_SIM_SEED`` it replays
``REPLAY_SEEDS``, a fixed list of seeds that together cover every kind of event of the schedules of
the CI seeds (``test_the_replay_seeds_cover_every_event_kind``), not seed 0.

More seeds locally (any range, stops at the first failure)::

    RIFFLE_SIM_FIRST=500 RIFFLE_SIM_SEEDS=5000 python3 -m pytest tests/sim -k seed -x -q

The heartbeat's crashes need a coordinator over real sockets: they are in
``tests/actors/test_permanent_crashes.py`` (same harness, ordinary loop, not deterministic).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.sim.harness import World, make_schedule, sim_seed

FIRST = int(os.environ.get("RIFFLE_SIM_FIRST", "0"))
COUNT = int(os.environ.get("RIFFLE_SIM_SEEDS", "500"))


def _run(root: Path, seed: int) -> World:
    try:
        return sim_seed(root, seed)
    except BaseException as e:
        e.add_note(f"replay: RIFFLE_SIM_SEED={seed} python3 -m pytest tests/sim -k replay")
        raise


@pytest.mark.parametrize("seed", range(FIRST, FIRST + COUNT))
def test_seed(tmp_path: Path, seed: int) -> None:
    _run(tmp_path, seed)


#: Seeds that together hold every (event, kind) of the schedules of seeds 0..499: each crash kind
#: injected, killed and stalled, each disk fault, a clock jump, a kill during the purge
REPLAY_SEEDS = (2, 10, 14, 21, 24, 41, 53, 105, 128, 148)


def _features(seed: int) -> set[tuple[str, str]]:
    steps, events = make_schedule(seed)
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
def test_replay(tmp_path: Path, seed: int) -> None:
    """The seed(s) in ``RIFFLE_SIM_SEED`` (``123`` or ``5,9``), else ``REPLAY_SEEDS``; each twice,
    with the same trace both times (a failure fails the first run)."""
    first = _run(tmp_path / "first", seed)
    second = _run(tmp_path / "second", seed)
    assert first.event_trace() == second.event_trace(), f"seed {seed} did not replay its own trace"


def test_the_replay_seeds_cover_every_event_kind() -> None:
    every = set().union(*(_features(s) for s in range(500)))
    assert ("kill during the purge", "") in every and ("stall", "disk") in every
    assert set().union(*(_features(s) for s in REPLAY_SEEDS)) == every


def test_the_same_seed_gives_the_same_event_trace(tmp_path: Path) -> None:
    """Twice the same seed: byte-identical traces, holding what timing used to decide (where a kill
    landed, which calls were retried, every reply status); another seed: another trace. No thread
    is started on the way (the disks' pools are never used)."""
    seed = 16  # a stall that catches a spill, a jump, a disk fault, the AppActor killed during the purge
    steps, events = make_schedule(seed)
    assert {ev.what for ev in events} >= {"kill", "stall", "jump", "disk"} and events[-1].step == len(steps)
    threads = set(threading.enumerate())
    first = _run(tmp_path / "first", seed)
    started = {t for t in threading.enumerate() if t not in threads}
    second = _run(tmp_path / "second", seed)
    other = _run(tmp_path / "other", seed + 1)
    assert not started, f"threads started by the simulation: {started}"
    assert first.event_trace() == second.event_trace()
    assert first.event_trace() != other.event_trace()
    text = first.event_trace().decode()
    assert "a spill is in flight: crashing" in text and "crash app:" in text, text
    assert "sendShuffleData -> 0" in text and "unregisterShuffleByAppId" in text, text
    # the schedule part: every event at its step, in order
    assert first.trace == second.trace
    assert [ev for _, ev in first.trace] == events and all(step == ev.step for step, ev in first.trace)


def test_schedules_are_a_function_of_the_seed() -> None:
    from tests.sim.harness import SIM_KINDS

    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)
    kinds = {e.kind for s in range(500) for e in make_schedule(s)[1] if e.what in ("inject", "kill", "stall")}
    assert set(SIM_KINDS) <= kinds
    whats = {e.what for s in range(500) for e in make_schedule(s)[1]}
    assert whats == {"inject", "kill", "stall", "disk", "jump"}
