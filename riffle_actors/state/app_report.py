"""The ``/apps`` report of one application: typed figures built from its ``AppState``.

``AppInfo`` (the app) and ``ShuffleInfo`` (each shuffle) are what the AppActor answers to
``GetAppInfo``; the admin API (``riffle_actors.admin``) and the AppManager read them. Pure records.

See also: ``riffle_actors.state.app_state``, ``riffle_actors.actors.app_messages``.
"""

from __future__ import annotations

from dataclasses import dataclass


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
