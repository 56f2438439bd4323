"""The pure parts of the integrity checks: the block CRC, the scrubber's chunking, the IntegrityLedger,
and the scrubber's walk of a data path (real files and symlinks)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from riffle_actors.actors.scrub import _chunks
from riffle_actors.io.localfile import list_partitions
from riffle_actors.protocol.crc import CRC_IMPL, block_crc, check_indexed, crc32, find_bad_block
from riffle_actors.protocol.index import IndexEntry
from riffle_actors.records import Block, BlockBatch
from riffle_actors.state.integrity import CorruptBlock, IntegrityLedger

# java.util.zip.CRC32 of "123456789" (the standard CRC-32 check value; CRC-32C's would be 0xE3069283)
CHECK_VALUE = 0xCBF43926


def test_block_crc_is_java_crc32_and_uses_isal() -> None:
    assert CRC_IMPL == "isal"
    assert block_crc(b"123456789") == CHECK_VALUE
    data = os.urandom(100_003)
    assert block_crc(data) == zlib.crc32(data) == block_crc(memoryview(data))
    assert crc32(data[50:], crc32(data[:50])) == zlib.crc32(data)  # continues like zlib's


def blk(bid: int, data: bytes, crc: int | None = None) -> Block:
    return Block(bid, len(data), len(data), zlib.crc32(data) if crc is None else crc, 1, data)


def test_find_bad_block_names_the_first_mismatch() -> None:
    good = [blk(1, b"a" * 100), blk(2, b"b" * 100)]
    assert find_bad_block([BlockBatch.of(0, good), BlockBatch.of(1, [blk(3, b"c")])]) is None
    bad = blk(4, b"d" * 10, crc=zlib.crc32(b"e" * 10))
    found = find_bad_block([BlockBatch.of(0, good), BlockBatch.of(7, [blk(3, b"c"), bad, blk(5, b"x", crc=0)])])
    assert found is not None and (found.partition_id, found.block_id) == (7, 4)
    assert (found.expected, found.actual) == (zlib.crc32(b"e" * 10), zlib.crc32(b"d" * 10))
    # a crc outside 32 bits never matches (the client sends the unsigned value)
    assert find_bad_block([BlockBatch.of(0, [blk(6, b"z", crc=zlib.crc32(b"z") | 1 << 32)])]).block_id == 6
    # memoryview data (urpc frames)
    mv = memoryview(b"hello world")
    assert find_bad_block([BlockBatch.of(0, [Block(8, 11, 11, zlib.crc32(b"hello world"), 1, mv)])]) is None


def entries_of(blocks: list[bytes], start: int = 0) -> list[IndexEntry]:
    out, off = [], start
    for i, b in enumerate(blocks):
        out.append(IndexEntry(off, len(b), len(b), zlib.crc32(b), i, 1))
        off += len(b)
    return out


def test_check_indexed_finds_the_rotten_block() -> None:
    blocks = [os.urandom(1000) for _ in range(5)]
    buf = bytearray(b"".join(blocks))
    es = entries_of(blocks, start=4096)
    assert check_indexed(buf, 4096, es) == []
    buf[2500] ^= 1  # inside block 2
    ((e, actual),) = check_indexed(bytes(buf), 4096, es)
    assert e.block_id == 2 and actual == zlib.crc32(bytes(buf[2000:3000]))


def test_chunks_cover_contiguous_runs_within_the_chunk_size() -> None:
    es = entries_of([b"x" * 100] * 10)
    runs = list(_chunks(es, 1000, 350))
    assert [(s, e, len(r)) for s, e, r in runs] == [(0, 300, 3), (300, 600, 3), (600, 900, 3), (900, 1000, 1)]
    # a block bigger than a chunk is one chunk; records past the data file end are left out; gaps split
    big = [IndexEntry(0, 5000, 5000, 0, 1, 1), IndexEntry(6000, 10, 10, 0, 2, 1), IndexEntry(6010, 10, 10, 0, 3, 1),
           IndexEntry(9000, 100, 100, 0, 4, 1)]
    assert [(s, e) for s, e, _ in _chunks(big, 7000, 350)] == [(0, 5000), (6000, 6020)]


def test_ledger_refused_then_repaired() -> None:
    led = IntegrityLedger(max_pending=2)
    assert not led.has_pending("a")
    assert led.on_refused("a", [1, 2, 3]) == 3
    assert led.has_pending("a")
    assert led.on_accepted("a", [1, 9]) == 1
    assert led.on_accepted("a", [1]) == 0  # repaired once
    a = led.app("a")
    assert (a.refused_blocks, a.repaired_blocks, a.pending) == (3, 1, {2})  # 3 was over max_pending
    assert led.on_accepted("other", [1]) == 0 and led.app("other") is None


def test_ledger_corrupt_ranges_per_disk_and_forgotten_by_a_purge() -> None:
    led = IntegrityLedger(max_corrupt=2)
    c = CorruptBlock(1000, 100, 77, 1, 2)
    assert led.on_scrubbed("a", 0, 3, "d1", [c]) == 1
    assert led.on_scrubbed("a", 0, 3, "d1", [c]) == 0  # found again by the next pass: not counted again
    assert led.app("a").corrupt_blocks == 1
    assert led.corrupt_in("a", 0, 3, "d1", 0, 1000) is None  # ends where it starts
    assert led.corrupt_in("a", 0, 3, "d1", 0, 1001) == c
    assert led.corrupt_in("a", 0, 3, "d1", 1099, 5) == c
    assert led.corrupt_in("a", 0, 3, "d1", 1100, 50) is None
    assert led.corrupt_in("a", 0, 3, "d1", 1050, 0) is None  # an empty read holds nothing
    assert led.corrupt_in("a", 0, 3, "d2", 0, 5000) is None  # the other disk's file is fine
    assert led.corrupt_in("a", 0, 4, "d1", 0, 5000) is None
    assert led.corrupt_in("a", 1, 3, "d1", 0, 5000) is None
    # more than max_corrupt: the whole file counts as corrupt
    led.on_scrubbed("a", 0, 3, "d1", [CorruptBlock(o, 10, o, 1, 2) for o in (0, 20, 40)])
    assert led.corrupt_in("a", 0, 3, "d1", 5000, 10) is not None
    led.on_scrubbed("b", 0, 3, "d1", [c])
    led.forget_files("a", 0, "d1")
    assert led.corrupt_in("a", 0, 3, "d1", 0, 5000) is None and led.corrupt_in("a", 0, 3, "d1", 5000, 10) is None
    assert led.corrupt_in("b", 0, 3, "d1", 0, 5000) == c  # another app's findings stay
    assert led.app("a").corrupt_blocks == 4  # counts stay
    led.forget_files("b", None, "d1")
    assert not led.corrupt_partitions()


def test_a_find_of_a_read_that_raced_a_purge_is_dropped() -> None:
    """A scrub chunk (or checked read) in flight when its app is purged must not re-record the
    deleted file's corrupt block after ``forget_files`` (CI saw "findings forgotten" time out)."""
    led = IntegrityLedger()
    c = CorruptBlock(1000, 100, 77, 1, 2)
    before = led.mark()  # the read starts
    led.forget_files("a", 0, "d1")  # the purge lands while it reads
    assert led.on_scrubbed("a", 0, 3, "d1", [c], since=before) == 0
    assert led.on_read_checked("a", 0, 3, "d1", [c], since=before) == 0
    assert not led.corrupt_partitions() and led.app("a") is None
    assert led.on_scrubbed("b", 0, 3, "d1", [c], since=before) == 1  # another app's find stands
    after = led.mark()  # a read that starts after the purge (the id registered again)
    assert led.on_scrubbed("a", 0, 3, "d1", [c], since=after) == 1


