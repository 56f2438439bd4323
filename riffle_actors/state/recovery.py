"""Restart recovery decisions: from what the data paths hold to the apps a restarted server serves.

Input: one ``DiskScan`` per data path (``riffle_actors.io.meta_store.scan_root``, files repaired
already). Output (``plan_recovery``): a ``RecoveryPlan`` with

- one ``RecoveredApp`` per app that has at least one usable shuffle: its registrations (ranges,
  LOCAL_ORDER, user, properties, remote storage), the reported block ids per partition, the
  disks holding each partition's segments (in the order the segment records name them, then
  any other disk holding files) and the home disk holding its metadata logs;
- the **lost** blocks per shuffle: reported block ids that no index on any disk names (except
  in partitions with a segment on the HDFS tier: clients read those blocks from HDFS). They
  were acknowledged and only in memory when the process died (a SIGKILL); after a graceful
  stop there are none. They are counted, never hidden;
- ``removals``: ``(path, reason)`` for every shuffle directory with no usable metadata (no log,
  an unreadable one, or one without a registration) and every app directory left with no
  usable shuffle. The caller removes them and logs one line each;
- ``foreign``: what the scans left alone (symlinks, FIFOs, devices, names the server never
  writes), one line each (at most ``FOREIGN_KEPT`` per disk) and their total count.

Pure and synchronous, but O(block ids): run it off the event loop.

See also: ``riffle_actors.recovery`` (carries the plan out), ``riffle_actors.protocol.shuffle_meta``.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from riffle_actors.io.meta_store import DiskScan, ScannedShuffle
from riffle_actors.protocol.bitmap import BlockIdSet, BlockIdSetMap
from riffle_actors.protocol.shuffle_meta import BlockIdsRecord, RegisterRecord, SegmentRecord
from riffle_actors.state.tier_policy import HDFS_TIER


@dataclass(slots=True)
class RecoveredPartition:
    disks: tuple[str, ...]  # data paths holding its segments, in segment order
    data_bytes: int  # indexed bytes over every disk
    blocks: int  # index records over every disk


@dataclass(slots=True)
class RecoveredShuffle:
    shuffle_id: int
    ranges: list[tuple[int, int]]
    local_order: bool
    remote_storage: str
    reported: BlockIdSetMap
    partitions: dict[int, RecoveredPartition]
    lost_blocks: int = 0  # reported ids with no data on any disk
    lost_partitions: tuple[int, ...] = ()  # partitions with at least one lost block
    hdfs_partitions: tuple[int, ...] = ()  # partitions with a segment on the HDFS tier (this server's files)


@dataclass(slots=True)
class RecoveredApp:
    app_id: str
    home: str  # data path of its metadata logs
    user: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    shuffles: dict[int, RecoveredShuffle] = field(default_factory=dict)

    @property
    def lost_blocks(self) -> int:
        return sum(s.lost_blocks for s in self.shuffles.values())

    @property
    def partitions(self) -> int:
        return sum(len(s.partitions) for s in self.shuffles.values())


@dataclass(slots=True)
class RecoveryPlan:
    apps: list[RecoveredApp] = field(default_factory=list)
    removals: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    repairs: list[str] = field(default_factory=list)  # truncations done by the scan
    problems: list[str] = field(default_factory=list)  # data paths that could not be scanned
    foreign: list[str] = field(default_factory=list)  # entries left alone ("path: what"), bounded
    foreign_total: int = 0


def _readable(s: ScannedShuffle) -> tuple[bool, str]:
    if s.meta_problem:
        return False, s.meta_problem
    if s.meta is None:
        return False, ""
    return True, ""


def _registered(s: ScannedShuffle) -> bool:
    return s.meta is not None and any(isinstance(r, RegisterRecord) for r in s.meta.records)


def _build_shuffle(shuffle_id: int, copies: list[tuple[str, ScannedShuffle]], metas: list[tuple[str, ScannedShuffle]],
                   app: RecoveredApp) -> RecoveredShuffle:
    ranges: list[tuple[int, int]] = []
    local_order = False
    remote = ""
    reported = BlockIdSetMap()  # no GC-tracked object per partition (a shuffle may have 1M)
    segment_order: dict[int, list[str]] = {}
    all_reported_ids = array("Q")
    for _disk, s in metas:
        assert s.meta is not None
        for rec in s.meta.records:
            if isinstance(rec, RegisterRecord):
                for r in rec.ranges:
                    if r not in ranges:
                        ranges.append(r)
                local_order = rec.local_order
                remote = rec.remote_storage or remote
                if rec.user:
                    app.user = rec.user
                if rec.properties:
                    app.properties = dict(rec.properties)
            elif isinstance(rec, BlockIdsRecord):
                for pid, ids in rec.parts:
                    all_reported_ids.extend(ids)
                    reported.update_ids(pid, ids)
            elif isinstance(rec, SegmentRecord):
                order = segment_order.setdefault(rec.partition_id, [])
                if rec.disk not in order:
                    order.append(rec.disk)
    partitions: dict[int, RecoveredPartition] = {}
    # one big array, one set at the end: adding to a large 64-bit bitmap call by call costs O(size) each
    on_disk_ids = array("Q")
    for disk, s in copies:  # copies are in data-path order
        for pid, part in s.partitions.items():
            if not part.index_records:
                continue
            on_disk_ids.extend(part.block_ids)
            p = partitions.get(pid)
            if p is None:
                partitions[pid] = RecoveredPartition((disk,), part.data_bytes, part.index_records)
                continue
            p.disks = (*p.disks, disk)
            p.data_bytes += part.data_bytes
            p.blocks += part.index_records
            order = segment_order.get(pid, [])
            p.disks = tuple(sorted(p.disks, key=lambda d: (order.index(d) if d in order else len(order))))
    # lost: reported, on no disk (block ids are unique across partitions: they carry the partition id)
    lost = 0
    lost_parts = []
    on_disk = BlockIdSet(on_disk_ids)
    missing_all = BlockIdSet(all_reported_ids)
    missing_all.discard_many(on_disk)
    on_hdfs = {pid for pid, order in segment_order.items() if HDFS_TIER in order}
    if missing_all:
        # a partition with a segment on the HDFS tier has blocks no local index names; clients read
        # those from HDFS themselves, so they are not lost (and not checked here)
        lost = 0
        for pid, reported_ids in reported.items():
            missing = reported_ids.copy()
            missing.discard_many(on_disk)
            if missing and pid not in on_hdfs:
                lost_parts.append(pid)
                lost += len(missing)
    return RecoveredShuffle(shuffle_id, ranges, local_order, remote, reported, partitions, lost,
                            tuple(sorted(lost_parts)), tuple(sorted(on_hdfs)))


def plan_recovery(scans: list[DiskScan]) -> RecoveryPlan:
    """Decide what a restarted server serves and removes; see the module docstring."""
    plan = RecoveryPlan()
    app_ids: list[str] = []
    for scan in scans:
        if scan.error:
            plan.problems.append(scan.error)
        plan.foreign.extend(scan.foreign)
        plan.foreign_total += scan.foreign_total
        for app_id in scan.apps:
            if app_id not in app_ids:
                app_ids.append(app_id)
    for app_id in app_ids:
        found = [(scan.root, scan.apps[app_id]) for scan in scans if app_id in scan.apps]
        shuffle_ids = sorted({sid for _, a in found for sid in a.shuffles})
        app = RecoveredApp(app_id, "")
        newest = -1
        unusable: list[tuple[int, str]] = []
        for sid in shuffle_ids:
            copies = [(disk, a.shuffles[sid]) for disk, a in found if sid in a.shuffles]
            for _, s in copies:
                plan.repairs.extend(s.repaired)
            metas = []
            problems = []
            for disk, s in copies:
                ok, why = _readable(s)
                if ok:
                    metas.append((disk, s))
                elif why:
                    problems.append(why)
            # the logs of every disk count (an app whose home disk failed moved its log), as long as
            # one of them holds the registration
            if not any(_registered(s) for _, s in metas):
                if metas:
                    problems.extend(f"{s.path}: the metadata log holds no registration" for _, s in metas)
                unusable.append((sid, "; ".join(problems) or "no metadata log on any data path"))
                continue
            for disk, s in metas:  # the home: the disk of the most recently written log
                if s.meta_mtime_ns > newest:
                    app.home, newest = disk, s.meta_mtime_ns
            app.shuffles[sid] = _build_shuffle(sid, copies, metas, app)
        if not app.shuffles:
            why = "; ".join(f"shuffle {sid}: {w}" for sid, w in unusable) or "no shuffle directory"
            for _disk, a in found:
                plan.removals.append((a.path, f"app {app_id} has no usable shuffle metadata ({why})"))
            continue
        for sid, why in unusable:
            for _disk, a in found:
                if sid in a.shuffles:
                    plan.removals.append((a.shuffles[sid].path,
                                          f"shuffle {sid} of app {app_id} has no usable metadata ({why})"))
        plan.apps.append(app)
    return plan
