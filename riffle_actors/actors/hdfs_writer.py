"""HdfsWriterActor: the HDFS tier's writer pool; HdfsSpillRoute: the SpillDispatcher's way into it.

The HdfsWriter (one actor under the storage supervisor, permanent) owns every HDFS file this
server writes. It keeps, per app, the remote storage the client named in registerShuffle
(``RegisterRemoteStorage``) **if the operator allows it**: ``AllowedRemoteStorages`` holds
``hdfs_store.remote_storage``, the only bases this server ever connects to, each with the
operator's Hadoop conf; a client path that is not one of them (compared normalized,
``protocol.hdfs_layout.normalize_remote_path``) is refused with INVALID_REQUEST, and the client's
``remoteStorageConf`` items are never used. Per partition it keeps up to ``partition_write_max_concurrency`` file
pairs ``<serverId>_<i>_<retry>.data|.index`` (spec §5.5, ``riffle_actors.protocol.hdfs_layout``):
a batch takes a free writer index ``i`` of its partition, so two writes never append to one
pair, and at most ``max_concurrency`` writes run at once over the server. A write appends the
data, then the 40-byte index records, on the writer's thread pool, within
``write_timeout_sec``. A failed or timed-out write (or one cut short by a crash of the actor)
moves its pair to the next ``retry``: HDFS may keep the old file leased, and a thread still
stuck in it must never share a file with a new write. The abandoned files are closed by lease
recovery once a write succeeds again: one request per file per round, the next round
``LEASE_RECOVERY_RETRY_S`` later on the server's timer (``RetryLeaseRecovery``; no thread waits
between two tries), at most ``LEASE_RECOVERY_ROUNDS`` rounds until the next successful write.
A file whose timed-out call is still running is not recovered before that call has ended: the
call may still reach the NameNode and reopen the file for append, and a file left open that way
hides its acknowledged bytes from readers (its last block stays under construction). The end of
such a call starts a round of its own. A recovered file shorter than what was acknowledged in it
is counted (``lost_bytes``, the ``riffle_hdfs_lost_bytes`` metric) and logged as an error.

The write is acknowledged (``HdfsWritten``) only once both files are closed; until then the
batch is the SpillDispatcher's, still in memory, and a failure, a timeout or the actor's
crash only makes the dispatcher write it elsewhere (``HdfsSpillRoute``). Everything that must
outlive an incarnation (threads, remote storages, file pairs, fences, counters, HDFS health)
lives in ``HdfsResources``, which the server creates once.

``PurgeFiles`` (sent by the AppManager with the disks' purges) fences the app or shuffle,
waits for its writes in flight, then deletes exactly what this server made for it
(``_AppFiles``): every file pair it created (recorded before the file is created), then every
directory it created (``<appId>``, ``<shuffleId>``, ``<p>-<p>`` levels it found missing), deepest
first and only while empty. It never lists a tree and never removes a directory it did not make.
After a restart the file names are not known, only the partitions with HDFS segments
(``shuffle.meta``, handed over by restart recovery): there the purge lists that one partition
directory and deletes the files named as this server's pairs (``is_server_file``); directories
made before the restart stay. A recovered app whose base is no longer allowed is not touched.

``HdfsSpillRoute`` runs inside the SpillDispatcher: it asks ``state.tier_policy`` for the tier
of each attempt, writes to HDFS when told to, records the choice and any fallback (metrics,
per-app counts for ``/apps``) and answers False when the batch must go to the local disks.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NoReturn

from loguru import logger

from riffle_actors.actors.storage_messages import AppPurgedError, PurgeFiles, UnfenceApp
from riffle_actors.errors import InvalidRequestError, RiffleError, StatusCode
from riffle_actors.io.hdfs import HdfsIO, conf_items
from riffle_actors.log import RateLimitedLog
from riffle_actors.protocol.hdfs_layout import (
    app_dir,
    file_pair,
    is_server_file,
    normalize_remote_path,
    partition_dir,
    shuffle_dir,
    split_remote_path,
)
from riffle_actors.protocol.index import build_index
from riffle_actors.records import Block
from riffle_actors.runtime import (
    Actor,
    ActorDeadError,
    ActorRef,
    Clock,
    MailboxFullError,
    Schedule,
    SystemClock,
)
from riffle_actors.state.tier_policy import HdfsHealth, Tier, TierReason, TierRules, choose_tier

_FENCE_LIMIT = 10_000
_MAX_NAME_PROBES = 64  # retry suffixes tried when an earlier run left files with the same names


# ---------------------------------------------------------------------------- messages
class HdfsWriteError(RiffleError):
    """An HDFS write failed (or timed out); the batch is still in memory."""

    status = StatusCode.INTERNAL_ERROR


@dataclass(frozen=True, slots=True)
class RegisterRemoteStorage:
    """registerShuffle's ``remoteStorage``: where the app's HDFS files go, if the operator allows it.

    ``conf``: the client's Hadoop conf items, ignored (the operator's conf of the base is used).
    ``recovered``: (shuffle id, partition id) of the partitions restart recovery found with HDFS
    segments (their files are this server's, to delete when the app or shuffle is purged).
    Refused with ``InvalidRequestError`` when the path is not in ``hdfs_store.remote_storage``.
    """

    app_id: str
    path: str
    conf: tuple[tuple[str, str], ...] = ()
    recovered: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HdfsWrite:
    app_id: str
    shuffle_id: int
    partition_id: int
    blocks: tuple[Block, ...]
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class HdfsWritten:
    data_path: str
    offset: int
    data_file_len: int


@dataclass(frozen=True, slots=True)
class GetHdfsStats:
    pass


@dataclass(frozen=True, slots=True)
class HdfsStats:
    apps_with_remote: int
    written_bytes: int
    writes: int
    write_failures: int
    new_file_pairs: int      # retry suffixes started after a failure
    files_purged: int
    healthy: bool
    last_error: str
    writes_in_flight: int
    pending_recoveries: int = 0  # abandoned files whose lease recovery has not finished
    remote_storage_refused: int = 0  # registrations (and recovered apps) naming a base not allowed
    lost_bytes: int = 0  # acknowledged bytes that abandoned files no longer held once recovered


# ---------------------------------------------------------------------------- resources
@dataclass(frozen=True, slots=True)
class RemoteStorage:
    fs_url: str
    base: str
    conf: tuple[tuple[str, str], ...]
    path: str  # normalized (``normalize_remote_path``)


class AllowedRemoteStorages:
    """The operator's remote storage bases (``hdfs_store.remote_storage``): the only ones ever used.

    ``resolve(path)`` answers the operator's ``RemoteStorage`` (its conf) for a client's path that
    equals an allowed base once both are normalized, else raises ``InvalidRequestError`` naming
    the key to set (counted in ``refused``, logged at most every 10 s). The bases are fixed at
    construction; the service and the HdfsWriter share one instance.
    """

    KEY = "hdfs_store.remote_storage"

    def __init__(self, bases: Iterable[tuple[str, Mapping[str, str]]] = ()):
        self.refused = 0
        self._log = RateLimitedLog(10.0)
        self._by_path: dict[str, RemoteStorage] = {}
        for path, conf in bases:
            normal = normalize_remote_path(path)
            fs_url, base = split_remote_path(normal)
            self._by_path[normal] = RemoteStorage(fs_url, base, conf_items(conf), normal)

    def __len__(self) -> int:
        return len(self._by_path)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._by_path)

    def resolve(self, path: str) -> RemoteStorage:
        try:
            normal = normalize_remote_path(path)
        except ValueError as e:
            self._refuse(f"{e} (allowed bases: {self.KEY} in the server config)")
        remote = self._by_path.get(normal)
        if remote is None:
            self._refuse(f"remote storage {path!r} is not allowed on this server: add it to {self.KEY} in the "
                         f"server config (and the coordinator's remote_storage.path), or use a storage type "
                         f"without HDFS")
        return remote

    def _refuse(self, why: str) -> NoReturn:
        self.refused += 1
        show, suppressed = self._log.should_log("refused")
        if show:
            logger.warning("refused a remote storage: {}{}", why,
                           f" ({suppressed} similar refusals suppressed)" if suppressed else "")
        raise InvalidRequestError(why)


@dataclass(eq=False)
class _AppFiles:
    """What this server made on HDFS for one app: the only things its purge deletes.

    Written from the writer threads (a file pair is recorded just before it is created, a
    directory just after this server created it) and read by the purge, under ``lock``.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    files: dict[tuple[RemoteStorage, str], None] = field(default_factory=dict)  # in creation order
    dirs: dict[tuple[RemoteStorage, str], None] = field(default_factory=dict)   # created here, in order
    ready: set[tuple[RemoteStorage, str]] = field(default_factory=set)        # partition dirs known to exist
    recovered: dict[tuple[RemoteStorage, str], None] = field(default_factory=dict)  # partition dirs, pre-restart

    def add_file(self, remote: RemoteStorage, path: str) -> None:
        with self.lock:
            self.files[(remote, path)] = None

    def add_dir(self, remote: RemoteStorage, path: str) -> None:
        with self.lock:
            self.dirs[(remote, path)] = None

    def take(self, app_id: str, shuffle_id: int | None) -> tuple[list, list, list]:
        """Forget and return (files, dirs, recovered partition dirs) of the app, or of one of its
        shuffles: those under ``<base>/<appId>/<shuffleId>`` of whichever base they are on."""
        def under(key: tuple[RemoteStorage, str]) -> bool:
            if shuffle_id is None:
                return True
            prefix = shuffle_dir(key[0].base, app_id, shuffle_id)
            return key[1] == prefix or key[1].startswith(prefix + "/")
        with self.lock:
            out = []
            for table in (self.files, self.dirs, self.recovered):
                keys = [k for k in table if under(k)]
                for k in keys:
                    del table[k]
                out.append(keys)
            self.ready = {k for k in self.ready if not under(k)}
        return out[0], out[1], out[2]


@dataclass(slots=True)
class _Slot:
    index: int
    retry: int = 0
    created: bool = False
    data_len: int = 0   # bytes of the data file acknowledged so far
    index_len: int = 0  # bytes of the index file acknowledged so far


@dataclass(eq=False)
class _PartitionFiles:
    slots: list[_Slot]
    free: list[int]
    sem: asyncio.Semaphore


@dataclass(eq=False, slots=True)
class _Abandoned:
    """A file a write failed on: lease recovery closes it, then its length is checked."""

    remote: RemoteStorage
    acked_len: int  # bytes acknowledged in it before the failed write
    call: asyncio.Future | None  # the failed write's thread call, while it may still run


@dataclass(eq=False)
class HdfsResources:
    """What the HDFS tier keeps across HdfsWriter restarts (see the module docstring)."""

    io: HdfsIO = field(default_factory=HdfsIO)
    max_concurrency: int = 50
    partition_write_max_concurrency: int = 20
    write_timeout_s: float = 120.0
    health: HdfsHealth = field(default_factory=HdfsHealth)
    server_id: str = ""  # set by the server once its ports are known (file names start with it)
    allowed: AllowedRemoteStorages = field(default_factory=AllowedRemoteStorages)  # hdfs_store.remote_storage
    remotes: dict[str, RemoteStorage] = field(default_factory=dict)
    made: dict[str, _AppFiles] = field(default_factory=dict)  # app -> what this server made on HDFS
    partitions: dict[tuple[str, int, int], _PartitionFiles] = field(default_factory=dict)
    fenced: OrderedDict[tuple[str, int | None], int] = field(default_factory=OrderedDict)
    inflight: dict[str, set[asyncio.Future]] = field(default_factory=dict)
    written_bytes: int = 0
    writes: int = 0
    write_failures: int = 0
    new_file_pairs: int = 0
    files_purged: int = 0
    # abandoned files (a write to them failed): their lease is recovered once HDFS works again (and
    # the failed call has ended), so the bytes acknowledged before the failure become readable again
    recoveries: dict[str, _Abandoned] = field(default_factory=dict)
    lost_bytes: int = 0  # acknowledged bytes missing from abandoned files once recovered
    on_lost: Callable[[int], None] | None = None  # metrics hook: acknowledged bytes found missing
    recovering: bool = False
    recovery_rounds: int = 0  # lease recovery rounds since the last successful write started them
    app_bytes: Counter = field(default_factory=Counter)        # app -> bytes written to HDFS
    app_fallbacks: Counter = field(default_factory=Counter)    # app -> batches sent local after HDFS failed
    _pool: ThreadPoolExecutor | None = None
    _global: asyncio.Semaphore | None = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="hdfs-w")
        return self._pool

    @property
    def global_sem(self) -> asyncio.Semaphore:
        if self._global is None:
            self._global = asyncio.Semaphore(self.max_concurrency)
        return self._global

    def files_of(self, key: tuple[str, int, int]) -> _PartitionFiles:
        pf = self.partitions.get(key)
        if pf is None:
            n = self.partition_write_max_concurrency
            pf = self.partitions[key] = _PartitionFiles([_Slot(i) for i in range(n)], list(range(n - 1, -1, -1)),
                                                        asyncio.Semaphore(n))
        return pf

    def is_fenced(self, app_id: str, shuffle_id: int, epoch: int) -> bool:
        return (app_id, None) in self.fenced or self.fenced.get((app_id, shuffle_id), -1) >= epoch

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


