"""The shuffle metadata log: record format (torn tails, corrupt checksums, versions), the file writer and
the start-up scan's repairs, and the recovery plan built from scans."""

from __future__ import annotations

import struct
from array import array
from pathlib import Path

import pytest

from riffle_actors.io import meta_store
from riffle_actors.io.localfile import append_batch
from riffle_actors.protocol.index import INDEX_RECORD_SIZE
from riffle_actors.protocol.shuffle_meta import (
    BLOCK_IDS,
    FILE_HEADER,
    HEADER_SIZE,
    REGISTER,
    SEGMENT,
    BlockIdsRecord,
    MetaFormatError,
    RegisterRecord,
    SegmentRecord,
    decode_log,
    encode_block_ids,
    encode_register,
    encode_segment,
    frame,
)
from riffle_actors.records import Block
from riffle_actors.state.recovery import plan_recovery
from riffle_actors.state.tier_policy import HDFS_TIER


def _log(*records: tuple[int, bytes]) -> bytes:
    return FILE_HEADER + b"".join(frame(k, b) for k, b in records)


REG = (REGISTER, encode_register([(0, 3), (7, 9)], local_order=True, user="alice", remote_storage="hdfs://x",
                                 properties=[("k", "v"), ("ü", "é")]))
IDS = (BLOCK_IDS, encode_block_ids([(1, array("Q", [5, 6, 2**63 - 1])), (2, [])]))
SEG = (SEGMENT, encode_segment(3, "/data/d1"))


def test_round_trip_of_every_kind() -> None:
    out = decode_log(_log(REG, IDS, SEG))
    assert out.problem == "" and out.unknown_records == 0
    assert out.valid_length == len(_log(REG, IDS, SEG))
    reg, ids, seg = out.records
    assert reg == RegisterRecord(((0, 3), (7, 9)), True, "alice", "hdfs://x", (("k", "v"), ("ü", "é")))
    assert isinstance(ids, BlockIdsRecord)
    assert [(p, list(a)) for p, a in ids.parts] == [(1, [5, 6, 2**63 - 1]), (2, [])]
    assert seg == SegmentRecord(3, "/data/d1")


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 12])
def test_a_torn_tail_is_reported_and_everything_before_it_kept(cut: int) -> None:
    whole = _log(REG, IDS)
    buf = whole + frame(*SEG)[:cut]
    out = decode_log(buf)
    assert len(out.records) == 2
    assert out.valid_length == len(whole)
    assert "torn" in out.problem


def test_a_corrupt_checksum_stops_the_read_there() -> None:
    first = _log(REG)
    bad = bytearray(frame(*IDS))
    bad[-1] ^= 0xFF
    out = decode_log(first + bytes(bad) + frame(*SEG))
    assert [type(r) for r in out.records] == [RegisterRecord]
    assert out.valid_length == len(first)
    assert "checksum mismatch" in out.problem


def test_an_implausible_length_is_not_read_as_a_record() -> None:
    buf = _log(REG) + struct.pack("<IIB", 0xFFFFFFF0, 0, REGISTER)
    out = decode_log(buf)
    assert len(out.records) == 1 and "not plausible" in out.problem


def test_unknown_kinds_from_a_newer_writer_are_skipped() -> None:
    out = decode_log(_log(REG, (99, b"future"), SEG))
    assert out.unknown_records == 1
    assert [type(r) for r in out.records] == [RegisterRecord, SegmentRecord]
    assert out.problem == ""


def test_a_checked_record_that_does_not_parse_stops_the_read() -> None:
    out = decode_log(_log(REG, (SEGMENT, b"\x01\x00")))
    assert len(out.records) == 1 and "does not parse" in out.problem


@pytest.mark.parametrize("buf, why", [
    (b"RSHM", "torn"),
    (b"XXXX\x01\x00\x00\x00", "not a shuffle metadata log"),
    (b"RSHM\x02\x00\x00\x00", "version 2 is not supported"),
])
def test_a_bad_header_makes_the_file_unusable(buf: bytes, why: str) -> None:
    with pytest.raises(MetaFormatError, match=why):
        decode_log(buf)


def test_header_only_is_an_empty_log() -> None:
    out = decode_log(FILE_HEADER)
    assert out.records == [] and out.valid_length == HEADER_SIZE and out.problem == ""


# ---------------------------------------------------------------------------- file writer and scan
def _blocks(pid: int, ids: list[int]) -> list[Block]:
    return [Block(i, 10, 10, 0, 1, bytes([i % 256]) * 10) for i in ids]


def test_append_writes_the_header_once_and_the_scan_reads_it_back(tmp_path: Path) -> None:
    root = str(tmp_path)
    meta_store.append_meta(root, "app", 0, [REG])
    meta_store.append_meta(root, "app", 0, [IDS, SEG])
    raw = Path(meta_store.meta_path(root, "app", 0)).read_bytes()
    assert raw.startswith(FILE_HEADER) and raw.count(b"RSHM") == 1
    append_batch(root, "app", 0, 1, _blocks(1, [5, 6]))
    scan = meta_store.scan_root(root)
    shuffle = scan.apps["app"].shuffles[0]
    assert shuffle.meta is not None and len(shuffle.meta.records) == 3
    assert list(shuffle.partitions[1].block_ids) == [5, 6] and shuffle.partitions[1].data_bytes == 20
    assert shuffle.repaired == []


