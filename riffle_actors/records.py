"""Immutable per-block records shared by the transports, the actors and the disk IO.

This module owns the shape of one shuffle block as the server keeps it. A ``Block`` is
created once per received block (a NamedTuple: cheap to build, immutable) and is never
copied afterwards: ``data`` stays the ``bytes`` object the transport decoded (gRPC) or a
read-only ``memoryview`` slice of the frame it arrived in (urpc).

See also: ``riffle_actors.protocol.index`` (the 40-byte on-disk record of a block).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from typing import NamedTuple


class Block(NamedTuple):
    """One shuffle block: Uniffle's ``ShuffleBlock`` minus the redundant wire length."""

    block_id: int
    length: int
    uncompress_length: int
    crc: int
    task_attempt_id: int
    data: bytes | memoryview


class BlockBatch:
    """One partition's blocks of one send, columnar: the form a send travels in from the transport to
    the partition (``riffle_actors.service``, ``AppendBlocks``).

    The integer fields are ``array('q')`` columns (one entry per block, in wire order) and ``datas``
    the payloads (``bytes`` from gRPC, or ``memoryview`` slices of one buffer of the partition's own
    from urpc), so a send costs no Python object per block until a partition stores it, and a
    check over the whole send (ids, lengths, CRCs) is one pass over a few arrays. ``data_bytes`` is
    ``sum(len(d) for d in datas)``. ``blocks()`` makes the ``Block`` records a partition keeps.
    """

    __slots__ = ("block_ids", "crcs", "data_bytes", "datas", "lengths", "partition_id", "task_ids",
                 "uncompress_lengths")

    def __init__(self, partition_id: int, block_ids: array, lengths: array, uncompress_lengths: array,
                 crcs: array, task_ids: array, datas: list, data_bytes: int | None = None) -> None:
        self.partition_id = partition_id
        self.block_ids = block_ids
        self.lengths = lengths
        self.uncompress_lengths = uncompress_lengths
        self.crcs = crcs
        self.task_ids = task_ids
        self.datas = datas
        self.data_bytes = sum(map(len, datas)) if data_bytes is None else data_bytes

    @classmethod
    def of(cls, partition_id: int, blocks: Iterable[Block]) -> BlockBatch:
        """A batch from ``Block`` records (tests, tools, the gRPC adapter's fallback)."""
        blocks = tuple(blocks)
        return cls(partition_id, array("q", [b.block_id for b in blocks]), array("q", [b.length for b in blocks]),
                   array("q", [b.uncompress_length for b in blocks]), array("q", [b.crc for b in blocks]),
                   array("q", [b.task_attempt_id for b in blocks]), [b.data for b in blocks])

    def __len__(self) -> int:
        return len(self.block_ids)

    def blocks(self) -> Iterator[Block]:
        return map(Block, self.block_ids, self.lengths, self.uncompress_lengths, self.crcs, self.task_ids,
                   self.datas)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockBatch):
            return NotImplemented
        return (self.partition_id == other.partition_id and self.block_ids == other.block_ids
                and self.lengths == other.lengths and self.uncompress_lengths == other.uncompress_lengths
                and self.crcs == other.crcs and self.task_ids == other.task_ids
                and list(map(bytes, self.datas)) == list(map(bytes, other.datas)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockBatch(partition {self.partition_id}, {len(self)} blocks, {self.data_bytes} bytes)"
