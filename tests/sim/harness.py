"""Crash and fault schedules against one real in-process server, and the invariants they must keep.

A ``World`` is a ``ShuffleServer`` on a ``ManualClock`` with a ``FaultyLocalIO`` per disk, driven by
the gRPC ``UniffleClient`` (the same path the Java client takes), optionally with an in-process
coordinator for the heartbeat. A *schedule* (``make_schedule(seed, ...)``, a pure function of the
seed) lists events placed before or during the steps of a write + spill + read + purge workload:

- ``inject``: ``system.inject_crash(actor, after=n)``: the actor crashes at its (n+1)-th next message;
- ``kill``: ``ref.crash(...)`` a few loop turns into the step: the incarnation ends wherever it is,
  with its write tasks, reply-later work and fan-outs in flight;
- ``stall``: the next append on each disk is held in its thread; once a spill batch is in flight,
  the actor is killed, then the appends go on;
- ``disk``: a fault armed on a disk's ``FaultyLocalIO`` (a failed or torn append, a failed purge, an
  append that crashes the Disk actor);
- ``jump``: the clock jumps forward (every deadline due meanwhile fires).

Time: a ticker moves the ``ManualClock`` in small steps all along (spill pauses and ticket expiry
need it to move), and jumps move it further; nothing sleeps to wait for a condition. The
schedule and the workload are determined by the seed; thread and socket timing is not, so a
replay repeats the same faults at the same steps of the workload (``World.trace``, checked by
``test_the_same_seed_applies_the_same_trace``), not the same interleaving.

Why the ticker follows real time rather than the harness's own event count: the server under
test answers over real gRPC sockets (grpc's own threads) and appends in its IO thread pool, and
while one client call is outstanding the server may wait on the ManualClock (a spill pause, a
ticket expiry, a retry backoff of the storage actor). A clock moved only at harness events would
leave such a call waiting until its deadline, so the clock must move while the harness awaits a
reply, and how much of it passes then depends on thread and socket timing. The same holds for
the loop turn at which a ``kill`` lands, whether a ``stall``'s append was entered before its
step ended, and which calls are retried: those are in ``World.log``, not in ``World.trace``.

``World.check_invariants()`` ends every schedule: every acknowledged block readable byte-exact;
spills drained (no batch in flight or queued, ``in_flight`` 0) and the budget of the app equal
to what its AppActor holds; every mailbox empty (no ask left waiting: every client call also runs
under a deadline); then, after the purge: budget (0, 0, 0), no ticket, no file or open fd under
the data paths, every permanent actor running and nothing escalated.
"""

from __future__ import annotations

import asyncio
import errno
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from riffle_actors.actors.app_messages import GetAppInfo
from riffle_actors.actors.heartbeat import SendHeartbeatNow
from riffle_actors.actors.spill import GetSpillStats
from riffle_actors.config import ServerConfig, validate_config
from riffle_actors.io.faults import FaultyLocalIO
from riffle_actors.runtime import ActorDeadError, FireDue, InjectedCrash, ManualClock
from riffle_actors.server import ShuffleServer
from tests.helpers import app_dirs, budget_figures, poll_until
from tests.helpers.client import BlockSpec, UniffleClient, UniffleError, assert_read_matches, make_blocks

NO_REGISTER = 4

#: Every kind of permanent actor a schedule can crash (``app`` is an AppActor: temporary, purged on a crash).
KINDS = ("memory", "spill", "app_manager", "apps", "app", "disk", "disk_monitor", "storage", "timer", "heartbeat")
#: The kinds of the simulation (the heartbeat needs a coordinator: its own crash tests start one).
SIM_KINDS = tuple(k for k in KINDS if k != "heartbeat")
PERMANENT = ("timer", "storage", "memory", "spill", "apps", "app_manager", "disk_monitor")
CALL_DEADLINE_S = 30.0  # real seconds any one client call may take before the run counts as hung