def test_scan_truncates_torn_files(tmp_path: Path) -> None:
    root = str(tmp_path)
    meta_store.append_meta(root, "app", 0, [REG, IDS])
    meta = Path(meta_store.meta_path(root, "app", 0))
    good_meta = meta.stat().st_size
    with open(meta, "ab") as f:
        f.write(frame(*SEG)[:5])
    append_batch(root, "app", 0, 1, _blocks(1, [5, 6]))
    index = tmp_path / "app" / "0" / "partition-1.index"
    data = tmp_path / "app" / "0" / "partition-1.data"
    with open(index, "ab") as f:
        f.write(b"\0" * 7)  # torn last index record
    with open(data, "ab") as f:
        f.write(b"z" * 30)  # data written, its index record never was
    (tmp_path / "app" / "0" / "partition-4.data").write_bytes(b"q" * 8)  # no index at all
    scan = meta_store.scan_root(root)
    shuffle = scan.apps["app"].shuffles[0]
    assert meta.stat().st_size == good_meta
    assert index.stat().st_size == 2 * INDEX_RECORD_SIZE
    assert data.stat().st_size == 20
    assert not (tmp_path / "app" / "0" / "partition-4.data").exists()
    text = "\n".join(shuffle.repaired)
    assert "torn record" in text and "torn last index record" in text and "after the last indexed block" in text
    assert "without any index record" in text


def test_scan_cuts_index_records_past_the_data_file(tmp_path: Path) -> None:
    root = str(tmp_path)
    append_batch(root, "app", 0, 1, _blocks(1, [1, 2, 3]))
    data = tmp_path / "app" / "0" / "partition-1.data"
    with open(data, "r+b") as f:
        f.truncate(15)  # the third block and half of the second are gone
    part = meta_store.scan_root(root).apps["app"].shuffles[0].partitions[1]
    assert list(part.block_ids) == [1] and part.data_bytes == 10
    assert (tmp_path / "app" / "0" / "partition-1.index").stat().st_size == INDEX_RECORD_SIZE


# ---------------------------------------------------------------------------- the plan
def test_plan_counts_lost_blocks_and_orders_segments(tmp_path: Path) -> None:
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    meta_store.append_meta(d1, "app", 0, [
        (REGISTER, encode_register([(0, 9)], user="bob")),
        (BLOCK_IDS, encode_block_ids([(1, [1, 2, 3]), (2, [7])])),
        (SEGMENT, encode_segment(1, d2)), (SEGMENT, encode_segment(1, d1)),
    ])
    append_batch(d2, "app", 0, 1, _blocks(1, [1]))
    append_batch(d1, "app", 0, 1, _blocks(1, [2]))
    append_batch(d1, "app", 0, 2, _blocks(2, [7]))
    plan = plan_recovery([meta_store.scan_root(d1), meta_store.scan_root(d2)])
    assert plan.removals == []
    (app,) = plan.apps
    assert app.home == d1 and app.user == "bob"
    s = app.shuffles[0]
    assert s.partitions[1].disks == (d2, d1)  # the segment records' order, not the data paths'
    assert s.lost_blocks == 1 and s.lost_partitions == (1,)  # block 3 was reported, never spilled
    assert sorted(s.reported[1]) == [1, 2, 3]


def test_blocks_of_a_partition_with_an_hdfs_segment_are_not_counted_lost(tmp_path: Path) -> None:
    d1 = str(tmp_path / "d1")
    meta_store.append_meta(d1, "app", 0, [
        (REGISTER, encode_register([(0, 9)], remote_storage="hdfs://nn:8020/rss")),
        (BLOCK_IDS, encode_block_ids([(1, [1, 2]), (2, [7, 8])])),
        (SEGMENT, encode_segment(1, d1)), (SEGMENT, encode_segment(2, HDFS_TIER)),
    ])
    append_batch(d1, "app", 0, 1, _blocks(1, [1]))
    append_batch(d1, "app", 0, 2, _blocks(2, [7]))
    (app,) = plan_recovery([meta_store.scan_root(d1)]).apps
    s = app.shuffles[0]
    # partition 2's block 8 went to HDFS (clients read it there); partition 1's block 2 is lost
    assert s.lost_blocks == 1 and s.lost_partitions == (1,)
    assert s.remote_storage == "hdfs://nn:8020/rss"


def test_plan_removes_what_has_no_usable_metadata(tmp_path: Path) -> None:
    d1 = str(tmp_path / "d1")
    meta_store.append_meta(d1, "good", 0, [REG])
    append_batch(d1, "good", 1, 0, _blocks(0, [1]))  # shuffle 1: data but no metadata
    append_batch(d1, "orphan", 0, 0, _blocks(0, [1]))
    Path(d1, "bad-version", "0").mkdir(parents=True)
    Path(d1, "bad-version", "0", "shuffle.meta").write_bytes(b"RSHM\x07\x00\x00\x00")
    meta_store.append_meta(d1, "no-register", 0, [IDS])
    plan = plan_recovery([meta_store.scan_root(d1)])
    assert [a.app_id for a in plan.apps] == ["good"]
    removed = dict(plan.removals)
    assert set(removed) == {f"{d1}/good/1", f"{d1}/orphan", f"{d1}/bad-version", f"{d1}/no-register"}
    assert "version 7 is not supported" in removed[f"{d1}/bad-version"]
    assert "no registration" in removed[f"{d1}/no-register"]
    assert "no metadata log" in removed[f"{d1}/good/1"]
