"""Building blocks of the fault scenarios: write acknowledged blocks, read them all back, inspect disks.

``Workload`` remembers every block a client got an acknowledgement for, so a test can end by
checking the first invariant of the suite: every acknowledged byte is readable (byte-exact,
crc-checked) -- or, for a test that expects a loss, reported with an error status.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from riffle_actors.actors.app_messages import GetPartitionDisks
from tests.helpers.client import BlockSpec, UniffleClient, assert_read_matches, make_blocks

APP = "application_1700000000000_0042_1700000000001"


@dataclass
class Workload:
    client: UniffleClient
    app_id: str = APP
    shuffle_id: int = 0
    partitions: range = range(8)
    acked: list[BlockSpec] = field(default_factory=list)
    _next_task: int = 1

    async def register(self) -> None:
        await self.client.register_shuffle(self.app_id, self.shuffle_id, self.partitions)

    async def write(self, *, per_partition: int, block_size: int = 16 << 10,
                    partitions: Any = None, per_send: int = 4) -> list[BlockSpec]:
        """One map task writing ``per_partition`` blocks to each partition; returns them once acknowledged."""
        task = self._next_task
        self._next_task += 1
        blocks = [b for p in (partitions if partitions is not None else self.partitions)
                  for b in make_blocks(p, task, per_partition, block_size)]
        acked: list[BlockSpec] = []
        try:
            for i in range(0, len(blocks), per_send):
                chunk = blocks[i:i + per_send]
                await self.client.send_blocks(self.app_id, self.shuffle_id, chunk)
                acked.extend(chunk)
                self.acked.extend(chunk)  # as they are acknowledged: tests trigger faults on progress
        finally:
            # like a task that reports what it wrote; blocks never acknowledged are not expected
            if acked:
                await self.client.report(self.app_id, self.shuffle_id, task, acked)
        return blocks

    async def read_back(self) -> None:
        """Every acknowledged block, byte-exact, from memory and every disk that holds it."""
        ids = await self.client.get_shuffle_result(self.app_id, self.shuffle_id, self.partitions)
        assert set(ids) >= {b.block_id for b in self.acked}
        for p in self.partitions:
            want = [b for b in self.acked if b.partition_id == p]
            got = await self.client.read_partition(self.app_id, self.shuffle_id, p, ids)
            assert_read_matches(got, want)

    async def finish(self) -> None:
        """finishShuffle: everything in memory is spilled and on a disk when this returns."""
        resp = await self.client.stub.finishShuffle(self.client.pb.FinishShuffleRequest(
            appId=self.app_id, shuffleId=self.shuffle_id))
        assert resp.status == 0, resp.retMsg


async def partition_disks(srv: Any, app_id: str, shuffle_id: int, partition_id: int) -> tuple[str, ...]:
    return await srv.directory[app_id].ask(GetPartitionDisks(shuffle_id=shuffle_id, partition_id=partition_id))


async def disks_holding(srv: Any, w: Workload) -> dict[int, tuple[str, ...]]:
    return {p: await partition_disks(srv, w.app_id, w.shuffle_id, p) for p in w.partitions}




async def run_in_background(coro: Any) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)
    return task


def process_gone(pid: int, wait_s: float = 10.0) -> bool:
    """True once ``pid`` has exited (a SIGKILL takes effect asynchronously; a zombie counts as gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        psutil.wait_procs([proc], timeout=wait_s)
        return proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def child_processes() -> set[int]:
    """Live descendant processes, without multiprocessing's resource tracker (one per process, by design)."""
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.Error:
            pass
    return out
