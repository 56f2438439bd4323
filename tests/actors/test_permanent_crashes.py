"""Crash each kind of permanent actor at seeded points of a write + spill + read + purge workload.

A real in-process server (gRPC, Disk threads, ManualClock) runs the workload of
``tests.sim.harness``; the crashes come from the runtime's ``inject_crash`` seam (between two
messages) and from ``ref.crash`` (wherever the incarnation is, with its tasks in flight). Each
run ends with the invariants of ``World.check_invariants``: every acknowledged block readable
until the purge, no batch in flight, no ask left waiting, the budget exact and back to zero, no
file left after the purge. The heartbeat's runs have a real in-process coordinator.

A failure names the seed and its events; ``tests/sim`` has the mixed schedules.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.sim.harness import KINDS, Event, Step, make_workload, run_schedule, run_with_coordinator

SEEDS = (1, 2, 3)


def crash_schedule(kind: str, seed: int):
    """Crashes of ``kind`` at seeded steps: one while a spill is in flight, maybe a kill or an
    injected crash, and one while the app is purged (3 at most: more within 5 s is the
    supervisor's restart intensity, which gives up on purpose)."""
    rng = random.Random(f"{kind}-{seed}")
    steps = make_workload(rng)
    # first a crash while a spill batch is in flight, in a write that surely spills
    at = rng.randrange(len(steps))
    steps.insert(at, Step("write", 6, 48 << 10))
    events = [Event(at, "stall", kind, rng.randrange(0, 4), rng.randrange(2))]
    for _ in range(rng.randint(0, 1) if kind != "app" else 0):  # 3 crashes at most: the restart intensity
        step = rng.randrange(len(steps))
        if rng.random() < 0.5:
            events.append(Event(step, "inject", kind, rng.randrange(0, 8), rng.randrange(2)))
        else:
            events.append(Event(step, "kill", kind, rng.randrange(0, 40), rng.randrange(2)))
    if kind != "app":  # and one while the app is purged
        events.append(Event(len(steps), "kill", kind, rng.randrange(0, 20), rng.randrange(2)))
    events.sort(key=lambda e: e.step)
    return steps, events


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", KINDS)
async def test_permanent_actor_crash_keeps_the_invariants(tmp_path: Path, kind: str, seed: int) -> None:
    steps, events = crash_schedule(kind, seed)
    if kind != "heartbeat":
        world = await run_schedule(tmp_path, seed, steps, events)
    else:
        world = await run_with_coordinator(tmp_path, seed, steps, events)
    if kind == "app":
        assert world.losses >= 1  # temporary: its crash purged the app, which registered again and went on
        return
    names = {world.actor_name(kind, e.disk) for e in events}
    assert sum(world.restarts.get(n, 0) for n in names) >= 1, (world.restarts, world.log)


@pytest.mark.parametrize("crash_disk", [False, True])
async def test_a_failed_purge_is_retried_until_the_files_are_gone(tmp_path: Path, crash_disk: bool) -> None:
    """Deleting the app's files fails on both disks (EIO, twice each): the disks try again (timer,
    next purge, new incarnation) and nothing is left; with ``crash_disk`` a Disk actor also crashes
    while the purge is pending."""
    import errno

    from tests.sim.harness import World

    world = World(tmp_path, seed=0)
    try:
        await world.start()
        await world.write(6, 48 << 10)  # spills to both disks
        for io in world.faulty.values():
            io.fail("remove_app", errno.EIO, times=2)
        if crash_disk:
            world.purge_events = [Event(0, "kill", "disk", 5, 0)]
        await world.check_invariants()  # waits for no file left after the purge
        assert all(io.rules == [] or all(r.times == 0 for r in io.rules) for io in world.faulty.values())
        assert sum(r.hits for io in world.faulty.values() for r in io.rules) == 4
    finally:
        await world.close()
