"""A small Uniffle shuffle client over gRPC that behaves like the Java client (tests only).

Works with any generated ``rss.common`` module pair: our ``riffle_actors.protocol.proto``
(the default) or the upstream ``Rss.proto`` compiled by ``tests.helpers.upstream_proto``.
Fields that a proto version lacks (0.9.2 has no ``storageIds``/``storageId``) are simply
not used, as the matching Java client would not use them.

Writer (``send_blocks``): ``requireBuffer`` for Σ(len + 32), backoff and retry on NO_BUFFER,
then ``sendShuffleData`` with the ticket; a failed send (INTERNAL_ERROR, NO_BUFFER) is
retried with a new ticket; NO_REGISTER and friends fail at once (spec §2.13).

Reader (``read_partition``), like ``ShuffleReadClientImpl``:

1. memory tier: ``getMemoryShuffleData`` from ``lastBlockId = -1``, then the blockId of the
   last returned segment, until an empty response;
2. local-file tier: ``getLocalShuffleIndex``, segmentation of the index exactly as spec §5.4
   (``split_index``: readBufferSize R, runs of adjacent records, storage ids, dataFileLen), one
   ``getLocalShuffleData`` per segment that holds a wanted block, whose size must be exactly
   the segment length;
3. every block is consumed at most once (de-duplicated by id), only if it is expected, and
   its crc32 is checked; at the end every expected block must have been read ("Blocks read
   inconsistent" in Java).

See also: spec §2.6-2.8, §5.4; ``tests.helpers.upstream_proto``.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple, Self

import grpc

from riffle_actors.protocol.bitmap import BlockIdSet, deserialize_block_ids, serialize_block_ids
from riffle_actors.protocol.blockid import SPARK_DEFAULT, BlockIdLayout
from riffle_actors.protocol.index import decode_index
from riffle_actors.protocol.proto import uniffle_pb2, uniffle_pb2_grpc

SUCCESS = 0
NO_BUFFER = 2
NO_REGISTER = 4
INTERNAL_ERROR = 6
NO_BUFFER_FOR_HUGE_PARTITION = 10
NOT_RETRIABLE = {NO_REGISTER, 12, 13, 14}
GRPC_OPTIONS = [("grpc.max_receive_message_length", (1 << 31) - 1), ("grpc.max_send_message_length", 1 << 30)]
BLOCK_OVERHEAD = 32  # per-block bytes the Java client adds to requireSize


class UniffleError(Exception):
    def __init__(self, rpc: str, status: int, msg: str):
        self.rpc = rpc
        self.status = status
        super().__init__(f"{rpc} failed: status {status}: {msg}")


class BlockSpec(NamedTuple):
    """One block as a writer produced it."""

    block_id: int
    partition_id: int
    task_attempt_id: int
    data: bytes
    crc: int
    uncompress_length: int


def make_blocks(partition_id: int, task_attempt_id: int, count: int, size: int, *,
                layout: BlockIdLayout = SPARK_DEFAULT, seq_start: int = 0,
                rng: random.Random | None = None) -> list[BlockSpec]:
    """``count`` blocks of ``size`` random bytes with Spark-layout ids (sequenceNo counts up)."""
    rng = rng or random.Random(partition_id * 1_000_003 + task_attempt_id)
    out = []
    for i in range(count):
        data = rng.randbytes(size)
        bid = layout.get_block_id(seq_start + i, partition_id, task_attempt_id)
        out.append(BlockSpec(bid, partition_id, task_attempt_id, data, zlib.crc32(data), size * 2))
    return out


async def write_block_by_block(client: Any, app_id: str, partitions: Sequence[int], count: int = 6,
                               size: int = 300_000) -> list[BlockSpec]:
    """Register shuffle 0 of ``app_id``, send ``count`` blocks of ``size`` bytes per partition, one block
    per send (so a small spill threshold spills each), and report them; the blocks written."""
    await client.register_shuffle(app_id, 0, partitions)
    blocks = [b for p in partitions for b in make_blocks(p, 1, count, size)]
    for b in blocks:
        await client.send_blocks(app_id, 0, [b])
    await client.report(app_id, 0, 1, blocks)
    return blocks


def require_size(blocks: Iterable[BlockSpec]) -> int:
    return sum(len(b.data) + BLOCK_OVERHEAD for b in blocks)


# ---------------------------------------------------------------------------- index segmentation
@dataclass(slots=True)
class SegmentBlock:
    block_id: int
    buffer_offset: int
    length: int
    crc: int
    task_attempt_id: int
    file_offset: int


@dataclass(slots=True)
class Segment:
    """A run of adjacent index records read with one getLocalShuffleData (Java ShuffleDataSegment)."""

    offset: int
    storage_id: int
    length: int = 0
    blocks: list[SegmentBlock] = field(default_factory=list)


def split_index(index: bytes, data_file_len: int, storage_ids: Sequence[int], read_buffer_size: int,
                task_filter: Container[int] | None = None) -> list[Segment]:
    """Spec §5.4: turn an index into read segments exactly as the 0.10 client does."""
    segments: list[Segment] = []
    cur: Segment | None = None
    storage_index = 0
    prev_offset = -1
    total = 0
    for e in decode_index(index):
        if storage_ids and prev_offset != -1 and e.offset < prev_offset:
            storage_index += 1  # the next concatenated index file started
        prev_offset = e.offset
        sid = storage_ids[storage_index] if storage_ids else -1
        total += e.length
        if data_file_len != -1 and total > data_file_len:
            break
        passes = task_filter is None or e.task_attempt_id in task_filter
        if cur is not None and (cur.length >= read_buffer_size or cur.storage_id != sid or not passes):
            segments.append(cur)
            cur = None
        if passes:
            if cur is None:
                cur = Segment(offset=e.offset, storage_id=sid)
            cur.blocks.append(SegmentBlock(e.block_id, cur.length, e.length, e.crc, e.task_attempt_id, e.offset))
            cur.length += e.length
    if cur is not None:
        segments.append(cur)
    return segments


@dataclass(slots=True)
class ReadStats:
    memory_calls: int = 0
    memory_blocks: int = 0
    index_calls: int = 0
    index_blocks: int = 0  # records seen in index answers (read or not)
    data_calls: int = 0
    file_blocks: int = 0
    skipped_segments: int = 0


# ---------------------------------------------------------------------------- the client
class UniffleClient:
    """One gRPC channel to one shuffle server; see the module docstring."""

    def __init__(self, target: str, pb: ModuleType = uniffle_pb2, pb_grpc: ModuleType = uniffle_pb2_grpc, *,
                 layout: BlockIdLayout = SPARK_DEFAULT, read_buffer_size: int = 14 << 20,
                 retry_deadline_s: float = 30.0, backoff_s: float = 0.005, backoff_max_s: float = 0.1,
                 channel: Any = None):
        """``channel``: a ``grpc.aio``-shaped channel to use instead of one to ``target`` (the
        simulation's in-process channel, ``tests.sim.loop.InProcessChannel``)."""
        self.target = target
        self.pb = pb
        self.channel = channel if channel is not None else grpc.aio.insecure_channel(target, options=GRPC_OPTIONS)
        self.stub = pb_grpc.ShuffleServerStub(self.channel)
        self.layout = layout
        self.read_buffer_size = read_buffer_size
        self.retry_deadline_s = retry_deadline_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.no_buffer_retries = 0
        self.send_retries = 0
        self.statuses: Counter[int] = Counter()  # every status code the server answered
        self._has_storage_ids = "storageIds" in pb.GetLocalShuffleIndexResponse.DESCRIPTOR.fields_by_name
        self._has_storage_id = "storageId" in pb.GetLocalShuffleDataRequest.DESCRIPTOR.fields_by_name

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check(self, rpc: str, resp: Any) -> Any:
        self.statuses[resp.status] += 1
        if resp.status != SUCCESS:
            raise UniffleError(rpc, resp.status, resp.retMsg)
        return resp

    # ------------------------------------------------------------- driver
    async def register_shuffle(self, app_id: str, shuffle_id: int, partitions: Iterable[int], *,
                               local_order: bool = False, user: str = "tester",
                               remote_storage: str = "", remote_conf: Mapping[str, str] | None = None,
                               properties: Mapping[str, str] | None = None) -> None:
        pb = self.pb
        extra: dict[str, Any] = {}
        if properties:  # the client's Spark conf (0.10+ clients send it with each registration)
            extra["properties"] = dict(properties)
        if remote_storage:  # the HDFS tier: where this app's HDFS files go (spec §2.1)
            extra["remoteStorage"] = pb.RemoteStorage(path=remote_storage, remoteStorageConf=[
                pb.RemoteStorageConfItem(key=k, value=v) for k, v in (remote_conf or {}).items()])
        req = pb.ShuffleRegisterRequest(
            appId=app_id, shuffleId=shuffle_id, user=user, **extra,
            partitionRanges=[pb.ShufflePartitionRange(start=p, end=p) for p in partitions],
            shuffleDataDistribution=pb.DataDistribution.Value("LOCAL_ORDER" if local_order else "NORMAL"))
        self._check("registerShuffle", await self.stub.registerShuffle(req))

    async def heartbeat(self, app_id: str) -> None:
        self._check("appHeartbeat", await self.stub.appHeartbeat(self.pb.AppHeartBeatRequest(appId=app_id)))

    async def unregister_app(self, app_id: str) -> None:
        self._check("unregisterShuffleByAppId", await self.stub.unregisterShuffleByAppId(
            self.pb.ShuffleUnregisterByAppIdRequest(appId=app_id)))

    async def unregister_shuffle(self, app_id: str, shuffle_id: int) -> None:
        self._check("unregisterShuffle", await self.stub.unregisterShuffle(
            self.pb.ShuffleUnregisterRequest(appId=app_id, shuffleId=shuffle_id)))

    # ------------------------------------------------------------- writer
    async def _backoff(self, attempt: int) -> None:
        # client-side retry pacing (the Java client sleeps too); not a wait for a test condition
        await asyncio.sleep(min(self.backoff_max_s, self.backoff_s * (2 ** min(attempt, 10))))

    async def require_buffer(self, app_id: str, shuffle_id: int, size: int,
                             partition_ids: Sequence[int] = ()) -> int:
        """A ticket id; retries NO_BUFFER with backoff until the retry deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_deadline_s
        attempt = 0
        while True:
            resp = await self.stub.requireBuffer(self.pb.RequireBufferRequest(
                requireSize=size, appId=app_id, shuffleId=shuffle_id, partitionIds=list(partition_ids)))
            self.statuses[resp.status] += 1
            if resp.status == SUCCESS:
                return resp.requireBufferId
            if resp.status not in (NO_BUFFER, NO_BUFFER_FOR_HUGE_PARTITION) or loop.time() > deadline:
                raise UniffleError("requireBuffer", resp.status, resp.retMsg)
            self.no_buffer_retries += 1
            attempt += 1
            await self._backoff(attempt)

    def send_request(self, app_id: str, shuffle_id: int, ticket: int, blocks: Sequence[BlockSpec]) -> Any:
        pb = self.pb
        by_partition: dict[int, list[BlockSpec]] = {}
        for b in blocks:
            by_partition.setdefault(b.partition_id, []).append(b)
        return pb.SendShuffleDataRequest(
            appId=app_id, shuffleId=shuffle_id, requireBufferId=ticket,
            shuffleData=[pb.ShuffleData(partitionId=pid, block=[
                pb.ShuffleBlock(blockId=b.block_id, length=len(b.data), uncompressLength=b.uncompress_length,
                                crc=b.crc, data=b.data, taskAttemptId=b.task_attempt_id) for b in bl])
                for pid, bl in by_partition.items()])

    def send_require_size(self, app_id: str, shuffle_id: int, blocks: Sequence[BlockSpec]) -> int:
        """The requireBuffer size of one send (gRPC: Σ(len + 32); the urpc client adds its message size)."""
        return require_size(blocks)

    async def send_blocks(self, app_id: str, shuffle_id: int, blocks: Sequence[BlockSpec]) -> None:
        """requireBuffer + sendShuffleData with the Java client's retries; returns once acknowledged."""
        size = self.send_require_size(app_id, shuffle_id, blocks)
        pids = sorted({b.partition_id for b in blocks})
        attempt = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_deadline_s
        while True:
            ticket = await self.require_buffer(app_id, shuffle_id, size, pids)
            resp = await self.stub.sendShuffleData(self.send_request(app_id, shuffle_id, ticket, blocks))
            self.statuses[resp.status] += 1
            if resp.status == SUCCESS:
                return
            if resp.status in NOT_RETRIABLE or loop.time() > deadline:
                raise UniffleError("sendShuffleData", resp.status, resp.retMsg)
            self.send_retries += 1
            attempt += 1
            await self._backoff(attempt)

    async def report(self, app_id: str, shuffle_id: int, task_attempt_id: int, blocks: Iterable[BlockSpec]) -> None:
        pb = self.pb
        by_partition: dict[int, list[int]] = {}
        for b in blocks:
            by_partition.setdefault(b.partition_id, []).append(b.block_id)
        self._check("reportShuffleResult", await self.stub.reportShuffleResult(pb.ReportShuffleResultRequest(
            appId=app_id, shuffleId=shuffle_id, taskAttemptId=task_attempt_id, bitmapNum=1,
            partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=p, blockIds=ids)
                                 for p, ids in by_partition.items()])))

    # ------------------------------------------------------------- reader
    def _layout_msg(self) -> Any:
        s, p, t = self.layout.as_tuple()
        return self.pb.BlockIdLayout(sequenceNoBits=s, partitionIdBits=p, taskAttemptIdBits=t)

    async def get_shuffle_result(self, app_id: str, shuffle_id: int, partitions: Iterable[int]) -> BlockIdSet:
        resp = self._check("getShuffleResultForMultiPart", await self.stub.getShuffleResultForMultiPart(
            self.pb.GetShuffleResultForMultiPartRequest(appId=app_id, shuffleId=shuffle_id,
                                                        partitions=list(partitions), blockIdLayout=self._layout_msg())))
        return deserialize_block_ids(resp.serializedBitmap)

    async def read_partition(self, app_id: str, shuffle_id: int, partition_id: int, expected: Container[int] | None,
                             *, partition_num: int = 1, read_buffer_size: int | None = None,
                             task_ids: Iterable[int] | None = None, check_complete: bool = True,
                             stats: ReadStats | None = None, max_memory_calls: int = 100_000,
                             partition_of_layout: bool = True) -> dict[int, bytes]:
        """Read one partition from memory then local files; block id -> bytes (crc-checked).

        ``expected``: the block ids to consume (None = every block seen); with ``partition_of_layout``
        only those whose partition (decoded with the client's layout) is ``partition_id`` count.
        ``task_ids``: the expected task attempt ids, sent as the memory filter and applied to the index.
        """
        pb = self.pb
        rbs = read_buffer_size or self.read_buffer_size
        stats = stats if stats is not None else ReadStats()
        if expected is not None and partition_of_layout:
            # like the Java reader: of the reported ids keep those whose partition is the one read
            expected = {bid for bid in expected if self.layout.partition_id(bid) == partition_id}  # type: ignore[attr-defined]
        task_filter = set(task_ids) if task_ids is not None else None
        filter_bytes = serialize_block_ids(task_filter) if task_filter is not None else b""
        got: dict[int, bytes] = {}

        def consume(block_id: int, crc: int, data: bytes) -> bool:
            if block_id in got or (expected is not None and block_id not in expected):
                return False
            actual = zlib.crc32(data)
            if actual != crc:
                raise AssertionError(f"crc mismatch for block {block_id}: {actual} != {crc} ({len(data)} bytes)")
            got[block_id] = data
            return True

        # 1. memory, lastBlockId cursor
        last = -1
        while True:
            stats.memory_calls += 1
            if stats.memory_calls > max_memory_calls:
                raise AssertionError(f"memory cursor of partition {partition_id} did not terminate")
            resp = self._check("getMemoryShuffleData", await self.stub.getMemoryShuffleData(
                pb.GetMemoryShuffleDataRequest(appId=app_id, shuffleId=shuffle_id, partitionId=partition_id,
                                               lastBlockId=last, readBufferSize=rbs,
                                               serializedExpectedTaskIdsBitmap=filter_bytes)))
            segs = resp.shuffleDataBlockSegments
            if not segs:
                break
            for seg in segs:
                if task_filter is not None and seg.taskAttemptId not in task_filter:
                    raise AssertionError(f"memory returned block {seg.blockId} of a filtered task {seg.taskAttemptId}")
                if consume(seg.blockId, seg.crc, resp.data[seg.offset:seg.offset + seg.length]):
                    stats.memory_blocks += 1
            last = segs[-1].blockId

        # 2. local files: index, then one data read per useful segment
        stats.index_calls += 1
        ix = self._check("getLocalShuffleIndex", await self.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
            appId=app_id, shuffleId=shuffle_id, partitionId=partition_id, partitionNumPerRange=1,
            partitionNum=partition_num)))
        storage_ids = list(ix.storageIds) if self._has_storage_ids else []
        stats.index_blocks += len(ix.indexData) // 40
        for seg in split_index(ix.indexData, ix.dataFileLen, storage_ids, rbs, task_filter):
            if all(b.block_id in got or (expected is not None and b.block_id not in expected) for b in seg.blocks):
                stats.skipped_segments += 1
                continue
            kwargs: dict[str, Any] = {}
            if self._has_storage_id:
                kwargs["storageId"] = seg.storage_id
            stats.data_calls += 1
            resp = self._check("getLocalShuffleData", await self.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
                appId=app_id, shuffleId=shuffle_id, partitionId=partition_id, partitionNumPerRange=1,
                partitionNum=partition_num, offset=seg.offset, length=seg.length, **kwargs)))
            if len(resp.data) != seg.length:
                raise AssertionError(f"getLocalShuffleData returned {len(resp.data)} bytes, asked {seg.length}")
            for b in seg.blocks:
                if b.file_offset != seg.offset + b.buffer_offset:
                    raise AssertionError(f"index records of segment at {seg.offset} are not contiguous")
                if consume(b.block_id, b.crc, resp.data[b.buffer_offset:b.buffer_offset + b.length]):
                    stats.file_blocks += 1

        if check_complete and expected is not None:
            missing = [bid for bid in expected if bid not in got]  # type: ignore[attr-defined]
            if missing:
                raise AssertionError(f"Blocks read inconsistent: partition {partition_id} misses {len(missing)} "
                                     f"blocks, e.g. {missing[:5]}")
        return got


def blocks_by_id(blocks: Iterable[BlockSpec]) -> dict[int, BlockSpec]:
    return {b.block_id: b for b in blocks}


def assert_read_matches(got: Mapping[int, bytes], written: Iterable[BlockSpec]) -> None:
    """Every written block was read back byte-exact, and nothing else."""
    want = {b.block_id: b.data for b in written}
    assert set(got) == set(want), f"read {len(got)} blocks, wrote {len(want)}: " \
                                  f"missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}"
    for bid, data in want.items():
        assert got[bid] == data, f"block {bid} differs"
