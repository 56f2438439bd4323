"""Spark on the HDFS tier: MEMORY_LOCALFILE_HDFS with a real HDFS (MiniDFSCluster) and a skewed partition.

A separate cluster (coordinator + two servers) runs with ``store_type = MEMORY_LOCALFILE_HDFS``; the
coordinator's ``[remote_storage]`` points at the MiniDFSCluster, so the Spark application sets only
``spark.rss.storage.type=MEMORY_LOCALFILE_HDFS`` (fetchRemoteStorage hands it the path). On the servers a
partition is huge after 2 MiB, and a huge partition's spill batches above 256 KiB go to HDFS.

The ``skew`` job puts 90 % of its rows on one key: that reduce partition becomes huge, its batches are
written to HDFS in the Uniffle layout, and the reducers read them from HDFS themselves (the server never
serves HDFS data). The result must equal Spark's own sort shuffle.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

JOBS = ["skew"]


@pytest.fixture(scope="module")
def hdfs_cluster(minihdfs, e2e_root, e2e):
    remote = f"{minihdfs.url}/rss"
    cluster = e2e.start_cluster(e2e_root / "hdfs-cluster", hdfs_remote=remote)
    try:
        yield cluster, remote
    finally:
        cluster.stop()


def test_skewed_partition_spills_to_hdfs_and_reducers_read_it(spark_runner, hdfs_cluster, e2e, attach_log):
    cluster, remote = hdfs_cluster
    vanilla = spark_runner.get("hdfs", "vanilla", JOBS, {})
    e2e.assert_oracle_ok(vanilla, "skew")
    rss = spark_runner.get("hdfs", "rss_hdfs", JOBS, {"hdfs_remote": remote}, cluster)
    attach_log("Spark driver (hdfs/rss_hdfs)", rss.driver_log)
    for name, path in cluster.log_files():
        attach_log(name, path)
    j = e2e.assert_rss_carried(rss, "skew", cluster)
    hdfs_bytes = e2e.metric_delta(j, "riffle_spill_bytes_total:hdfs")
    huge_choices = e2e.metric_delta(j, "riffle_spill_tier_choices_total:huge_partition")
    assert huge_choices > 0 and hdfs_bytes > 0, (
        f"no huge-partition spill reached HDFS (choices {huge_choices}, bytes {hdfs_bytes})")
    files = j.get("hdfs_files", {})
    assert "_error" not in files, files
    # data + index pairs of this app in <remote>/<appId>/<shuffle>/<p>-<p>/<serverId>_<i>_<retry>.*
    names = files["names"]
    assert files["files"] >= 2 and any(n.endswith(".index") for n in names) and any(
        n.endswith(".data") for n in names), files
    assert files["bytes"] >= hdfs_bytes, f"HDFS holds {files['bytes']} bytes, the servers wrote {hdfs_bytes}"
    # the servers served at most what they did not write to HDFS: the rest came from HDFS itself
    served = e2e.metric_delta(j, e2e.READ)
    received = e2e.metric_delta(j, e2e.RECEIVED)
    assert served < received, f"servers served {served} bytes of {received}: nothing was read from HDFS"
    # the client's own account: bytes its readers consumed from the cold tier (HDFS), per reader
    cold = sum(int(m) for m in re.findall(r"Client read \d+ bytes from .*?Consumed\[ hot:\d+ warm:\d+ cold:(\d+)",
                                          rss.driver_log.read_text(errors="replace")))
    # something came from HDFS, and every byte came from somewhere. Not necessarily all the servers wrote
    # there: a block still in memory while its spill to HDFS runs is read from memory (hot), and its bytes
    # count on both sides (CI saw 6.9 of 7.9 MB written to HDFS consumed from it, the rest served)
    assert cold > 0, f"readers consumed nothing from HDFS, the servers wrote {hdfs_bytes} bytes there"
    assert cold + served >= received, (
        f"of {received} bytes received the readers consumed {cold} from HDFS and the servers served {served}")
    e2e.assert_same_result(vanilla, rss, "skew")
    # spark.stop() unregisters the app: its HDFS files are deleted with it
    assert rss.result.get("finished"), "the application did not stop cleanly"