@dataclass(frozen=True, slots=True)
class RetryLeaseRecovery:
    """Told by the timer: another round of lease recovery of the abandoned files still leased;
    ``call_ended``: told when a failed write's call ended (its files can be recovered now)."""

    call_ended: bool = False


#: A round of lease recovery asks the NameNode once per abandoned file; the files it has not closed yet
#: are asked again this much later (on the server's timer), up to LEASE_RECOVERY_ROUNDS rounds; then
#: the next successful write starts again (HDFS usually closes a file within a few seconds).
LEASE_RECOVERY_RETRY_S = 0.5
LEASE_RECOVERY_ROUNDS = 60

HdfsMsg = RegisterRemoteStorage | HdfsWrite | PurgeFiles | UnfenceApp | GetHdfsStats | RetryLeaseRecovery


class HdfsWriterActor(Actor):
    expected_errors = (RiffleError,)
    mailbox_size = 1_000_000  # one ask per in-flight batch, like the SpillDispatcher

    def __init__(self, resources: HdfsResources):
        self.res = resources

    def receive(self, msg: HdfsMsg):
        match msg:
            case RegisterRemoteStorage(app_id=app_id, path=path, conf=conf, recovered=recovered):
                if not path:
                    return None
                remote = self.res.allowed.resolve(path)
                if recovered:
                    made = self.res.made.setdefault(app_id, _AppFiles())
                    with made.lock:
                        for shuffle_id, partition_id in recovered:
                            made.recovered[(remote, partition_dir(remote.base, app_id, shuffle_id,
                                                                  partition_id))] = None
                if self.res.remotes.get(app_id) == remote:
                    return None
                self.res.remotes[app_id] = remote
                logger.bind(app_id=app_id).info(
                    "app {}: remote storage {}{}", app_id, remote.path,
                    f" ({len(conf)} client conf items ignored: the server's conf for it is used)" if conf else "")
                return None
            case HdfsWrite():
                if self.res.is_fenced(msg.app_id, msg.shuffle_id, msg.epoch):
                    raise AppPurgedError(f"app {msg.app_id} shuffle {msg.shuffle_id} was purged")
                remote_or_none = self.res.remotes.get(msg.app_id)
                if remote_or_none is None:
                    raise HdfsWriteError(f"app {msg.app_id} registered no remote storage")
                return self._tracked(msg.app_id, self._write(msg, remote_or_none))
            case PurgeFiles():
                key = (msg.app_id, msg.shuffle_id)
                self.res.fenced[key] = max(self.res.fenced.pop(key, -1), msg.epoch)
                while len(self.res.fenced) > _FENCE_LIMIT:
                    self.res.fenced.popitem(last=False)
                return self._purge(msg)
            case UnfenceApp(app_id=app_id):
                for key in [k for k in self.res.fenced if k[0] == app_id]:
                    del self.res.fenced[key]
                return None
            case RetryLeaseRecovery(call_ended=call_ended):
                if call_ended:
                    self.res.recovery_rounds = 0  # a round for the file that call held, however many ran
                if self.res.recoveries and not self.res.recovering:
                    self.spawn(self._recover())
                return None
            case GetHdfsStats():
                r = self.res
                return HdfsStats(len(r.remotes), r.written_bytes, r.writes, r.write_failures, r.new_file_pairs,
                                 r.files_purged, r.health.healthy(self.system.clock.monotonic()),
                                 r.health.last_error, sum(len(s) for s in r.inflight.values()),
                                 len(r.recoveries), r.allowed.refused, r.lost_bytes)
            case _:
                raise TypeError(f"unexpected message {msg!r}")

    def _tracked(self, app_id: str, coro) -> asyncio.Future:
        fut = asyncio.ensure_future(coro)
        live = self.res.inflight.setdefault(app_id, set())
        live.add(fut)

        def done(f: asyncio.Future) -> None:
            live.discard(f)
            if not live and self.res.inflight.get(app_id) is live:
                del self.res.inflight[app_id]
        fut.add_done_callback(done)
        return fut

    async def _write(self, msg: HdfsWrite, remote: RemoteStorage) -> HdfsWritten:
        res = self.res
        loop = asyncio.get_running_loop()
        async with res.global_sem:
            pf = res.files_of((msg.app_id, msg.shuffle_id, msg.partition_id))
            async with pf.sem:
                slot = pf.slots[pf.free.pop()]
                ok = False
                pair = None  # the pair an append was started on
                fut: asyncio.Future | None = None
                try:
                    for _ in range(_MAX_NAME_PROBES):
                        if res.is_fenced(msg.app_id, msg.shuffle_id, msg.epoch):
                            raise AppPurgedError(f"app {msg.app_id} shuffle {msg.shuffle_id} was purged")
                        candidate = file_pair(remote.base, msg.app_id, msg.shuffle_id, msg.partition_id,
                                              res.server_id, slot.index, slot.retry)
                        index_bytes, data_len = build_index(msg.blocks, slot.data_len)
                        pair = candidate
                        made = res.made.setdefault(msg.app_id, _AppFiles())
                        dirs = (app_dir(remote.base, msg.app_id), shuffle_dir(remote.base, msg.app_id, msg.shuffle_id),
                                partition_dir(remote.base, msg.app_id, msg.shuffle_id, msg.partition_id))
                        fut = loop.run_in_executor(res.pool, _append, res.io, remote, pair,
                                                   [b.data for b in msg.blocks], index_bytes, not slot.created,
                                                   made, dirs)
                        try:
                            written = await asyncio.wait_for(asyncio.shield(fut), res.write_timeout_s)
                        except TimeoutError:
                            fut.add_done_callback(_consume)
                            raise TimeoutError(f"HDFS write did not finish within {res.write_timeout_s:g}s "
                                               f"(hdfs_store.write_timeout_sec)") from None
                        if not written:  # the names are taken (an earlier run of this server id)
                            slot.retry += 1
                            pair = None
                            continue
                        offset = slot.data_len
                        slot.created = True
                        slot.data_len += data_len
                        slot.index_len += len(index_bytes)
                        ok = True
                        res.written_bytes += data_len
                        res.writes += 1
                        res.app_bytes[msg.app_id] += data_len
                        if res.recoveries and not res.recovering:
                            res.recovery_rounds = 0
                            self.spawn(self._recover())  # HDFS works again: close the abandoned files
                        return HdfsWritten(pair.data, offset, slot.data_len)
                    raise HdfsWriteError(f"no free file name for {candidate.data} after {_MAX_NAME_PROBES} tries")
                except RiffleError:
                    raise
                except Exception as e:  # any client error (re-raised as HdfsWriteError): the batch goes elsewhere
                    res.write_failures += 1
                    raise HdfsWriteError(f"HDFS write of {len(msg.blocks)} blocks of {msg.app_id}/"
                                         f"{msg.shuffle_id}/{msg.partition_id} failed: {e!r}") from e
                finally:
                    if not ok and pair is not None:
                        # the pair may be leased, half written or still written by a stuck thread: it is
                        # never written again, and its lease is recovered (the acknowledged part of the
                        # data file is not readable while the failed append keeps its last block open)
                        call = fut if fut is not None and not fut.done() else None
                        res.recoveries[pair.data] = _Abandoned(remote, slot.data_len, call)
                        res.recoveries[pair.index] = _Abandoned(remote, slot.index_len, call)
                        if call is not None:
                            call.add_done_callback(self._call_ended)
                        slot.retry += 1
                        slot.created = False
                        slot.data_len = slot.index_len = 0
                        res.new_file_pairs += 1
                    pf.free.append(slot.index)

    def _call_ended(self, _call: asyncio.Future) -> None:
        """A failed write's thread call ended (on the loop): its files may be recovered now."""
        try:
            self.ref.tell_nowait(RetryLeaseRecovery(call_ended=True))
        except (ActorDeadError, MailboxFullError):  # the next successful write starts a round
            logger.debug("HDFS writer cannot take the lease recovery round of an ended call now")

    async def _recover(self) -> None:
        """One round: one lease recovery request per abandoned file whose failed call has ended; a
        round for those still leased (or still held by their call) is scheduled on the timer
        (``LEASE_RECOVERY_RETRY_S``, at most ``LEASE_RECOVERY_ROUNDS`` rounds)."""
        res = self.res
        res.recovering = True
        res.recovery_rounds += 1
        loop = asyncio.get_running_loop()
        try:
            for path, ab in list(res.recoveries.items()):
                if ab.call is not None and not ab.call.done():
                    continue  # the call may still reopen the file: recovered after it ended (``_call_ended``)
                try:
                    done, length = await asyncio.wait_for(loop.run_in_executor(
                        res.pool, _recover_lease, res.io, ab.remote, path), res.write_timeout_s)
                except Exception as e:  # noqa: BLE001 - tried again after the next successful write
                    logger.warning("HDFS lease recovery of {} failed: {!r}", path, e)
                    return
                if done:
                    res.recoveries.pop(path, None)
                    if length < ab.acked_len:
                        lost = ab.acked_len - max(length, 0)
                        res.lost_bytes += lost
                        if res.on_lost is not None:
                            res.on_lost(lost)
                        logger.error("HDFS file {} holds {} of the {} bytes acknowledged in it after lease recovery: "
                                     "{} acknowledged bytes lost (riffle_hdfs_lost_bytes)", path,
                                     "none" if length < 0 else length, ab.acked_len, lost)
                    else:
                        logger.info("HDFS file {} closed by lease recovery after a failed write", path)
        finally:
            res.recovering = False
        if res.recoveries and res.recovery_rounds < LEASE_RECOVERY_ROUNDS:
            timer = self.system.get("timer")
            if timer is not None:
                timer.tell_nowait(Schedule(("hdfs-lease-recovery", self.ref.name),
                                           self.system.clock.monotonic() + LEASE_RECOVERY_RETRY_S, self.ref,
                                           RetryLeaseRecovery()))

    async def _purge(self, msg: PurgeFiles) -> int:
        res = self.res
        live = [f for f in res.inflight.get(msg.app_id, ()) if not f.done()]
        if live:  # fenced already: no new write starts; let the running ones end first
            await asyncio.wait(live, timeout=res.write_timeout_s)
        if msg.shuffle_id is None:
            for key in [k for k in res.partitions if k[0] == msg.app_id]:
                del res.partitions[key]
            res.remotes.pop(msg.app_id, None)
            res.app_bytes.pop(msg.app_id, None)
            res.app_fallbacks.pop(msg.app_id, None)
            made = res.made.pop(msg.app_id, None)
        else:
            for key in [k for k in res.partitions if k[0] == msg.app_id and k[1] == msg.shuffle_id]:
                del res.partitions[key]
            made = res.made.get(msg.app_id)
        if made is None:
            return 0
        files, dirs, recovered = made.take(msg.app_id, msg.shuffle_id)
        gone = {path for _, path in files}
        for path in [p for p in res.recoveries if p in gone]:
            del res.recoveries[path]
        if not (files or dirs or recovered):
            return 0
        loop = asyncio.get_running_loop()
        try:
            n = await asyncio.wait_for(loop.run_in_executor(
                res.pool, _remove_made, res.io, files, dirs, recovered, res.server_id), res.write_timeout_s)
        except Exception as e:  # noqa: BLE001 - a purge failure is logged, the app is gone anyway
            logger.bind(app_id=msg.app_id).warning("could not delete the HDFS files of {}{}: {!r}", msg.app_id,
                                                   "" if msg.shuffle_id is None else f" shuffle {msg.shuffle_id}", e)
            return 0
        res.files_purged += n
        return n


