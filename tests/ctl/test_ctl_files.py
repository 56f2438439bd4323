"""riffle-ctl's file commands against real daemons: ``inspect file`` on the files a real server wrote,
``config template`` starter configs that real daemons start with, and ``bench disk`` on a data
directory."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from riffle_actors.config import load_config
from riffle_actors.coordinator.config import load_coordinator_config
from riffle_actors.protocol.index import decode_index
from tests.ctl.cluster import BASE_ENV, RealCluster, http_json, send_blocks

pytestmark = pytest.mark.integration


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[RealCluster]:
    c = RealCluster(tmp_path)
    try:
        c.start_coordinator()
        yield c
    finally:
        c.stop()


def test_inspect_checks_every_block_of_a_real_servers_files(small_cluster: RealCluster, tmp_path: Path) -> None:
    server = small_cluster.start_server("writer")
    small_cluster.wait_registered(1)
    blocks = [bytes([i]) * (1000 + i) + b"payload" for i in range(4)]
    send_blocks(server.ports["grpc_port"], "app-inspect", blocks)
    server.proc.send_signal(signal.SIGTERM)  # flushes memory to disk before it exits
    assert server.proc.wait(60) == 0
    [index] = list((tmp_path / "writer-data").rglob("*.index"))
    data = index.with_suffix(".data")
    records = decode_index(index.read_bytes())
    assert len(records) == 4

    clean = small_cluster.ctl("inspect", "file", "--index-file", str(index), "--data-file", str(data),
                              "--format", "json")
    assert clean.returncode == 0, clean.stderr
    rows = [json.loads(line) for line in clean.stdout.splitlines()]
    assert [r["block_id"] for r in sorted(rows, key=lambda r: r["offset"])] == sorted(r.block_id for r in records)
    assert {r["check"] for r in rows} == {"ok"} and {r["task_attempt_id"] for r in rows} == {7}
    assert "4 records, 4 blocks ok, 0 corrupt" in clean.stderr

    # flip one byte inside the third block of the data file
    third = sorted(records, key=lambda r: r.offset)[2]
    third_record = records.index(third)
    raw = bytearray(data.read_bytes())
    raw[third.offset + 10] ^= 0xFF
    data.write_bytes(bytes(raw))
    bad = small_cluster.ctl("inspect", "file", "--index-file", str(index), "--data-file", str(data))
    assert bad.returncode == 1
    assert (f"corrupt: record {third_record} (blockId {third.block_id}, offset {third.offset}, "
            f"length {third.length}): CRC mismatch") in bad.stdout
    assert "4 records, 3 blocks ok, 1 corrupt" in bad.stdout

    # a truncated data file: the last block lies outside it
    data.write_bytes(bytes(raw[:-5]))
    short = small_cluster.ctl("inspect", "file", "--index-file", str(index), "--data-file", str(data),
                              "--format", "csv")
    assert short.returncode == 1 and "lie outside the data file" in short.stderr

    # without the data file: the records only
    only = small_cluster.ctl("inspect", "file", "--index-file", str(index), "--format", "json")
    assert only.returncode == 0 and len(only.stdout.splitlines()) == 4


def _loopback(text: str, **ports: int) -> str:
    """A starter config moved to loopback and free ports (what a test may change; nothing else)."""
    text = text.replace('"0.0.0.0"', '"127.0.0.1"')
    for key, value in ports.items():
        text = re.sub(rf"(?m)^{key} = \d+", f"{key} = {value}", text)
    return text


def test_config_template_writes_configs_the_daemons_start_with(small_cluster: RealCluster, tmp_path: Path) -> None:
    out = tmp_path / "gen"
    out.mkdir()
    for kind in ("server", "coordinator"):
        r = small_cluster.ctl("config", "template", kind, "--output", str(out / f"{kind}.toml"))
        assert r.returncode == 0, r.stderr
        again = small_cluster.ctl("config", "template", kind, "--output", str(out / f"{kind}.toml"))
        assert again.returncode == 2 and "--force" in again.stderr
    server_text, coord_text = (out / "server.toml").read_text(), (out / "coordinator.toml").read_text()
    assert all(sum("#" in line for line in t.splitlines()) > 15 for t in (server_text, coord_text))  # commented
    load_config(out / "server.toml")  # the daemons' own loaders accept the files as written
    load_coordinator_config(out / "coordinator.toml")
    stdout = small_cluster.ctl("config", "template", "server")
    assert stdout.stdout == server_text

    # real daemons run from them (ports, addresses and the data path moved to the test's)
    coord = RealCluster(tmp_path / "from-template")
    coord.tmp.mkdir()
    try:
        coord.coordinator = coord._spawn("riffle_actors.coordinator", "coordinator",
                                         _loopback(coord_text, grpc_port=0, http_port=0), BASE_ENV)
        quorum = f"127.0.0.1:{coord.coordinator.ports['grpc_port']}"
        server_cfg = _loopback(server_text, grpc_port=0, http_port=0).replace("127.0.0.1:21000", quorum).replace(
            "/var/lib/riffle/data1", str(tmp_path / "tdata")).replace('capacity = "8G"', 'capacity = "64M"')
        coord.servers.append(coord._spawn("riffle_actors.server", "server", server_cfg, BASE_ENV))
        [registered] = coord.wait_registered(1)
        assert registered["status"] == "ACTIVE"
    finally:
        coord.stop()


def _accepts_direct(directory: Path) -> bool:
    """Whether ``directory``'s file system opens files with ``O_DIRECT`` (probed by the test itself)."""
    probe = directory / ".direct-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def test_disk_bench_on_a_data_directory(small_cluster: RealCluster, tmp_path: Path) -> None:
    server = small_cluster.start_server("bench")
    small_cluster.wait_registered(1)
    data_dir = tmp_path / "bench-data"
    assert data_dir.is_dir()
    before = sorted(data_dir.iterdir())

    def bench(*args: str) -> list[dict]:
        r = small_cluster.ctl("bench", "disk", *args, "--dir", str(data_dir), "--format", "json")
        assert r.returncode == 0, r.stderr
        assert sorted(data_dir.iterdir()) == before  # the bench files are removed
        return [json.loads(line) for line in r.stdout.splitlines()]

    [append] = bench("append", "--batch-number", "8", "--concurrency", "4", "--write-size", "256K")
    assert append["bytes"] == 8 << 20 and append["blocks"] == 32 and append["mb_per_s"] > 0
    assert 0 <= append["p50_ms"] <= append["p95_ms"] <= append["p99_ms"] <= append["max_ms"]
    setup, read = bench("read", "--read-size", "256K", "--batch-number", "8", "--concurrency", "4")
    assert setup["mode"] == "append (setup)" and read["mode"] == "read"
    assert read["bytes"] == 8 << 20 and read["blocks"] == 32 and read["mb_per_s"] > 0
    # O_DIRECT: ext4/xfs and tmpfs (Linux >= 6.6) accept it, so the bench must give figures here; the
    # refusal (ramfs) is tests/fault/test_direct_io_mounts.py::test_disk_bench_direct_on_real_mounts
    if not _accepts_direct(data_dir):
        pytest.fail(f"the file system of {data_dir} refuses O_DIRECT: run the tests on one that accepts it "
                    "(ext4, xfs, tmpfs on Linux >= 6.6)")
    [direct] = bench("append", "--batch-number", "4", "--concurrency", "2", "--write-size", "256K", "--direct")
    assert direct["mode"] == "append O_DIRECT" and direct["bytes"] == 2 << 20 and direct["mb_per_s"] > 0, direct
    assert server.proc.poll() is None and http_json(small_cluster.url + "/api/servers")[0]["status"] == "ACTIVE"
    bad = small_cluster.ctl("bench", "disk", "append", "--dir", str(data_dir), "--batch-number", "1",
                            "--concurrency", "1", "--write-size", "1000", "--direct")
    assert bad.returncode == 2 and "multiple of 4096" in bad.stderr
    missing = small_cluster.ctl("bench", "disk", "read", "--dir", str(tmp_path / "nope"), "--read-size", "4K",
                                "--batch-number", "1", "--concurrency", "1")
    assert missing.returncode == 1 and "is not a directory" in missing.stderr
    too_many = small_cluster.ctl("bench", "disk", "append", "--dir", str(data_dir), "--batch-number", "1",
                                 "--concurrency", "5000", "--write-size", "4K")
    assert too_many.returncode == 2 and "--concurrency must be 1..1024" in too_many.stderr