@dataclass(frozen=True, slots=True)
class Event:
    step: int          # the workload step it is applied before (or during, for ``kill``); the step
                       # after the last is the purge
    what: str          # inject | kill | stall | disk | jump
    kind: str = ""     # actor kind, or the disk fault
    arg: float = 0     # inject: messages to let through; kill: loop turns to wait; jump: seconds
    disk: int = 0      # which disk (disk crashes and faults)


@dataclass(frozen=True, slots=True)
class Step:
    what: str          # write | read | finish
    per_partition: int = 0
    block_size: int = 0


def make_workload(rng: random.Random) -> list[Step]:
    steps = []
    for _ in range(rng.randint(3, 5)):
        steps.append(Step("write", rng.randint(2, 6), rng.choice((4 << 10, 16 << 10, 48 << 10))))
        if rng.random() < 0.5:
            steps.append(Step("read"))
    steps.append(Step("finish"))
    return steps


DISK_FAULTS = ("append_eio", "append_torn", "append_crash", "purge_eio", "read_eio")


def make_schedule(seed: int, kinds: tuple[str, ...] = SIM_KINDS, *, crashes: tuple[int, int] = (1, 3),
                  disk_faults: tuple[int, int] = (0, 2), jumps: tuple[int, int] = (0, 2)) -> tuple[list[Step], list[Event]]:
    """The workload and its events, from the seed alone."""
    rng = random.Random(seed)
    steps = make_workload(rng)
    n = len(steps)
    events: list[Event] = []
    for _ in range(rng.randint(*crashes)):
        kind = rng.choice(kinds)
        r = rng.random()
        if r < 0.1:  # while the app is purged at the end
            events.append(Event(n, "kill", kind, rng.randrange(0, 20), rng.randrange(2)))
            continue
        if r < 0.4:
            events.append(Event(rng.randrange(n), "inject", kind, rng.randrange(0, 6), rng.randrange(2)))
        elif r < 0.75:
            events.append(Event(rng.randrange(n), "kill", kind, rng.randrange(0, 40), rng.randrange(2)))
        else:
            events.append(Event(rng.randrange(n), "stall", kind, rng.randrange(0, 4), rng.randrange(2)))
    for _ in range(rng.randint(*disk_faults)):
        events.append(Event(rng.randrange(n), "disk", rng.choice(DISK_FAULTS), rng.randint(1, 2), rng.randrange(2)))
    for _ in range(rng.randint(*jumps)):
        events.append(Event(rng.randrange(n), "jump", "", rng.choice((0.5, 2.0, 5.0, 15.0))))
    events.sort(key=lambda e: e.step)
    return steps, events


def sim_config(root: Path, *, coordinator: str | None = None) -> ServerConfig:
    """Small memory so that writes spill, probes that never run on their own (no worker processes)."""
    cfg: dict[str, Any] = {
        "grpc_port": 0, "grpc_bind_address": "127.0.0.1", "http_port": 0, "http_bind_address": "127.0.0.1",
        "grace_period_sec": 0,
        "memory_store": {"capacity": "1M", "buffer_ticket_timeout_sec": 60},
        "localfile_store": {"data_paths": [str(root / "disk0"), str(root / "disk1")],
                            "disk_healthy_check_interval_sec": 100_000, "disk_failures_to_quarantine": 100,
                            "disk_io_timeout_sec": 30.0},
        "hybrid_store": {"memory_single_buffer_max_spill_size": "64K"},
        "app_config": {"app_expiry_check_interval_sec": 2},
    }
    if coordinator is not None:
        cfg["coordinator_quorum"] = [coordinator]
        cfg["heartbeat_interval_seconds"] = 5
    return validate_config(ServerConfig, cfg)


