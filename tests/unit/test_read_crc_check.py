"""The read CRC check's pieces on real files: the index lookup of a range, the check, the ledger record.

``localfile.index_entries_in`` must give exactly the records of the blocks wholly inside a range
(found by a binary search over the index file, read in pieces), whatever the range's alignment:
compared with a plain filter over the whole index, for random block sizes, ranges cutting blocks
at either edge, ranges spanning more records than one piece, and absent files. The Disk actor's
``_read_checked`` then finds exactly the flipped block; the ledger records a read-check find like a
scrubber's, and the refusal names who found it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from riffle_actors.actors.disk import _read_checked
from riffle_actors.io import localfile
from riffle_actors.io.local import RealLocalIO
from riffle_actors.protocol.crc import block_crc
from riffle_actors.protocol.index import IndexEntry, decode_index
from riffle_actors.records import Block
from riffle_actors.state.integrity import CorruptBlock, IntegrityLedger

APP = "application_1_0001_2"


def _write(root: Path, sizes: list[int], seed: int, per_append: int = 7) -> list[IndexEntry]:
    rng = random.Random(seed)
    blocks = []
    for i, n in enumerate(sizes):
        data = rng.randbytes(n)
        blocks.append(Block(i, n, n, block_crc(data), 1, data))
    for i in range(0, len(blocks), per_append):
        localfile.append_batch(str(root), APP, 0, 3, blocks[i:i + per_append])
    index, _ = localfile.read_index(str(root), APP, 0, 3)
    return decode_index(index)


def _whole(entries: list[IndexEntry], offset: int, length: int) -> list[IndexEntry]:
    end = offset + length
    return [e for e in entries if offset <= e.offset < end and e.offset + e.length <= end]


def test_index_entries_in_gives_the_whole_blocks_of_any_range(tmp_path: Path) -> None:
    rng = random.Random(5)
    sizes = [rng.choice((0, 1, 17, 4096, 5000, 65536)) for _ in range(300)]
    entries = _write(tmp_path, sizes, seed=1)
    size = entries[-1].offset + entries[-1].length
    ranges = [(0, size), (0, 0), (size, 0), (1, size - 1), (0, size - 1)]
    ranges += [(e.offset, e.length) for e in entries[::17]]  # one block each
    ranges += [(entries[10].offset, entries[40].offset - entries[10].offset)]  # a client segment
    for _ in range(300):
        offset = rng.randrange(size)
        ranges.append((offset, rng.randrange(size - offset + 1)))
    for offset, length in ranges:
        got = localfile.index_entries_in(str(tmp_path), APP, 0, 3, offset, length)
        assert got == _whole(entries, offset, length), (offset, length)


def test_a_range_of_more_records_than_one_piece_is_read_whole(tmp_path: Path) -> None:
    n = localfile._RANGE_SCAN_RECORDS * 2 + 100
    entries = _write(tmp_path, [3] * n, seed=2, per_append=1000)
    got = localfile.index_entries_in(str(tmp_path), APP, 0, 3, 6, 3 * (n - 3))
    assert got == entries[2:n - 1]


def test_no_files_no_records(tmp_path: Path) -> None:
    assert localfile.index_entries_in(str(tmp_path), APP, 0, 3, 0, 100) == []
    _write(tmp_path, [10], seed=3)
    assert localfile.index_entries_in(str(tmp_path), APP, 0, 4, 0, 100) == []  # another partition


def test_the_read_check_finds_the_flipped_block_only(tmp_path: Path) -> None:
    entries = _write(tmp_path, [1000] * 10, seed=4)
    io = RealLocalIO()
    data, blocks, checked, bad = _read_checked(io.read_data, io, str(tmp_path), APP, 0, 3, 0, 10_000)
    assert (blocks, checked, bad) == (10, 10_000, []) and len(data) == 10_000
    path, _ = localfile.partition_paths(str(tmp_path), APP, 0, 3)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, 4321)[0] ^ 1]), 4321)
    finally:
        os.close(fd)
    data, blocks, checked, bad = _read_checked(io.read_data, io, str(tmp_path), APP, 0, 3, 0, 10_000)
    assert [e for e, _ in bad] == [entries[4]] and bad[0][1] == block_crc(data[4000:5000])
    assert data == Path(path).read_bytes()  # the bytes checked are the bytes returned
    # a range cutting the rotten block at an edge: the whole blocks are checked, the cut one is not
    data, blocks, checked, bad = _read_checked(io.read_data, io, str(tmp_path), APP, 0, 3, 4500, 2500)
    assert (blocks, checked, bad) == (2, 2000, [])


def test_a_read_check_find_is_recorded_like_a_scrub_and_named_in_the_refusal() -> None:
    led = IntegrityLedger()
    c = CorruptBlock(1000, 100, 77, 1, 2, "read check")
    assert led.on_read_checked("a", 0, 3, "d1", [c]) == 1
    assert led.on_scrubbed("a", 0, 3, "d1", [CorruptBlock(1000, 100, 77, 1, 2)]) == 0  # the same block
    assert led.corrupt_in("a", 0, 3, "d1", 0, 2000) == c
    assert led.app("a").corrupt_blocks == 1 and dict(led.totals())["corrupt_blocks"] == 1
    msg = IntegrityLedger.refusal(c, 3, "d1")
    assert "block 77 at offset 1000" in msg and "found by the read check" in msg
    assert "found by the scrubber" in IntegrityLedger.refusal(CorruptBlock(0, 1, 2, 3, 4), 3, "d1")
