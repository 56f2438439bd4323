"""Restore: one app's ``AppState`` rebuilt from what a restart's recovery found on disk.

``restore_app(state, recovered)`` is the state step behind the AppActor's ``RestoreApp`` (sent
once, right after the app's actor started at a restart; ``riffle_actors.recovery``). It applies
the ``RecoveredApp`` (``riffle_actors.state.recovery``) to the state:

- the app's user and registerShuffle properties;
- each shuffle registered again with its ranges and LOCAL_ORDER (a new epoch, as any registration);
- its reported block ids and the count of reported blocks the restart lost;
- one size-table line per partition with files: the disks holding its segments and its bytes
  (on disk, and received: what a restart knows of a partition is what its index names).

and returns a ``RestorePlan``, what the actor carries out: the metadata log's home disk and the
registration records to keep (written again if the app's log moves to another disk), and the
lost-block summary to log. No PartitionActor starts here: a restored partition's actor starts on
its first message, as any other, and reads its figures from the size table.

Pure and synchronous (no IO, no clock reads beyond the state's), O(partitions) plus the id sets'
merge; recovery already did the O(block ids) work off the event loop.

See also: ``riffle_actors.state.app_state``, ``riffle_actors.actors.app`` (carries the plan out).
"""

from __future__ import annotations

from dataclasses import dataclass

from riffle_actors.protocol.shuffle_meta import encode_register
from riffle_actors.state.app_state import AppState, PartitionEntry
from riffle_actors.state.recovery import RecoveredApp

LOST_PARTITIONS_NAMED = 20  # partitions the lost-block summary names per shuffle; "..." for more


@dataclass(frozen=True, slots=True)
class RestoredRegistration:
    """A recovered shuffle's registration, as its metadata log holds it (a REGISTER record body)."""

    shuffle_id: int
    epoch: int  # the epoch the restored state gave the shuffle
    record: bytes


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """What the actor does once the state is restored (see the module docstring)."""

    home: str  # data path of the app's metadata logs
    registrations: tuple[RestoredRegistration, ...]
    shuffles: int
    partitions: int  # size-table lines restored (partitions with files)
    reported_partitions: int  # partitions with reported block ids restored
    lost_blocks: int  # reported blocks the restart found no data for
    lost_summary: str  # per shuffle, its lost blocks and the partitions they belong to; "" when none


def restore_app(state: AppState, recovered: RecoveredApp) -> RestorePlan:
    """Apply ``recovered`` to ``state`` (a state just made, or with registrations that came first:
    these are extended, never replaced); the plan for the actor."""
    state.recovered = True
    state.user = recovered.user
    state.properties = dict(recovered.properties)
    properties = tuple(recovered.properties.items())
    registrations: list[RestoredRegistration] = []
    partitions = reported_partitions = 0
    for sid, rs in recovered.shuffles.items():
        state.register_shuffle(sid, rs.ranges, rs.local_order)  # on disk: accepted before, not checked again
        shuffle = state.shuffles[sid]
        registrations.append(RestoredRegistration(sid, shuffle.epoch, encode_register(
            rs.ranges, local_order=rs.local_order, user=recovered.user, remote_storage=rs.remote_storage,
            properties=properties)))
        shuffle.reported.update(rs.reported)
        reported_partitions += len(rs.reported)
        shuffle.lost_blocks = rs.lost_blocks
        for pid, rp in rs.partitions.items():
            entry = shuffle.partitions.get(pid)
            if entry is None:
                entry = shuffle.partitions[pid] = PartitionEntry()
            f = entry.figures
            f.disks = rp.disks
            f.disk_bytes = rp.data_bytes
            f.total_bytes = rp.data_bytes
            partitions += 1
    return RestorePlan(recovered.home, tuple(registrations), len(recovered.shuffles), partitions, reported_partitions,
                       recovered.lost_blocks, _lost_summary(recovered))


def _lost_summary(recovered: RecoveredApp) -> str:
    lines = []
    for sid, rs in recovered.shuffles.items():
        if not rs.lost_blocks:
            continue
        named = list(rs.lost_partitions[:LOST_PARTITIONS_NAMED])
        more = " ..." if len(rs.lost_partitions) > LOST_PARTITIONS_NAMED else ""
        lines.append(f"shuffle {sid}: {rs.lost_blocks} blocks of partitions {named}{more}")
    return "; ".join(lines)
