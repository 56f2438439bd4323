"""Spark job shapes on RssShuffleManager vs Spark's own sort shuffle (the oracle).

Jobs of one group run inside one Spark application (one JVM start); each job's result is checked on its own.
Every job runs with ``spark.rss.client.type=GRPC``; the core group runs again with ``GRPC_NETTY`` (data over
the servers' urpc port). The spill job runs on GRPC only: it exercises the shared storage path, and a second
384 MiB run would cost about a minute of CI for no transport coverage the core group lacks.
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]

MiB = 1 << 20

CORE_JOBS = [
    "rdd_basic",  # RDD groupByKey / reduceByKey, closed-form answers
    "groupby_agg",  # DataFrame groupBy + count/sum/min/max
    "join",  # sort-merge join (broadcast off)
    "sort",  # global orderBy: order checked, not only content
    "skew",  # 90 % of rows on one key
    "many_partitions",  # 2000 reduce partitions, AQE off
    "large_records",  # records of 1..6 MiB
    "multistage_aqe_on",  # repartition -> groupBy -> join -> orderBy, AQE on
    "multistage_aqe_off",  # same, AQE off
    "aqe_skew_join",  # AQE skew-join split (map-range reads)
]
GROUPS = {"core": CORE_JOBS, "spill": ["spill"]}
JOB_GROUP = {job: group for group, jobs in GROUPS.items() for job in jobs}
ALL_JOBS = [*CORE_JOBS, "spill"]


def _params(e2e) -> dict:
    # the spill job moves ~3x the memory capacity of all servers together
    return {"spill_bytes": 3 * e2e.server_memory * e2e.num_servers}


SPILLED = "riffle_spill_bytes_total"  # server counter: bytes flushed from memory to local files

# per job: the least the servers must have received (bytes), beyond "grew"
MIN_RECEIVED = {"large_records": 40 * MiB}


def _vanilla(spark_runner, e2e, group):
    return spark_runner.get(group, "vanilla", GROUPS[group], _params(e2e))


def _rss(spark_runner, e2e, group, cluster, mode="rss"):
    return spark_runner.get(group, mode, GROUPS[group], _params(e2e), cluster)


# (job, run mode): GRPC for every job, GRPC_NETTY for the core group
RSS_CASES = [pytest.param(job, "rss", id=f"{job}-grpc") for job in ALL_JOBS] + [
    pytest.param(job, "rss_netty", id=f"{job}-grpc_netty") for job in CORE_JOBS
]


@pytest.mark.parametrize("job", ALL_JOBS)
def test_oracle_runs_on_sort_shuffle(job, spark_runner, e2e, attach_log):
    run = _vanilla(spark_runner, e2e, JOB_GROUP[job])
    attach_log(f"Spark driver ({run.group}/vanilla)", run.driver_log)
    e2e.assert_oracle_ok(run, job)


@pytest.mark.parametrize("job, mode", RSS_CASES)
def test_job_on_riffle_matches_sort_shuffle(job, mode, spark_runner, rss_cluster, e2e, attach_log):
    group = JOB_GROUP[job]
    vanilla = _vanilla(spark_runner, e2e, group)
    e2e.assert_oracle_ok(vanilla, job)
    rss = _rss(spark_runner, e2e, group, rss_cluster, mode)
    attach_log(f"Spark driver ({group}/{mode})", rss.driver_log)
    min_received = MIN_RECEIVED.get(job, 1)
    if job == "spill":
        min_received = 0.9 * _params(e2e)["spill_bytes"]
    j = e2e.assert_rss_carried(rss, job, rss_cluster, min_received=min_received)
    # the runs of this module are sequential: urpc requests during the job come from this application
    urpc_requests = e2e.metric_delta(j, e2e.URPC_RPCS)
    if e2e.client_types[mode] == "GRPC_NETTY":
        assert urpc_requests > 0, "no request reached the servers' urpc port during a GRPC_NETTY job"
    elif e2e.client_types[mode] == "GRPC":
        assert urpc_requests == 0, f"{urpc_requests:.0f} urpc requests during a GRPC job"
    if job == "spill":
        # memory holds at most the servers' capacity; everything beyond it must have gone to local files
        spilled, received = e2e.metric_delta(j, SPILLED), e2e.metric_delta(j, e2e.RECEIVED)
        must = max(1.0, received - e2e.num_servers * e2e.server_memory)
        assert SPILLED in e2e.metric_names(j), f"servers' /metrics lack {SPILLED}"
        assert spilled >= must, (
            f"{SPILLED} grew by {spilled / MiB:.1f} MiB; received {received / MiB:.1f} MiB "
            f"with {e2e.num_servers} x {e2e.server_memory / MiB:.0f} MiB of memory"
        )
    e2e.assert_same_result(vanilla, rss, job)


@pytest.mark.parametrize("group, mode", [("core", "rss"), ("spill", "rss"), ("core", "rss_netty")])
def test_app_is_unregistered_after_stop(group, mode, spark_runner, rss_cluster, e2e, attach_log):
    """spark.stop() ends with unregisterShuffleByAppId: the servers drop the app."""
    rss = _rss(spark_runner, e2e, group, rss_cluster, mode)
    attach_log(f"Spark driver ({group}/{mode})", rss.driver_log)
    assert "startup_error" not in rss.result, rss.result["startup_error"][-3000:]
    assert rss.result.get("finished"), f"the {group} application did not stop cleanly (exit {rss.returncode})"
    app_id = rss.result["app_id"]
    deadline, listed = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        listed = [s for s in rss_cluster.servers if app_id in json.dumps(e2e.http_json(s.http + "/apps"))]
        if not listed:
            return
        time.sleep(0.5)
    pytest.fail(f"app {app_id}_* still listed by {[s.name for s in listed]} /apps 20 s after spark.stop()")
