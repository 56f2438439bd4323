"""A real Spark job (the stock Uniffle 0.9.2 client) on servers with Riffle's partition split on.

A separate cluster runs with ``[app_config] partition_split_enable = true`` and a 256 KiB
``partition_split_threshold``; the ``skew`` job puts 90 % of its rows on one key, so that reduce
partition goes above the threshold and every later requireBuffer naming it (the 0.9.2 client sends the
partition ids) is answered with it in ``needSplitPartitionIds``. The 0.9.2 client has no such field
(its ``Rss.proto`` ``RequireBufferResponse`` ends at ``retMsg``; partition reassignment came with 0.10),
so it cannot move the partition: it must read the answer as a plain success and the job must give Sort
shuffle's result, while the servers' log shows the split was asked for.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

JOBS = ["skew"]
SPLIT = {"app_config": 'partition_split_enable = true\npartition_split_threshold = "256K"\n'}


@pytest.fixture(scope="module")
def split_cluster(e2e_root, e2e):
    cluster = e2e.start_cluster(e2e_root / "split-cluster", server_sections=SPLIT)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_0_9_2_job_runs_on_through_partition_split_answers(spark_runner, split_cluster, e2e, attach_log):
    cluster = split_cluster
    vanilla = spark_runner.get("split", "vanilla", JOBS, {})
    e2e.assert_oracle_ok(vanilla, "skew")
    rss = spark_runner.get("split", "rss", JOBS, {}, cluster)
    attach_log("Spark driver (split/rss)", rss.driver_log)
    for name, path in cluster.log_files():
        attach_log(name, path)
    e2e.assert_rss_carried(rss, "skew", cluster)
    e2e.assert_same_result(vanilla, rss, "skew")
    logs = "".join(s.log_path.read_text(errors="replace") for s in cluster.servers)
    assert "partition split asked for partitions" in logs, "no requireBuffer answered with a split partition"
    assert rss.result.get("finished"), "the application did not stop cleanly"
