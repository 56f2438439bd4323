"""Disk faults: a Disk actor killed or crashing mid-spill, EIO, ENOSPC on a full tmpfs, EROFS after a
remount, hung writes, failing reads, hung probes; what the server does and what the client sees.

Every test ends with the suite's invariants: every acknowledged block is read back byte-exact
(or its read fails with an error status naming the disk), and after the purge memory, tickets,
files and file descriptors are released and the supervisor tree is in the expected state.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from riffle_actors.state.disk_health import DiskStatus
from tests.fault import probes
from tests.fault.scenario import APP, Workload, child_processes, disks_holding, process_gone
from tests.helpers import poll_until

pytestmark = pytest.mark.fault


def disk_report(health: dict, name: str) -> dict:
    return next(d for d in health["disks"] if d["name"] == name)


# ---------------------------------------------------------------------------- Disk actor crashes
async def test_disk_actor_killed_mid_spill_is_restarted_and_the_spill_retried(fault_server, client_factory,
                                                                               invariants):
    srv = await fault_server()
    w = Workload(client_factory(srv), partitions=range(2))
    await w.register()
    # the bytes reach the data file, then the write pauses before its acknowledgement
    paused = {name: io.hang("append_batch", after=True) for name, io in srv.faulty.items()}
    await w.write(per_partition=20, partitions=[0])  # 320 KiB > the 256 KiB single-buffer spill size
    name = await poll_until(lambda: next((n for n, b in paused.items() if b.entered.is_set()), None))
    assert srv.budget.in_flight > 0
    await w.read_back()  # mid-spill, everything is readable from memory

    disk_ref = dict(srv.disks)[name]
    disk_ref.crash(RuntimeError("killed by the fault test"))
    await poll_until(lambda: disk_ref.statistics().restarts == 1 and disk_ref.statistics().state == "running")
    for b in paused.values():
        b.release.set()
    await poll_until(lambda: srv.budget.in_flight == 0)

    await w.write(per_partition=4)
    await w.finish()
    await w.read_back()  # the batch may be on disk twice (first write + retry): never a wrong byte
    assert srv.disk_health[name].status is DiskStatus.HEALTHY  # a restart is not a disk failure
    await invariants.after_purge(srv, w.client, APP, disk_restarts={name: 1})


async def test_disk_actor_crashing_on_an_unexpected_error_is_restarted(fault_server, client_factory, invariants):
    srv = await fault_server()
    w = Workload(client_factory(srv), partitions=range(2))
    await w.register()
    rules = {name: io.fail("append_batch", RuntimeError("bug in the IO layer"), times=1)
             for name, io in srv.faulty.items()}
    await w.write(per_partition=20, partitions=[0])
    await poll_until(lambda: any(r.hits for r in rules.values()))
    await poll_until(lambda: srv.budget.in_flight == 0)
    crashed = next(n for n, r in rules.items() if r.hits)
    await w.finish()
    await w.read_back()
    spill = srv.system.get("spill")
    assert spill is not None and spill.statistics().restarts == 0  # the dispatcher itself survived
    await invariants.after_purge(srv, w.client, APP, disk_restarts={crashed: 1})


# ---------------------------------------------------------------------------- write failures
async def test_repeated_eio_on_spills_quarantines_the_disk_and_moves_its_spills(fault_server, client_factory,
                                                                               invariants):
    srv = await fault_server()
    bad, good = srv.disk_names
    srv.faulty[bad].fail("append_batch", errno.EIO)
    w = Workload(client_factory(srv), partitions=range(12))
    await w.register()
    await w.write(per_partition=20)  # 12 spills; those hashed to the bad disk fail and move
    await w.finish()
    await poll_until(lambda: srv.disk_health[bad].status is DiskStatus.QUARANTINED)
    assert srv.faulty[bad].rules[0].hits >= 3
    assert all(disks == (good,) for disks in (await disks_holding(srv, w)).values())
    await w.read_back()

    health = (await srv.admin.health()).to_json()
    report = disk_report(health, bad)
    assert not report["healthy"] and report["status"] == "QUARANTINED"
    assert "EIO on spill write" in report["reason"] and f"moved to {good}" in report["reason"]
    assert health["status"] == "HEALTHY"  # min_number_of_available_disks = 1

    # probation: the disk works again, two healthy probes re-admit it
    srv.faulty[bad].heal()
    await srv.admin.probe_disks()
    assert srv.disk_health[bad].status is DiskStatus.PROBATION
    await srv.admin.probe_disks()
    assert srv.disk_health[bad].status is DiskStatus.HEALTHY
    assert disk_report((await srv.admin.health()).to_json(), bad)["healthy"]
    await invariants.after_purge(srv, w.client, APP)


async def test_a_full_tmpfs_gives_enospc_and_nothing_acknowledged_is_lost(fault_server, client_factory, mounts,
                                                                        invariants, tmp_path):
    small = mounts.tmpfs("small", size="8m")
    other = tmp_path / "big"
    srv = await fault_server(data_paths=[str(small), str(other)])
    w = Workload(client_factory(srv), partitions=range(8))
    await w.register()
    await w.write(per_partition=20)
    await w.finish()
    on_small = [p for p, disks in (await disks_holding(srv, w)).items() if str(small) in disks]
    assert on_small, "precondition: some partitions were spilled to the tmpfs"

    filler = mounts.fill(small, leave_bytes=64 << 10)  # the tmpfs is now (almost) full
    await w.write(per_partition=20)  # spills of the partitions on the tmpfs hit ENOSPC and move
    await w.finish()
    board = srv.disk_health[str(small)]
    assert board.status is DiskStatus.QUARANTINED and board.kind == "ENOSPC"
    holding = await disks_holding(srv, w)
    assert all(holding[p] == (str(small), str(other)) for p in on_small)  # kept taking data elsewhere
    await w.read_back()
    report = disk_report((await srv.admin.health()).to_json(), str(small))
    assert "ENOSPC on spill write" in report["reason"]

    await srv.admin.probe_disks()  # still full: the quarantine holds (no probation below the low watermark)
    assert srv.disk_health[str(small)].status is DiskStatus.QUARANTINED
    filler.unlink()
    await srv.admin.probe_disks()
    await srv.admin.probe_disks()
    assert srv.disk_health[str(small)].status is DiskStatus.HEALTHY
    await invariants.after_purge(srv, w.client, APP)


async def test_a_read_only_remount_gives_erofs_and_old_files_stay_readable(fault_server, client_factory, mounts,
                                                                         invariants, tmp_path):
    ro = mounts.tmpfs("flaky", size="16m")
    other = tmp_path / "big"
    srv = await fault_server(data_paths=[str(ro), str(other)], localfile_store={"min_number_of_available_disks": 2})
    w = Workload(client_factory(srv), partitions=range(8))
    await w.register()
    await w.write(per_partition=20)
    await w.finish()
    on_ro = [p for p, disks in (await disks_holding(srv, w)).items() if str(ro) in disks]
    assert on_ro

    mounts.remount(ro, "ro")
    await w.write(per_partition=20)
    await w.finish()
    assert srv.disk_health[str(ro)].kind == "EROFS"
    await w.read_back()  # the read-only file system still serves what it holds, byte-exact

    await srv.admin.probe_disks()
    health = (await srv.admin.health()).to_json()
    assert health["status"] == "UNHEALTHY"
    assert any("fewer than min_number_of_available_disks=2" in r for r in health["reasons"])
    assert "EROFS on write probe" in disk_report(health, str(ro))["reason"]

    mounts.remount(ro, "rw")
    await srv.admin.probe_disks()
    await srv.admin.probe_disks()
    assert (await srv.admin.health()).to_json()["status"] == "HEALTHY"
    await invariants.after_purge(srv, w.client, APP)


async def test_a_hung_write_times_out_and_the_spill_moves_to_another_disk(fault_server, client_factory,
                                                                         invariants):
    srv = await fault_server(localfile_store={"disk_io_timeout_sec": 0.5})
    bad, _ = srv.disk_names
    hung = srv.faulty[bad].hang("append_batch", times=None)
    w = Workload(client_factory(srv), partitions=range(8))
    await w.register()
    await w.write(per_partition=20)
    await w.finish()  # returns: every spill is acknowledged by the good disk
    assert hung.entered.is_set()
    assert srv.budget.in_flight == 0
    board = srv.disk_health[bad]
    assert board.status is DiskStatus.QUARANTINED and board.kind == "TIMEOUT"
    await w.read_back()
    assert "TIMEOUT on spill write" in disk_report((await srv.admin.health()).to_json(), bad)["reason"]
    srv.faulty[bad].heal()  # the stuck writes complete late, behind everything; the purge follows them
    await invariants.after_purge(srv, w.client, APP)


# ---------------------------------------------------------------------------- read failures
async def test_eio_on_reads_answers_an_error_naming_the_disk_never_wrong_bytes(fault_server, client_factory,
                                                                             invariants):
    srv = await fault_server()
    w = Workload(client_factory(srv), partitions=range(4))
    await w.register()
    await w.write(per_partition=20)
    await w.finish()
    holding = await disks_holding(srv, w)
    p, (disk,) = next((p, d) for p, d in holding.items() if d)
    pb = w.client.pb

    srv.faulty[disk].fail("read_data", errno.EIO)
    ix = await w.client.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
        appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=4))
    assert ix.status == 0 and ix.dataFileLen > 0
    resp = await w.client.stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
        appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=4,
        offset=0, length=ix.dataFileLen, storageId=ix.storageIds[0]))
    assert resp.status == 6 and not resp.data  # INTERNAL_ERROR, no bytes at all
    assert disk in resp.retMsg and "EIO" in resp.retMsg

    srv.faulty[disk].heal()
    srv.faulty[disk].fail("read_index", errno.EIO, times=1)
    ix = await w.client.stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
        appId=APP, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=4))
    assert ix.status == 6 and disk in ix.retMsg and not ix.indexData

    await w.read_back()  # healed: byte-exact again
    await invariants.after_purge(srv, w.client, APP)


# ---------------------------------------------------------------------------- probes
async def test_a_hung_probe_quarantines_its_disk_without_stalling_the_server(fault_server, client_factory,
                                                                           invariants):
    # a generous timeout: the check below is causal (RPCs answered while the probe still hangs), not timed
    srv = await fault_server(probe_fn=probes.announced_hang, localfile_store={"disk_probe_timeout_sec": 10})
    bad, good = srv.disk_names
    w = Workload(client_factory(srv), partitions=range(4))
    await w.register()
    results = await srv.admin.probe_disks()  # starts a probe worker process per disk and probes both disks
    assert all(r is not None and r.ok for r in results.values())

    marker, hanging = os.path.join(bad, probes.HANG), os.path.join(bad, probes.HANGING)
    Path(marker).touch()
    try:
        round_task = asyncio.ensure_future(srv.admin.probe_disks())
        await poll_until(lambda: os.path.exists(hanging))  # the worker process is really stuck in its probe
        for _ in range(5):
            await w.client.heartbeat(APP)
        # the event loop never waits on a probe: the RPCs were answered while the probe still hangs
        assert not round_task.done()
        results = await round_task
    finally:
        os.unlink(marker)
        if os.path.exists(hanging):
            os.unlink(hanging)
    assert results[bad] is not None and results[bad].kind == "TIMEOUT"
    assert results[good] is not None and results[good].ok
    stats = await srv.admin.probe_stats()
    killed = stats.killed_pids[-1]
    assert await asyncio.get_running_loop().run_in_executor(None, process_gone, killed)
    report = disk_report((await srv.admin.health()).to_json(), bad)
    assert "TIMEOUT on probe" in report["reason"] and f"probe process {killed} killed" in report["reason"]

    await w.write(per_partition=20)  # new data goes to the other disk
    await w.finish()
    assert all(d in ((), (good,)) for d in (await disks_holding(srv, w)).values())

    await srv.admin.probe_disks()
    await srv.admin.probe_disks()
    assert srv.disk_health[bad].status is DiskStatus.HEALTHY
    await w.read_back()
    await invariants.after_purge(srv, w.client, APP)


async def test_fewer_healthy_disks_than_the_minimum_reports_unhealthy_everywhere(fault_server, client_factory,
                                                                              invariants):
    import aiohttp

    srv = await fault_server(probe_fn=probes.scripted_probe, localfile_store={"min_number_of_available_disks": 2})
    bad, _ = srv.disk_names
    marker = os.path.join(bad, probes.FAIL_EIO)
    Path(marker).touch()
    await srv.admin.probe_disks()
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{srv.http_port}/health") as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["status"] == "UNHEALTHY"
    assert any(f"{bad}: EIO on write probe" in r for r in body["reasons"]), body["reasons"]
    await srv.admin.refresh_snapshot()
    assert srv.admin.heartbeat_snapshot().is_healthy is False
    assert [d.status for d in srv.admin.heartbeat_snapshot().disks] == ["UNHEALTHY", "NORMAL"]

    os.unlink(marker)
    await srv.admin.probe_disks()
    await srv.admin.probe_disks()
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{srv.http_port}/health") as resp:
        assert resp.status == 200
    await srv.admin.refresh_snapshot()
    assert srv.admin.heartbeat_snapshot().is_healthy is True
    invariants.tree(srv)


async def test_a_crashed_disk_monitor_restarts_keeps_its_verdicts_and_leaks_no_process(fault_server, client_factory,
                                                                                      invariants):
    before = child_processes()
    srv = await fault_server()
    bad, good = srv.disk_names
    srv.faulty[bad].fail("append_batch", errno.EROFS)
    w = Workload(client_factory(srv), partitions=range(8))
    await w.register()
    await w.write(per_partition=20)
    await w.finish()
    assert srv.disk_health[bad].kind == "EROFS"
    await srv.admin.probe_disks()  # the probe fleet is up: one worker process per disk
    workers = (await srv.admin.probe_stats()).worker_pids
    assert len(workers) == 2

    srv.disk_monitor.crash(RuntimeError("bug in the disk monitor"))
    await poll_until(lambda: srv.disk_monitor.statistics().restarts == 1
                     and srv.disk_monitor.statistics().state == "running")
    for pid in workers.values():  # the crashed incarnation shut its probe processes down
        assert await asyncio.get_running_loop().run_in_executor(None, process_gone, pid)
    assert not srv.disk_health[bad].placeable  # the verdict lives on the board, not in the actor
    assert (await srv.admin.probe_stats()).worker_pids == {}

    await w.write(per_partition=20)  # still routed around the bad disk
    await w.finish()
    assert all(d in ((), (good,)) for d in (await disks_holding(srv, w)).values())
    srv.faulty[bad].heal()
    await srv.admin.probe_disks()  # a new fleet, started by the new incarnation
    await srv.admin.probe_disks()
    assert srv.disk_health[bad].placeable
    await w.read_back()
    await invariants.after_purge(srv, w.client, APP)

    srv._test_stopped = True  # type: ignore[attr-defined]
    await srv.stop(0)
    leftover = {pid for pid in child_processes() - before
                if not await asyncio.get_running_loop().run_in_executor(None, process_gone, pid, 5.0)}
    assert not leftover, f"processes left behind by the server: {leftover}"
