"""Restart recovery: at start, before any port listens, rebuild the apps the data paths hold.

The steps, each off the event loop where it is heavy:

1. scan every data path on its Disk's writer thread (``riffle_actors.io.meta_store.scan_root``),
   all disks at once; torn files are repaired (truncated to the last whole record) and each
   repair is logged;
2. decide (``riffle_actors.state.recovery.plan_recovery``, on a worker thread): the apps to
   rebuild, the blocks lost (reported, no data on any disk), what to remove;
3. remove the directories with no usable metadata (one log line each: the path and why);
4. start one AppActor per app (``GetOrCreateApp``) and hand it what was found (``RestoreApp``).
   From then on the app answers getShuffleResult*, getLocalShuffleIndex/Data on gRPC and urpc,
   and is listed in ``/apps`` and in the heartbeats; its last-seen time is the restart, so an app
   whose client sends nothing within the app heartbeat timeout is purged by the usual expiry
   sweep (logged with its reason).

The outcome is a ``RecoveryReport`` (in the log, ``/apps`` per app, the ``riffle_recovery_*``
metrics): apps and partitions rebuilt, blocks lost, directories removed, files repaired, seconds.

See also: ``docs/recovery.md``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from loguru import logger

from riffle_actors.actors.app_manager import GetOrCreateApp
from riffle_actors.actors.app_messages import RestoreApp
from riffle_actors.actors.disk import DiskResources
from riffle_actors.actors.hdfs_writer import RegisterRemoteStorage
from riffle_actors.errors import InvalidRequestError
from riffle_actors.io.meta_store import DEFAULT_MAX_FILE_BYTES, DiskScan, remove_tree, scan_root
from riffle_actors.runtime import ActorRef
from riffle_actors.state.recovery import RecoveryPlan, plan_recovery


@dataclass(slots=True)
class RecoveryReport:
    apps: int = 0
    shuffles: int = 0
    partitions: int = 0
    reported_blocks: int = 0
    lost_blocks: int = 0
    lost_by_app: dict[str, int] = field(default_factory=dict)
    removed: list[tuple[str, str]] = field(default_factory=list)
    repaired: int = 0
    foreign: int = 0  # entries left alone: symlinks, FIFOs, devices, names the server never writes
    seconds: float = 0.0
    # (app, path): apps whose recorded remote storage is no longer in hdfs_store.remote_storage
    remote_storage_refused: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"apps": self.apps, "shuffles": self.shuffles, "partitions": self.partitions,
                "reported_blocks": self.reported_blocks, "lost_blocks": self.lost_blocks,
                "lost_by_app": dict(self.lost_by_app), "removed": [{"path": p, "reason": r} for p, r in self.removed],
                "repaired_files": self.repaired, "foreign_entries": self.foreign, "seconds": round(self.seconds, 3),
                "remote_storage_refused": [{"app_id": a, "path": p} for a, p in self.remote_storage_refused]}


async def _scan(res: DiskResources, max_file_bytes: int) -> DiskScan:
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(res.writer, scan_root, res.root, max_file_bytes)
    except OSError as e:
        return DiskScan(res.root, error=f"cannot scan {res.root}: {e}")


def _remove(roots: Sequence[str], removals: Sequence[tuple[str, str]]) -> None:
    for path, why in removals:
        root = next((r for r in roots if path.startswith(r.rstrip(os.sep) + os.sep)), None)
        try:
            if root is None:
                raise OSError(f"{path} is not below a data path")
            remove_tree(root, path)
        except OSError as e:  # never fatal: the next start tries again
            logger.warning("recovery could not remove {} ({}): {}", path, why, e)


async def recover(disks: Sequence[DiskResources], app_manager: ActorRef, hdfs: ActorRef | None = None,
                  *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> RecoveryReport:
    """Rebuild the apps found under ``disks``; see the module docstring.

    The cyclic garbage collector is off meanwhile: recovery allocates several objects per partition
    that all live on, and the full collections they trigger made a 50k-partition recovery 2.5x slower
    (12.2 s against 4.9 s, ``scripts/bench_restart.py``). Nothing here creates reference cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return await _recover(disks, app_manager, hdfs, max_file_bytes)
    finally:
        if was_enabled:
            gc.enable()


async def _recover(disks: Sequence[DiskResources], app_manager: ActorRef, hdfs: ActorRef | None,
                   max_file_bytes: int) -> RecoveryReport:
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    scans = list(await asyncio.gather(*(_scan(res, max_file_bytes) for res in disks)))
    scanned = time.monotonic()
    plan: RecoveryPlan = await loop.run_in_executor(None, plan_recovery, scans)
    planned = time.monotonic()
    report = RecoveryReport()
    for problem in plan.problems:
        logger.error("recovery: {}", problem)
    for repair in plan.repairs:
        logger.warning("recovery repaired a partial file: {}", repair)
    report.repaired = len(plan.repairs)
    removals = list(plan.removals)
    apps = plan.apps  # their directory names passed check_app_id in the scan
    for line in plan.foreign:
        logger.warning("recovery: foreign entry {}", line)
    if plan.foreign_total > len(plan.foreign):
        logger.warning("recovery: {} more foreign entries not listed", plan.foreign_total - len(plan.foreign))
    report.foreign = plan.foreign_total
    if removals:
        await loop.run_in_executor(None, _remove, [res.root for res in disks], removals)
        for path, why in removals:
            logger.warning("recovery removed {}: {}", path, why)
    report.removed = removals
    for app in apps:
        ref = await app_manager.ask(GetOrCreateApp(app.app_id, recovered=True))
        await ref.ask(RestoreApp(app))
        remote = next((s.remote_storage for s in app.shuffles.values() if s.remote_storage), "")
        if remote and hdfs is not None:
            # the HDFS writer learns where the app's files are again (if the base is still allowed):
            # its later spills and its purge reach them (the operator's conf for the base is used)
            on_hdfs = tuple((s.shuffle_id, p) for s in app.shuffles.values() for p in s.hdfs_partitions)
            try:
                await hdfs.ask(RegisterRemoteStorage(app.app_id, remote, (), recovered=on_hdfs))
            except InvalidRequestError as e:
                report.remote_storage_refused.append((app.app_id, remote))
                logger.bind(app_id=app.app_id).error(
                    "recovered app {}: its remote storage is refused ({}); its HDFS files ({} partitions) are "
                    "not touched and not deleted by its purge (an operator must remove them), its later "
                    "spills stay local", app.app_id, e, len(on_hdfs))
        report.apps += 1
        report.shuffles += len(app.shuffles)
        report.partitions += app.partitions
        report.reported_blocks += sum(s.reported.id_count() for s in app.shuffles.values())
        if app.lost_blocks:
            report.lost_by_app[app.app_id] = app.lost_blocks
            report.lost_blocks += app.lost_blocks
        logger.bind(app_id=app.app_id).info(
            "recovered app {}: {} shuffles, {} partitions on disk, {} lost blocks", app.app_id, len(app.shuffles),
            app.partitions, app.lost_blocks)
    report.seconds = time.monotonic() - started
    logger.info("recovery took {:.3f}s (scan {:.3f}s, plan {:.3f}s, rebuild {:.3f}s): {} apps, {} shuffles, "
                "{} partitions, {} reported blocks, {} lost blocks, {} paths removed, {} files repaired, "
                "{} foreign entries left alone",
                report.seconds, scanned - started, planned - scanned, time.monotonic() - planned, report.apps,
                report.shuffles, report.partitions, report.reported_blocks, report.lost_blocks, len(report.removed),
                report.repaired, report.foreign)
    return report
