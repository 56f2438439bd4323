"""Immutable per-block records shared by the transports, the actors and the disk IO.

This module owns the shape of one shuffle block as the server keeps it. A ``Block`` is
created once per received block (a NamedTuple: cheap to build, immutable) and is never
copied afterwards: ``data`` stays the ``bytes`` object the transport decoded (gRPC) or a
read-only ``memoryview`` slice of the frame it arrived in (urpc).

See also: ``riffle_actors.protocol.index`` (the 40-byte on-disk record of a block).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple


class Block(NamedTuple):
    """One shuffle block: Uniffle's ``ShuffleBlock`` minus the redundant wire length."""

    block_id: int
    length: int
    uncompress_length: int
    crc: int
    task_attempt_id: int
    data: bytes | memoryview


class BlockBatch:
    """One partition's blocks of one send: the form a send travels in from the transport to the
    partition (``riffle_actors.service``, ``AppendBlocks``, ``AppendPart``).

    Columnar: ``block_ids``, ``lengths``, ``uncompress_lengths``, ``crcs`` and ``task_ids`` are
    ``array('q')`` columns (one entry per block, in wire order) and ``datas`` the payloads (``bytes``
    from gRPC, ``memoryview`` slices of a buffer of the partition's own from urpc), so a check over
    the whole send (ids, CRCs) is one pass over a few arrays, and ``data_bytes`` (the sum of the
    payload lengths) is known without one. ``blocks()`` gives the ``Block`` records a partition keeps.

    Either form is made once and the other only when asked for (then kept): the urpc decoder builds
    the columns and the partition makes the records; the gRPC adapter builds the records (protobuf
    hands over one message per block anyway) and the columns exist only if something reads them.
    """

    __slots__ = ("_blocks", "_cols", "data_bytes", "partition_id")

    def __init__(self, partition_id: int, block_ids: array, lengths: array, uncompress_lengths: array,
                 crcs: array, task_ids: array, datas: list, data_bytes: int | None = None) -> None:
        self.partition_id = partition_id
        self._cols: tuple | None = (block_ids, lengths, uncompress_lengths, crcs, task_ids, datas)
        self._blocks: tuple[Block, ...] | None = None
        self.data_bytes = sum(map(len, datas)) if data_bytes is None else data_bytes

    @classmethod
    def of(cls, partition_id: int, blocks: Iterable[Block]) -> BlockBatch:
        """A batch of ``Block`` records (the gRPC adapter, tests, tools)."""
        self = cls.__new__(cls)
        self.partition_id = partition_id
        self._blocks = blocks = tuple(blocks)
        self._cols = None
        self.data_bytes = sum(len(b.data) for b in blocks)
        return self

    def _columns(self) -> tuple:
        cols = self._cols
        if cols is None:
            blocks = self._blocks
            assert blocks is not None  # a batch has one form at least
            cols = self._cols = (array("q", [b.block_id for b in blocks]), array("q", [b.length for b in blocks]),
                                 array("q", [b.uncompress_length for b in blocks]),
                                 array("q", [b.crc for b in blocks]), array("q", [b.task_attempt_id for b in blocks]),
                                 [b.data for b in blocks])
        return cols

    @property
    def block_ids(self) -> array:
        return self._columns()[0]

    @property
    def lengths(self) -> array:
        return self._columns()[1]

    @property
    def uncompress_lengths(self) -> array:
        return self._columns()[2]

    @property
    def crcs(self) -> array:
        return self._columns()[3]

    @property
    def task_ids(self) -> array:
        return self._columns()[4]

    @property
    def datas(self) -> list:
        return self._columns()[5]

    def id_crc_data(self) -> Iterable[tuple[int, int, Any]]:
        """(block id, crc, data) of each block in wire order, from whichever form the batch has (the
        ingest CRC check reads it without making the other form)."""
        if self._blocks is not None:
            return ((b.block_id, b.crc, b.data) for b in self._blocks)
        cols = self._cols
        assert cols is not None
        return zip(cols[0], cols[3], cols[5])

    def min_block_id(self) -> int:
        """The smallest block id (0 for no blocks), from whichever form the batch has."""
        if self._cols is not None:
            ids = self._cols[0]
            return min(ids) if ids else 0
        return min((b.block_id for b in self._blocks), default=0)  # type: ignore[union-attr]

    def __len__(self) -> int:
        return len(self._blocks) if self._blocks is not None else len(self._cols[0])  # type: ignore[index]

    def blocks(self) -> tuple[Block, ...]:
        blocks = self._blocks
        if blocks is None:
            blocks = self._blocks = tuple(map(Block, *self._cols))  # type: ignore[misc]
        return blocks

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockBatch):
            return NotImplemented
        return (self.partition_id == other.partition_id and self._columns()[:5] == other._columns()[:5]
                and list(map(bytes, self.datas)) == list(map(bytes, other.datas)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockBatch(partition {self.partition_id}, {len(self)} blocks, {self.data_bytes} bytes)"
