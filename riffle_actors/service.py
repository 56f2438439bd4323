"""ShuffleService: the transport-agnostic use cases of the shuffle server.

Every transport (gRPC now, urpc later) decodes a request into domain values (wire formats such
as block-id layouts and task-id bitmaps are decoded by ``riffle_actors.transport.decode``, never
here), calls one method here and encodes the result; errors are ``RiffleError`` subclasses whose
status is mapped in one place (``riffle_actors.errors.to_status``). This is where the RPCs' order
of checks from spec §2 lives: app check, ticket handling (a taken ticket is handed to the AppActor, which
converts it into used memory; a cancelled RPC cannot strand it), the routing of reads to
memory or to the disks that hold a partition's files.

Every id a client hands over is checked here, where it enters, by ``riffle_actors.protocol.ids``
(app id, shuffle id, each partition id), for both transports: a bad one is refused with
INVALID_REQUEST naming the field before any actor sees the request. The lists a request carries
(partition ids of a read or a requireBuffer) are bounded by ``[app_config] partition_number_max_limit``
before they are walked. ``storageId`` must name one of this server's disks (or be -1, "not sent").

Integrity (docs/faults.md "Integrity"): with ``[app_config] block_crc_check_enable`` every block of a
send is checked against its ``crc`` (``riffle_actors.protocol.crc``; on a thread above 8 MiB) before
its ticket is taken; a mismatch refuses the whole send (``BlockCorruptError``, INTERNAL_ERROR naming
the block, which the client resends) and gives the ticket back. A local read of a range holding a
block a scrubber found corrupt is refused the same way (the client reads another replica), and so is
one whose bytes the disk's read CRC check (``[localfile_store] read_crc_check_enable``) finds do not
match their index records as it reads them (the blocks are then recorded as a scrubber's finds are).
All are counted in the ``IntegrityLedger`` (per app) and the metrics.

It owns no state: the actors do. It holds their refs and the read-only ``AppDirectory``.

See also: ``riffle_actors.transport.grpc_server`` (the gRPC adapter), ``riffle_actors.server``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import NoReturn

from riffle_actors.actors.app_manager import AppDirectory, GetOrCreateApp, PurgeApp, PurgeAppShuffle
from riffle_actors.actors.app_messages import (
    AppendBlocks,
    CheckBufferRequest,
    CommitShuffleTask,
    FinishShuffle,
    GetLocalReadPlan,
    GetMemoryData,
    GetPartitionDisks,
    GetShuffleResult,
    Heartbeat,
    RegisterShuffle,
    ReportShuffleResult,
)
from riffle_actors.actors.hdfs_writer import AllowedRemoteStorages, RegisterRemoteStorage
from riffle_actors.actors.memory import BufferGrant, TakeTicket
from riffle_actors.actors.partition import tell_commit
from riffle_actors.actors.storage_messages import (
    CorruptRange,
    DiskIOError,
    ReadAheadHint,
    ReadData,
    ReadIndex,
)
from riffle_actors.errors import (
    BlockCorruptError,
    InternalError,
    InvalidRequestError,
    NoRegisterError,
    RiffleError,
    StorageError,
    TicketExceededError,
)
from riffle_actors.metrics import Metrics
from riffle_actors.protocol import ids
from riffle_actors.protocol.bitmap import TaskIdFilter
from riffle_actors.protocol.blockid import BlockIdLayout
from riffle_actors.protocol.crc import BadBlock, find_bad_block
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.index import shift_offsets
from riffle_actors.records import Block, BlockBatch
from riffle_actors.runtime import ActorDeadError, ActorRef, Forward, MailboxFullError
from riffle_actors.state.buffer import BLOCK_OVERHEAD_BYTES
from riffle_actors.state.disk_health import DiskHealthBoard
from riffle_actors.state.integrity import CorruptBlock, IntegrityLedger
from riffle_actors.state.send import SendTicket


def _check_ids(app_id: object, shuffle_id: object = 0, partition_ids: Iterable[object] = ()) -> None:
    """``protocol.ids``' checks of the ids of one request; INVALID_REQUEST naming the field."""
    try:
        ids.check_app_id(app_id)
        ids.check_shuffle_id(shuffle_id)
        for pid in partition_ids:
            ids.check_partition_id(pid)
    except ProtocolError as e:
        raise InvalidRequestError(f"invalid {e}") from None


