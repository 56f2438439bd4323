"""The AppActor's messages and their reply records (``riffle_actors.actors.app``).

Commands, queries and replies of one application's actor, in the vocabulary of the Uniffle RPCs
they come from (registerShuffle, sendShuffleData, reportShuffleResult, getShuffleResult,
getMemoryShuffleData, requireBuffer, finishShuffle, unregisterShuffle, app heartbeats) plus the
server's own (spill rounds, ``/apps``, the expiry sweep, a restart's ``RestoreApp``). Senders: the
``ShuffleService`` (``riffle_actors.service``), the ``AppManagerActor`` and the restart recovery.

Plain frozen records, no behaviour; each constructor is what the service layer builds after it
parsed and validated a request (ids through ``riffle_actors.protocol.ids``). ``AppMsg`` is the
union the AppActor's ``receive`` matches on. The ``/apps`` report (``AppInfo``) is a state record:
``riffle_actors.state.app_report``.

See also: ``riffle_actors.actors.app`` (the actor), ``riffle_actors.actors.partition`` (its
partitions' messages), ``riffle_actors.state.send`` (the ``SendTicket`` a send carries).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from riffle_actors.protocol.blockid import BlockIdLayout
from riffle_actors.records import BlockBatch
from riffle_actors.runtime import Terminated
from riffle_actors.state.read_ahead import ClientReadAhead
from riffle_actors.state.recovery import RecoveredApp
from riffle_actors.state.send import SendTicket


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterShuffle:
    shuffle_id: int
    ranges: tuple[tuple[int, int], ...]
    local_order: bool
    user: str = ""
    properties: tuple[tuple[str, str], ...] = ()
    remote_storage: str = ""  # registerShuffle's remoteStorage path (kept in the metadata log)


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendBlocks:
    """All partitions of one sendShuffleData request, paid for by a ticket of ``ticket_size`` bytes.

    ``ticket`` (``riffle_actors.state.send``, made by the sender) turns the reservation into used
    memory as the partitions append; without one the AppActor makes it. Whatever the outcome, once
    the AppActor has processed the message the ticket is settled or will be (by the partitions, or by
    the AppActor's ``on_stop``); on ``ActorDeadError`` the sender tells the ``Commit`` of
    ``ticket.release_rest()``, which gives back exactly what no partition used (all of it if the
    message was never processed).
    """

    shuffle_id: int
    partitions: tuple[BlockBatch, ...]
    ticket_size: int = 0
    ticket: SendTicket | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportShuffleResult:
    shuffle_id: int
    task_attempt_id: int
    # iterated once; the gRPC adapter hands over a generator of its protobuf repeated fields
    partition_to_block_ids: Iterable[tuple[int, Sequence[int]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class GetShuffleResult:
    shuffle_id: int
    partition_ids: tuple[int, ...]
    layout: BlockIdLayout | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMemoryData:
    shuffle_id: int
    partition_id: int
    last_block_id: int
    read_buffer_size: int
    task_filter: Container[int] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetPartitionDisks:
    shuffle_id: int
    partition_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GetLocalReadPlan:
    """A local data read: the disks holding the partition, and whether (and how) the app asked for
    read-ahead (``LocalReadPlan``)."""

    shuffle_id: int
    partition_id: int


@dataclass(frozen=True, slots=True)
class LocalReadPlan:
    disks: tuple[str, ...]
    read_ahead: ClientReadAhead | None  # None: the app did not ask (its registration's properties)
    sequential: bool  # the partition's memory was read without a task filter (Riffle's sequential mark)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckBufferRequest:
    """requireBuffer: the app check, then NO_REGISTER unless the shuffle (and each partition named) is
    registered; then refused (``HugePartitionBackpressureError``) while one of the partitions is huge and
    holds more than ``limit_bytes`` in memory (staging + in flight; None = the partition limit is off).
    Replies with the partitions named that are above the split threshold (sorted; () when none); with
    ``size``, the whole requireBuffer in one ask: the AppActor forwards ``RequireBuffer`` to the
    MemoryManager, whose ``BufferGrant`` (the ticket and those partitions) is the reply."""

    shuffle_id: int
    partition_ids: tuple[int, ...]
    limit_bytes: int | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class RestoreApp:
    """Sent once, right after the app's actor started at a restart: what recovery found on disk."""

    recovered: RecoveredApp


@dataclass(frozen=True, slots=True)
class CommitShuffleTask:
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class FinishShuffle:
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class PurgeShuffle:
    shuffle_id: int


@dataclass(frozen=True, slots=True)
class GetSpillCandidates:
    pass


@dataclass(frozen=True, slots=True)
class SpillPartitions:
    keys: tuple[tuple[int, int], ...]  # (shuffle_id, partition_id)


@dataclass(frozen=True, slots=True)
class SpillAll:
    """Spill every buffer (graceful shutdown); replies once all spills completed."""


@dataclass(frozen=True, slots=True)
class GetAppInfo:
    pass


@dataclass(frozen=True, slots=True)
class IsExpired:
    pass


AppMsg = (RegisterShuffle | AppendBlocks | ReportShuffleResult | GetShuffleResult | GetMemoryData
          | GetPartitionDisks | GetLocalReadPlan | CheckBufferRequest | Heartbeat | CommitShuffleTask | FinishShuffle
          | PurgeShuffle | GetSpillCandidates | SpillPartitions | SpillAll | GetAppInfo | IsExpired
          | RestoreApp | Terminated)
