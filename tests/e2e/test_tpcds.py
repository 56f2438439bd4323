"""TPC-DS 'tiny' (sf=0.01) queries on RssShuffleManager vs Spark's sort shuffle (order-independent digests).

CI runs a subset in one Spark application per client type; RIFFLE_E2E_TPCDS_ALL=1 runs all 99 (marked slow).
The GRPC and the GRPC_NETTY applications run at the same time on the one cluster, so the servers serve
both transports to two applications at once.
Data and query texts come from DuckDB's TPC-DS extension (dsdgen + tpcds_queries()), see conftest.tpcds.
"""

from __future__ import annotations

import os

import pytest

# multi-stage queries with non-empty results at sf=0.01: CTEs, rollups, windows, unions, intersect, outer joins
CI_QUERIES = [
    "q01",
    "q02",
    "q05",
    "q07",
    "q14",
    "q18",
    "q27",
    "q36",
    "q46",
    "q47",
    "q51",
    "q67",
    "q78",
    "q98",
]
ALL = os.environ.get("RIFFLE_E2E_TPCDS_ALL") == "1"
QUERIES = [f"q{i:02d}" for i in range(1, 100)] if ALL else CI_QUERIES
GROUP = "tpcds_all" if ALL else "tpcds"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)] + ([pytest.mark.slow] if ALL else [])


def _params(tpcds):
    return {"tpcds_data": tpcds["data"], "tpcds_queries": {q: tpcds["queries"][q] for q in QUERIES}}


@pytest.mark.parametrize("query", QUERIES)
def test_tpcds_oracle(query, spark_runner, tpcds, e2e, attach_log):
    run = spark_runner.get(GROUP, "vanilla", QUERIES, _params(tpcds))
    attach_log(f"Spark driver ({GROUP}/vanilla)", run.driver_log)
    e2e.assert_oracle_ok(run, query)


MODES = ["rss", "rss_netty"]  # spark.rss.client.type GRPC and GRPC_NETTY, run at the same time


def _rss_runs(spark_runner, tpcds, cluster):
    return dict(zip(MODES, spark_runner.get_many(GROUP, MODES, QUERIES, _params(tpcds), cluster)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("query", QUERIES)
def test_tpcds_on_riffle_matches_sort_shuffle(query, mode, spark_runner, tpcds, rss_cluster, e2e, attach_log):
    vanilla = spark_runner.get(GROUP, "vanilla", QUERIES, _params(tpcds))
    e2e.assert_oracle_ok(vanilla, query)
    rss = _rss_runs(spark_runner, tpcds, rss_cluster)[mode]
    attach_log(f"Spark driver ({GROUP}/{mode})", rss.driver_log)
    e2e.assert_rss_carried(rss, query, rss_cluster, oracle=vanilla)
    e2e.assert_same_result(vanilla, rss, query)


def test_grpc_and_grpc_netty_applications_shared_the_cluster_at_once(spark_runner, tpcds, rss_cluster, e2e):
    runs = _rss_runs(spark_runner, tpcds, rss_cluster)
    for mode, run in runs.items():
        assert "startup_error" not in run.result, f"{mode}: {run.result['startup_error'][-3000:]}"
        assert run.result.get("finished"), f"the {mode} application did not stop cleanly (exit {run.returncode})"
    grpc, netty = runs["rss"], runs["rss_netty"]
    assert max(grpc.started_epoch, netty.started_epoch) < min(grpc.ended_epoch, netty.ended_epoch)
    urpc_requests = sum(e2e.metric_delta(netty.job(q), e2e.URPC_RPCS) for q in QUERIES if netty.job(q))
    assert urpc_requests > 0, "no request reached the servers' urpc port during the GRPC_NETTY application"
