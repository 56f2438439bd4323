"""Spill under memory pressure, reads racing the spill, expiry of tickets and apps, graceful stop.

The invariant every test here checks in one form or another: a block acknowledged by
sendShuffleData stays readable, byte-exact, through memory or the local files (spec §2.3
visibility, §2.6 memory invariants), and nothing is left behind once an app is gone
(budget used/allocated/in-flight 0, no tickets, no app directory). Time-driven behaviour
(ticket and app expiry) runs on a ManualClock; the tests advance it and wait on conditions.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections import defaultdict

import aiohttp
import grpc
import pytest

from riffle_actors.actors.spill import DiskHealthChanged, GetSpillStats
from riffle_actors.runtime import ManualClock
from riffle_actors.io import localfile
from riffle_actors.protocol.index import decode_index
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from tests.conftest import stop_server
from tests.helpers import app_dirs, budget_figures, gather_all, poll_until, wait_server_clean
from tests.helpers.client import (
    BlockSpec,
    ReadStats,
    UniffleClient,
    UniffleError,
    assert_read_matches,
    make_blocks,
    require_size,
)

pytestmark = pytest.mark.integration

APP = "application_spill_1"
PARTITIONS = 8


def client_for(srv) -> UniffleClient:
    return UniffleClient(f"127.0.0.1:{srv.grpc_port}", read_buffer_size=100 << 10)


async def read_everything(client: UniffleClient, app_id: str, shuffle_id: int, written: list[BlockSpec],
                          partitions=range(PARTITIONS)) -> ReadStats:
    """The reduce side: shuffle result, then every partition read like the Java client, byte-exact."""
    ids = await client.get_shuffle_result(app_id, shuffle_id, partitions)
    assert set(ids) == {b.block_id for b in written}
    stats = ReadStats()
    for p in partitions:
        got = await client.read_partition(app_id, shuffle_id, p, ids, partition_num=PARTITIONS, stats=stats)
        assert_read_matches(got, [b for b in written if b.partition_id == p])
    return stats


# ---------------------------------------------------------------------------- spill under pressure
async def test_spill_under_pressure_with_reads_racing(server_factory) -> None:
    """Write > 3x the memory capacity while readers keep reading everything acknowledged so far."""
    srv = await server_factory(capacity="4M")
    capacity = srv.cfg.memory_store.capacity
    writers, sends_per_writer, block_size = 6, 14, 24 << 10
    acked: dict[int, set[int]] = defaultdict(set)  # partition -> ids acknowledged by a send
    written: list[BlockSpec] = []
    writers_done = asyncio.Event()
    sweeps = [0]
    racing = ReadStats()

    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, range(PARTITIONS))

        async def writer(task: int) -> None:
            rng = random.Random(task)
            mine: list[BlockSpec] = []
            for i in range(sends_per_writer):
                # one block per partition per send, like a map task's buffer flush
                blocks = [b for p in range(PARTITIONS)
                          for b in make_blocks(p, task, 1, block_size + rng.randrange(1024), seq_start=i, rng=rng)]
                await client.send_blocks(APP, 0, blocks)
                for b in blocks:
                    acked[b.partition_id].add(b.block_id)
                mine.extend(blocks)
            await client.report(APP, 0, task, mine)
            written.extend(mine)

        async def reader(first: int) -> None:
            p = first
            mine = 0
            while not writers_done.is_set() or mine < 2:
                snapshot = set(acked[p])  # everything acknowledged before this sweep started
                got = await client.read_partition(APP, 0, p, snapshot, partition_num=PARTITIONS, stats=racing)
                assert set(got) == snapshot
                sweeps[0] += 1
                mine += 1
                p = (p + 1) % PARTITIONS

        async def write_all() -> None:
            try:
                await gather_all(*(writer(t) for t in range(writers)))
            finally:
                writers_done.set()

        await gather_all(write_all(), *(reader(r * 2) for r in range(4)))

        total = sum(require_size([b]) for b in written)
        assert total >= 3 * capacity
        assert sweeps[0] >= 8
        # the sweeps found data in memory and in the files: they did race the spill
        assert racing.memory_blocks > 0 and racing.index_blocks > 0, racing
        stats = await read_everything(client, APP, 0, written)
        assert stats.file_blocks > 0
        spill_stats = await srv.spill.ask(GetSpillStats())
        assert spill_stats.completed > 0 and spill_stats.failed_attempts == 0
        assert budget_figures(srv)[0] <= capacity
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


async def test_local_order_spill_and_task_filter(server_factory) -> None:
    """LOCAL_ORDER shuffles are spilled sorted by task; filtered reads get exactly their tasks' blocks."""
    srv = await server_factory(capacity="4M", hybrid_store={"memory_single_buffer_max_spill_size": "256K"})
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, range(2), local_order=True)
        written: list[BlockSpec] = []
        for round_ in range(6):
            blocks = [b for task in (3, 1, 2) for b in make_blocks(1, task, 2, 20_000, seq_start=round_ * 2)]
            await client.send_blocks(APP, 0, blocks)
            written.extend(blocks)
        for task in (1, 2, 3):
            await client.report(APP, 0, task, [b for b in written if b.task_attempt_id == task])
        ix = await client.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(appId=APP, shuffleId=0,
                                                                                   partitionId=1))
        entries = decode_index(ix.indexData)
        assert entries, "the single-buffer limit spilled the partition"
        # within each spilled batch the records are sorted by task and contiguous in the file
        assert [e.offset for e in entries] == sorted(e.offset for e in entries)
        ids = await client.get_shuffle_result(APP, 0, [1])
        wanted = {b.block_id for b in written if b.task_attempt_id in (1, 3)}
        got = await client.read_partition(APP, 0, 1, {i for i in ids if i in wanted}, task_ids=[1, 3])
        assert_read_matches(got, [b for b in written if b.task_attempt_id in (1, 3)])
        got = await client.read_partition(APP, 0, 1, ids)
        assert_read_matches(got, written)
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