_CHECK_STEP_IDS = 16_384  # partition ids checked per loop turn (~5 ms on this box)


async def _check_ids_in_steps(app_id: object, shuffle_id: object, partition_ids: Sequence[object]) -> None:
    """``_check_ids`` of a long partition list (up to ``partition_number_max_limit``: 1M ids, ~0.3 s
    of checks), giving the loop a turn every ``_CHECK_STEP_IDS`` ids. Callers check a short list with
    ``_check_ids`` at once instead (no coroutine per call: requireBuffer runs this on every send)."""
    _check_ids(app_id, shuffle_id, partition_ids[:_CHECK_STEP_IDS])
    for start in range(_CHECK_STEP_IDS, len(partition_ids), _CHECK_STEP_IDS):
        await asyncio.sleep(0)
        _check_ids(app_id, shuffle_id, partition_ids[start:start + _CHECK_STEP_IDS])


def _checked_reports(p2b: Iterable[tuple[int, Sequence[int]]]):
    """The (partition id, block ids) pairs of a report, each partition id checked as it is reached."""
    for pid, block_ids in p2b:
        try:
            ids.check_partition_id(pid)
        except ProtocolError as e:
            raise InvalidRequestError(f"invalid {e}") from None
        yield pid, block_ids


_CRC_ON_LOOP_BYTES = 8 << 20  # sends up to this size are checked on the loop (~1 ms with ISA-L), bigger ones
# on a thread (the CRC releases the GIL): a 64 MB send would hold the loop ~7 ms, a loaded box more


