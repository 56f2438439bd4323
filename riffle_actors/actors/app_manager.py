"""AppManagerActor: the app registry, heartbeat expiry, purge orchestration and spill rounds.

It owns the ``AppDirectory`` (app id -> AppActor ref). The directory is written only by
this actor; the ShuffleService reads it synchronously on the same event loop to route a
request to its AppActor without an extra hop (reads never block and never see a torn
update, since everything runs on one thread).

A purge (unregister, heartbeat expiry, or the crash of an AppActor seen through death
watch) stops the AppActor, gives its memory and tickets back to the MemoryManager, deletes
its files on every disk (the Disk actors fence the app so late spills are dropped) and
records the app in the history (``riffle_actors.io.app_history``: bounded, kept ``retention_days``
and, with ``historical_apps_config.backend = "SLED"``, on disk), with Riffle's per-app totals read
from the AppActor just before it stops (received bytes, partitions, huge partitions and their
sizes, whether a partition split was asked for). Purges never block the event loop: file deletion
runs on the disks' threads.

Its mailbox never waits on an app. Everything that needs answers from AppActors is a
*fan-out*: the question goes to every app at once, each app gets ``APP_ASK_TIMEOUT_S`` on the
injected clock, and the round goes on with whatever came back; the message is replied later
(or the round runs as a task), so a ``GetOrCreateApp`` for a new app is answered while a
sweep waits on a stuck app. The conclusions come from ``riffle_actors.state.app_sweep``:

- **Expiry sweep** (``CheckExpiredApps``, from the timer): apps that say they expired, or whose
  actor is gone, are purged; one that leaves ``EXPIRY_MISSES_TO_PURGE`` checks in a row
  unanswered is purged too (a slow answer is not a verdict, a stuck actor must not hold data).
- **Watermark spill round** (``SpillLargest``, from the MemoryManager): collect every app's
  staging sizes, spill the largest buffers until ``target_bytes``, answer ``SpillRoundDone``
  with what was scheduled.
- **Listing** (``ListApps``) and **flush** (``FlushAllApps``, at shutdown; not bounded per app,
  the caller bounds it as a whole).

At most ``max_apps`` apps (``[app_config] app_number_hard_limit``) are registered at once,
counting the registrations under way: a ``GetOrCreateApp`` for one more new app is refused with
ACCESS_DENIED naming the key (apps already registered are served as before).

Sweeps and spill rounds run one at a time each; a request during a round coalesces into one
more round after it. Registrations and purges of one app id run in order (a purge's tells
reach the disks before a re-registration lifts their fences); a purge decided by a sweep or by
death watch applies only while the directory still holds the very actor it judged, so each
AppActor is purged exactly once.

See also: ``riffle_actors.actors.app`` (one app), ``riffle_actors.actors.memory``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from loguru import logger

from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, ChildSpec, RestartPolicy, Terminated
from riffle_actors.actors.app import AppActor
from riffle_actors.actors.app_messages import GetAppInfo, GetSpillCandidates, IsExpired, PurgeShuffle, SpillAll, \
    SpillPartitions
from riffle_actors.state.app_report import AppInfo
from riffle_actors.actors.storage_messages import PurgeFiles, UnfenceApp
from riffle_actors.actors.memory import PurgeAppMemory, SpillLargest, SpillRoundDone
from riffle_actors.runtime import Clock
from riffle_actors.errors import AccessDeniedError, InvalidRequestError, RiffleError
from riffle_actors.io.app_history import AppHistory
from riffle_actors.protocol import ids
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.state.app_sweep import Answer, ExpiryBook, RoundGate, SpillCandidate, pick_spill

T = TypeVar("T")

_FENCE_EVERY_EPOCH = 1 << 62


def check_app_id(app_id: str) -> None:
    """App ids become directory names: refuse anything that could escape a data path
    (the rule is ``protocol.ids.check_app_id``'s)."""
    try:
        ids.check_app_id(app_id)
    except ProtocolError as e:
        raise InvalidRequestError(f"invalid {e}") from None


def history_record(app_id: str, reason: str, end_ms: int, info: AppInfo | None) -> dict[str, Any]:
    """One finished app in Riffle's ``/apps/history`` form (its ``HistoricalAppInfo`` fields) plus
    ``reason`` and ``purged_epoch_ms``. The huge-partition min/avg/max are 0 without huge partitions
    (Riffle shows u64::MAX as the min then)."""
    huge = [b for sh in info.shuffles.values() for b in sh.huge_partition_bytes] if info is not None else []
    return {
        "app_id": app_id,
        "reason": reason,
        "purged_epoch_ms": end_ms,
        "total_bytes": info.received_bytes if info is not None else 0,
        "partition_num": info.partition_count if info is not None else 0,
        "huge_partition_num": len(huge),
        "avg_huge_partition_bytes": sum(huge) // len(huge) if huge else 0,
        "max_huge_partition_bytes": max(huge, default=0),
        "min_huge_partition_bytes": min(huge, default=0),
        "start_timestamp": info.registered_epoch_ms if info is not None else 0,
        "end_timestamp": end_ms,
        "partition_split_triggered": info.partition_split_triggered if info is not None else False,
    }
def _forget_creating(creating: set[str], app_id: str, _task: object) -> None:
    creating.discard(app_id)


class AppDirectory(dict[str, ActorRef]):
    """app id -> AppActor ref; mutated only by the AppManagerActor."""


class AppManagerLedger:
    """What the AppManager keeps across its restarts, besides the ``AppDirectory``: the purges it has
    decided and not finished (re-run by the next incarnation: every step of a purge is idempotent),
    the spill round it owes an answer to, and the purge history. The server creates it once."""

    def __init__(self, history_size: int = 1000, history: AppHistory | None = None) -> None:
        # (app id, shuffle id or None for the whole app) -> (the AppActor judged, reason); insertion order
        self.purges: dict[tuple[str, int | None], tuple[ActorRef | None, str]] = {}
        self.round_reply_to: ActorRef | None = None  # a SpillLargest being served: answer it after a crash
        self.history: AppHistory = history if history is not None else AppHistory(max_apps=history_size)
        self.purged_total = 0


@dataclass(frozen=True, slots=True)
class GetOrCreateApp:
    app_id: str
    recovered: bool = False  # restart recovery: accepted before, never refused by max_apps


@dataclass(frozen=True, slots=True)
class PurgeApp:
    app_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class PurgeAppShuffle:
    app_id: str
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class CheckExpiredApps:
    pass


@dataclass(frozen=True, slots=True)
class ListApps:
    pass


@dataclass(frozen=True, slots=True)
class GetHistory:
    pass


@dataclass(frozen=True, slots=True)
class FlushAllApps:
    """Spill every buffer of every app to disk (graceful shutdown); replies when done."""


AppManagerMsg = (GetOrCreateApp | PurgeApp | PurgeAppShuffle | CheckExpiredApps | ListApps | GetHistory
                 | FlushAllApps | SpillLargest | Terminated)


APP_ASK_TIMEOUT_S = 10.0
"""How long, on the manager's clock, a fan-out (expiry check, spill candidates and orders, listing)
waits for one AppActor. An app that has not answered by then is left out of that round."""

EXPIRY_MISSES_TO_PURGE = 3
"""Expiry checks in a row an app may leave unanswered before it is purged as expired all the same."""


class AppManagerActor(Actor):
    """The app registry and its sweeps; see the module docstring.

    ``receive`` never waits: what needs an answer from apps or a started actor is replied later.

    **What survives a crash.** The ``AppDirectory`` and the ``AppManagerLedger`` (both the server's)
    and the mailbox. A purge is entered in the ledger when it is decided (the app leaves the
    directory at that moment) and leaves it once the AppActor is stopped, the MemoryManager told
    ``PurgeAppMemory`` and every disk told ``PurgeFiles``; the crash cancels the steps in progress
    and the next incarnation's ``on_start`` runs every purge of the ledger again (stopping a stopped
    actor, purging purged memory and deleting deleted files are no-ops), so an app is never half
    purged and no file is leaked. A registration cut short may leave an AppActor started but not in
    the directory: the next incarnation's ``on_start`` (or the next ``GetOrCreateApp`` of that id)
    adopts it, so it is served, swept for expiry and purged like any other. The ``SpillRoundDone`` owed to the
    MemoryManager is sent by the next incarnation (with 0 bytes: it starts a fresh round on its next
    commit). Lost with the incarnation: the asks being answered (they fail with ``ActorDeadError``;
    the service answers the client with an error, and it retries), the expiry miss counts (an app
    is judged again from its next check) and the round gates. Death-watch ``Terminated`` messages of
    AppActors go to the ref, which survives, and wait in the mailbox.
    """

    expected_errors = (RiffleError,)

    def __init__(self, *, directory: AppDirectory, app_factory: Callable[[str], AppActor], memory: ActorRef,
                 disks: list[ActorRef], clock: Clock, apps_supervisor: ActorRef | None = None,
                 history_size: int = 1000, app_ask_timeout_s: float = APP_ASK_TIMEOUT_S,
                 expiry_misses_to_purge: int = EXPIRY_MISSES_TO_PURGE, ledger: AppManagerLedger | None = None,
                 max_apps: int | None = None):
        self.directory = directory
        self.apps_supervisor = apps_supervisor
        self.app_factory = app_factory
        self.memory = memory
        self.disks = disks
        self.clock = clock
        self.app_ask_timeout_s = app_ask_timeout_s
        self.ledger = ledger if ledger is not None else AppManagerLedger(history_size)
        self.history = self.ledger.history
        self.expiry = ExpiryBook(expiry_misses_to_purge)
        self.sweeps: RoundGate[CheckExpiredApps] = RoundGate()
        self.spill_rounds: RoundGate[SpillLargest] = RoundGate()
        # app id -> the last registration or purge step for it: steps of one app id run in order
        self._app_steps: dict[str, asyncio.Task[Any]] = {}
        self.max_apps = max_apps  # [app_config] app_number_hard_limit; None = no limit
        self._creating: set[str] = set()  # new app ids whose registration is under way

    @property
    def purged_total(self) -> int:
        return self.ledger.purged_total

    async def on_start(self) -> None:
        ledger = self.ledger
        if self.apps_supervisor is not None:  # AppActors a cut-short registration left out of the directory
            for name, ref in self.system.children(self.apps_supervisor).items():
                app_id = name.removeprefix("app:")
                if ref.is_alive and app_id not in self.directory and (app_id, None) not in ledger.purges:
                    logger.bind(app_id=app_id).warning("app {} adopted after a restart of the app manager", app_id)
                    ref.watch(self.ref)
                    self.directory[app_id] = ref
        if ledger.purges:
            logger.warning("app manager restarted: finishing {} interrupted purge(s)", len(ledger.purges))
            self.spawn(self._finish_purges())
        if ledger.round_reply_to is not None:
            reply_to, ledger.round_reply_to = ledger.round_reply_to, None
            try:
                reply_to.tell_nowait(SpillRoundDone(0))
            except Exception:  # noqa: BLE001 - the MemoryManager times a lost round out by itself
                logger.warning("could not answer the spill round cut short by a restart")

    async def _finish_purges(self) -> None:
        """Run the purges a crash cut short again, as steps of their ids (owned by this incarnation)."""
        steps = []
        for (app_id, shuffle_id), (ref, reason) in list(self.ledger.purges.items()):
            if shuffle_id is None:
                steps.append(self._app_step(app_id, partial(self._release_app, app_id, ref, reason)))
            else:
                steps.append(self._app_step(app_id, partial(self._purge_shuffle, app_id, shuffle_id)))
        for result in await asyncio.gather(*steps, return_exceptions=True):
            if isinstance(result, Exception):  # stays in the ledger: the next incarnation tries again
                logger.opt(exception=result).error("an interrupted purge failed again: {!r}", result)

    def receive(self, msg: AppManagerMsg):
        match msg:
            case GetOrCreateApp(app_id=app_id, recovered=recovered):
                check_app_id(app_id)
                ref = self.directory.get(app_id)
                if ref is not None and ref.is_alive:
                    return ref
                if app_id not in self._creating:
                    if not recovered:
                        self._admit(app_id)
                    self._creating.add(app_id)
                task = self._app_step(app_id, partial(self._create_app, app_id))
                task.add_done_callback(partial(_forget_creating, self._creating, app_id))
                return task
            case PurgeApp(app_id=app_id, reason=reason):
                return self._purge(app_id, reason)
            case PurgeAppShuffle(app_id=app_id, shuffle_id=shuffle_id):
                self.ledger.purges[(app_id, shuffle_id)] = (None, "shuffle unregistered")
                return self._app_step(app_id, partial(self._purge_shuffle, app_id, shuffle_id))
            case CheckExpiredApps():
                return self._expiry_sweeps() if self.sweeps.request(msg) else None
            case ListApps():
                return self._list_apps()
            case GetHistory():
                return self.ledger.history.list()
            case FlushAllApps():
                return self._flush_all()
            case SpillLargest():
                return self._spill_rounds(msg) if self.spill_rounds.request(msg) else None
            case Terminated(ref=ref, reason=reason):
                for app_id, known in list(self.directory.items()):
                    if known is ref:
                        why = f"app actor crashed: {reason!r}" if reason is not None else "app actor stopped"
                        return self._purge(app_id, why, ref=ref)
                return None
            case _:
                raise InvalidRequestError(f"unexpected message {type(msg).__name__}")

    # ------------------------------------------------------------- registration and purge
    def _admit(self, app_id: str) -> None:
        """ACCESS_DENIED when one more app would take the server above ``max_apps``."""
        if self.max_apps is None:
            return
        alive = sum(1 for ref in self.directory.values() if ref.is_alive) + len(self._creating)
        if alive >= self.max_apps:
            raise AccessDeniedError(
                f"app {app_id} refused: this server already has {alive} registered apps, the most it takes "
                f"([app_config] app_number_hard_limit = {self.max_apps}); ask the coordinator for another server")

    def _app_step(self, app_id: str, step: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Run ``step`` after the previous step for ``app_id`` (whatever its outcome); other ids run freely.

        A purge's tells thus reach the MemoryManager and the disks before a later registration of
        the same id lifts its fences, and two registrations of one new id create one AppActor.
        """
        previous = self._app_steps.get(app_id)

        async def run() -> T:
            if previous is not None:
                await asyncio.wait([previous])
            return await step()

        task = asyncio.get_running_loop().create_task(run(), name=f"actor:{self.name}:app-step")
        self._app_steps[app_id] = task

        def forget(t: asyncio.Task[Any]) -> None:
            if self._app_steps.get(app_id) is t:
                del self._app_steps[app_id]

        task.add_done_callback(forget)
        return task

    async def _create_app(self, app_id: str) -> ActorRef:
        ref = self.directory.get(app_id)
        if ref is not None and ref.is_alive:  # registered by the step before this one
            return ref
        for disk in self.disks:  # the id may have been purged before: lift its disk fences
            await disk.tell(UnfenceApp(app_id))
        # temporary: a crashed app is purged, never silently restarted with lost data
        spec = ChildSpec(f"app:{app_id}", partial(self.app_factory, app_id), RestartPolicy.TEMPORARY)
        orphan = self.system.get(spec.name)
        if orphan is not None and orphan.is_alive:
            # started by a registration that a crash of this actor cut short: adopt it
            ref = orphan
        elif self.apps_supervisor is not None:
            ref = await self.system.start_child(self.apps_supervisor, spec)
        else:
            ref = await self.system.spawn(spec.factory(), name=spec.name)
        ref.watch(self.ref)
        self.directory[app_id] = ref
        logger.bind(app_id=app_id).info("app {} registered", app_id)
        return ref

    def _purge(self, app_id: str, reason: str, *, ref: ActorRef | None = None,
               ask_info: bool = True) -> asyncio.Task[None] | None:
        """Purge ``app_id`` (only while its AppActor is still ``ref``, when given): exactly once per actor.

        The app leaves the directory at once, so no request reaches it any more; stopping it and
        releasing its memory and files follow as a step of its id.
        """
        if ref is not None:
            if self.directory.get(app_id) is not ref:
                return None  # purged already (or replaced by a new registration)
            del self.directory[app_id]
        else:
            ref = self.directory.pop(app_id, None)
        self.ledger.purges[(app_id, None)] = (ref, reason)  # from now on it happens, crash or not
        return self._app_step(app_id, partial(self._release_app, app_id, ref, reason, ask_info=ask_info))

    async def _release_app(self, app_id: str, ref: ActorRef | None, reason: str, *, ask_info: bool = True) -> None:
        # the history's figures; not asked of an app purged for not answering (it would not now either)
        info = await self._final_info(ref) if ref is not None and ask_info else None
        if ref is not None:
            await ref.stop()
        await self.memory.tell(PurgeAppMemory(app_id=app_id))
        for disk in self.disks:
            await disk.tell(PurgeFiles(app_id=app_id))
        ledger = self.ledger
        ledger.purges.pop((app_id, None), None)
        ledger.purged_total += 1
        ledger.history.record(history_record(app_id, reason, int(self.clock.time() * 1000), info))
        logger.bind(app_id=app_id).info("app {} purged: {}", app_id, reason)

    async def _final_info(self, ref: ActorRef) -> AppInfo | None:
        """The app's figures for its history record (None: it does not answer in time, or is gone)."""
        answer = (await self._ask_apps({"": (ref, GetAppInfo())}, self.app_ask_timeout_s))[""]
        return answer if isinstance(answer, AppInfo) else None  # NO_ANSWER or the error it failed with

    async def _purge_shuffle(self, app_id: str, shuffle_id: int) -> None:
        ref = self.directory.get(app_id)
        epoch = _FENCE_EVERY_EPOCH  # app gone: its own purge follows (a new incarnation is unfenced)
        if ref is not None:
            try:
                epoch = await ref.ask(PurgeShuffle(shuffle_id))
            except ActorDeadError:
                pass
        await self.memory.tell(PurgeAppMemory(app_id=app_id, shuffle_id=shuffle_id))
        for disk in self.disks:
            await disk.tell(PurgeFiles(app_id=app_id, shuffle_id=shuffle_id, epoch=epoch))
        self.ledger.purges.pop((app_id, shuffle_id), None)
        logger.bind(app_id=app_id).info("shuffle {} of app {} purged", shuffle_id, app_id)

    # ------------------------------------------------------------- fan-outs
    async def _ask_apps(self, asks: dict[str, tuple[ActorRef, Any]],
                        timeout_s: float | None) -> dict[str, Any]:
        """Ask every app at once; app id -> its answer, the exception it failed with, or ``NO_ANSWER``.

        ``timeout_s`` bounds the wait on the manager's clock (None: wait for every answer).
        """
        if not asks:
            return {}
        loop = asyncio.get_running_loop()
        tasks = {app_id: loop.create_task(ref.ask(msg), name=f"actor:{self.name}:ask")
                 for app_id, (ref, msg) in asks.items()}
        deadline: asyncio.Future[None] = loop.create_future()
        handle = None
        if timeout_s is not None:

            def expire() -> None:
                if not deadline.done():
                    deadline.set_result(None)

            handle = self.clock.call_at(self.clock.monotonic() + timeout_s, expire)
        waiting: set[asyncio.Future[Any]] = set(tasks.values())
        try:
            while waiting and not deadline.done():
                _, waiting = await asyncio.wait(waiting | {deadline}, return_when=asyncio.FIRST_COMPLETED)
                waiting.discard(deadline)
        finally:
            if handle is not None:
                handle.cancel()
            deadline.cancel()
            for t in waiting:
                t.cancel()
            if waiting:
                await asyncio.wait(waiting)
        return {app_id: NO_ANSWER if t.cancelled() else t.exception() or t.result()
                for app_id, t in tasks.items()}

    async def _expiry_sweeps(self) -> None:
        """Expiry sweeps until no further one was requested meanwhile."""
        while True:
            await self._sweep_expired()
            if self.sweeps.finished() is None:
                return

    async def _sweep_expired(self) -> None:
        refs = dict(self.directory)
        answers = await self._ask_apps({a: (r, IsExpired()) for a, r in refs.items()}, self.app_ask_timeout_s)
        verdicts = {app_id: _expiry_answer(answer) for app_id, answer in answers.items()}
        purges = [self._purge(app_id, reason, ref=refs[app_id], ask_info=answers[app_id] is not NO_ANSWER)
                  for app_id, reason in self.expiry.decide(verdicts)]
        await asyncio.gather(*(p for p in purges if p is not None))

    async def _spill_rounds(self, msg: SpillLargest | None) -> None:
        """Spill rounds until no further one was requested meanwhile; each is answered with SpillRoundDone."""
        while msg is not None:
            scheduled = 0
            self.ledger.round_reply_to = msg.reply_to
            try:
                scheduled = await self._spill_largest(msg.target_bytes)
            finally:
                if self.ledger.round_reply_to is msg.reply_to:
                    self.ledger.round_reply_to = None
                    msg.reply_to.tell_nowait(SpillRoundDone(scheduled))  # the MemoryManager's mailbox is huge
            msg = self.spill_rounds.finished()

    async def _spill_largest(self, target_bytes: int) -> int:
        refs = dict(self.directory)
        answers = await self._ask_apps({a: (r, GetSpillCandidates()) for a, r in refs.items()},
                                       self.app_ask_timeout_s)
        candidates = [SpillCandidate(size, app_id, sid, pid) for app_id, listed in answers.items()
                      if _answered(listed) for size, sid, pid in listed]
        orders = pick_spill(candidates, target_bytes)
        done = await self._ask_apps({a: (refs[a], SpillPartitions(keys)) for a, keys in orders.items()},
                                    self.app_ask_timeout_s)
        return sum(n for n in done.values() if _answered(n))

    async def _list_apps(self) -> list[Any]:
        answers = await self._ask_apps({a: (r, GetAppInfo()) for a, r in self.directory.items()},
                                       self.app_ask_timeout_s)
        return [info for info in answers.values() if _answered(info)]

    async def _flush_all(self) -> None:
        # no per-app bound: a flush takes as long as the disks need; the caller bounds the whole
        await self._ask_apps({a: (r, SpillAll()) for a, r in self.directory.items()}, None)


NO_ANSWER: Any = object()
"""What ``AppManagerActor._ask_apps`` reports for an app that did not answer in time."""


def _answered(answer: Any) -> bool:
    return answer is not NO_ANSWER and not isinstance(answer, BaseException)


def _expiry_answer(answer: Any) -> Answer:
    if answer is NO_ANSWER:
        return Answer.NO_ANSWER
    if isinstance(answer, ActorDeadError):
        return Answer.GONE
    if isinstance(answer, BaseException):
        return Answer.NO_ANSWER  # an app that failed to answer is judged by later checks
    return Answer.EXPIRED if answer else Answer.ALIVE
