"""What a crash does to the mail of a supervised actor, and the ``inject_crash`` test seam.

The mailbox outlives the incarnation: tells and asks queued to a crashing permanent actor are
handled by the next incarnation; an ask is failed only when no incarnation will ever take it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from riffle_actors.runtime import (
    Actor,
    ActorDeadError,
    ActorSystem,
    ChildSpec,
    InjectedCrash,
    RestartPolicy,
    Supervisor,
)

pytestmark = pytest.mark.asyncio


class Recorder(Actor):
    """Appends every message to a shared list (which outlives incarnations); "boom" crashes it."""

    def __init__(self, seen: list[tuple[int, Any]], starts: list[int]) -> None:
        starts.append(len(starts) + 1)
        self.incarnation = len(starts)
        self.seen = seen

    def receive(self, msg: Any) -> Any:
        if msg == "boom":
            raise RuntimeError("boom")
        self.seen.append((self.incarnation, msg))
        return (self.incarnation, msg)


class AsyncRecorder(Recorder):
    async def receive(self, msg: Any) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return Recorder.receive(self, msg)


@pytest.mark.parametrize("kind", [Recorder, AsyncRecorder])
async def test_mail_queued_behind_a_crash_goes_to_the_next_incarnation(system: ActorSystem, poll, kind) -> None:
    seen: list[tuple[int, Any]] = []
    starts: list[int] = []
    ref = await system.start_child(None, ChildSpec("rec", lambda: kind(seen, starts)))
    # all queued in one go, before the actor runs: the crash is in the middle of the mailbox
    ref.tell_nowait("a")
    ref.tell_nowait("boom")
    ref.tell_nowait("b")
    ref.tell_nowait("c")
    assert await ref.ask("d") == (2, "d")
    assert seen == [(1, "a"), (2, "b"), (2, "c"), (2, "d")]
    crash = asyncio.ensure_future(ref.ask("boom"))
    asked = asyncio.ensure_future(ref.ask("e"))
    with pytest.raises(RuntimeError, match="boom"):
        await crash
    assert await asked == (3, "e")
    assert ref.statistics().restarts == 2


async def test_asks_fail_when_no_restart_follows(system: ActorSystem) -> None:
    seen: list[tuple[int, Any]] = []
    starts: list[int] = []
    ref = await system.start_child(None, ChildSpec("tmp", lambda: Recorder(seen, starts),
                                                   RestartPolicy.TEMPORARY))
    crash = asyncio.ensure_future(ref.ask("boom"))
    queued = asyncio.ensure_future(ref.ask("late"))
    with pytest.raises(RuntimeError):
        await crash
    with pytest.raises(ActorDeadError):
        await queued
    assert seen == [] and not ref.is_alive


async def test_asks_fail_when_the_supervisor_gives_up(system: ActorSystem, escalations: list) -> None:
    seen: list[tuple[int, Any]] = []
    starts: list[int] = []
    sup = await system.start_child(None, ChildSpec("sup", lambda: Supervisor("sup", max_restarts=1, within_s=60),
                                                   RestartPolicy.TEMPORARY))
    ref = await system.start_child(sup, ChildSpec("rec", lambda: Recorder(seen, starts)))
    futures = [asyncio.ensure_future(ref.ask(m)) for m in ("boom", "boom", "x")]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[0], RuntimeError) and isinstance(results[1], RuntimeError)
    assert isinstance(results[2], ActorDeadError)  # nobody will ever take it: failed, not left waiting
    assert not ref.is_alive and not sup.is_alive


async def test_inject_crash_puts_a_tell_back_and_fails_an_ask(system: ActorSystem, poll) -> None:
    seen: list[tuple[int, Any]] = []
    starts: list[int] = []
    ref = await system.start_child(None, ChildSpec("rec", lambda: Recorder(seen, starts)))
    system.inject_crash("rec", after=1)
    ref.tell_nowait("a")
    ref.tell_nowait("b")  # the crash takes its place; the next incarnation handles it
    ref.tell_nowait("c")
    await poll(lambda: len(seen) == 3)
    assert seen == [(1, "a"), (2, "b"), (2, "c")]

    system.inject_crash("rec")
    with pytest.raises(InjectedCrash):
        await ref.ask("d")
    assert await ref.ask("e") == (3, "e")
    assert ("d" not in [m for _, m in seen]) and ref.statistics().restarts == 2


async def test_inject_crash_while_restarting_arms_the_next_incarnation(system: ActorSystem, poll) -> None:
    seen: list[tuple[int, Any]] = []
    starts: list[int] = []
    ref = await system.start_child(None, ChildSpec("rec", lambda: AsyncRecorder(seen, starts)))
    system.inject_crash("rec", after=0)
    system.inject_crash("rec", after=2)  # replaces the first one
    for m in "abcd":
        ref.tell_nowait(m)
    await poll(lambda: len(seen) == 4)
    assert seen == [(1, "a"), (1, "b"), (2, "c"), (2, "d")]


async def test_inject_crash_unknown_actor(system: ActorSystem) -> None:
    with pytest.raises(KeyError):
        system.inject_crash("nobody")


async def test_children_outlive_a_supervisor_with_a_table(system: ActorSystem, poll) -> None:
    from riffle_actors.runtime import ChildTable, RestartPolicy

    seen: list[tuple[int, Any]] = []
    starts: list[int] = []
    table = ChildTable()
    sup = await system.start_child(None, ChildSpec("sup", lambda: Supervisor("sup", table=table)))
    child = await system.start_child(sup, ChildSpec("kid", lambda: Recorder(seen, starts), RestartPolicy.TEMPORARY))
    assert await child.ask("a") == (1, "a")
    system.inject_crash("sup")
    with pytest.raises(InjectedCrash):  # the crash takes the place of this ask
        await system.start_child(sup, ChildSpec("kid2", lambda: Recorder(seen, starts)))
    await poll(lambda: sup.statistics().restarts == 1 and sup.statistics().state == "running")
    assert child.is_alive and await child.ask("b") == (1, "b")  # same incarnation: not restarted
    assert system.children(sup) == {"kid": child}
    # a stop for good of the supervisor stops the children it took over
    await system.stop_child(None, "sup")
    assert not child.is_alive