def _append(io: HdfsIO, remote: RemoteStorage, pair, data, index: bytes, create: bool, made: _AppFiles,
            dirs: tuple[str, ...]) -> bool:
    client = io.client(remote.fs_url, remote.conf)
    if create:
        if io.exists(client, pair.data) or io.exists(client, pair.index):
            return False
        if (remote, dirs[-1]) not in made.ready:
            # the app, shuffle and partition levels this server finds missing are its own (the base is
            # the operator's: made if missing, never recorded, so never removed)
            for d in dirs:
                if io.make_dir(client, d):
                    made.add_dir(remote, d)
            with made.lock:
                made.ready.add((remote, dirs[-1]))
        made.add_file(remote, pair.data)
        made.add_file(remote, pair.index)
    io.append_pair(client, pair, data, index, create)
    return True


def _recover_lease(io: HdfsIO, remote: RemoteStorage, path: str) -> tuple[bool, int]:
    """(closed, its length once closed: -1 when the file is gone, 0 while not closed)."""
    client = io.client(remote.fs_url, remote.conf)
    if not io.recover_lease(client, path):
        return False, 0
    return True, io.file_length(client, path)


def _remove_made(io: HdfsIO, files: list, dirs: list, recovered: list, server_id: str) -> int:
    """Delete the files, then the directories, this server made (see ``_AppFiles``); files deleted."""
    deleted = 0
    for remote, path in files:
        deleted += io.delete_file(io.client(remote.fs_url, remote.conf), path)
    for remote, directory in recovered:  # partitions written before a restart: this server's names only
        client = io.client(remote.fs_url, remote.conf)
        for name in io.list_files(client, directory):
            if is_server_file(name, server_id):
                deleted += io.delete_file(client, f"{directory}/{name}")
    for remote, directory in sorted(dirs, key=lambda k: k[1].count("/"), reverse=True):
        io.remove_empty_dir(io.client(remote.fs_url, remote.conf), directory)
    return deleted


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