async def test_purge_while_spilling_leaves_nothing(server_factory) -> None:
    """Unregister an app while its sends and spills are in flight: no memory, ticket or file survives."""
    srv = await server_factory(capacity="4M", hybrid_store={"memory_single_buffer_max_spill_size": "128K"})
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, range(PARTITIONS))
        sent = [0]

        async def writer(task: int) -> None:
            for seq in range(1000):
                blocks = make_blocks(task % PARTITIONS, task, 2, 30_000, seq_start=seq * 2)
                try:
                    await client.send_blocks(APP, 0, blocks)
                except UniffleError as e:
                    assert e.status == pb.NO_REGISTER
                    return
                sent[0] += 1

        tasks = [asyncio.ensure_future(writer(t)) for t in range(8)]
        try:
            await poll_until(lambda: sent[0] >= 60 and app_dirs(srv, APP))
            await client.unregister_app(APP)
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await wait_server_clean(srv, APP)
        # a late spill must not recreate the files
        async def spill_idle() -> bool:
            stats = await srv.spill.ask(GetSpillStats())
            return stats.pending == 0 and stats.running == 0

        await poll_until(spill_idle)
        assert app_dirs(srv, APP) == []


async def test_cancelled_sends_keep_the_accounting_exact(server_factory, manual_clock: ManualClock) -> None:
    """Sends whose RPC the client cancels (deadline) neither strand reservations nor miscount memory."""
    srv = await server_factory(clock=manual_clock, capacity="64M",
                               hybrid_store={"memory_single_buffer_max_spill_size": "64M"})
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, range(PARTITIONS))
        cancelled = 0

        async def writer(task: int) -> None:
            nonlocal cancelled
            for seq in range(0, 24, 4):
                blocks = make_blocks(task % PARTITIONS, task, 4, 20_000, seq_start=seq)
                t = await client.require_buffer(APP, 0, require_size(blocks))
                try:
                    await client.stub.sendShuffleData(client.send_request(APP, 0, t, blocks),
                                                      timeout=random.choice([0.0005, 0.002, 5]))
                except grpc.aio.AioRpcError:
                    cancelled += 1

        await gather_all(*(writer(t) for t in range(16)))
        assert cancelled > 0

        async def used_matches_buffers() -> bool:
            apps = await srv.admin.apps()
            return srv.budget.used == apps[0]["memory_bytes"] and srv.budget.in_flight == 0

        await poll_until(used_matches_buffers)
        # tickets never taken by a send expire and give their reservation back
        manual_clock.advance(srv.cfg.memory_store.buffer_ticket_timeout_sec + 1)
        await poll_until(lambda: srv.budget.allocated == 0 and len(srv.tickets) == 0)
        assert await used_matches_buffers()
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