def test_ledger_keeps_at_most_max_apps() -> None:
    led = IntegrityLedger(max_apps=2)
    for app in ("a", "b", "c"):
        led.on_refused(app, [1])
    assert led.app("a") is None and led.app("c") is not None


def test_list_partitions_walks_only_real_files(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    shuffle = root / "app_1" / "3"
    shuffle.mkdir(parents=True)
    for pid in (0, 12):
        (shuffle / f"partition-{pid}.index").write_bytes(b"")
        (shuffle / f"partition-{pid}.data").write_bytes(b"")
    (shuffle / "partition-x.index").write_bytes(b"")  # not a partition id
    (shuffle / "shuffle.meta").write_bytes(b"")
    outside = tmp_path / "outside"
    (outside / "9").mkdir(parents=True)
    (outside / "9" / "partition-1.index").write_bytes(b"")
    (outside / "partition-5.index").write_bytes(b"")
    os.symlink(outside / "partition-5.index", shuffle / "partition-5.index")  # a symlinked index file
    os.symlink(outside / "9", root / "app_1" / "9")  # a symlinked shuffle directory
    os.symlink(outside, root / "app_2")  # a symlinked app directory
    (root / "notanapp!").mkdir()
    assert list_partitions(str(root)) == [("app_1", 3, 0), ("app_1", 3, 12)]
    assert list_partitions(str(tmp_path / "missing")) == []


def test_the_heartbeat_carries_the_integrity_totals_to_the_coordinator_listing() -> None:
    from riffle_actors.actors.heartbeat import HeartbeatSnapshot
    from riffle_actors.coordinator.cluster import ServerStatus, ServerView
    from riffle_actors.ctl.tables import INSTANCE_COLUMNS
    from riffle_actors.transport.coordinator_client import encode_heartbeat
    from riffle_actors.transport.coordinator_grpc import decode_heartbeat
    from riffle_actors.transport.coordinator_http import server_to_dict

    led = IntegrityLedger()
    led.on_refused("a", [1, 2])
    led.on_accepted("a", [1])
    led.on_scrubbed("a", 0, 0, "d", [CorruptBlock(0, 1, 5, 1, 2)])
    req = encode_heartbeat(HeartbeatSnapshot(ip="127.0.0.1", grpc_port=1, integrity=led.totals()))
    req.displayMetrics["repaired_blocks_x"] = "7"  # unknown entries are ignored
    req.displayMetrics["corrupt_reads_refused"] = "-3"  # and values that are not counts
    hb = decode_heartbeat(req)
    assert dict(hb.integrity) == {"corrupt_blocks": 1, "refused_blocks": 2, "repaired_blocks": 1}
    row = server_to_dict(ServerView(node=hb, status=ServerStatus.ACTIVE, operator_status=None, excluded=False,
                                    registered_epoch_ms=0, last_heartbeat_epoch_ms=0, assigned_partitions=0,
                                    total_assigned_partitions=0))
    assert (row["corrupt_blocks"], row["repaired_blocks"], row["corrupt_reads_refused"]) == (1, 1, 0)
    assert INSTANCE_COLUMNS["corrupt_blocks"][1](row) == 1 and INSTANCE_COLUMNS["repaired_blocks"][1](row) == 1