class ShuffleService:
    def __init__(self, *, directory: AppDirectory, app_manager: ActorRef, memory: ActorRef,
                 disks: Sequence[tuple[str, ActorRef]], metrics: Metrics,
                 huge_partition_limit_bytes: int | None = None, disk_health: DiskHealthBoard | None = None,
                 max_read_length: int = 64 << 20, hdfs: ActorRef | None = None,
                 remote_storages: AllowedRemoteStorages | None = None, max_partitions: int = 1 << 20,
                 integrity: IntegrityLedger | None = None, crc_check: bool = True):
        self.hdfs = hdfs  # the HdfsWriter (store_type with HDFS): told each app's remote storage
        # hdfs_store.remote_storage: a registration naming another remote storage is refused
        self.remote_storages = remote_storages if remote_storages is not None else AllowedRemoteStorages()
        self.directory = directory
        self.app_manager = app_manager
        self.memory = memory
        self.disk_names = [name for name, _ in disks]
        self.disk_refs = dict(disks)
        self.metrics = metrics
        # [app_config] partition_limit_memory_backpressure_ratio x capacity; None = partition limit off
        self.huge_partition_limit_bytes = huge_partition_limit_bytes
        self.disk_health = disk_health  # read-only here; written by the DiskMonitor
        self.max_read_length = max_read_length  # grpc_max_message_size: the largest local read served
        self.max_partitions = max_partitions  # [app_config] partition_number_max_limit
        self.integrity = integrity if integrity is not None else IntegrityLedger()
        self.crc_check = crc_check  # [app_config] block_crc_check_enable

    def _check_partition_list(self, what: str, partition_ids: Sequence[int]) -> None:
        if len(partition_ids) > self.max_partitions:
            raise InvalidRequestError(f"{what} names {len(partition_ids)} partitions, more than a shuffle may have "
                                      f"({self.max_partitions}, [app_config] partition_number_max_limit)")

    def _app(self, app_id: str) -> ActorRef:
        ref = self.directory.get(app_id)
        if ref is None or not ref.is_alive:
            raise NoRegisterError(f"app {app_id!r} is not registered on this server")
        return ref

    async def _ask_app(self, app_id: str, msg):
        try:
            return await self._app(app_id).ask(msg)
        except ActorDeadError:
            raise NoRegisterError(f"app {app_id!r} was removed") from None

    # ------------------------------------------------------------- writes
    async def register_shuffle(self, app_id: str, shuffle_id: int, ranges: Sequence[tuple[int, int]],
                               local_order: bool, user: str = "", properties: dict[str, str] | None = None,
                               remote_storage: tuple[str, tuple[tuple[str, str], ...]] | None = None) -> None:
        """``remote_storage``: registerShuffle's (path, Hadoop conf items), for the HDFS tier. With an
        HDFS tier, a path that is not an allowed base (``hdfs_store.remote_storage``) is refused
        (INVALID_REQUEST) before anything is registered; the conf items are never used.
        The ranges' own limits (partition count, block-id layout) are the AppActor's to check."""
        _check_ids(app_id, shuffle_id, (pid for r in ranges for pid in r))
        for start, end in ranges:
            if end < start:
                raise InvalidRequestError(f"invalid partition range [{start}, {end}]")
        if self.hdfs is not None and remote_storage is not None and remote_storage[0]:
            self.remote_storages.resolve(remote_storage[0])
        ref = await self.app_manager.ask(GetOrCreateApp(app_id))
        try:
            await ref.ask(RegisterShuffle(shuffle_id=shuffle_id, ranges=tuple(ranges), local_order=local_order,
                                          user=user, properties=tuple((properties or {}).items()),
                                          remote_storage=remote_storage[0] if remote_storage else ""))
        except ActorDeadError:
            raise InternalError(f"app {app_id!r} was removed while registering; retry") from None
        if self.hdfs is not None and remote_storage is not None and remote_storage[0]:
            await self.hdfs.ask(RegisterRemoteStorage(app_id, remote_storage[0], tuple(remote_storage[1])))

    async def require_buffer(self, app_id: str, shuffle_id: int, size: int,
                             partition_ids: Sequence[int] = ()) -> int:
        """A ticket id (``grant_buffer`` without the split partitions)."""
        return (await self.grant_buffer(app_id, shuffle_id, size, partition_ids)).ticket_id

    async def grant_buffer(self, app_id: str, shuffle_id: int, size: int,
                           partition_ids: Sequence[int] = ()) -> BufferGrant:
        """A ticket id, and the partitions named that the client should split (Riffle's partition split,
        ``[app_config] partition_split_*``: requireBuffer's ``needSplitPartitionIds``; only clients that
        send the partition ids, 0.10 and later, can be told, and only those from 0.10 read the field). ``partition_ids`` (requireBuffer field 4, sent by 0.10 clients) enable the
        huge-partition backpressure: NO_BUFFER_FOR_HUGE_PARTITION for a huge partition holding too much
        memory; a request naming no partition is never held back that way.

        Tickets are issued only to a registered app for a registered shuffle (and registered partitions,
        when named): every client since 0.6 sends its appId, shuffleId and the send's partitionIds (0.9.2
        included), so an empty appId (the pre-0.6 "EMPTY" pseudo app) is refused as an invalid id. The
        MemoryManager bounds what one app holds reserved (``[memory_store] app_buffer_ticket_max_*``)."""
        self._check_partition_list("requireBuffer", partition_ids)
        if len(partition_ids) <= _CHECK_STEP_IDS:
            _check_ids(app_id, shuffle_id, partition_ids)
        else:
            await _check_ids_in_steps(app_id, shuffle_id, partition_ids)
        if size < 0:
            raise InvalidRequestError(f"requireSize {size} is negative")
        # one ask: the AppActor checks, then hands the reservation on to the MemoryManager, which answers
        return await self._ask_app(app_id, CheckBufferRequest(
            shuffle_id=shuffle_id, partition_ids=tuple(partition_ids),
            limit_bytes=self.huge_partition_limit_bytes, size=size))

    async def send_data(self, app_id: str, shuffle_id: int, ticket_id: int,
                        partitions: tuple[BlockBatch, ...]) -> int:
        """Append the blocks; returns the bytes accepted. Readable from memory once this returns.

        ``partitions``: the send columnar, one ``BlockBatch`` per partition; every check and sum
        over it is one pass per partition over its columns (no per-block object is made here)."""
        _check_ids(app_id, shuffle_id, (b.partition_id for b in partitions))
        app = self._app(app_id)
        if not partitions:
            raise InternalError("No data in request")
        # what the client reserved for these blocks (spec §2.2); more than the ticket would let
        # memory grow past its capacity, so such a send is refused whatever the ticket says
        data_bytes = sum(b.data_bytes for b in partitions)
        needed = data_bytes + BLOCK_OVERHEAD_BYTES * sum(map(len, partitions))
        if self.crc_check:
            bad = await self._find_bad_block(partitions, data_bytes)
            if bad is not None:
                await self._refuse_corrupt_send(app_id, ticket_id, partitions, bad)
        accepted = await self._take_ticket_and_append(app, app_id, shuffle_id, ticket_id, partitions, needed)
        self.metrics.received_bytes.inc(data_bytes)
        if self.integrity.has_pending(app_id):  # blocks refused earlier for a crc mismatch: resent?
            repaired = self.integrity.on_accepted(app_id, (bid for batch in partitions for bid in batch.block_ids))
            if repaired:
                self.metrics.crc_repaired_blocks.inc(repaired)
        return accepted

    async def _find_bad_block(self, partitions: tuple[BlockBatch, ...], nbytes: int) -> BadBlock | None:
        """``find_bad_block`` of a send: on the loop when small, on a thread when big (see
        ``_CRC_ON_LOOP_BYTES``); the time it took and the bytes are counted."""
        start = time.perf_counter()
        if nbytes <= _CRC_ON_LOOP_BYTES:
            bad = find_bad_block(partitions)
        else:
            bad = await asyncio.get_running_loop().run_in_executor(None, find_bad_block, partitions)
        self.metrics.crc_check_seconds.inc(time.perf_counter() - start)
        self.metrics.crc_checked_bytes.inc(nbytes)
        return bad

    async def _refuse_corrupt_send(self, app_id: str, ticket_id: int, partitions: tuple[BlockBatch, ...],
                                   bad: BadBlock) -> NoReturn:
        """Refuse the whole send (nothing of it is stored: the client resends the whole request), give its
        ticket's reservation back, count it."""
        block_ids = [bid for batch in partitions for bid in batch.block_ids]
        n = self.integrity.on_refused(app_id, block_ids)
        self.metrics.crc_refused_sends.inc()
        self.metrics.crc_refused_blocks.inc(n)
        try:  # the ticket is spent, all of its reservation back before the refusal is answered
            await self.memory.ask(TakeTicket(ticket_id=ticket_id, app_id=app_id, release=True))
        except RiffleError:
            pass  # no such ticket (expired, or never issued): nothing to give back
        raise BlockCorruptError(
            f"block {bad.block_id} of partition {bad.partition_id}: its bytes have crc {bad.actual}, the request "
            f"says {bad.expected}; the whole send ({len(block_ids)} blocks) was refused, nothing stored; resend it "
            f"([app_config] block_crc_check_enable)")

    async def _take_ticket_and_append(self, app: ActorRef, app_id: str, shuffle_id: int, ticket_id: int,
                                      partitions: tuple[BlockBatch, ...], needed: int) -> int:
        """One ask: the MemoryManager takes the ticket (a send carrying more than it reserved is refused
        there: the ticket is spent, its reservation back, nothing stored), funds the send's ``SendTicket``
        and hands the ``AppendBlocks`` on to the app's actor, whose answer is the reply."""
        # the partitions convert the ticket into used memory (its Commits) as their blocks become readable
        ticket = SendTicket(app_id, 0)
        take = TakeTicket(ticket_id=ticket_id, app_id=app_id, needed=needed, fund=ticket,
                          then=Forward(app, AppendBlocks(shuffle_id=shuffle_id, partitions=partitions, ticket=ticket)))
        try:
            reply = self.memory.ask_nowait(take)
        except MailboxFullError:  # not in practice (a million messages): wait for room
            reply = asyncio.ensure_future(self.memory.ask(take))
        reply.add_done_callback(lambda done: self._send_ended(done, ticket))
        try:
            # shielded: a cancelled RPC (client deadline) must not strand a taken ticket's reservation
            return await asyncio.shield(reply)
        except ActorDeadError:
            if app.is_alive:
                raise
            raise NoRegisterError(f"app {app_id!r} was removed") from None

    def _send_ended(self, reply: asyncio.Future, ticket: SendTicket) -> None:
        """A send's ask ended (whether or not its RPC still waits): on a failure, what no partition turned
        into used memory goes back (all of the ticket if the append never ran; ``release_rest`` is
        idempotent, the AppActor may have given it back already)."""
        exc = None if reply.cancelled() else reply.exception()
        if exc is None and not reply.cancelled():
            return
        if isinstance(exc, TicketExceededError):
            self.metrics.oversized_sends.inc()
        tell_commit(self.memory, ticket.release_rest())

    async def report_shuffle_result(self, app_id: str, shuffle_id: int, task_attempt_id: int,
                                    partition_to_block_ids: Iterable[tuple[int, Sequence[int]]]) -> int:
        """Partition ids are checked as the AppActor reaches them (the pairs stay lazy); which partitions
        and how many ids a report may carry is the AppActor's to check (``AppState.report_steps``)."""
        _check_ids(app_id, shuffle_id)
        return await self._ask_app(app_id, ReportShuffleResult(
            shuffle_id=shuffle_id, task_attempt_id=task_attempt_id,
            partition_to_block_ids=_checked_reports(partition_to_block_ids)))

    async def commit_shuffle_task(self, app_id: str, shuffle_id: int) -> int:
        _check_ids(app_id, shuffle_id)
        return await self._ask_app(app_id, CommitShuffleTask(shuffle_id))

    async def finish_shuffle(self, app_id: str, shuffle_id: int) -> None:
        _check_ids(app_id, shuffle_id)
        await self._ask_app(app_id, FinishShuffle(shuffle_id))

    # ------------------------------------------------------------- reads
    async def get_shuffle_result(self, app_id: str, shuffle_id: int, partition_ids: Sequence[int],
                                 layout: BlockIdLayout | None) -> bytes:
        """The serialized block-id bitmap of the partitions; ``layout`` None = the default layout."""
        self._check_partition_list("getShuffleResult", partition_ids)
        await _check_ids_in_steps(app_id, shuffle_id, partition_ids)
        return await self._ask_app(app_id, GetShuffleResult(shuffle_id=shuffle_id, partition_ids=tuple(partition_ids),
                                                            layout=layout))

    async def get_memory_data(self, app_id: str, shuffle_id: int, partition_id: int, last_block_id: int,
                              read_buffer_size: int, task_filter: TaskIdFilter | None) -> list[Block]:
        """Blocks after ``last_block_id`` from memory; ``task_filter`` None = every task's blocks."""
        _check_ids(app_id, shuffle_id, (partition_id,))
        blocks = await self._ask_app(app_id, GetMemoryData(
            shuffle_id=shuffle_id, partition_id=partition_id, last_block_id=last_block_id,
            read_buffer_size=max(1, read_buffer_size), task_filter=task_filter))
        if blocks:
            self.metrics.read_memory_bytes.inc(sum(len(b.data) for b in blocks))
        return blocks

    async def _disk_files(self, app_id: str, shuffle_id: int, partition_id: int,
                          disks: Sequence[str]) -> list[tuple[str, bytes, int]]:
        """(disk, index, data length) of every disk holding a (non-empty) file of the partition, in the
        partition's order of first use: the files of its virtual data file."""
        files = []
        for disk in disks:
            index, length = await self._ask_disk(disk, ReadIndex(app_id=app_id, shuffle_id=shuffle_id,
                                                                partition_id=partition_id))
            if index:
                files.append((disk, index, length))
        return files

    async def get_local_index(self, app_id: str, shuffle_id: int, partition_id: int) -> tuple[bytes, int, list[int]]:
        """(index bytes, data length, storage ids).

        A partition on one disk: its index verbatim, its data length, that disk's storage id. A partition
        whose spills moved to other disks (a disk fault) has a data file on each: they are served as ONE
        virtual data file, the files in order of first use one after the other, so that every client
        generation reads it right (the 0.9 client sends no storageId and would mix the files up; a
        0.10 client with no storage ids sends -1 throughout): the records of file k with their offsets
        shifted by the data length of files 0..k-1, no storage ids, the total length. The bases stay
        the same while readers hold an index: a partition never appends to a disk's file once a later
        one exists (``SpillJob.earlier_disks``)."""
        _check_ids(app_id, shuffle_id, (partition_id,))
        disks = await self._ask_app(app_id, GetPartitionDisks(shuffle_id=shuffle_id, partition_id=partition_id))
        files = await self._disk_files(app_id, shuffle_id, partition_id, disks)
        if not files:
            return b"", 0, []
        if len(files) == 1:
            disk, index, data_len = files[0]
            self.metrics.read_index_bytes.inc(len(index))
            return index, data_len, [self.disk_names.index(disk)]
        size = sum(len(index) for _, index, _ in files)
        if size > _SHIFT_ON_THREAD_BYTES:
            index = await asyncio.to_thread(_virtual_index, files)
        else:
            index = _virtual_index(files)
        self.metrics.read_index_bytes.inc(len(index))
        return index, sum(length for _, _, length in files), []

    async def get_local_data(self, app_id: str, shuffle_id: int, partition_id: int, storage_id: int,
                             offset: int, length: int, as_file: bool = False,
                             next_segments: Sequence[tuple[int, int]] = (), task_attempt_id: int = 0):
        """The bytes of a data-file range; with ``as_file`` a ``DataFile`` (an open descriptor the caller
        must close, for ``sendfile``) instead (or the bytes, where reads bypass the page cache), or
        ``b""`` for an empty range.

        ``storage_id``: an index into this server's disks, or -1 (a urpc V1 request carries none; a 0.9
        gRPC client sends 0); anything else is refused. It does not choose the file: ``offset`` is one of
        the partition's virtual data file (``get_local_index``), mapped onto its files here; a range
        across two files is read from both (as bytes, not ``sendfile``) and joined.
        ``next_segments`` / ``task_attempt_id``: the client's read plan (urpc V3), for read-ahead; the
        disk's read-ahead only uses them when the app asked for read-ahead (``riffle_actors.state.read_ahead``)."""
        _check_ids(app_id, shuffle_id, (partition_id,))
        if not -1 <= storage_id < len(self.disk_names):  # a storageId must make sense, even where unused
            raise InvalidRequestError(f"storageId {storage_id} is not a storage of this server "
                                      f"(it has {len(self.disk_names)}: 0..{len(self.disk_names) - 1})")
        if offset < 0 or length < 0:
            raise InvalidRequestError(f"invalid offset {offset} / length {length}")
        if length > self.max_read_length:
            raise InvalidRequestError(f"length {length} is above the largest read this server serves "
                                      f"({self.max_read_length} bytes, grpc_max_message_size)")
        plan = await self._ask_app(app_id, GetLocalReadPlan(shuffle_id=shuffle_id, partition_id=partition_id))
        disks = plan.disks
        if not disks:
            raise InternalError(f"no local data for app {app_id} shuffle {shuffle_id} partition {partition_id}")
        if length == 0:
            return b""
        hint = None
        if plan.read_ahead is not None:
            hint = ReadAheadHint(client=plan.read_ahead, sequential=plan.sequential, task_attempt_id=task_attempt_id,
                                 next_segments=tuple(next_segments))
        if len(disks) == 1:
            # one file, whatever the storageId (a 0.9 gRPC client sends none: it reads as 0)
            data = await self._read_piece(app_id, shuffle_id, partition_id, disks[0], offset, length, as_file, hint)
        else:
            # several files: the virtual data file of getLocalShuffleIndex for every client; the storageId
            # is not looked at (none was handed out for this partition, and an index of the time it was
            # on one disk has the first file's offsets, which are the same in the virtual file)
            # the bases: the lengths of the files before the last (which never grow once a later one exists)
            files = [*await self._disk_files(app_id, shuffle_id, partition_id, disks[:-1]), (disks[-1], b"", 0)]
            pieces = map_virtual_range([(disk, n) for disk, _, n in files], offset, length)
            if len(pieces) == 1:
                disk, file_offset, n = pieces[0]
                data = await self._read_piece(app_id, shuffle_id, partition_id, disk, file_offset, n, as_file,
                                              _piece_hint(hint, files, disk))
            else:  # a range across two files: both parts as bytes, joined
                parts = [await self._read_piece(app_id, shuffle_id, partition_id, disk, file_offset, n, False,
                                                _piece_hint(hint, files, disk))
                         for disk, file_offset, n in pieces]
                data = b"".join(parts)
        self.metrics.read_local_bytes.inc(length)
        return data

    async def _read_piece(self, app_id: str, shuffle_id: int, partition_id: int, disk: str, offset: int,
                          length: int, as_file: bool, hint: ReadAheadHint | None):
        """One range of the partition's data file on ``disk`` (file offsets), refused when it holds a block
        the scrubber found corrupt or the disk's read check (``read_crc_check_enable``) finds one."""
        corrupt = self.integrity.corrupt_in(app_id, shuffle_id, partition_id, disk, offset, length)
        if corrupt is not None:
            self._refuse_corrupt(app_id, partition_id, disk, corrupt)
        mark = self.integrity.mark()
        data = await self._ask_disk(disk, ReadData(app_id=app_id, shuffle_id=shuffle_id, partition_id=partition_id,
                                                   offset=offset, length=length, as_file=as_file, read_ahead=hint))
        if isinstance(data, CorruptRange):  # the read CRC check found them: recorded as the scrubber's finds are
            new = self.integrity.on_read_checked(app_id, shuffle_id, partition_id, disk, data.blocks, mark)
            if new:
                self.metrics.read_crc_corrupt_blocks.labels(disk).inc(new)
            self._refuse_corrupt(app_id, partition_id, disk, data.blocks[0])
        return data

    def _refuse_corrupt(self, app_id: str, partition_id: int, disk: str, corrupt: CorruptBlock) -> NoReturn:
        self.integrity.on_read_refused(app_id)
        self.metrics.corrupt_reads_refused.inc()
        raise BlockCorruptError(IntegrityLedger.refusal(corrupt, partition_id, disk))

    async def _ask_disk(self, disk: str, msg):
        """A read on one disk; every failure becomes an error status naming the disk, never partial data."""
        try:
            return await self.disk_refs[disk].ask(msg)
        except ActorDeadError:
            raise InternalError(f"disk {disk} restarted during the read; retry") from None
        except DiskIOError as e:
            board = self.disk_health
            health = board[disk] if board is not None else None
            if board is not None and health is not None and not health.placeable:
                raise StorageError(f"{e}; disk {disk} is {health.status.value}: "
                                   f"{health.describe(board.policy)}") from None
            raise
        except RiffleError:
            raise
        except Exception as e:  # noqa: BLE001 - the disk actor crashed on this read
            raise InternalError(f"disk {disk}: read failed: {e!r}") from None

    # ------------------------------------------------------------- lifecycle
    async def app_heartbeat(self, app_id: str) -> None:
        _check_ids(app_id)
        await self._ask_app(app_id, Heartbeat())

    async def unregister_shuffle(self, app_id: str, shuffle_id: int) -> None:
        _check_ids(app_id, shuffle_id)
        self._app(app_id)
        await self.app_manager.tell(PurgeAppShuffle(app_id, shuffle_id))

    async def unregister_app(self, app_id: str) -> None:
        _check_ids(app_id)
        self._app(app_id)
        await self.app_manager.tell(PurgeApp(app_id, "unregistered by client"))

    async def remote_merge(self, app_id: str, shuffle_id: int = 0, partition_id: int = 0) -> NoReturn:
        """startSortMerge / getSortedShuffleData: the ids are checked, then refused (no remote merge here)."""
        _check_ids(app_id, shuffle_id, (partition_id,))
        raise InternalError("Remote merge is disabled")


