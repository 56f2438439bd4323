"""Spark jobs against a riffle-server host of two worker processes (``runtime_config.worker_number = 2``).

The cluster of this module is one coordinator and ONE riffle-server host whose two workers register as
the two servers (one IP, two ports; docs/workers.md). Each job must give the sort-shuffle answer, its
shuffle data must go through the host, and both workers must have taken data, as the host's one
``/metrics`` page shows per ``worker`` label. (The whole suite runs on such hosts with
``RIFFLE_E2E_SERVER_WORKERS=2``, see tests/e2e/README.md.)
"""

from __future__ import annotations

import pytest

from tests.helpers import parse_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]

JOBS = ["rdd_basic", "groupby_agg", "join", "sort", "multistage_aqe_on"]
GROUP = "workers"


@pytest.fixture(scope="module")
def host_cluster(e2e_root, e2e):
    cluster = e2e.start_cluster(e2e_root / "workers-cluster", workers=2)
    try:
        assert len(cluster.servers) == 1 and len(cluster.active_servers()) == 2
        yield cluster
    finally:
        cluster.stop()


def _runs(spark_runner, e2e, cluster):
    return spark_runner.get_many(GROUP, ["vanilla", "rss_workers"], JOBS, {}, cluster)


@pytest.mark.parametrize("job", JOBS)
def test_job_on_a_two_worker_host_matches_sort_shuffle(job, spark_runner, host_cluster, e2e, attach_log):
    vanilla, rss = _runs(spark_runner, e2e, host_cluster)
    attach_log(f"Spark driver ({GROUP}/rss_workers)", rss.driver_log)
    e2e.assert_oracle_ok(vanilla, job)
    e2e.assert_rss_carried(rss, job, host_cluster)
    e2e.assert_same_result(vanilla, rss, job)


def test_both_workers_of_the_host_took_shuffle_data(spark_runner, host_cluster, e2e):
    _runs(spark_runner, e2e, host_cluster)
    host = host_cluster.servers[0]
    samples = parse_metrics(e2e.http_get(host.http + "/metrics"))
    received = {labels["worker"]: value for labels, value in samples[e2e.RECEIVED]}
    assert set(received) == {"0", "1"} and all(v > 0 for v in received.values()), received
    health = e2e.http_json(host.http + "/health")
    assert health["status"] == "HEALTHY" and len(health["workers"]) == 2, health
