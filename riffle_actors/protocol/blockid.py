"""The bit layout of a Uniffle block id (spec §4).

This module owns ``BlockIdLayout``: how a non-negative int64 block id is split, high to
low, into ``sequenceNo | partitionId | taskAttemptId`` with widths ``(s, p, t)``,
``s + p + t = 63`` and each width in ``[1, 31]`` (Uniffle ``BlockIdLayout``)::

    blockId       = (sequenceNo << (p + t)) | (partitionId << t) | taskAttemptId
    partitionId   = (blockId >> t) & ((1 << p) - 1)
    taskAttemptId =  blockId       & ((1 << t) - 1)
    sequenceNo    = (blockId >> (p + t)) & ((1 << s) - 1)

The server only decodes ids when block ids of several partitions share one store
(``getShuffleResult*``); it must then use the layout the request carries, never a
hard-coded one. ``from_proto_fields`` validates it like Java's ``BlockIdLayout.from``
(which throws, e.g. on the all-zero layout of a request that carries none).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from riffle_actors.protocol.errors import ProtocolError

__all__ = [
    "RIFFLE_FALLBACK",
    "SPARK_DEFAULT",
    "UNIFFLE_DEFAULT",
    "BlockIdLayout",
]

_TOTAL_BITS = 63
_MIN_BITS = 1
_MAX_BITS = 31


@dataclass(frozen=True, slots=True)
class BlockIdLayout:
    """Widths of the three block-id parts; iterable as ``(s, p, t)``."""

    sequence_no_bits: int
    partition_id_bits: int
    task_attempt_id_bits: int
    # derived once, so the per-id helpers are a shift and a mask
    _partition_shift: int = field(init=False, repr=False, compare=False)
    _sequence_shift: int = field(init=False, repr=False, compare=False)
    _sequence_mask: int = field(init=False, repr=False, compare=False)
    _partition_mask: int = field(init=False, repr=False, compare=False)
    _task_mask: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        widths = (
            ("sequence_no_bits", self.sequence_no_bits),
            ("partition_id_bits", self.partition_id_bits),
            ("task_attempt_id_bits", self.task_attempt_id_bits),
        )
        for name, bits in widths:
            if isinstance(bits, bool) or not isinstance(bits, int):
                raise ProtocolError(f"block_id_layout.{name}", f"{bits!r} is not an int")
            if not _MIN_BITS <= bits <= _MAX_BITS:
                raise ProtocolError(
                    f"block_id_layout.{name}", f"{bits} is outside [{_MIN_BITS}, {_MAX_BITS}]"
                )
        total = self.sequence_no_bits + self.partition_id_bits + self.task_attempt_id_bits
        if total != _TOTAL_BITS:
            raise ProtocolError("block_id_layout", f"bit widths sum to {total}, not {_TOTAL_BITS}")
        t = self.task_attempt_id_bits
        set_ = object.__setattr__
        set_(self, "_partition_shift", t)
        set_(self, "_sequence_shift", t + self.partition_id_bits)
        set_(self, "_sequence_mask", (1 << self.sequence_no_bits) - 1)
        set_(self, "_partition_mask", (1 << self.partition_id_bits) - 1)
        set_(self, "_task_mask", (1 << t) - 1)

    @classmethod
    def from_proto_fields(
        cls, sequence_no_bits: int, partition_id_bits: int, task_attempt_id_bits: int
    ) -> BlockIdLayout:
        """Layout from the ``BlockIdLayout`` proto message fields (validated)."""
        return cls(sequence_no_bits, partition_id_bits, task_attempt_id_bits)

    def __iter__(self) -> Iterator[int]:
        yield self.sequence_no_bits
        yield self.partition_id_bits
        yield self.task_attempt_id_bits

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.sequence_no_bits, self.partition_id_bits, self.task_attempt_id_bits)

    @property
    def max_sequence_no(self) -> int:
        return self._sequence_mask

    @property
    def max_partition_id(self) -> int:
        return self._partition_mask

    @property
    def max_task_attempt_id(self) -> int:
        return self._task_mask

    def get_block_id(self, sequence_no: int, partition_id: int, task_attempt_id: int) -> int:
        """Compose a block id; each part must fit its width (like Java's ``getBlockId``)."""
        if not 0 <= sequence_no <= self._sequence_mask:
            raise ProtocolError("sequence_no", f"{sequence_no} does not fit {self.sequence_no_bits} bits")
        if not 0 <= partition_id <= self._partition_mask:
            raise ProtocolError("partition_id", f"{partition_id} does not fit {self.partition_id_bits} bits")
        if not 0 <= task_attempt_id <= self._task_mask:
            raise ProtocolError(
                "task_attempt_id", f"{task_attempt_id} does not fit {self.task_attempt_id_bits} bits"
            )
        return (
            (sequence_no << self._sequence_shift) | (partition_id << self._partition_shift) | task_attempt_id
        )

    def partition_id(self, block_id: int) -> int:
        return (block_id >> self._partition_shift) & self._partition_mask

    def task_attempt_id(self, block_id: int) -> int:
        return block_id & self._task_mask

    def sequence_no(self, block_id: int) -> int:
        return (block_id >> self._sequence_shift) & self._sequence_mask


SPARK_DEFAULT = BlockIdLayout(21, 20, 22)
"""Spark 3 client default: ``maxPartitions`` 1 048 576, ``task.maxFailures`` 4, no speculation."""

UNIFFLE_DEFAULT = BlockIdLayout(18, 24, 21)
"""Uniffle ``BlockIdLayout.DEFAULT`` (an ``RssConf`` without layout keys)."""

RIFFLE_FALLBACK = BlockIdLayout(16, 24, 23)
"""What Riffle assumes when a request carries no layout."""
