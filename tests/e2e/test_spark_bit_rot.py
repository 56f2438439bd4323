"""A real Spark job reads the other replica when one replica's spilled data files rot on disk.

One coordinator and three riffle-server daemons of this test's own (each block spilled to disk at once:
``memory_single_buffer_max_spill_size = 1K``; a scrubber pass every half second). The driver
(tests/e2e/restart_job.py) collects a reduceByKey over a mapped RDD with ``spark.rss.data.replica=2``
(write 2, read 1), then pauses. Meanwhile one byte of every data file of one server is flipped behind its
back, and the test waits until that server's scrubber has found every one of them (its metric). The
driver then collects the same RDD again: the shuffle is read again, the corrupt server refuses the reads
of its rotten ranges (``riffle_server_corrupt_reads_refused``) and the client reads the other replica.
The answer must equal the first one and Spark's own sort shuffle's (a vanilla run of the same driver),
and no map stage may run again (the map function's accumulator is unchanged, Spark's status tracker shows
the second job's map stage with no completed task).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    TIME_SCALE,
    client_jar,
    http_get,
    http_json,
    rss_conf,
    start_cluster,
    tail,
)
from tests.e2e.two_actions import assert_reread_exactly, launch, metric, stop_driver, wait_phase
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

SERVERS = 3


def _spill_and_scrub_at_once(text: str) -> str:
    text = text.replace("[localfile_store]\n", "[localfile_store]\nscrub_rate = \"1G\"\nscrub_interval_sec = 0.5\n", 1)
    return text.replace("[hybrid_store]\n", "[hybrid_store]\nmemory_single_buffer_max_spill_size = \"1K\"\n", 1)


def _flip_every_data_file(data_dir: Path) -> int:
    """Flip one byte (the 11th) of every non-empty partition data file below ``data_dir``; how many."""
    n = 0
    for path in sorted(data_dir.rglob("partition-*.data")):
        if path.is_symlink() or path.stat().st_size <= 10:
            continue
        fd = os.open(path, os.O_RDWR)
        try:
            (b,) = os.pread(fd, 1, 10)
            os.pwrite(fd, bytes([b ^ 0x01]), 10)
            os.fsync(fd)
        finally:
            os.close(fd)
        n += 1
    return n


def _wait(pred, timeout: float, what: str):
    return wait_for(pred, timeout=timeout * TIME_SCALE, what=what, interval=0.2)


def test_a_rotten_replica_is_refused_and_the_job_reads_the_other_one(tmp_path: Path) -> None:
    jar = client_jar()
    assert jar is not None
    vanilla, v_out, v_go, v_log = launch(tmp_path / "vanilla", {})
    v_go.touch()  # the oracle does not pause
    cluster = start_cluster(tmp_path / "cluster", servers=SERVERS, workers=1,
                            edit_server_toml=_spill_and_scrub_at_once)
    rss = None
    try:
        conf = {**rss_conf(jar[1], cluster), "spark.rss.data.replica": "2", "spark.rss.data.replica.write": "2",
                "spark.rss.data.replica.read": "1", "spark.rss.client.assignment.shuffle.nodes.max": "2"}
        rss, out, go, log = launch(tmp_path / "rss", conf)
        first = wait_phase(rss, out, log, "phase1", 400)
        assert first["rows"] > 0 and first["map_records"] > 0

        # rot every data file of one server holding replicas; the other replicas stay intact
        def files(s) -> int:
            return len(list((s.workdir / "d1").rglob("partition-*.data")))
        holders = _wait(lambda: [s for s in cluster.servers if files(s)] if sum(
            1 for s in cluster.servers if files(s)) >= 2 else None, 60,
            "two servers holding spilled replicas: " + ", ".join(f"{s.name} {files(s)}" for s in cluster.servers))
        victim = max(holders, key=files)
        flipped = _flip_every_data_file(victim.workdir / "d1")
        assert flipped > 0, "nothing was spilled to the victim's disk"
        _wait(lambda: metric(http_get(victim.http + "/metrics"), "riffle_scrub_corrupt_blocks_total") >= flipped,
              120, f"the scrubber finding the {flipped} flipped bytes")
        apps = http_json(victim.http + "/apps")
        assert sum(a["corrupt_blocks"] for a in apps) >= flipped, apps
        go.touch()

        second = wait_phase(rss, out, log, "phase2", 400)
        assert rss.wait(120) == 0, tail(log, 80)
        # Whether the reader asks the rotten server first is the client's choice (the replica order of
        # each partition's assignment): when it does, that server refuses the corrupt range and the reader
        # takes the other replica (14 refusals in one run, 0 in another on a quiet box). The refusal itself
        # is tests/fault/test_bit_rot.py's; here the result must be exact either way.
        refused = metric(http_get(victim.http + "/metrics"), "riffle_server_corrupt_reads_refused_total")
        print(f"reads of corrupt ranges refused by {victim.name}: {refused:.0f}")
        assert_reread_exactly(first, second, (vanilla, v_out, v_log))
    finally:
        if rss is not None:
            stop_driver(rss)
        stop_driver(vanilla)
        cluster.stop()
