"""Spark driver of tests/e2e/test_restart_spark.py: two actions over one shuffled RDD, a pause between them.

    python restart_job.py --spec spec.json

spec.json: ``conf`` (SparkConf entries), ``out`` (result JSON path, rewritten after each phase), ``go`` (a
file whose appearance ends the pause: the harness restarts the shuffle servers meanwhile), ``wait_s``.

Phase 1 collects a reduceByKey over a mapped RDD (map and reduce stages run). Phase 2 collects the same
RDD again: its shuffle is read again (from the shuffle servers under RssShuffleManager), and the map stage
must be skipped. The result says, per phase, the sorted rows' digest, how many records the map function
saw (an accumulator: a recomputed map stage would add to it) and, for phase 2, every stage of its jobs as
Spark's status tracker reports it (a skipped stage completed no task).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import traceback

from pyspark.sql import SparkSession

N = 400_000
KEYS = 5_000


def digest(rows) -> str:
    h = hashlib.sha256()
    for k, v in rows:
        h.update(f"{k}:{v[0]}:{v[1]}\n".encode())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    with open(ap.parse_args().spec) as f:
        spec = json.load(f)
    out: dict = {}

    def dump() -> None:
        tmp = spec["out"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, spec["out"])

    builder = SparkSession.builder.appName("riffle-restart")
    for k, v in spec["conf"].items():
        builder = builder.config(k, v)
    try:
        spark = builder.getOrCreate()
        sc = spark.sparkContext
        seen = sc.accumulator(0)

        def mapper(i):
            seen.add(1)
            v = (i * 7919) % 10007
            return (i % KEYS, (v, f"{v:05d}" * 8))  # ~60 bytes a record on the wire

        rdd = sc.parallelize(range(N), 4).map(mapper) \
            .reduceByKey(lambda a, b: (a[0] + b[0], max(a[1], b[1])), numPartitions=16) \
            .mapValues(lambda v: (v[0], v[1][:5]))
        sc.setJobGroup("first", "map and reduce")
        rows = sorted(rdd.collect())
        out["phase1"] = {"digest": digest(rows), "rows": len(rows), "map_records": seen.value}
        dump()
        deadline = time.monotonic() + float(spec.get("wait_s", 600))
        while not os.path.exists(spec["go"]):  # the harness restarts the shuffle servers meanwhile
            if time.monotonic() > deadline:
                raise TimeoutError("no go signal")
            time.sleep(0.2)
        sc.setJobGroup("second", "the same shuffle read again")
        rows = sorted(rdd.collect())
        tracker = sc.statusTracker()
        stages = []
        for job_id in tracker.getJobIdsForGroup("second"):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds:
                info = tracker.getStageInfo(stage_id)
                stages.append({"job": job_id, "stage": stage_id, "status": job.status,
                               "num_tasks": info.numTasks if info else None,
                               "completed_tasks": info.numCompletedTasks if info else None,
                               "name": info.name if info else None})
        out["phase2"] = {"digest": digest(rows), "rows": len(rows), "map_records": seen.value, "stages": stages}
        dump()
        spark.stop()
    except Exception:  # reported to the harness, then raised
        out["error"] = traceback.format_exc()
        dump()
        raise


if __name__ == "__main__":
    main()