@dataclass
class World:
    """One server, one client, one app; see the module docstring."""

    root: Path
    seed: int = 0
    coordinator: str | None = None
    app_id: str = "application_1700000000000_0007"
    shuffle_id: int = 0
    partitions: range = range(4)
    clock: ManualClock = field(default_factory=ManualClock)
    srv: ShuffleServer | None = None
    client: UniffleClient | None = None
    faulty: dict[str, FaultyLocalIO] = field(default_factory=dict)
    acked: list[BlockSpec] = field(default_factory=list)
    losses: int = 0  # times the app was purged by the crash of its AppActor (by design) and registered again
    log: list[str] = field(default_factory=list)
    #: (step, event) in the order the harness applied or launched the events of the schedule: a
    #: function of the seed (unlike ``log``, which also holds what timing decided)
    trace: list[tuple[int, Event]] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # actor name -> restarts, at the end of the run
    purge_events: list[Event] = field(default_factory=list)  # kills while the app is purged
    _task_id: int = 0
    _ticker: asyncio.Task | None = None
    _stop_ticking: bool = False

    # ------------------------------------------------------------- start / stop
    async def start(self) -> None:
        def local_io(name: str, root: str) -> FaultyLocalIO:
            self.faulty[name] = FaultyLocalIO(name=name)
            return self.faulty[name]

        self.srv = ShuffleServer(sim_config(self.root, coordinator=self.coordinator), clock=self.clock,
                                 local_io_factory=local_io)
        await self.srv.start()
        self.client = UniffleClient(f"127.0.0.1:{self.srv.grpc_port}", backoff_s=0.002, backoff_max_s=0.02)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        await self.call(self.client.register_shuffle(self.app_id, self.shuffle_id, self.partitions))

    async def close(self) -> None:
        self._stop_ticking = True
        if self._ticker is not None:
            await self._ticker
        for io in self.faulty.values():
            io.heal()
        if self.client is not None:
            await self.client.close()
        if self.srv is not None:
            await self.srv.stop(0)

    async def _tick(self) -> None:
        """Move the clock along while the workload runs (0.02 s of clock per ms of real time at most)."""
        while not self._stop_ticking:
            await asyncio.sleep(0.001)
            self.clock.advance(0.02)

    async def ask(self, ref: Any, msg: Any) -> Any:
        """An ask of the harness itself: an armed test crash may take its place, so ask again."""
        for _ in range(10):
            try:
                return await ref.ask(msg, timeout=CALL_DEADLINE_S)
            except (InjectedCrash, ActorDeadError):
                await poll_until(lambda: ref.statistics().state == "running", 10)
        raise AssertionError(f"{ref.name} never answered {msg!r}")

    async def call(self, aw: Any) -> Any:
        """A client call under a real-time deadline: a call that never returns is an ask left waiting."""
        return await asyncio.wait_for(aw, CALL_DEADLINE_S)

    # ------------------------------------------------------------- events
    def actor_name(self, kind: str, disk: int = 0) -> str:
        assert self.srv is not None
        return {"app": f"app:{self.app_id}", "disk": f"disk:{self.srv.disk_names[disk % len(self.srv.disk_names)]}",
                }.get(kind, kind)

    def apply(self, ev: Event) -> None:
        """Apply an event that does not wait (all but ``kill``)."""
        assert self.srv is not None
        self.log.append(f"{ev}")
        if ev.what == "inject":
            name = self.actor_name(ev.kind, ev.disk)
            if self.srv.system.get(name) is not None:
                self.srv.system.inject_crash(name, after=int(ev.arg))
        elif ev.what == "jump":
            self.clock.advance(ev.arg)
        elif ev.what == "disk":
            io = self.faulty[self.srv.disk_names[ev.disk % len(self.srv.disk_names)]]
            times = int(ev.arg)
            if ev.kind == "append_eio":
                io.fail("append_batch", errno.EIO, times=times)
            elif ev.kind == "append_torn":
                io.fail("append_batch", errno.EIO, times=times, after=True)
            elif ev.kind == "append_crash":
                io.fail("append_batch", RuntimeError("bug in the write path"), times=1)
            elif ev.kind == "purge_eio":
                io.fail("remove_app", errno.EIO, times=times)
            elif ev.kind == "read_eio":
                io.fail("read_index", errno.EIO, times=times)

    async def kill_mid_spill(self, ev: Event, step_done: asyncio.Future) -> None:
        """``stall``: hold the next append of the step on each disk, crash the actor while a batch is
        in flight (the dispatcher waits on a disk, the AppActor on the dispatcher), then let go."""
        assert self.srv is not None
        self.log.append(f"{ev}")
        held = [(io, io.hang("append_batch", times=1)) for io in self.faulty.values()]

        def entered() -> bool:
            return any(b.entered.is_set() for _, b in held)

        try:
            while not entered() and not step_done.done():
                await asyncio.sleep(0.001)
            if entered():
                self.log.append("a spill is in flight: crashing")
                await self.kill_later(Event(ev.step, "kill", ev.kind, ev.arg, ev.disk))
        finally:
            for _, blocked in held:
                blocked.times = 0  # disarmed if it did not fire (a later append is not held)
                blocked.release.set()

    async def kill_later(self, ev: Event) -> None:
        """``kill``: a few loop turns into the step, end the incarnation wherever it is."""
        assert self.srv is not None
        self.log.append(f"{ev}")
        for _ in range(int(ev.arg)):
            await asyncio.sleep(0)
        ref = self.srv.system.get(self.actor_name(ev.kind, ev.disk))
        if ref is not None and ref.is_alive:
            ref.crash(RuntimeError(f"simulated crash of {ref.name} (seed {self.seed})"))

    # ------------------------------------------------------------- workload
    async def run(self, steps: list[Step], events: list[Event]) -> None:
        self.purge_events = [e for e in events if e.step >= len(steps)]
        for i, step in enumerate(steps):
            now = [e for e in events if e.step == i]
            self.trace.extend((i, ev) for ev in now)
            for ev in now:
                if ev.what not in ("kill", "stall"):
                    self.apply(ev)
            step_task = asyncio.ensure_future(self.step(step))
            kills = [asyncio.ensure_future(self.kill_later(ev)) for ev in now if ev.what == "kill"]
            kills += [asyncio.ensure_future(self.kill_mid_spill(ev, step_task)) for ev in now if ev.what == "stall"]
            try:
                await step_task
            finally:
                await asyncio.gather(*kills)

    async def step(self, step: Step) -> None:
        if step.what == "write":
            await self._lossy(self.write(step.per_partition, step.block_size))
        elif step.what == "read":
            await self._lossy(self.read_back())
        elif step.what == "finish":
            await self._lossy(self.finish())

    async def _lossy(self, aw: Any) -> None:
        """Run a step; the crash of the AppActor purges the app (by design): start over with it."""
        try:
            await aw
        except UniffleError as e:
            if e.status != NO_REGISTER:
                raise
            await self.app_lost()

    async def app_lost(self) -> None:
        assert self.srv is not None and self.client is not None
        self.losses += 1
        self.log.append("app purged by the crash of its actor; registering it again")
        srv = self.srv
        await poll_until(lambda: self.app_id not in srv.directory and not app_dirs(srv, self.app_id)
                         and srv.budget.used_by_app(self.app_id) == 0, 20, message="app purge after its crash")
        self.acked.clear()
        await self.retrying(lambda: self.client.register_shuffle(self.app_id, self.shuffle_id, self.partitions))

    async def retrying(self, call: Any, attempts: int = 20) -> Any:
        """A call retried on error statuses other than NO_REGISTER (a crash answered it with an error)."""
        for attempt in range(attempts):
            try:
                return await self.call(call())
            except UniffleError as e:
                if e.status == NO_REGISTER or attempt == attempts - 1:
                    raise
                self.log.append(f"retrying after {e}")
                await asyncio.sleep(0.002 * (attempt + 1))  # client-side retry pacing, like the Java client
        raise AssertionError("unreachable")

    async def write(self, per_partition: int, block_size: int) -> None:
        assert self.client is not None
        self._task_id += 1
        task = self._task_id
        blocks = [b for p in self.partitions for b in make_blocks(p, task, per_partition, block_size)]
        acked: list[BlockSpec] = []
        for i in range(0, len(blocks), 4):
            chunk = blocks[i:i + 4]
            await self.retrying(lambda chunk=chunk: self.client.send_blocks(self.app_id, self.shuffle_id, chunk))
            acked.extend(chunk)
        await self.retrying(lambda: self.client.report(self.app_id, self.shuffle_id, task, acked))
        self.acked.extend(acked)

    async def read_back(self) -> None:
        """Every acknowledged block, byte-exact (a read that failed on an injected fault is retried)."""
        assert self.client is not None
        c = self.client
        ids = await self.retrying(lambda: c.get_shuffle_result(self.app_id, self.shuffle_id, self.partitions))
        assert set(ids) >= {b.block_id for b in self.acked}, "reported blocks missing from getShuffleResult"
        for p in self.partitions:
            want = [b for b in self.acked if b.partition_id == p]
            got = await self.retrying(lambda p=p: c.read_partition(self.app_id, self.shuffle_id, p, ids))
            assert_read_matches(got, want)

    async def finish(self) -> None:
        assert self.client is not None
        c = self.client
        pb = c.pb

        async def commit_and_finish() -> None:
            c._check("commitShuffleTask", await c.stub.commitShuffleTask(
                pb.ShuffleCommitRequest(appId=self.app_id, shuffleId=self.shuffle_id)))
            c._check("finishShuffle", await c.stub.finishShuffle(
                pb.FinishShuffleRequest(appId=self.app_id, shuffleId=self.shuffle_id)))

        await self.retrying(commit_and_finish)

    # ------------------------------------------------------------- invariants
    async def drained(self) -> None:
        """Wait until no spill is queued, running or in flight, and every mailbox is empty."""
        srv = self.srv
        assert srv is not None

        async def quiet() -> bool:
            stats = await self.ask(srv.spill, GetSpillStats())
            return (stats.pending == 0 and stats.running == 0 and srv.budget.in_flight == 0
                    and all(s.depth == 0 for s in srv.system.statistics()))

        await poll_until(quiet, 20, message=f"spills or mail not drained: budget {budget_figures(srv)}, "
                                            f"mailboxes {[s for s in srv.system.statistics() if s.depth]}")

    async def tree(self) -> None:
        """The supervisor tree once restarts in progress are done (an armed crash may fire late)."""
        last: list[AssertionError] = []

        def settled() -> bool:
            try:
                self._tree()
            except AssertionError as e:
                last[:] = [e]
                return False
            return True

        try:
            await poll_until(settled, 10)
        except AssertionError:
            raise last[0] from None

    def _tree(self) -> None:
        srv = self.srv
        assert srv is not None
        assert srv.escalated is None, f"supervisor tree gave up: {srv.escalated!r}"
        stats = {s.name: s for s in srv.system.statistics()}
        names = list(PERMANENT) + [f"disk:{d}" for d in srv.disk_names]
        if self.coordinator is not None:
            names.append("heartbeat")
        for name in names:
            assert name in stats and stats[name].state == "running", f"{name}: {stats.get(name)}"
        apps = {n.removeprefix("app:") for n in stats if n.startswith("app:")}
        assert apps == set(srv.directory), f"app actors {apps} != registered apps {set(srv.directory)}"

    async def check_invariants(self) -> None:
        srv = self.srv
        assert srv is not None and self.client is not None
        await self.drained()
        await self._lossy(self.read_back())  # every acknowledged block, byte-exact, until the purge
        await self.drained()
        b = srv.budget
        assert 0 <= b.in_flight <= b.used and b.allocated >= 0, budget_figures(srv)
        ref = srv.directory.get(self.app_id)
        if ref is not None:  # the budget of the app is exactly what its actor holds
            info = await self.ask(ref, GetAppInfo())
            assert b.used_by_app(self.app_id) == info.memory_bytes, (b.used_by_app(self.app_id), info)
            assert info.in_flight_bytes == 0, info
        await self.tree()
        # the timer kept every schedule (tickets, apps, probes, purge retries) across its crashes
        assert await self.ask(srv.timer, FireDue()) >= 3 + len(srv.disk_names)
        if self.coordinator is not None:
            sent = await self.ask(srv.heartbeat, SendHeartbeatNow())
            assert sent == {self.coordinator: True}, sent  # (its counters start again with each incarnation)
        # purge: everything of the app goes, even after crashes (events of the step after the last,
        # killed while the purge runs) and failed deletions
        self.trace.extend((e.step, e) for e in self.purge_events)
        during = [asyncio.ensure_future(self.kill_later(ev)) for ev in self.purge_events]
        try:
            await self.retrying(lambda: self.client.unregister_app(self.app_id))
        except UniffleError as e:
            # purged already: by an attempt that failed after all, or by the crash of its AppActor
            # killed during this step; what follows checks that everything of it is released
            if e.status != NO_REGISTER:
                raise
            self.log.append("the app was purged before the unregistration reached it")
        finally:
            await asyncio.gather(*during)
        paths = list(srv.cfg.localfile_store.data_paths)
        from tests.fault.conftest import open_files_under

        def clean() -> bool:
            return (budget_figures(srv) == (0, 0, 0) and len(srv.tickets) == 0 and not app_dirs(srv)
                    and self.app_id not in srv.directory and not open_files_under(paths))

        try:
            await poll_until(clean, 20)
        except AssertionError:
            raise AssertionError(f"not clean after the purge: budget {budget_figures(srv)}, tickets "
                                 f"{len(srv.tickets)}, dirs {app_dirs(srv)}, apps {list(srv.directory)}, "
                                 f"open files {open_files_under(paths)}") from None
        await self.drained()
        await self.tree()
        self.restarts = {s.name: s.restarts for s in srv.system.statistics()}


