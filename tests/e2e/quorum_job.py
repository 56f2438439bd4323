"""Spark driver for tests/e2e/test_coordinator_quorum.py; runs inside the client's network namespace.

    python quorum_job.py --conf CONF.json --gate DIR --out RESULT.json --mode running|new

``running``: one job over two chained shuffles whose map tasks wait for the file ``DIR/go`` (each
first writes ``DIR/started-<partition>``), so the test can kill a coordinator while the job runs;
then a second job over a shuffle that did not exist yet (it needs an assignment after the kill).
``new``: a fresh application with one shuffle (started after the kill).
The answers and the application id go to RESULT.json; the test checks them against closed forms.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pyspark import TaskContext
from pyspark.sql import SparkSession

N = 200_000
GATE_LIMIT_S = 180


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conf", required=True)
    ap.add_argument("--gate", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["running", "new"], required=True)
    args = ap.parse_args()
    with open(args.conf) as f:
        conf = json.load(f)
    builder = SparkSession.builder.appName(f"riffle-quorum-{args.mode}")
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    out: dict = {"app_id": sc.applicationId}

    def dump() -> None:
        with open(args.out + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(args.out + ".tmp", args.out)

    dump()
    gate = args.gate

    def wait_for_gate(rows):
        part = TaskContext.get().partitionId()
        with open(os.path.join(gate, f"started-{part}"), "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + GATE_LIMIT_S
        while not os.path.exists(os.path.join(gate, "go")):
            if time.monotonic() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(0.05)
        yield from rows

    numbers = sc.parallelize(range(N), 4)
    if args.mode == "running":
        # shuffle 0: sum per key mod 97; shuffle 1: those sums regrouped mod 7
        by97 = numbers.mapPartitions(wait_for_gate).map(lambda x: (x % 97, x)).reduceByKey(lambda a, b: a + b, 8)
        out["running"] = sorted(by97.map(lambda kv: (kv[0] % 7, kv[1])).reduceByKey(lambda a, b: a + b, 5).collect())
        dump()
        # shuffle 2: registered only now, after the test killed a coordinator
        out["after"] = sorted(numbers.map(lambda x: (x % 13, 1)).reduceByKey(lambda a, b: a + b, 6).collect())
    else:
        out["new"] = sorted(numbers.map(lambda x: (x % 11, x)).reduceByKey(lambda a, b: a + b, 6).collect())
    dump()
    spark.stop()


if __name__ == "__main__":
    main()
