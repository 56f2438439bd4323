"""PartitionBuffer: one partition's blocks in memory, staging and in flight, with the read cursor.

Owns, for one (app, shuffle, partition):

- ``staging``: blocks appended since the last spill, in arrival order;
- in-flight batches (``flight_id`` -> blocks): staging lists handed to a disk, still readable
  until the disk acknowledged data *and* index (spec §2.6 invariant);
- the ids of every block ever accepted, so a retried send is de-duplicated even after its
  first copy was spilled (a duplicate id in memory would loop the client's cursor forever).

Every accepted block gets an arrival sequence number. Because a spill always takes the
whole staging list, each batch is a contiguous run of sequence numbers and the logical
memory sequence S (flights by ascending id, then staging) is sorted by it; the
``lastBlockId`` cursor therefore finds its position with one dict lookup and a bisect.

Sizes are counted as Uniffle counts them: ``len(data) + 32`` per block.

See also: ``riffle_actors.state.partition`` (the partition logic around it, owned by a PartitionActor).
"""

from __future__ import annotations

import bisect
from collections.abc import Container, Iterable
from dataclasses import dataclass

from pyroaring import BitMap64

from riffle_actors.records import Block

BLOCK_OVERHEAD_BYTES = 32


def block_size(block: Block) -> int:
    return len(block.data) + BLOCK_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class Flight:
    """A batch of blocks being spilled; ``size`` in budget bytes, ``data_bytes`` on disk."""

    flight_id: int
    blocks: tuple[Block, ...]
    size: int
    data_bytes: int


class _Run:
    """A contiguous run of sequence numbers: the staging list or one in-flight batch."""

    __slots__ = ("first_seq", "blocks", "flight_id", "size")

    def __init__(self, first_seq: int, blocks: list[Block], flight_id: int):
        self.first_seq = first_seq
        self.blocks = blocks
        self.flight_id = flight_id  # -1 for staging
        self.size = 0  # budget bytes of an in-flight batch (set when it leaves staging)


class PartitionBuffer:
    __slots__ = (
        "_flights", "_staging", "staging_bytes", "in_flight_bytes", "_seen_ids", "_seq_of",
        "_next_seq", "_next_flight_id", "total_bytes", "block_count",
    )

    def __init__(self) -> None:
        self._flights: list[_Run] = []  # ascending flight id == ascending first_seq
        self._staging = _Run(0, [], -1)
        self.staging_bytes = 0
        self.in_flight_bytes = 0
        self._seen_ids = BitMap64()
        self._seq_of: dict[int, int] = {}  # block id -> arrival seq, for blocks in memory
        self._next_seq = 0
        self._next_flight_id = 1
        self.total_bytes = 0  # every byte ever accepted, memory or disk (huge-partition check)
        self.block_count = 0

    # ------------------------------------------------------------------ writes
    def append(self, blocks: Iterable[Block]) -> int:
        """Append blocks in order, dropping ids seen before; returns the budget bytes accepted."""
        return self.append_blocks(blocks)[0]

    def append_blocks(self, blocks: Iterable[Block]) -> tuple[int, int]:
        """``append``, also counting what was dropped: (accepted, dropped) budget bytes."""
        seen = self._seen_ids
        seq_of = self._seq_of
        staging = self._staging.blocks
        seq = self._next_seq
        accepted = dropped = 0
        for block in blocks:
            bid = block.block_id
            if bid in seen:
                dropped += len(block.data) + BLOCK_OVERHEAD_BYTES
                continue
            seen.add(bid)
            seq_of[bid] = seq
            seq += 1
            staging.append(block)
            accepted += len(block.data) + BLOCK_OVERHEAD_BYTES
        self.block_count += seq - self._next_seq
        self._next_seq = seq
        self.staging_bytes += accepted
        self.total_bytes += accepted
        return accepted, dropped

    def start_flight(self) -> Flight | None:
        """Move the whole staging list into a new in-flight batch (None if staging is empty)."""
        run = self._staging
        if not run.blocks:
            return None
        run.flight_id = self._next_flight_id
        self._next_flight_id += 1
        self._flights.append(run)
        run.size = size = self.staging_bytes
        flight = Flight(run.flight_id, tuple(run.blocks), size, size - BLOCK_OVERHEAD_BYTES * len(run.blocks))
        self.in_flight_bytes += size
        self.staging_bytes = 0
        self._staging = _Run(self._next_seq, [], -1)
        return flight

    def complete_flight(self, flight_id: int) -> int:
        """The batch is durably on disk: drop it from memory; returns its budget bytes."""
        for i, run in enumerate(self._flights):
            if run.flight_id == flight_id:
                del self._flights[i]
                pop = self._seq_of.pop
                for block in run.blocks:
                    pop(block.block_id, None)
                self.in_flight_bytes -= run.size
                return run.size
        return 0

    def in_flight_ids(self) -> list[int]:
        return [run.flight_id for run in self._flights]

    def flight(self, flight_id: int) -> Flight | None:
        for run in self._flights:
            if run.flight_id == flight_id:
                size = sum(len(b.data) for b in run.blocks)
                return Flight(run.flight_id, tuple(run.blocks), size + BLOCK_OVERHEAD_BYTES * len(run.blocks), size)
        return None

    # ------------------------------------------------------------------ reads
    @property
    def memory_bytes(self) -> int:
        return self.staging_bytes + self.in_flight_bytes

    def _runs(self) -> list[_Run]:
        return [*self._flights, self._staging]

    def read(self, last_block_id: int, read_buffer_size: int,
             task_filter: Container[int] | None = None) -> list[Block]:
        """Blocks after ``last_block_id`` in memory order, at least one if any, about ``read_buffer_size`` bytes.

        ``last_block_id == -1`` or an id no longer in memory starts from the beginning (spec §2.6).
        """
        runs = self._runs()
        start_seq = -1
        if last_block_id != -1:
            seq = self._seq_of.get(last_block_id)
            if seq is not None:
                start_seq = seq
        # position of the first block with sequence > start_seq
        firsts = [r.first_seq for r in runs]
        ri = max(0, bisect.bisect_right(firsts, start_seq) - 1)
        out: list[Block] = []
        total = 0
        for run in runs[ri:]:
            blocks = run.blocks
            i = start_seq + 1 - run.first_seq
            if i < 0:
                i = 0
            for j in range(i, len(blocks)):
                block = blocks[j]
                if task_filter is not None and block.task_attempt_id not in task_filter:
                    continue
                out.append(block)
                total += len(block.data)
                if total >= read_buffer_size:
                    return out
        return out

    def contains_block(self, block_id: int) -> bool:
        return block_id in self._seen_ids
