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


# --- direct reads (direct_io_read_enable) ------------------------------------------------------------
def _resident_bytes(path: str) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_direct_reads_return_exactly_the_range_at_any_alignment(tmp_path: Path):
    """Unaligned starts and ends, the file's unpadded tail (a short read at the end of the file), ranges
    larger than a reader thread's buffer, an empty range, and past-the-end refusals."""
    _needs_direct(tmp_path)
    size = localfile.DIRECT_READ_BYTES + 3 * 4096 + 123  # the last block is not a whole 4096
    localfile.append_batch(str(tmp_path), "app", 1, 3, _blocks([size - 5000, 5000], 9), direct=True)
    data, _ = _files(tmp_path)
    assert len(data) == size
    rng = random.Random(4)
    ranges = [(0, size), (0, 1), (1, 4095), (4095, 2), (4096, 4096), (size - 1, 1), (size - 4097, 4097),
              (size - 123, 123), (5, localfile.DIRECT_READ_BYTES), (0, 0), (size, 0)]
    ranges += [(o, rng.randint(0, size - o)) for o in (rng.randrange(size) for _ in range(40))]
    for offset, length in ranges:
        got = localfile.read_data(str(tmp_path), "app", 1, 3, offset, length, direct=True)
        assert got == data[offset:offset + length], (offset, length)
    assert localfile.direct_read_refused(str(tmp_path)) is None
    from riffle_actors.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="past the end"):
        localfile.read_data(str(tmp_path), "app", 1, 3, size - 1, 2, direct=True)


def test_direct_reads_bypass_the_page_cache_and_replace_sendfile(tmp_path: Path):
    _needs_direct(tmp_path)
    if shutil.which("fincore") is None:
        pytest.skip("fincore (util-linux) is needed to see the page cache")
    io = RealLocalIO(direct_io=True, direct_read=True)
    io.append_batch(str(tmp_path), "app", 1, 3, _blocks([4 << 20, 77], 2))
    data_path, _ = localfile.partition_paths(str(tmp_path), "app", 1, 3)
    _evict(data_path)
    assert _resident_bytes(data_path) == 0
    expected = Path(data_path).read_bytes()
    _evict(data_path)
    assert io.read_data(str(tmp_path), "app", 1, 3, 0, len(expected)) == expected
    # sendfile would read through the page cache: the bytes come back instead of an open file
    assert io.open_data(str(tmp_path), "app", 1, 3, 10, 1 << 20) == expected[10:10 + (1 << 20)]
    assert _resident_bytes(data_path) == 0
    buffered = RealLocalIO(direct_io=True, direct_read=False)
    assert buffered.read_data(str(tmp_path), "app", 1, 3, 0, len(expected)) == expected
    assert _resident_bytes(data_path) >= 4 << 20
    f = buffered.open_data(str(tmp_path), "app", 1, 3, 0, 5)
    assert isinstance(f, localfile.DataFile)
    os.close(f.fd)
    # Riffle reads directly only where it appends directly
    assert RealLocalIO(direct_io=False, direct_read=True).direct_read is False
