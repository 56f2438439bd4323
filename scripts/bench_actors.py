"""Micro-benchmark of the actor runtime: tell/s and ask round trips/s (not run in CI).

Usage: ``python scripts/bench_actors.py [--loop uvloop|asyncio] [--n 1000000] [--repeats 3]``
Prints the median of the repeats for each phase. On 2 shared cores expect ±15-30 % between runs.
Targets (uvloop): > 1 M tell/s, > 150 k serial ask round trips/s.

``--idle N`` measures idle actors instead: it starts N trivial actors under one supervisor and prints
the memory each costs while idle (traced by ``tracemalloc`` in one pass, RSS growth in another, untraced
pass), the time to start one, the time to wake each once (one ask), the asyncio tasks left while they
idle, and the time to stop them all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from riffle_actors.runtime import Actor, ActorRef, ActorSystem, ChildSpec, Supervisor  # noqa: E402


class Counter(Actor):
    mailbox_size = 10_000

    def __init__(self) -> None:
        self.count = 0

    def receive(self, msg: object) -> int:
        self.count += 1
        return self.count


class Ponger(Actor):
    def receive(self, msg: int) -> int:
        return msg


async def drained(ref: ActorRef, actor: Counter, total: int) -> None:
    while actor.count < total:
        await ref.ask(None)  # FIFO barrier; the barrier asks are counted too
        total += 1


async def bench_tell(system: ActorSystem, n: int) -> float:
    actor = Counter()
    ref = await system.spawn(actor)
    t0 = time.perf_counter()
    for i in range(n):
        await ref.tell(i)
    await drained(ref, actor, n)
    dt = time.perf_counter() - t0
    await ref.stop()
    return n / dt


async def bench_tell_nowait(system: ActorSystem, n: int) -> float:
    actor = Counter()
    ref = await system.spawn(actor)
    tell = ref.tell_nowait
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        room = min(actor.mailbox_size - ref.statistics().depth, n - sent)
        for i in range(room):
            tell(i)
        sent += room
        await asyncio.sleep(0)  # let the actor drain
    await drained(ref, actor, n)
    dt = time.perf_counter() - t0
    await ref.stop()
    return n / dt


async def bench_ask_serial(system: ActorSystem, n: int) -> float:
    ref = await system.spawn(Ponger())
    ask = ref.ask
    t0 = time.perf_counter()
    for i in range(n):
        await ask(i)
    dt = time.perf_counter() - t0
    await ref.stop()
    return n / dt


async def bench_ask_concurrent(system: ActorSystem, n: int, askers: int = 64) -> float:
    ref = await system.spawn(Ponger())
    per = n // askers

    async def asker() -> None:
        for i in range(per):
            await ref.ask(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(asker() for _ in range(askers)))
    dt = time.perf_counter() - t0
    await ref.stop()
    return per * askers / dt


async def bench_threadsafe(system: ActorSystem, n: int) -> float:
    actor = Counter()
    ref = await system.spawn(actor)

    def producer() -> None:
        for i in range(n):
            ref.tell_threadsafe(i)

    t0 = time.perf_counter()
    thread = threading.Thread(target=producer)
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.001)
    await drained(ref, actor, n)
    dt = time.perf_counter() - t0
    await ref.stop()
    return n / dt


class Idle(Actor):
    def receive(self, msg: object) -> object:
        return msg


def rss_bytes() -> int:
    """Resident set size now (Linux /proc), falling back to the peak from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


async def start_idle(system: ActorSystem, n: int) -> tuple[list[ActorRef], float]:
    """Start ``n`` Idle actors under a fresh supervisor; return their refs and the seconds it took."""
    sup = await system.start_child(None, ChildSpec("idle-sup", lambda: Supervisor("idle-sup")))
    t0 = time.perf_counter()
    refs = [await system.start_child(sup, ChildSpec(f"idle-{i}", Idle)) for i in range(n)]
    return refs, time.perf_counter() - t0


def actor_tasks() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_name().startswith("actor:"))


async def bench_idle(n: int) -> None:
    # Pass 1, untraced: start time, RSS growth, tasks while idle, wake and stop times.
    system = ActorSystem()
    await system.start()
    gc.collect()
    rss0 = rss_bytes()
    refs, start_s = await start_idle(system, n)
    gc.collect()
    rss1 = rss_bytes()
    idle_tasks = actor_tasks()
    t0 = time.perf_counter()
    for ref in refs:
        await ref.ask(None)
    wake_s = time.perf_counter() - t0
    woken_tasks = actor_tasks()
    t0 = time.perf_counter()
    await system.stop_all()
    stop_s = time.perf_counter() - t0
    del refs
    # Pass 2, traced: Python allocations held per idle actor (its actor, cell, ref, mailbox, supervisor
    # and registry entries, any task); the supervisor itself is started before the baseline.
    system = ActorSystem()
    await system.start()
    sup = await system.start_child(None, ChildSpec("traced-sup", lambda: Supervisor("traced-sup")))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        await system.start_child(sup, ChildSpec(f"traced-{i}", Idle))
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    await system.stop_all()
    print(f"idle actors: {n}")
    print(f"  memory per idle actor   {traced / n:8.0f} B traced   {(rss1 - rss0) / n:8.0f} B RSS growth")
    print(f"  start per actor         {start_s / n * 1e6:8.1f} us   (start_child under one supervisor)")
    print(f"  wake per actor          {wake_s / n * 1e6:8.1f} us   (one ask to each, serially)")
    print(f"  stop_all per actor      {stop_s / n * 1e6:8.1f} us")
    print(f"  actor tasks while idle  {idle_tasks:8d}     after one ask each: {woken_tasks}")


async def main(n: int, repeats: int) -> None:
    system = ActorSystem()
    phases: list[tuple[str, Callable[[], Awaitable[float]], str]] = [
        ("tell (await ref.tell, burst + drain)", lambda: bench_tell(system, n), "msg/s"),
        ("tell_nowait (fill to capacity, drain)", lambda: bench_tell_nowait(system, n), "msg/s"),
        ("ask round trip, serial", lambda: bench_ask_serial(system, n // 5), "rt/s"),
        ("ask, 64 concurrent askers", lambda: bench_ask_concurrent(system, n // 2), "rt/s"),
        ("tell_threadsafe from one thread", lambda: bench_threadsafe(system, n // 5), "msg/s"),
    ]
    for label, run, unit in phases:
        rates = [await run() for _ in range(repeats)]
        print(f"{label:<42} median {statistics.median(rates) / 1e3:9.1f} k{unit}  "
              f"(runs: {', '.join(f'{r / 1e3:.0f}k' for r in rates)})")
    await system.stop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--idle", type=int, default=0, metavar="N",
                        help="measure N idle actors (memory, start, wake, stop) instead of throughput")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, loop={args.loop}, n={args.n}")
    job = bench_idle(args.idle) if args.idle else main(args.n, args.repeats)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(job)
    else:
        asyncio.run(job)