async def test_partition_files_on_two_disks(server_factory) -> None:
    """A disk taken out of rotation: the partition continues on another disk, read as one virtual file."""
    srv = await server_factory(capacity="4M")
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, [0])
        first = make_blocks(0, 1, 5, 30_000)
        await client.send_blocks(APP, 0, first)
        await client.stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=0))
        used = [d for d in srv.cfg.localfile_store.data_paths
                if os.path.exists(localfile.partition_paths(d, APP, 0, 0)[0])]
        assert len(used) == 1
        await srv.spill.tell(DiskHealthChanged(used[0], False, "taken out by the test"))
        second = make_blocks(0, 2, 5, 30_000)
        await client.send_blocks(APP, 0, second)
        await client.stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=0))
        await client.report(APP, 0, 1, first)
        await client.report(APP, 0, 2, second)
        ix = await client.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(appId=APP, shuffleId=0,
                                                                                   partitionId=0))
        # one virtual data file (issue 21): no storage ids, the second file's offsets after the first's
        assert list(ix.storageIds) == []
        assert ix.dataFileLen == sum(len(b.data) for b in first + second)
        entries = decode_index(ix.indexData)
        assert [e.block_id for e in entries] == [b.block_id for b in first + second]
        assert [e.offset for e in entries] == list(itertools.accumulate((len(b.data) for b in first + second),
                                                                        initial=0))[:-1]
        # whatever storageId a client sends (-1, or 0 from a 0.9 client), the offset names one place
        base = sum(len(b.data) for b in first)
        for sid in (-1, 0, 1):
            for off, block in ((0, first[0]), (base, second[0])):
                resp = await client.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
                    appId=APP, shuffleId=0, partitionId=0, offset=off, length=len(block.data), storageId=sid))
                assert resp.data == block.data
        resp = await client.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
            appId=APP, shuffleId=0, partitionId=0, offset=0, length=10, storageId=7))
        assert resp.status == pb.INVALID_REQUEST
        ids = await client.get_shuffle_result(APP, 0, [0])
        stats = ReadStats()
        assert_read_matches(await client.read_partition(APP, 0, 0, ids, stats=stats), first + second)
        assert stats.file_blocks == 10
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


# ---------------------------------------------------------------------------- expiry (ManualClock)
async def test_ticket_expiry_releases_allocated_memory(server_factory, manual_clock: ManualClock) -> None:
    # one app takes 900K of the 1M in tickets here: let it hold all of capacity
    srv = await server_factory(clock=manual_clock, capacity="1M", memory_store={"app_buffer_ticket_max_ratio": 1.0})
    timeout = srv.cfg.memory_store.buffer_ticket_timeout_sec
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, [0])
        old = await client.require_buffer(APP, 0, 600 << 10)
        manual_clock.advance(timeout / 2)
        young = await client.require_buffer(APP, 0, 300 << 10)
        assert budget_figures(srv) == (0, 900 << 10, 0)
        resp = await client.stub.requireBuffer(pb.RequireBufferRequest(requireSize=200 << 10, appId=APP))
        assert resp.status == pb.NO_BUFFER
        await client.heartbeat(APP)
        manual_clock.advance(timeout / 2 + 1)  # only the old ticket is past its timeout
        async with aiohttp.ClientSession() as http:

            async def only_young_left() -> bool:
                async with http.get(f"http://127.0.0.1:{srv.http_port}/health") as resp:
                    assert resp.status == 200
                    return (await resp.json())["memory"]["allocated"] == 300 << 10

            await poll_until(only_young_left)
        assert len(srv.tickets) == 1
        # the freed room is usable, the expired ticket is not
        await client.require_buffer(APP, 0, 200 << 10)
        blocks = make_blocks(0, 1, 1, 1000)
        resp = await client.stub.sendShuffleData(client.send_request(APP, 0, old, blocks))
        assert resp.status == pb.INTERNAL_ERROR
        resp = await client.stub.sendShuffleData(client.send_request(APP, 0, young, blocks))
        assert resp.status == pb.SUCCESS
        await client.heartbeat(APP)
        manual_clock.advance(timeout + 1)
        await poll_until(lambda: srv.budget.allocated == 0 and len(srv.tickets) == 0)
        assert budget_figures(srv) == (require_size(blocks), 0, 0)
        await client.unregister_app(APP)
        await wait_server_clean(srv, APP)


