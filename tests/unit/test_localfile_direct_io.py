"""O_DIRECT spill appends (``localfile.append_batch(direct=True)``): exact bytes, exact index offsets.

Each case appends the same batches with buffered IO to one data path and with direct IO to
another and requires byte-identical data and index files: unaligned tails carried from one
append to the next, empty batches, batches larger than the staging buffer, memoryview
payloads. ``fincore`` (util-linux) shows that a direct append leaves the page cache alone.
The file systems that refuse O_DIRECT are covered in ``tests/fault/test_direct_io_mounts.py``.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.io import localfile
from riffle_actors.io.local import RealLocalIO
from riffle_actors.records import Block


def _needs_direct(path: Path) -> None:
    probe = path / ".odirect-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError as e:
        pytest.skip(f"the file system of {path} refuses O_DIRECT ({e}); direct appends cannot be tested here")
    finally:
        probe.unlink(missing_ok=True)


def _blocks(sizes: list[int], seed: int, start_id: int = 0, as_view: bool = False) -> list[Block]:
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(sizes):
        data = rng.randbytes(n)
        out.append(Block(start_id + i, n, n * 2, i, 7, memoryview(data) if as_view else data))
    return out


def _files(root: Path) -> tuple[bytes, bytes]:
    data, index = localfile.partition_paths(str(root), "app", 1, 3)
    return Path(data).read_bytes(), Path(index).read_bytes()


def _append_both(tmp: Path, batches: list[list[Block]]) -> None:
    buffered, direct = tmp / "buffered", tmp / "direct"
    for batch in batches:
        a = localfile.append_batch(str(buffered), "app", 1, 3, batch)
        b = localfile.append_batch(str(direct), "app", 1, 3, batch, direct=True)
        assert a == b
    assert localfile.direct_io_refused(str(direct)) is None
    assert _files(direct) == _files(buffered)
    data_len = len(_files(direct)[0])
    assert localfile.read_index(str(direct), "app", 1, 3) == (_files(buffered)[1], data_len)


def test_unaligned_appends_match_buffered_ones(tmp_path: Path):
    _needs_direct(tmp_path)
    sizes = [[1], [4095], [1, 2, 3], [4096], [5000, 1], [], [0], [8191, 4097], [12288], [3]]
    _append_both(tmp_path, [_blocks(s, seed=i, start_id=100 * i) for i, s in enumerate(sizes)])
    data, _ = _files(tmp_path / "direct")
    assert len(data) == sum(map(sum, sizes))


def test_a_batch_larger_than_the_staging_buffer_is_written_in_pieces(tmp_path: Path):
    _needs_direct(tmp_path)
    big = localfile.DIRECT_STAGING_BYTES + 12345
    _append_both(tmp_path, [_blocks([777], 1), _blocks([big, 5], 2, 10, as_view=True), _blocks([3], 3, 20)])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9000), max_size=5), min_size=1, max_size=6), st.integers(0, 2**16))
def test_any_sequence_of_appends_matches_buffered(tmp_path_factory, batches, seed):
    tmp = tmp_path_factory.mktemp("direct")
    _needs_direct(tmp)
    _append_both(tmp, [_blocks(s, seed + i, 50 * i, as_view=bool(i % 2)) for i, s in enumerate(batches)])
    shutil.rmtree(tmp)


def test_direct_appends_bypass_the_page_cache(tmp_path: Path):
    _needs_direct(tmp_path)
    if shutil.which("fincore") is None:
        pytest.skip("fincore (util-linux) is needed to see the page cache")
    io = RealLocalIO(direct_io=True)
    io.append_batch(str(tmp_path), "app", 1, 3, _blocks([4 << 20], 1))
    data, _ = localfile.partition_paths(str(tmp_path), "app", 1, 3)
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", data],
                         capture_output=True, text=True, check=True).stdout
    assert int(out.split()[0]) == 0  # a buffered append would leave 4 MiB of (dirty) cache
    buffered = RealLocalIO(direct_io=False)
    buffered.append_batch(str(tmp_path / "b"), "app", 1, 3, _blocks([4 << 20], 1))
    data_b, _ = localfile.partition_paths(str(tmp_path / "b"), "app", 1, 3)
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", data_b],
                         capture_output=True, text=True, check=True).stdout
    assert int(out.split()[0]) >= 4 << 20


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_concurrent_appends_to_one_partition_keep_every_block_at_its_indexed_offset(
    tmp_path: Path, direct: bool
) -> None:
    """Several writer threads per disk (``disk_write_threads``) may append batches of one partition at
    once; each block must still be found, byte-exact, where its index record says."""
    from concurrent.futures import ThreadPoolExecutor

    from riffle_actors.protocol.index import decode_index

    if direct:
        _needs_direct(tmp_path)
    batches = [_blocks([random.Random(i).randint(1, 9000) for _ in range(3)], seed=i, start_id=10 * i)
               for i in range(200)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda b: localfile.append_batch(str(tmp_path), "app", 1, 3, b, direct=direct), batches))
    data, index = _files(tmp_path)
    entries = decode_index(index)
    expected = {b.block_id: bytes(b.data) for batch in batches for b in batch}
    assert sorted(e.block_id for e in entries) == sorted(expected)
    assert sum(e.length for e in entries) == len(data)
    for e in entries:
        assert data[e.offset:e.offset + e.length] == expected[e.block_id], f"block {e.block_id} misplaced"
