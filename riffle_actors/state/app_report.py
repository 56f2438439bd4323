"""The ``/apps`` report of one application: typed figures built from its ``AppState``.

``app_report(state)`` builds an ``AppInfo`` (the app) with one ``ShuffleInfo`` per registered
shuffle, the AppActor's answer to ``GetAppInfo``; the admin API (``riffle_actors.admin``), the
AppManager and the app history read it. Every figure comes from the state: the size table
(each partition's ``PartitionFigures``), the reported ids, the liveness clock and the marks
``recovered`` / ``split_triggered``. Pure and synchronous: O(partitions), one pass per shuffle.

See also: ``riffle_actors.state.app_state``, ``riffle_actors.actors.app_messages``.
"""

from __future__ import annotations

from dataclasses import dataclass

from riffle_actors.state.app_state import AppState, ShuffleState


@dataclass(frozen=True, slots=True)
class ShuffleInfo:
    """One shuffle of an app, as ``/apps`` shows it."""

    ranges: int
    partitions: int
    partition_actors: int
    memory_bytes: int
    disk_bytes: int
    received_bytes: int
    reported_partitions: int
    disks: tuple[str, ...]
    huge_partitions: int
    lost_blocks: int = 0  # reported blocks lost by the last restart (only in memory when it died)
    huge_partition_bytes: tuple[int, ...] = ()  # bytes received by each huge partition
    hdfs_bytes: int = 0  # spilled to the HDFS tier (clients read it from HDFS)
    reported_block_ids: int = 0  # block ids reported by the tasks (reportShuffleResult)


@dataclass(frozen=True, slots=True)
class AppInfo:
    app_id: str
    user: str
    registered_epoch_ms: int
    idle_s: float
    shuffles: dict[int, ShuffleInfo]
    partition_count: int
    memory_bytes: int
    in_flight_bytes: int
    received_bytes: int
    partition_actors: int = 0  # PartitionActors running (or starting) now
    recovered: bool = False  # rebuilt from disk at the server's start
    lost_blocks: int = 0  # reported blocks the restart found no data for (see ShuffleInfo.lost_blocks)
    partition_split_triggered: bool = False  # a partition went above the split threshold (Riffle's flag)


def shuffle_report(shuffle: ShuffleState) -> ShuffleInfo:
    """One shuffle's line of ``/apps``."""
    entries = shuffle.partitions.values()
    figures = [e.figures for e in entries]
    return ShuffleInfo(
        ranges=shuffle.range_count,
        partitions=len(shuffle.partitions),
        partition_actors=sum(1 for e in entries if e.has_actor),
        memory_bytes=sum(f.memory_bytes for f in figures),
        disk_bytes=sum(f.disk_bytes for f in figures),
        received_bytes=sum(f.total_bytes for f in figures),
        reported_partitions=len(shuffle.reported),
        disks=tuple(sorted({d for f in figures for d in f.disks})),
        huge_partitions=sum(1 for f in figures if f.huge),
        huge_partition_bytes=tuple(f.total_bytes for f in figures if f.huge),
        lost_blocks=shuffle.lost_blocks,
        hdfs_bytes=sum(f.hdfs_bytes for f in figures),
        reported_block_ids=shuffle.reported.id_count(),
    )


def app_report(state: AppState) -> AppInfo:
    """The app's ``/apps`` figures, as of now."""
    shuffles = {sid: shuffle_report(sh) for sid, sh in state.shuffles.items()}
    staging, in_flight = state.memory_bytes()
    return AppInfo(
        app_id=state.app_id,
        user=state.user,
        registered_epoch_ms=state.registered_epoch_ms,
        idle_s=state.clock.monotonic() - state.last_seen_monotonic,
        shuffles=shuffles,
        partition_count=state.partition_count(),
        memory_bytes=staging + in_flight,
        in_flight_bytes=in_flight,
        received_bytes=state.received_bytes(),
        partition_actors=sum(s.partition_actors for s in shuffles.values()),
        recovered=state.recovered,
        lost_blocks=sum(s.lost_blocks for s in shuffles.values()),
        partition_split_triggered=state.split_triggered or any(
            e.figures.split for sh in state.shuffles.values() for e in sh.partitions.values()),
    )