async def test_app_heartbeat_expiry_purges_the_app(server_factory, manual_clock: ManualClock) -> None:
    srv = await server_factory(clock=manual_clock, app_config={"app_heartbeat_timeout_min": 1,
                                                               "app_expiry_check_interval_sec": 10})
    silent, alive = "app_silent", "app_alive"
    async with client_for(srv) as client:
        written = {}
        for app_id in (silent, alive):
            await client.register_shuffle(app_id, 0, range(2))
            blocks = [b for p in range(2) for b in make_blocks(p, 1, 6, 50_000)]
            await client.send_blocks(app_id, 0, blocks[:6])
            await client.stub.finishShuffle(pb.FinishShuffleRequest(appId=app_id, shuffleId=0))  # some on disk
            await client.send_blocks(app_id, 0, blocks[6:])  # some in memory
            await client.report(app_id, 0, 1, blocks)
            written[app_id] = blocks
        await client.require_buffer(silent, 0, 1000)  # and a reservation
        assert app_dirs(srv, silent) and srv.budget.used_by_app(silent) > 0

        manual_clock.advance(30)
        await client.heartbeat(alive)
        manual_clock.advance(31)  # silent: 61 s without a call; alive: 31 s
        await poll_until(lambda: silent not in srv.directory)
        await poll_until(lambda: srv.budget.used_by_app(silent) == 0 and not app_dirs(srv, silent)
                         and len(srv.tickets) == 0)
        assert srv.budget.allocated == 0
        history = await srv.admin.history()
        assert [h["reason"] for h in history if h["app_id"] == silent] == ["heartbeat timeout"]
        resp = await client.stub.appHeartbeat(pb.AppHeartBeatRequest(appId=silent))
        assert resp.status == pb.NO_REGISTER
        resp = await client.stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
            appId=silent, shuffleId=0, partitionId=0, lastBlockId=-1, readBufferSize=1000))
        assert resp.status == pb.NO_REGISTER
        # the live app is untouched
        await read_everything(client, alive, 0, written[alive], partitions=range(2))
        # the silent driver comes back with a new shuffle: it starts from scratch and loses nothing
        await client.register_shuffle(silent, 1, range(2))
        again = [b for p in range(2) for b in make_blocks(p, 2, 4, 50_000)]
        await client.send_blocks(silent, 1, again)
        await client.stub.finishShuffle(pb.FinishShuffleRequest(appId=silent, shuffleId=1))
        await client.report(silent, 1, 2, again)
        await read_everything(client, silent, 1, again, partitions=range(2))
        assert app_dirs(srv, silent)
        await client.unregister_app(silent)
        await client.unregister_app(alive)
        await wait_server_clean(srv)


async def test_expired_app_answers_no_register_before_its_purge(server_factory, manual_clock: ManualClock) -> None:
    srv = await server_factory(clock=manual_clock, app_config={"app_heartbeat_timeout_min": 1,
                                                               "app_expiry_check_interval_sec": 600},
                               memory_store={"buffer_ticket_timeout_sec": 120})
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, [0])
        blocks = make_blocks(0, 1, 2, 1000)
        await client.send_blocks(APP, 0, blocks)
        t = await client.require_buffer(APP, 0, 100)  # a ticket taken just before the expiry
        manual_clock.advance(61)
        assert APP in srv.directory  # not purged yet: the check runs every 600 s
        for resp in (await client.stub.appHeartbeat(pb.AppHeartBeatRequest(appId=APP)),
                     await client.stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
                         appId=APP, shuffleId=0, partitionId=0, lastBlockId=-1, readBufferSize=1000))):
            assert resp.status == pb.NO_REGISTER
        resp = await client.stub.sendShuffleData(client.send_request(APP, 0, t, make_blocks(0, 2, 1, 10)))
        assert resp.status == pb.NO_REGISTER
        await poll_until(lambda: budget_figures(srv) == (require_size(blocks), 0, 0))  # the ticket was given back
        manual_clock.advance(600)
        await wait_server_clean(srv, APP)


# ---------------------------------------------------------------------------- graceful stop
def files_on_disk(srv, app_id: str, shuffle_id: int, partition_id: int) -> dict[int, bytes]:
    """Block id -> bytes, read straight from the data paths (the server is stopped)."""
    found: dict[int, bytes] = {}
    for root in srv.cfg.localfile_store.data_paths:
        data_path, _ = localfile.partition_paths(root, app_id, shuffle_id, partition_id)
        if not os.path.exists(data_path):
            continue
        index, data_len = localfile.read_index(root, app_id, shuffle_id, partition_id)
        with open(data_path, "rb") as f:
            data = f.read()
        assert len(data) == data_len
        for e in decode_index(index):
            assert e.block_id not in found
            found[e.block_id] = data[e.offset:e.offset + e.length]
    return found


@pytest.mark.parametrize("grace_s", [5, 0])
async def test_graceful_stop_flushes_memory(server_factory, grace_s: int) -> None:
    srv = await server_factory()
    async with client_for(srv) as client:
        await client.register_shuffle(APP, 0, range(3))
        blocks = [b for p in range(3) for b in make_blocks(p, 1, 5, 10_000)]
        await client.send_blocks(APP, 0, blocks)
        assert srv.budget.used == require_size(blocks) and not app_dirs(srv, APP)  # all in memory
    await stop_server(srv, grace_s=grace_s)
    for p in range(3):
        on_disk = files_on_disk(srv, APP, 0, p)
        if grace_s:
            assert_read_matches(on_disk, [b for b in blocks if b.partition_id == p])
        else:
            assert on_disk == {}  # no grace period: memory is not flushed
