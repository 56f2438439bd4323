"""Micro-benchmark of the actor runtime: tell/s and ask round trips/s (not run in CI).

Usage: ``python scripts/bench_actors.py [--loop uvloop|asyncio] [--n 1000000] [--repeats 3]``
Prints the median of the repeats for each phase. On 2 shared cores expect ±15-30 % between runs.
Targets (uvloop): > 1 M tell/s, > 150 k serial ask round trips/s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from riffle_actors.runtime import Actor, ActorRef, ActorSystem  # noqa: E402


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
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, loop={args.loop}, n={args.n}")
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main(args.n, args.repeats))
    else:
        asyncio.run(main(args.n, args.repeats))
