"""Fixtures for the actor runtime tests: a ManualClock, an ActorSystem with a leak check, a poll helper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from riffle_actors.runtime import ActorSystem, ManualClock

Poll = Callable[[Callable[[], bool]], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]


async def poll_until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until ``pred()`` holds; fail after ``timeout`` seconds of wall time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    spins = 0
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {pred}")
        spins += 1
        # Mostly pure yields; after many, a 1 ms nap so executor threads (tell_threadsafe) get a turn.
        await asyncio.sleep(0 if spins < 1000 else 0.001)


async def settle(rounds: int = 20) -> None:
    """Let already-scheduled callbacks and tasks run (used to check that something did NOT happen)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def leftover_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def poll() -> Poll:
    """``await poll(lambda: cond)``: wait for a condition instead of sleeping."""
    return poll_until


@pytest.fixture
def settle_loop() -> Settle:
    """``await settle_loop()``: let scheduled work run, to check that something did NOT happen."""
    return settle


@pytest.fixture
def escalations() -> list[BaseException]:
    """What the ``system`` fixture's root supervisor escalated (normally nothing)."""
    return []


@pytest_asyncio.fixture
async def system(clock: ManualClock, escalations: list[BaseException]) -> AsyncIterator[ActorSystem]:
    """An ActorSystem on the ManualClock; teardown stops everything and checks no actor task leaked."""
    sys_ = ActorSystem(clock=clock, on_escalation=escalations.append)
    yield sys_
    await sys_.stop_all()
    await settle()
    assert sys_.statistics() == []
    assert escalations == []
    leaked = [t for t in leftover_tasks() if t.get_name().startswith("actor:")]
    assert leaked == [], f"leaked actor tasks: {leaked}"
