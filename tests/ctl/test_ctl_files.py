"""riffle-ctl's file commands against real daemons: ``inspect`` on the files a real server wrote,
``config init`` templates that real daemons start with, and ``disk-bench`` on a data directory."""

from __future__ import annotations

import json
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

    clean = small_cluster.ctl("inspect", str(index), str(data), "--format", "json")
    assert clean.returncode == 0, clean.stderr
    rows = json.loads(clean.stdout)
    assert [r["block_id"] for r in sorted(rows, key=lambda r: r["offset"])] == sorted(r.block_id for r in records)
    assert {r["check"] for r in rows} == {"ok"} and {r["task_attempt_id"] for r in rows} == {7}
    assert "4 records, 4 blocks ok, 0 corrupt" in clean.stderr

    # flip one byte inside the third block of the data file
    third = sorted(records, key=lambda r: r.offset)[2]
    third_record = records.index(third)
    raw = bytearray(data.read_bytes())
    raw[third.offset + 10] ^= 0xFF
    data.write_bytes(bytes(raw))
    bad = small_cluster.ctl("inspect", str(index), str(data))
    assert bad.returncode == 1
    assert (f"corrupt: record {third_record} (blockId {third.block_id}, offset {third.offset}, "
            f"length {third.length}): CRC mismatch") in bad.stdout
    assert "4 records, 3 blocks ok, 1 corrupt" in bad.stdout

    # a truncated data file: the last block lies outside it
    data.write_bytes(bytes(raw[:-5]))
    short = small_cluster.ctl("inspect", str(index), str(data), "--format", "csv")
    assert short.returncode == 1 and "lie outside the data file" in short.stderr

    # without the data file: the records only
    only = small_cluster.ctl("inspect", str(index), "--format", "json")
    assert only.returncode == 0 and len(json.loads(only.stdout)) == 4


def _loopback(text: str, **ports: int) -> str:
    """A starter config moved to loopback and free ports (what a test may change; nothing else)."""
    text = text.replace('"0.0.0.0"', '"127.0.0.1"')
    for key, value in ports.items():
        text = re.sub(rf"(?m)^{key} = \d+", f"{key} = {value}", text)
    return text


def test_config_init_writes_configs_the_daemons_start_with(small_cluster: RealCluster, tmp_path: Path) -> None:
    out = tmp_path / "gen"
    out.mkdir()
    for kind in ("server", "coordinator"):
        r = small_cluster.ctl("config", "init", kind, "--output", str(out / f"{kind}.toml"))
        assert r.returncode == 0, r.stderr
        again = small_cluster.ctl("config", "init", kind, "--output", str(out / f"{kind}.toml"))
        assert again.returncode == 2 and "--force" in again.stderr
    server_text, coord_text = (out / "server.toml").read_text(), (out / "coordinator.toml").read_text()
    assert all(sum("#" in line for line in t.splitlines()) > 15 for t in (server_text, coord_text))  # commented
    load_config(out / "server.toml")  # the daemons' own loaders accept the files as written
    load_coordinator_config(out / "coordinator.toml")
    stdout = small_cluster.ctl("config", "init", "server")
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


def test_disk_bench_on_a_data_directory(small_cluster: RealCluster, tmp_path: Path) -> None:
    server = small_cluster.start_server("bench")
    small_cluster.wait_registered(1)
    data_dir = tmp_path / "bench-data"
    assert data_dir.is_dir()
    r = small_cluster.ctl("disk-bench", str(data_dir), "--size", "8M", "--block-size", "256K", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["mode"]: row for row in json.loads(r.stdout)}
    assert list(rows) == ["buffered write", "buffered read", "O_DIRECT write", "O_DIRECT read"]
    for mode in ("buffered write", "buffered read"):
        assert rows[mode]["bytes"] == 8 << 20 and rows[mode]["blocks"] == 32 and rows[mode]["mb_per_s"] > 0
        assert 0 <= rows[mode]["p50_ms"] <= rows[mode]["p95_ms"] <= rows[mode]["p99_ms"] <= rows[mode]["max_ms"]
    for mode in ("O_DIRECT write", "O_DIRECT read"):  # figures, or the reason the file system refused
        assert rows[mode]["skipped"] or rows[mode]["mb_per_s"] > 0
    assert "buffered write" in r.stderr  # the progress bar
    assert list(data_dir.glob(".riffle-disk-bench-*")) == []  # scratch file removed
    assert server.proc.poll() is None and http_json(small_cluster.url + "/api/servers")[0]["status"] == "ACTIVE"
    bad = small_cluster.ctl("disk-bench", str(data_dir), "--block-size", "1000")
    assert bad.returncode == 2 and "multiple of 4096" in bad.stderr
    missing = small_cluster.ctl("disk-bench", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "is not a directory" in missing.stderr
