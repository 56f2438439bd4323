"""PartitionActors under their AppActor on a ManualClock: lazy start, routing, append/read/dedup, spills
and their acknowledgements, spill rounds from the size table, finishShuffle, purge, and crashes.

The MemoryManager is the real actor (its budget tells whether the accounting is exact: a
``MarkInFlight`` before the matching ``CommitTicket`` would be ignored, a release counted twice
would show); the SpillDispatcher is a recorder, and the test acknowledges its jobs itself.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import pytest

from riffle_actors.actors.app import AppActor, PartitionCrashedError
from riffle_actors.actors.app_messages import (
    AppendBlocks,
    CheckBufferRequest,
    FinishShuffle,
    GetAppInfo,
    GetMemoryData,
    GetPartitionDisks,
    GetSpillCandidates,
    PurgeShuffle,
    RegisterShuffle,
    SpillPartitions,
)
from riffle_actors.actors.memory import BufferGrant, GetBudget, MemoryManagerActor
from riffle_actors.actors.spill import SpillCompleted, SpillJob
from riffle_actors.errors import HugePartitionBackpressureError, NoBufferError, NoRegisterError
from riffle_actors.records import Block, BlockBatch
from riffle_actors.runtime import (
    Actor,
    ActorDeadError,
    ActorRef,
    ActorSystem,
    InjectedCrash,
    ManualClock,
    Terminated,
)
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.buffer import BLOCK_OVERHEAD_BYTES as OVH
from riffle_actors.state.send import SendTicket
from riffle_actors.state.tickets import TicketBook

APP = "app1"
CAPACITY = 64 << 20


def blk(block_id: int, size: int = 1000, task: int = 0) -> Block:
    data = bytes([block_id % 251]) * size
    return Block(block_id, size, size, zlib.crc32(data), task, data)


def cost(blocks: list[Block]) -> int:
    return sum(len(b.data) + OVH for b in blocks)


class SpillRecorder(Actor):
    """Stands in for the SpillDispatcher: keeps the jobs; the test acknowledges them."""

    def __init__(self) -> None:
        self.jobs: list[SpillJob] = []

    def receive(self, msg: Any) -> None:
        self.jobs.append(msg)


class Watcher(Actor):
    def __init__(self, seen: list[Terminated]) -> None:
        self.seen = seen

    def receive(self, msg: Any) -> None:
        self.seen.append(msg)


class Rig:
    def __init__(self, system: ActorSystem, clock: ManualClock, budget: MemoryBudget, spill: SpillRecorder,
                 app: ActorRef):
        self.system, self.clock, self.budget, self.spill_rec, self.app = system, clock, budget, spill, app

    async def send(self, partitions: dict[int, list[Block]], shuffle_id: int = 0, slack: int = 0) -> int:
        """A send as the ShuffleService makes it: reserve, then AppendBlocks with a SendTicket."""
        size = sum(cost(b) for b in partitions.values()) + slack
        assert self.budget.try_allocate(size)
        return await self.app.ask(self.append_msg(partitions, shuffle_id, size))

    def append_msg(self, partitions: dict[int, list[Block]], shuffle_id: int, size: int) -> AppendBlocks:
        parts = tuple(BlockBatch.of(p, b) for p, b in partitions.items())
        return AppendBlocks(shuffle_id=shuffle_id, partitions=parts, ticket_size=size,
                            ticket=SendTicket(APP, size))

    async def read(self, partition: int, last: int = -1, size: int = 1 << 20, shuffle_id: int = 0,
                   tasks: set[int] | None = None) -> list[int]:
        got = await self.app.ask(GetMemoryData(shuffle_id=shuffle_id, partition_id=partition,
                                               last_block_id=last, read_buffer_size=size, task_filter=tasks))
        return [b.block_id for b in got]

    def partition_actors(self) -> set[str]:
        return {s.name for s in self.system.statistics() if s.name.startswith("part:")}

    def figures(self) -> tuple[int, int, int]:
        b = self.budget
        return b.used, b.allocated, b.in_flight

    async def settled(self) -> None:
        """Every message told so far to the memory manager has been processed."""
        memory = self.system.get("memory")
        assert memory is not None
        await memory.ask(GetBudget())

    async def ack(self, job: SpillJob, disk: str | None = "/d0") -> None:
        data_bytes = sum(len(b.data) for b in job.blocks)
        await job.reply_to.tell(SpillCompleted(shuffle_id=job.shuffle_id, partition_id=job.partition_id,
                                               flight_id=job.flight_id, disk=disk, data_bytes=data_bytes,
                                               epoch=job.epoch))


async def make_rig(system: ActorSystem, clock: ManualClock, *, spill_bytes: int | None = None,
                   huge_threshold: int | None = None, huge_spill: int | None = None,
                   local_order: bool = False) -> Rig:
    budget = MemoryBudget(CAPACITY)
    manager = MemoryManagerActor(budget=budget, tickets=TicketBook(clock, 60.0), high_watermark=0.9,
                                 low_watermark=0.5, clock=clock)
    memory = await system.spawn(manager, "memory")
    rec = SpillRecorder()
    spill = await system.spawn(rec, "spill")
    app = await system.spawn(AppActor(APP, clock=clock, heartbeat_timeout_s=600.0, memory=memory, spill=spill,
                                      single_buffer_spill_bytes=spill_bytes,
                                      huge_threshold_bytes=huge_threshold, huge_spill_bytes=huge_spill),
                             f"app:{APP}")
    await app.ask(RegisterShuffle(shuffle_id=0, ranges=((0, 999),), local_order=local_order))
    return Rig(system, clock, budget, rec, app)


async def test_partition_actors_start_on_first_data_only(system: ActorSystem, clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    assert rig.partition_actors() == set()  # 1000 partitions registered, none started
    blocks = {3: [blk(1), blk(2)], 7: [blk(3)]}
    assert await rig.send(blocks) == cost(blocks[3]) + cost(blocks[7])
    assert rig.partition_actors() == {f"part:{APP}/0.1/3", f"part:{APP}/0.1/7"}
    await rig.send({3: [blk(4)]})
    assert len(rig.partition_actors()) == 2
    info = await rig.app.ask(GetAppInfo())
    assert (info.partition_actors, info.partition_count, info.shuffles[0].partition_actors) == (2, 2, 2)
    assert await rig.read(500) == []  # never written: no actor started for a read
    assert len(rig.partition_actors()) == 2


async def test_append_read_cursor_filter_dedup_and_exact_memory(system: ActorSystem,
                                                                 clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    first = [blk(1, task=1), blk(2, task=2), blk(3, task=1)]
    assert await rig.send({0: first}, slack=100) == cost(first)
    await rig.settled()
    assert rig.figures() == (cost(first), 0, 0)  # the slack of the ticket went back too
    assert await rig.read(0) == [1, 2, 3]
    assert await rig.read(0, last=1) == [2, 3]
    assert await rig.read(0, size=1500) == [1, 2]
    assert await rig.read(0, tasks={1}) == [1, 3]
    # a retried send: duplicates are dropped and their reservation goes back
    assert await rig.send({0: [blk(2, task=2), blk(4)]}) == cost([blk(4)])
    await rig.settled()
    assert rig.figures() == (cost(first) + cost([blk(4)]), 0, 0)
    assert await rig.read(0) == [1, 2, 3, 4]
    info = await rig.app.ask(GetAppInfo())
    assert info.memory_bytes == info.received_bytes == rig.budget.used


async def test_messages_wait_in_order_while_their_actor_starts(system: ActorSystem,
                                                                clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    sizes = [cost([blk(i)]) for i in (1, 2)]
    for s in sizes:
        assert rig.budget.try_allocate(s)
    # both sends and the read are queued before the partition actor exists
    a = asyncio.ensure_future(rig.app.ask(rig.append_msg({5: [blk(1)]}, 0, sizes[0])))
    b = asyncio.ensure_future(rig.app.ask(rig.append_msg({5: [blk(2)]}, 0, sizes[1])))
    r = asyncio.ensure_future(rig.read(5))
    assert await asyncio.gather(a, b) == sizes
    assert await r == [1, 2]


async def test_negative_ids_or_unregistered_partitions_reject_the_whole_send(system: ActorSystem,
                                                                             clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    with pytest.raises(NoRegisterError):
        await rig.send({1: [blk(1)], 5000: [blk(2)]})
    await rig.settled()
    assert rig.figures() == (0, 0, 0) and rig.partition_actors() == set()
    assert await rig.read(1) == []


async def test_a_full_buffer_spills_and_its_acknowledgement_releases_it(system: ActorSystem,
                                                                        clock: ManualClock) -> None:
    rig = await make_rig(system, clock, spill_bytes=2500)
    blocks = [blk(1), blk(2), blk(3)]
    await rig.send({0: blocks})
    (job,) = rig.spill_rec.jobs
    assert [b.block_id for b in job.blocks] == [1, 2, 3] and job.epoch == 1
    assert job.reply_to.name == f"part:{APP}/0.1/0"  # the partition actor owns the acknowledgement
    await rig.settled()
    assert rig.figures() == (cost(blocks), 0, cost(blocks))  # committed, then in flight
    assert await rig.read(0) == [1, 2, 3]  # in flight is still readable
    await rig.ack(job, "/d1")
    await rig.settled()
    assert rig.figures() == (0, 0, 0)
    assert await rig.read(0) == []
    assert await rig.app.ask(GetPartitionDisks(shuffle_id=0, partition_id=0)) == ("/d1",)
    assert await rig.send({0: [blk(1)]}) == 0  # on disk, still de-duplicated


async def test_local_order_spills_sorted_by_task(system: ActorSystem, clock: ManualClock) -> None:
    rig = await make_rig(system, clock, spill_bytes=3000, local_order=True)
    await rig.send({0: [blk(1, task=9), blk(2, task=4), blk(3, task=6)]})
    (job,) = rig.spill_rec.jobs
    assert [b.task_attempt_id for b in job.blocks] == [4, 6, 9]
    await rig.ack(job)


async def test_spill_rounds_use_the_size_table_and_answer_after_marking(system: ActorSystem,
                                                                        clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    await rig.send({1: [blk(1)], 2: [blk(2), blk(3)], 3: [blk(4), blk(5), blk(6)]})
    candidates = sorted(await rig.app.ask(GetSpillCandidates()), reverse=True)
    assert candidates == [(3 * 1032, 0, 3), (2 * 1032, 0, 2), (1032, 0, 1)]
    scheduled = await rig.app.ask(SpillPartitions(((0, 3), (0, 2), (0, 999))))
    assert scheduled == 5 * 1032
    await rig.settled()
    assert rig.budget.in_flight == 5 * 1032
    assert sorted(await rig.app.ask(GetSpillCandidates())) == [(1032, 0, 1)]
    for job in rig.spill_rec.jobs:
        await rig.ack(job)
    await rig.settled()
    assert rig.figures() == (1032, 0, 0)


async def test_finish_shuffle_answers_once_every_batch_is_on_disk(system: ActorSystem,
                                                                  clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    await rig.send({0: [blk(1)], 1: [blk(2)]})
    finish = asyncio.ensure_future(rig.app.ask(FinishShuffle(0)))
    while len(rig.spill_rec.jobs) < 2:
        await asyncio.sleep(0)
    assert not finish.done()
    await rig.ack(rig.spill_rec.jobs[0])
    await rig.read(rig.spill_rec.jobs[0].partition_id)  # the acknowledgement was processed before this
    assert not finish.done()
    await rig.ack(rig.spill_rec.jobs[1])
    await finish
    await rig.settled()
    assert rig.figures() == (0, 0, 0)
    assert not await rig.app.ask(FinishShuffle(0))  # nothing in memory: answered without a spill
    assert len(rig.spill_rec.jobs) == 2


async def test_a_require_buffer_is_one_ask_answered_by_the_memory_manager(system: ActorSystem,
                                                                          clock: ManualClock) -> None:
    """requireBuffer's checks and its reservation in one ask of the AppActor: the MemoryManager answers it.
    A MemoryManager that fails on the reservation (here: crashes) costs that requireBuffer an error, never
    the app (had the AppActor waited for the answer, a failure that is not a ``RiffleError`` would crash it,
    and the app would be purged)."""
    rig = await make_rig(system, clock)
    grant = await rig.app.ask(CheckBufferRequest(shuffle_id=0, partition_ids=(1, 2), size=1000))
    assert grant == BufferGrant(1, ()) and rig.figures() == (0, 1000, 0)
    with pytest.raises(NoBufferError, match="no buffer"):
        await rig.app.ask(CheckBufferRequest(shuffle_id=0, partition_ids=(1,), size=CAPACITY))
    with pytest.raises(NoRegisterError):  # the AppActor's checks first: nothing reserved
        await rig.app.ask(CheckBufferRequest(shuffle_id=9, partition_ids=(1,), size=10))
    assert rig.figures() == (0, 1000, 0)
    system.inject_crash("memory")
    with pytest.raises(InjectedCrash):  # the asker gets the MemoryManager's failure (INTERNAL_ERROR on the wire)
        await rig.app.ask(CheckBufferRequest(shuffle_id=0, partition_ids=(1,), size=10))
    assert rig.app.is_alive
    with pytest.raises(ActorDeadError):  # stopped (unsupervised here; the server's restarts and keeps its mail)
        await rig.app.ask(CheckBufferRequest(shuffle_id=0, partition_ids=(1,), size=10))
    assert rig.app.is_alive
    assert await rig.app.ask(CheckBufferRequest(shuffle_id=0, partition_ids=(1,))) == ()


async def test_huge_partitions_get_backpressure_and_a_spill(system: ActorSystem, clock: ManualClock) -> None:
    rig = await make_rig(system, clock, spill_bytes=1 << 20, huge_threshold=3000, huge_spill=1 << 20)
    await rig.send({0: [blk(i) for i in range(4)], 1: [blk(10)]})
    check = CheckBufferRequest(shuffle_id=0, partition_ids=(1, 0), limit_bytes=2000)
    with pytest.raises(HugePartitionBackpressureError):
        await rig.app.ask(check)
    await rig.read(0)  # the spill order reached the partition before this read
    assert [j.partition_id for j in rig.spill_rec.jobs] == [0]
    assert (await rig.app.ask(GetAppInfo())).shuffles[0].huge_partitions == 1
    await rig.ack(rig.spill_rec.jobs[0])
    await rig.read(0)
    assert await rig.app.ask(check) == ()  # accepted; no partition to split


async def test_purge_releases_staging_and_in_flight_and_stops_the_partitions(system: ActorSystem,
                                                                             clock: ManualClock) -> None:
    rig = await make_rig(system, clock, spill_bytes=2000)
    await rig.send({0: [blk(1), blk(2)], 1: [blk(3)]})  # 0 spills, 1 stays staged
    (job,) = rig.spill_rec.jobs
    await rig.settled()
    assert rig.figures() == (3 * 1032, 0, 2 * 1032)
    part0 = job.reply_to
    assert await rig.app.ask(PurgeShuffle(0)) == 1
    await asyncio.wait_for(poll_stopped(part0), 5)
    while rig.partition_actors():
        await asyncio.sleep(0)
    await rig.settled()
    assert rig.figures() == (0, 0, 0)
    with pytest.raises(ActorDeadError):  # the dispatcher ignores this: the purge released the batch
        await rig.ack(job)
    with pytest.raises(NoRegisterError):
        await rig.send({0: [blk(9)]})
    # registered again: a new incarnation, new actors
    await rig.app.ask(RegisterShuffle(shuffle_id=0, ranges=((0, 9),), local_order=False))
    await rig.send({0: [blk(1)]})
    assert rig.partition_actors() == {f"part:{APP}/0.2/0"}
    assert await rig.read(0) == [1]


async def poll_stopped(ref: ActorRef) -> None:
    while ref.is_alive:
        await asyncio.sleep(0)


async def test_a_purge_while_the_actor_starts_fails_the_waiting_send_and_releases_it(
        system: ActorSystem, clock: ManualClock) -> None:
    rig = await make_rig(system, clock)
    size = cost([blk(1)])
    assert rig.budget.try_allocate(size)
    send = asyncio.ensure_future(rig.app.ask(rig.append_msg({4: [blk(1)]}, 0, size)))
    purge = asyncio.ensure_future(rig.app.ask(PurgeShuffle(0)))
    with pytest.raises(NoRegisterError):
        await send
    await purge
    for _ in range(50):
        await asyncio.sleep(0)
    await rig.settled()
    assert rig.figures() == (0, 0, 0) and rig.partition_actors() == set()


async def test_a_crashed_partition_actor_crashes_its_app_and_nothing_is_left_reserved(
        system: ActorSystem, clock: ManualClock) -> None:
    rig = await make_rig(system, clock, spill_bytes=2000)
    seen: list[Terminated] = []
    watcher = await system.spawn(Watcher(seen), "watcher")
    rig.app.watch(watcher)
    await rig.send({0: [blk(1), blk(2)], 1: [blk(3)]})
    ref0 = system.get(f"part:{APP}/0.1/0")
    assert ref0 is not None
    # a send whose part for partition 0 is still queued when that partition crashes
    size = cost([blk(4)]) + cost([blk(5)])
    assert rig.budget.try_allocate(size)
    send = asyncio.ensure_future(rig.app.ask(rig.append_msg({1: [blk(4)], 0: [blk(5)]}, 0, size)))
    await asyncio.sleep(0)
    ref0.crash(RuntimeError("bug in the partition actor"))
    with pytest.raises(ActorDeadError):
        await send
    while not seen:
        await asyncio.sleep(0)
    reason = seen[0].reason
    assert isinstance(reason, PartitionCrashedError) and "bug in the partition actor" in str(reason)
    assert not rig.app.is_alive
    assert rig.partition_actors() == set()  # the other partitions were stopped with the app
    await rig.settled()
    # nothing stays reserved; the app's used bytes go with its purge (the AppManager's PurgeAppMemory)
    assert rig.budget.allocated == 0
    rig.budget.purge_app(APP)
    assert rig.figures() == (0, 0, 0)



