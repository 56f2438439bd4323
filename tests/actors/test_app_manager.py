"""AppManagerActor on a ManualClock with fake AppActors: fan-outs that never block registration.

A *stuck* fake app does not answer until the test releases it, like an AppActor deep in a long
operation. Per-app waits are on the manager's clock, so the tests move
time to end them and poll on conditions; nothing sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from riffle_actors.actors.app_manager import (
    AppDirectory,
    AppManagerActor,
    CheckExpiredApps,
    FlushAllApps,
    GetHistory,
    GetOrCreateApp,
    ListApps,
    PurgeApp,
)
from riffle_actors.actors.app_messages import (
    GetAppInfo,
    GetSpillCandidates,
    IsExpired,
    SpillAll,
    SpillPartitions,
)
from riffle_actors.actors.memory import PurgeAppMemory, SpillLargest, SpillRoundDone
from riffle_actors.actors.storage_messages import PurgeFiles, UnfenceApp
from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, ActorSystem, ManualClock
from tests.actors.conftest import Poll, Settle

pytestmark = pytest.mark.asyncio

TIMEOUT_S = 10.0
HEARTBEAT_TIMEOUT_S = 60.0


class FakeApp(Actor):
    """Answers like an AppActor; a stuck one holds every sweep question until ``release`` is set."""

    def __init__(self, app_id: str, clock: ManualClock, *, stuck: bool = False,
                 candidates: list[tuple[int, int, int]] | None = None) -> None:
        self.app_id = app_id
        self.clock = clock
        self.stuck = stuck
        self.release = asyncio.Event()
        self.candidates = candidates or []
        self.last_call = clock.monotonic()
        self.got: list[Any] = []

    def receive(self, msg: Any) -> Any:
        self.got.append(msg)
        if self.stuck:
            return self._answer_once_released(msg)  # replied later: the asker waits, the mailbox does not
        return self._answer(msg)

    async def _answer_once_released(self, msg: Any) -> Any:
        await self.release.wait()
        return self._answer(msg)

    def _answer(self, msg: Any) -> Any:
        match msg:
            case IsExpired():
                return self.clock.monotonic() - self.last_call >= HEARTBEAT_TIMEOUT_S
            case GetSpillCandidates():
                return list(self.candidates)
            case SpillPartitions(keys=keys):
                return sum(size for size, sid, pid in self.candidates if (sid, pid) in keys)
            case GetAppInfo():
                return self.app_id
            case SpillAll():
                return None
            case _:
                raise AssertionError(f"unexpected {msg!r}")


class Recorder(Actor):
    """Stands in for the MemoryManager or a Disk actor: records what it is told."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def receive(self, msg: Any) -> Any:
        self.got.append(msg)


class Rig:
    def __init__(self, system: ActorSystem, clock: ManualClock) -> None:
        self.system = system
        self.clock = clock
        self.directory = AppDirectory()
        self.apps: dict[str, list[FakeApp]] = {}  # app id -> its actors, oldest first
        self.shapes: dict[str, dict[str, Any]] = {}  # app id -> FakeApp keyword arguments
        self.memory = Recorder()
        self.disk = Recorder()
        self.manager: AppManagerActor | None = None
        self.ref: ActorRef | None = None

    def app_factory(self, app_id: str) -> FakeApp:
        app = FakeApp(app_id, self.clock, **self.shapes.get(app_id, {}))
        self.apps.setdefault(app_id, []).append(app)
        return app

    async def start(self, **kwargs: Any) -> Rig:
        memory_ref = await self.system.spawn(self.memory, name="memory")
        disk_ref = await self.system.spawn(self.disk, name="disk")
        self.manager = AppManagerActor(directory=self.directory, app_factory=self.app_factory,
                                       memory=memory_ref, disks=[disk_ref], clock=self.clock,
                                       app_ask_timeout_s=TIMEOUT_S, **kwargs)
        self.ref = await self.system.spawn(self.manager, name="app_manager")
        return self

    async def register(self, app_id: str, **shape: Any) -> ActorRef:
        self.shapes[app_id] = shape
        assert self.ref is not None
        return await self.ref.ask(GetOrCreateApp(app_id))

    async def history(self) -> list[dict]:
        assert self.ref is not None
        return await self.ref.ask(GetHistory())