# ---------------------------------------------------------------------------- the dispatcher's route
class HdfsSpillRoute:
    """Chooses the tier of one spill attempt and writes to HDFS when it is HDFS.

    ``try_spill`` answers True when HDFS acknowledged the batch, False when the batch goes to
    the local disks (chosen so, or after an HDFS failure, which is then a counted fallback).
    ``on_choice(tier, reason)`` and ``on_spilled(tier, bytes, seconds)`` are metrics hooks.
    """

    def __init__(self, writer: ActorRef, resources: HdfsResources, rules: TierRules, *,
                 clock: Clock | None = None, on_choice: Callable[[str, str], None] | None = None,
                 on_spilled: Callable[[str, int, float], None] | None = None):
        self.writer = writer
        self.res = resources
        self.rules = rules
        self.clock = clock or SystemClock()
        self.on_choice = on_choice
        self.on_spilled = on_spilled
        self.choices: Counter = Counter()  # (tier, reason) -> attempts
        self._log = RateLimitedLog(10.0, monotonic=self.clock.monotonic)

    async def try_spill(self, job, healthy_disks: int) -> bool:
        data_bytes = sum(len(b.data) for b in job.blocks)
        now = self.clock.monotonic()
        choice = choose_tier(self.rules, batch_bytes=data_bytes, huge=getattr(job, "huge", False),
                             healthy_disks=healthy_disks, has_remote=job.app_id in self.res.remotes,
                             hdfs_healthy=self.res.health.healthy(now))
        if choice.reason == TierReason.HDFS_UNHEALTHY:
            self.res.app_fallbacks[job.app_id] += 1
        self._count(choice.tier, choice.reason)
        if choice.tier != Tier.HDFS:
            return False
        started = self.clock.monotonic()
        try:
            await self.writer.ask(HdfsWrite(app_id=job.app_id, shuffle_id=job.shuffle_id,
                                            partition_id=job.partition_id, blocks=job.blocks, epoch=job.epoch))
        except AppPurgedError:
            # purged meanwhile: not an HDFS fault. The dispatcher's next step drops the batch (the disks
            # are fenced too, and the owner is gone)
            return False
        except (HdfsWriteError, ActorDeadError, Exception) as e:  # noqa: BLE001 - the batch goes local
            self.res.health.failed(self.clock.monotonic(), str(e))
            self.res.app_fallbacks[job.app_id] += 1
            self._count(Tier.LOCALFILE, TierReason.HDFS_FAILED)
            show, suppressed = self._log.should_log("hdfs-failed")
            if show:
                logger.bind(app_id=job.app_id).warning(
                    "HDFS spill of {}/{}/{} failed ({}); HDFS is skipped for {:g}s, the batch goes to local "
                    "disk{}", job.app_id, job.shuffle_id, job.partition_id, e, self.rules.retry_after_s,
                    f" ({suppressed} similar messages suppressed)" if suppressed else "")
            return False
        self.res.health.succeeded()
        if self.on_spilled is not None:
            self.on_spilled(Tier.HDFS.value, data_bytes, self.clock.monotonic() - started)
        return True

    def _count(self, tier: Tier, reason: TierReason) -> None:
        self.choices[(tier.value, reason.value)] += 1
        if self.on_choice is not None:
            self.on_choice(tier.value, reason.value)
