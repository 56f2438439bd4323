"""O_DIRECT spill appends on real mounts: a file system that refuses O_DIRECT, and tmpfs.

ramfs refuses ``O_DIRECT`` at open (EINVAL) on every kernel, so it is the refusal case here;
tmpfs refused it before Linux 6.6 and accepts it since. Either way a server spilling there
must store exactly the bytes sent at exactly the offsets its index records; a refusal must be
logged with its reason and the spill done with buffered IO. ``riffle-ctl bench disk append --direct``
gives figures on tmpfs and refuses ramfs with exit 1 and a message naming the directory.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
from loguru import logger

from riffle_actors.io import localfile
from riffle_actors.io.local import RealLocalIO
from riffle_actors.protocol.index import decode_index
from riffle_actors.records import Block


def _mount(mounts, fstype: str, name: str) -> Path:
    if fstype == "tmpfs":
        return mounts.tmpfs(name, size="64m")
    if os.geteuid() != 0:
        pytest.skip(f"needs root to mount a {fstype}")
    path = mounts.base / name
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", fstype, fstype, str(path)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {fstype} at {path}: {r.stderr.strip() or r.returncode}")
    mounts.mounted.append(path)  # unmounted by the fixture's finalizer
    return path


def _accepts_direct(path: Path) -> bool:
    probe = path / ".probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _spill_and_check(root: Path) -> None:
    rng = random.Random(5)
    io = RealLocalIO(direct_io=True)
    sent: list[bytes] = []
    for batch in range(6):
        blocks = []
        for i in range(rng.randint(1, 4)):
            data = rng.randbytes(rng.choice([1, 100, 4095, 4097, 70_000]))
            sent.append(data)
            blocks.append(Block(batch * 10 + i, len(data), len(data), 0, 1, memoryview(data)))
        io.append_batch(str(root), "app", 0, 2, blocks)
    index, data_len = io.read_index(str(root), "app", 0, 2)
    records = decode_index(index)
    assert data_len == sum(map(len, sent))
    assert [io.read_data(str(root), "app", 0, 2, r.offset, r.length) for r in records] == sent


@pytest.mark.parametrize("fstype", ["ramfs", "tmpfs"])
def test_direct_spill_keeps_exact_bytes_and_falls_back_where_refused(mounts, fstype):
    root = _mount(mounts, fstype, fstype)
    accepts = _accepts_direct(root)
    if fstype == "ramfs":
        assert not accepts, "ramfs is expected to refuse O_DIRECT"
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:
        _spill_and_check(root)
    finally:
        logger.remove(sink)
    reason = localfile.direct_io_refused(str(root))
    if accepts:
        assert reason is None and not lines
    else:
        assert reason is not None and "O_DIRECT" in reason
        assert len(lines) == 1 and "refuses O_DIRECT" in lines[0] and str(root) in lines[0]


@pytest.mark.parametrize("fstype", ["ramfs", "tmpfs"])
def test_disk_bench_direct_on_real_mounts(mounts, fstype):
    """``riffle-ctl bench disk append --direct``: figures where the file system accepts O_DIRECT
    (tmpfs since Linux 6.6), a refusal naming the directory where it does not (ramfs), exit 1."""
    import json
    import sys

    from tests.ctl.cluster import BASE_ENV

    root = _mount(mounts, fstype, fstype)
    accepts = _accepts_direct(root)
    if fstype == "ramfs":
        assert not accepts, "ramfs is expected to refuse O_DIRECT"
    elif _kernel() >= (6, 6):
        assert accepts, "tmpfs accepts O_DIRECT since Linux 6.6"
    r = subprocess.run([sys.executable, "-m", "riffle_actors.ctl", "bench", "disk", "append", "--dir", str(root),
                        "--batch-number", "2", "--concurrency", "2", "--write-size", "64K", "--direct",
                        "--format", "json"], env=BASE_ENV, capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in r.stderr, r.stderr
    if accepts:
        assert r.returncode == 0, r.stderr
        [result] = [json.loads(line) for line in r.stdout.splitlines()]
        assert result["mode"] == "append O_DIRECT" and result["bytes"] == 2 * 2 * (64 << 10) and result["mb_per_s"] > 0
    else:
        assert r.returncode == 1 and f"the file system of {root} refuses O_DIRECT" in r.stderr, r
    assert sorted(p.name for p in root.iterdir()) == []  # no bench file (nor probe) left behind


@pytest.mark.parametrize("fstype", ["ramfs", "tmpfs"])
def test_direct_reads_fall_back_to_buffered_where_refused_and_say_so_once(mounts, fstype):
    """``direct_io_read_enable`` on a file system that refuses O_DIRECT at open (ramfs): every read is
    still byte-exact (buffered), the reason is logged once for the data path and reported by
    ``direct_read_refused``; where it is accepted (tmpfs since Linux 6.6), nothing is logged."""
    root = _mount(mounts, fstype, fstype)
    accepts = _accepts_direct(root)
    rng = random.Random(8)
    sent = [rng.randbytes(n) for n in (1, 4095, 70_000, 4097, 3)]
    # appended buffered, so the refusal is met by the reads themselves (not already by the appends)
    RealLocalIO(direct_io=False).append_batch(str(root), "app", 0, 2, [
        Block(i, len(d), len(d), 0, 1, memoryview(d)) for i, d in enumerate(sent)])
    io = RealLocalIO(direct_io=True, direct_read=True)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:
        records = decode_index(io.read_index(str(root), "app", 0, 2)[0])
        for _ in range(2):
            assert [io.read_data(str(root), "app", 0, 2, r.offset, r.length) for r in records] == sent
            whole = io.open_data(str(root), "app", 0, 2, 0, sum(map(len, sent)))
            if isinstance(whole, localfile.DataFile):
                os.close(whole.fd)
                assert not accepts  # sendfile is only offered where reads do not bypass the cache
            else:
                assert whole == b"".join(sent)
    finally:
        logger.remove(sink)
    reason = localfile.direct_read_refused(str(root))
    if accepts:
        assert reason is None and not lines
    else:
        assert reason is not None and "O_DIRECT" in reason
        assert len(lines) == 1 and "reads there use buffered IO" in lines[0] and str(root) in lines[0], lines
