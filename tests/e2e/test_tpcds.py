"""TPC-DS 'tiny' (sf=0.01) queries on RssShuffleManager vs Spark's sort shuffle (order-independent digests).

CI runs a subset in one Spark application; RIFFLE_E2E_TPCDS_ALL=1 runs all 99 (marked slow).
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


@pytest.mark.parametrize("query", QUERIES)
def test_tpcds_on_riffle_matches_sort_shuffle(query, spark_runner, tpcds, rss_cluster, e2e, attach_log):
    vanilla = spark_runner.get(GROUP, "vanilla", QUERIES, _params(tpcds))
    e2e.assert_oracle_ok(vanilla, query)
    rss = spark_runner.get(GROUP, "rss", QUERIES, _params(tpcds), rss_cluster)
    attach_log(f"Spark driver ({GROUP}/rss)", rss.driver_log)
    e2e.assert_rss_carried(rss, query, rss_cluster, oracle=vanilla)
    e2e.assert_same_result(vanilla, rss, query)