@pytest.fixture
def rig(system: ActorSystem, clock: ManualClock) -> Rig:
    return Rig(system, clock)


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    """Like the ``poll`` fixture, for a predicate that asks an actor."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await pred():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {pred}")
        await asyncio.sleep(0)


def asked(app: FakeApp, kind: type) -> int:
    return sum(1 for m in app.got if isinstance(m, kind))


async def test_a_new_app_registers_while_a_sweep_waits_on_a_stuck_app(rig: Rig, poll: Poll) -> None:
    await rig.start()
    assert rig.ref is not None and rig.manager is not None
    await rig.register("stuck", stuck=True)
    await rig.register("idle")
    await rig.ref.tell(CheckExpiredApps())
    await poll(lambda: asked(rig.apps["stuck"][0], IsExpired) == 1)

    # no time passes: the sweep still waits for the stuck app, the registration does not
    new_ref = await rig.ref.ask(GetOrCreateApp("new"))
    assert rig.directory["new"] is new_ref and rig.manager.sweeps.running
    assert await rig.history() == []  # other questions are answered meanwhile too

    rig.clock.advance(TIMEOUT_S)
    await poll(lambda: not rig.manager.sweeps.running)  # type: ignore[union-attr]
    assert set(rig.directory) == {"stuck", "idle", "new"}  # one unanswered check is no verdict
    rig.apps["stuck"][0].release.set()


async def test_expiry_purges_on_time_exactly_once(rig: Rig, poll: Poll, settle_loop: Settle) -> None:
    await rig.start()
    assert rig.ref is not None
    old = await rig.register("silent")
    rig.clock.advance(HEARTBEAT_TIMEOUT_S - 1)
    await rig.ref.tell(CheckExpiredApps())
    await poll(lambda: asked(rig.apps["silent"][0], IsExpired) == 1)
    await poll(lambda: not rig.manager.sweeps.running)  # type: ignore[union-attr]
    assert "silent" in rig.directory

    rig.clock.advance(1)
    await rig.ref.tell(CheckExpiredApps())
    await rig.ref.tell(CheckExpiredApps())  # requested during the sweep: one more, which finds nothing
    await poll(lambda: "silent" not in rig.directory)
    await poll(lambda: not rig.manager.sweeps.running)  # type: ignore[union-attr]
    await poll(lambda: PurgeFiles(app_id="silent") in rig.disk.got)
    await settle_loop()
    assert not old.is_alive
    assert [h["reason"] for h in await rig.history()] == ["heartbeat timeout"]  # the Terminated adds nothing
    assert rig.memory.got == [PurgeAppMemory(app_id="silent")]
    assert rig.disk.got.count(PurgeFiles(app_id="silent")) == 1


async def test_an_app_that_never_answers_is_purged_after_repeated_sweeps(rig: Rig, poll: Poll) -> None:
    await rig.start(expiry_misses_to_purge=2)
    assert rig.ref is not None and rig.manager is not None
    await rig.register("stuck", stuck=True)
    for sweep in (1, 2):
        await rig.ref.tell(CheckExpiredApps())
        await poll(lambda s=sweep: asked(rig.apps["stuck"][0], IsExpired) == s)
        assert "stuck" in rig.directory
        rig.clock.advance(TIMEOUT_S)
    manager = rig.manager
    await poll(lambda: "stuck" not in rig.directory and manager.purged_total == 1)
    history = await rig.history()
    assert [h["reason"] for h in history] == [
        "heartbeat timeout (expiry check not answered 2 times in a row)"]


async def test_a_spill_round_takes_the_largest_buffers_and_does_not_wait_forever(rig: Rig, poll: Poll,
                                                                                 settle_loop: Settle) -> None:
    await rig.start()
    assert rig.ref is not None and rig.manager is not None
    await rig.register("a", candidates=[(100, 0, 1), (10, 0, 2)])
    await rig.register("b", candidates=[(50, 0, 0), (40, 1, 0)])
    await rig.register("stuck", stuck=True, candidates=[(1000, 0, 0)])
    a, b = rig.apps["a"][0], rig.apps["b"][0]
    replies = Recorder()
    reply_to = await rig.system.spawn(replies, name="memory-replies")
    await rig.ref.tell(SpillLargest(target_bytes=140, reply_to=reply_to))
    await rig.ref.tell(SpillLargest(target_bytes=1, reply_to=reply_to))  # waits for the first round
    await poll(lambda: asked(a, GetSpillCandidates) == 1 and asked(b, GetSpillCandidates) == 1)
    new_ref = await rig.ref.ask(GetOrCreateApp("new"))  # answered during the round
    assert rig.directory["new"] is new_ref
    await settle_loop()
    assert asked(a, SpillPartitions) == 0  # the round waits for the stuck app, up to its bound
    assert asked(a, GetSpillCandidates) == 1  # and the second round waits for the first

    rig.clock.advance(TIMEOUT_S)
    await poll(lambda: asked(a, SpillPartitions) == 1 and asked(b, SpillPartitions) == 1)
    assert [m for m in a.got if isinstance(m, SpillPartitions)] == [SpillPartitions(((0, 1),))]
    assert [m for m in b.got if isinstance(m, SpillPartitions)] == [SpillPartitions(((0, 0),))]
    await poll(lambda: len(replies.got) == 1)
    assert replies.got == [SpillRoundDone(150)]
    await poll(lambda: asked(a, GetSpillCandidates) == 2)  # the second round starts after the first
    rig.clock.advance(TIMEOUT_S)
    await poll(lambda: len(replies.got) == 2)
    assert replies.got[1] == SpillRoundDone(100)
    assert rig.manager.spill_rounds.rounds == 2 and not rig.manager.spill_rounds.running
    rig.apps["stuck"][0].release.set()


async def test_listing_and_flush_leave_the_mailbox_free(rig: Rig, poll: Poll) -> None:
    await rig.start()
    assert rig.ref is not None
    await rig.register("a")
    await rig.register("stuck", stuck=True)
    listing = asyncio.ensure_future(rig.ref.ask(ListApps()))
    flush = asyncio.ensure_future(rig.ref.ask(FlushAllApps()))
    await poll(lambda: asked(rig.apps["stuck"][0], GetAppInfo) == 1)
    assert await rig.history() == [] and not listing.done()
    rig.clock.advance(TIMEOUT_S)
    assert await listing == ["a"]  # the stuck app is left out once its bound passed
    assert not flush.done()  # a flush has no per-app bound: it waits for every app
    rig.apps["stuck"][0].release.set()
    assert await flush is None


async def test_a_purge_reaches_the_disks_before_a_reregistration_unfences(rig: Rig, poll: Poll) -> None:
    await rig.start()
    assert rig.ref is not None
    old = await rig.register("x")
    await rig.ref.tell(PurgeApp("x", "unregistered by client"))
    new = await rig.ref.ask(GetOrCreateApp("x"))
    await poll(lambda: len(rig.disk.got) == 3)
    assert new is not old and not old.is_alive and rig.directory["x"] is new
    assert rig.disk.got == [UnfenceApp("x"), PurgeFiles(app_id="x"), UnfenceApp("x")]
    assert [h["reason"] for h in await rig.history()] == ["unregistered by client"]


async def test_a_crashed_app_is_purged_once(rig: Rig, poll: Poll, settle_loop: Settle) -> None:
    await rig.start()
    assert rig.ref is not None
    ref = await rig.register("x")
    ref.crash(RuntimeError("bug in the app actor"))
    await poll(lambda: "x" not in rig.directory)
    await rig.ref.tell(CheckExpiredApps())  # a sweep right after does not purge it again
    await rig.history()  # the sweep has started
    await poll(lambda: not rig.manager.sweeps.running)  # type: ignore[union-attr]
    await settle_loop()
    history = await rig.history()
    assert len(history) == 1 and "app actor crashed" in history[0]["reason"]
    assert rig.memory.got == [PurgeAppMemory(app_id="x")]


async def test_a_purge_cut_short_by_a_crash_is_finished_by_the_next_incarnation(
        system: ActorSystem, clock: ManualClock, poll: Poll) -> None:
    from riffle_actors.actors.app_manager import AppManagerLedger
    from riffle_actors.runtime import ChildSpec, ChildTable, Supervisor

    stopping = asyncio.Event()
    let_go = asyncio.Event()

    class SlowToStop(FakeApp):
        async def on_stop(self) -> None:  # the purge waits here, in the middle of its steps
            stopping.set()
            await let_go.wait()

    rig = Rig(system, clock)
    memory_ref = await system.spawn(rig.memory, name="memory")
    disk_ref = await system.spawn(rig.disk, name="disk")
    apps = await system.start_child(None, ChildSpec("apps", lambda: Supervisor("apps", table=ChildTable())))
    ledger = AppManagerLedger()
    manager = await system.start_child(None, ChildSpec("app_manager", lambda: AppManagerActor(
        directory=rig.directory, app_factory=lambda app_id: SlowToStop(app_id, clock), memory=memory_ref,
        disks=[disk_ref], clock=clock, apps_supervisor=apps, ledger=ledger)))
    await manager.ask(GetOrCreateApp("app-1"))
    purge = asyncio.ensure_future(manager.ask(PurgeApp("app-1", "unregistered")))
    await poll(stopping.is_set)
    assert "app-1" not in rig.directory and ("app-1", None) in ledger.purges
    manager.crash(RuntimeError("bug in the app manager"))
    with pytest.raises(ActorDeadError):
        await purge  # the asker of the crashed incarnation gets an error, it is not left waiting
    await poll(lambda: manager.statistics().restarts == 1 and manager.statistics().state == "running")
    let_go.set()
    await poll(lambda: not ledger.purges and ledger.purged_total == 1 and rig.memory.got and rig.disk.got[-1:]
               and isinstance(rig.disk.got[-1], PurgeFiles))
    assert [m for m in rig.memory.got if isinstance(m, PurgeAppMemory)] == [PurgeAppMemory(app_id="app-1")]
    assert [m for m in rig.disk.got if isinstance(m, PurgeFiles)][-1].app_id == "app-1"
    assert [h["app_id"] for h in await manager.ask(GetHistory())] == ["app-1"]
    assert system.children(apps) == {}