async def run_schedule(root: Path, seed: int, steps: list[Step], events: list[Event], *,
                       coordinator: str | None = None) -> World:
    """Run one schedule to its end and check the invariants; the failure names the seed and the events."""
    world = World(root, seed=seed, coordinator=coordinator)
    try:
        await world.start()
        await world.run(steps, events)
        await world.check_invariants()
    except BaseException as e:
        e.add_note(f"seed {seed}: steps {steps}\nevents {events}\nlog {world.log}")
        raise
    finally:
        await world.close()
    return world


HEARTBEAT_EVERY = 8
"""Every 8th seed of the simulation also runs a coordinator, and may crash the heartbeat."""


async def run_with_coordinator(root: Path, seed: int, steps: list[Step], events: list[Event]) -> World:
    """``run_schedule`` with a real in-process coordinator that the server heartbeats."""
    from riffle_actors.coordinator.config import CoordinatorConfig
    from riffle_actors.coordinator.runtime import Coordinator

    cfg = CoordinatorConfig.model_validate({
        "grpc_port": 0, "grpc_bind_address": "127.0.0.1", "http_port": 0, "http_bind_address": "127.0.0.1",
        "client_conf": {"rss.storage.type": "MEMORY_LOCALFILE"}, "admin": {"token": "t" * 32}})
    async with Coordinator(cfg, clock=ManualClock()) as coordinator:
        return await run_schedule(root, seed, steps, events, coordinator=f"127.0.0.1:{coordinator.grpc_port}")


async def run_seed(root: Path, seed: int) -> World:
    """One seed of the simulation: its schedule, with a coordinator for every ``HEARTBEAT_EVERY``-th."""
    if seed % HEARTBEAT_EVERY == 0:
        steps, events = make_schedule(seed, KINDS)
        return await run_with_coordinator(root, seed, steps, events)
    steps, events = make_schedule(seed)
    return await run_schedule(root, seed, steps, events)

