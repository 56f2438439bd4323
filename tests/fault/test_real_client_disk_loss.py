"""The issue's acceptance run: a Java-like client writes 3x the server's memory across two data paths,
one of them a small tmpfs that fills up (ENOSPC) or is remounted read-only (EROFS) mid-run.

Nothing acknowledged may be lost: a block stays in memory until a healthy disk acknowledged
it, so every block is read back byte-exact (crc-checked, via memory and the index/data RPCs
with storage ids). Probes run on their own timer here (every second, real time), as in
production. ``/health`` and the log name the failed disk, the reason and what the server did.
"""

from __future__ import annotations

import asyncio

import pytest
from loguru import logger

from riffle_actors.state.disk_health import DiskStatus
from tests.fault.scenario import APP, Workload, disks_holding
from tests.helpers import poll_until

pytestmark = pytest.mark.fault

CAPACITY = 4 << 20
MAP_TASKS = 6
PARTITIONS = range(16)
BLOCK = 16 << 10
BLOCKS_PER_PARTITION = 8  # 6 tasks x 16 partitions x 8 blocks x 16 KiB = 12 MiB = 3x memory


@pytest.mark.parametrize("fault", ["fills_up", "read_only"])
async def test_a_real_client_loses_no_acknowledged_block_when_a_data_path_fails(
        fault, fault_server, client_factory, mounts, tmp_path, invariants):
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    try:
        small = mounts.tmpfs("small", size="4m" if fault == "fills_up" else "16m")
        big = tmp_path / "big"
        srv = await fault_server(data_paths=[str(small), str(big)], capacity=CAPACITY, localfile_store={
            "disk_healthy_check_interval_sec": 1, "disk_probe_timeout_sec": 5.0, "disk_probation_probes": 2})
        client = client_factory(srv, retry_deadline_s=60)
        w = Workload(client, partitions=PARTITIONS)
        await w.register()

        async def map_task() -> None:
            await w.write(per_partition=BLOCKS_PER_PARTITION, block_size=BLOCK, per_send=8)

        async def break_the_tmpfs() -> None:
            if fault == "read_only":
                await poll_until(lambda: len(w.acked) * BLOCK >= CAPACITY, timeout=60)
                mounts.remount(small, "ro")

        await asyncio.gather(*(map_task() for _ in range(MAP_TASKS)), break_the_tmpfs())
        assert len(w.acked) * BLOCK >= 3 * CAPACITY
        await w.finish()

        board = srv.disk_health[str(small)]
        assert board.status in (DiskStatus.QUARANTINED, DiskStatus.OVERUSED), board
        kind = {"fills_up": ("ENOSPC", "OVERUSED"), "read_only": ("EROFS",)}[fault]
        assert board.kind in kind, board
        holding = await disks_holding(srv, w)
        assert any(str(small) in d for d in holding.values()) and any(str(big) in d for d in holding.values())

        await w.read_back()  # zero loss: every acknowledged block, byte-exact

        # the periodic probe (its own timer, out of process) confirms the verdict
        await poll_until(lambda: board.probes_total >= 1, timeout=30)
        assert not board.placeable, board

        health = (await srv.admin.health()).to_json()
        report = next(d for d in health["disks"] if d["name"] == str(small))
        assert not report["healthy"] and report["status"] in ("QUARANTINED", "OVERUSED")
        assert any(k in report["reason"] for k in kind), report
        assert any(str(small) in line and any(k in line for k in kind) and "other disks" in line
                   for line in lines), "the log names the disk, the reason and the action"

        if fault == "read_only":
            mounts.remount(small, "rw")  # so the purge can delete the files it holds
        await invariants.after_purge(srv, client, APP)
    finally:
        logger.remove(sink)