_SHIFT_ON_THREAD_BYTES = 1 << 20  # a virtual index above this (25k records) is built on a thread


def _virtual_index(files: Sequence[tuple[str, bytes, int]]) -> bytes:
    """The indexes of ``files`` as one, each file's offsets shifted by the data length of those before."""
    parts, base = [], 0
    for _, index, length in files:
        parts.append(shift_offsets(index, base))
        base += length
    return b"".join(parts)


def map_virtual_range(files: Sequence[tuple[str, int]], offset: int, length: int) -> list[tuple[str, int, int]]:
    """``[offset, offset + length)`` of a virtual data file made of ``files`` ((disk, data length), in
    order) as (disk, file offset, length) pieces. The last file takes whatever lies past the others (a
    range past its end is refused by its disk, as on a partition with one file)."""
    pieces: list[tuple[str, int, int]] = []
    base, end = 0, offset + length
    for i, (disk, size) in enumerate(files):
        last = i == len(files) - 1
        top = end if last else base + size
        lo, hi = max(offset, base), min(end, top)
        if lo < hi:
            pieces.append((disk, lo - base, hi - lo))
        base += size
        if base >= end:
            break
    return pieces


def _piece_hint(hint: ReadAheadHint | None, files: Sequence[tuple[str, bytes, int]],
                disk: str) -> ReadAheadHint | None:
    """The read-ahead hint of a read on ``disk``: the client's next segments that lie in that disk's file,
    in its file offsets (the others are left out)."""
    if hint is None or not hint.next_segments:
        return hint
    sizes = [(d, n) for d, _, n in files]
    mapped = []
    for seg_offset, seg_length in hint.next_segments:
        pieces = map_virtual_range(sizes, seg_offset, seg_length)
        if len(pieces) == 1 and pieces[0][0] == disk:
            mapped.append((pieces[0][1], pieces[0][2]))
    return replace(hint, next_segments=tuple(mapped))
