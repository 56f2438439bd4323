"""AppManagerActor: the app registry, heartbeat expiry, purge orchestration and spill rounds.

It owns the ``AppDirectory`` (app id -> AppActor ref). The directory is written only by
this actor; the ShuffleService reads it synchronously on the same event loop to route a
request to its AppActor without an extra hop (reads never block and never see a torn
update, since everything runs on one thread).

A purge (unregister, heartbeat expiry, or the crash of an AppActor seen through death
watch) stops the AppActor, gives its memory and tickets back to the MemoryManager, deletes
its files on every disk (the Disk actors fence the app so late spills are dropped) and
records the app in a bounded history. Purges never block the event loop: file deletion
runs on the disks' threads.

Watermark spill rounds: the MemoryManager asks for ``target_bytes``; this actor collects
every app's staging sizes, spills the largest buffers until the target is reached, and
reports how much it scheduled.

See also: ``riffle_actors.actors.app`` (one app), ``riffle_actors.actors.memory``.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from loguru import logger

from riffle_actors.runtime import Actor, ActorDeadError, ActorRef, ChildSpec, RestartPolicy, Terminated
from riffle_actors.actors.app import AppActor, GetAppInfo, GetSpillCandidates, IsExpired, PurgeShuffle, \
    SpillAll, SpillPartitions
from riffle_actors.actors.disk import PurgeFiles, UnfenceApp
from riffle_actors.actors.memory import PurgeAppMemory, SpillLargest, SpillRoundDone
from riffle_actors.runtime.clock import Clock
from riffle_actors.errors import InvalidRequestError, RiffleError

_APP_ID_RE = re.compile(r"^[A-Za-z0-9._@:+=,-]{1,255}$")
_FENCE_EVERY_EPOCH = 1 << 62


def check_app_id(app_id: str) -> None:
    """App ids become directory names: refuse anything that could escape a data path."""
    if not _APP_ID_RE.match(app_id) or app_id in (".", ".."):
        raise InvalidRequestError(f"invalid appId {app_id!r}: use letters, digits and ._@:+=,- only")


class AppDirectory(dict[str, ActorRef]):
    """app id -> AppActor ref; mutated only by the AppManagerActor."""


@dataclass(frozen=True, slots=True)
class GetOrCreateApp:
    app_id: str


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


class AppManagerActor(Actor):
    expected_errors = (RiffleError,)

    def __init__(self, *, directory: AppDirectory, app_factory: Callable[[str], AppActor], memory: ActorRef,
                 disks: list[ActorRef], clock: Clock, apps_supervisor: ActorRef | None = None,
                 history_size: int = 1000):
        self.directory = directory
        self.apps_supervisor = apps_supervisor
        self.app_factory = app_factory
        self.memory = memory
        self.disks = disks
        self.clock = clock
        self.history: deque[dict] = deque(maxlen=history_size)
        self.purged_total = 0
        self._purging: set[str] = set()

    async def receive(self, msg: AppManagerMsg):
        match msg:
            case GetOrCreateApp(app_id=app_id):
                check_app_id(app_id)
                if app_id in self._purging:
                    raise InvalidRequestError(f"app {app_id} is being removed")
                ref = self.directory.get(app_id)
                if ref is None or not ref.is_alive:
                    for disk in self.disks:  # the id may have been purged before: lift its disk fences
                        await disk.tell(UnfenceApp(app_id))
                    # temporary: a crashed app is purged, never silently restarted with lost data
                    spec = ChildSpec(f"app:{app_id}", partial(self.app_factory, app_id), RestartPolicy.TEMPORARY)
                    if self.apps_supervisor is not None:
                        ref = await self.system.start_child(self.apps_supervisor, spec)
                    else:
                        ref = await self.system.spawn(spec.factory(), name=spec.name)
                    ref.watch(self.ref)
                    self.directory[app_id] = ref
                    logger.bind(app_id=app_id).info("app {} registered", app_id)
                return ref
            case PurgeApp(app_id=app_id, reason=reason):
                await self._purge_app(app_id, reason)
            case PurgeAppShuffle(app_id=app_id, shuffle_id=shuffle_id):
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
                logger.bind(app_id=app_id).info("shuffle {} of app {} purged", shuffle_id, app_id)
            case CheckExpiredApps():
                for app_id, ref in list(self.directory.items()):
                    try:
                        expired = await ref.ask(IsExpired(), timeout=30)
                    except (ActorDeadError, asyncio.TimeoutError):
                        expired = True
                    if expired:
                        await self._purge_app(app_id, "heartbeat timeout")
            case ListApps():
                infos = []
                for ref in list(self.directory.values()):
                    try:
                        infos.append(await ref.ask(GetAppInfo(), timeout=10))
                    except (ActorDeadError, asyncio.TimeoutError):
                        pass
                return infos
            case GetHistory():
                return list(self.history)
            case FlushAllApps():
                waits = []
                for ref in list(self.directory.values()):
                    try:
                        waits.append(ref.ask(SpillAll()))
                    except ActorDeadError:
                        pass
                await asyncio.gather(*waits, return_exceptions=True)
            case SpillLargest(target_bytes=target, reply_to=reply_to):
                scheduled = 0
                try:
                    scheduled = await self._spill_largest(target)
                finally:
                    await reply_to.tell(SpillRoundDone(scheduled))
            case Terminated(ref=ref, reason=reason):
                for app_id, known in list(self.directory.items()):
                    if known is ref:
                        why = f"app actor crashed: {reason!r}" if reason is not None else "app actor stopped"
                        await self._purge_app(app_id, why)
            case _:
                raise InvalidRequestError(f"unexpected message {type(msg).__name__}")

    async def _spill_largest(self, target: int) -> int:
        candidates: list[tuple[int, int, int, ActorRef]] = []
        for ref in list(self.directory.values()):
            try:
                for size, sid, pid in await ref.ask(GetSpillCandidates(), timeout=10):
                    candidates.append((size, sid, pid, ref))
            except (ActorDeadError, asyncio.TimeoutError):
                continue
        candidates.sort(key=lambda c: c[0], reverse=True)
        picked: dict[ActorRef, list[tuple[int, int]]] = {}
        total = 0
        for size, sid, pid, ref in candidates:
            if total >= target:
                break
            picked.setdefault(ref, []).append((sid, pid))
            total += size
        scheduled = 0
        for ref, keys in picked.items():
            try:
                scheduled += await ref.ask(SpillPartitions(tuple(keys)), timeout=10)
            except (ActorDeadError, asyncio.TimeoutError):
                continue
        return scheduled

    async def _purge_app(self, app_id: str, reason: str) -> None:
        if app_id in self._purging:
            return
        self._purging.add(app_id)
        try:
            ref = self.directory.pop(app_id, None)
            if ref is not None:
                await ref.stop()
            await self.memory.tell(PurgeAppMemory(app_id=app_id))
            for disk in self.disks:
                await disk.tell(PurgeFiles(app_id=app_id))
            self.purged_total += 1
            self.history.append({"app_id": app_id, "reason": reason,
                                 "purged_epoch_ms": int(self.clock.time() * 1000)})
            logger.bind(app_id=app_id).info("app {} purged: {}", app_id, reason)
        finally:
            self._purging.discard(app_id)
