"""One Spark application running a group of e2e jobs; started by tests/e2e/conftest.py in its own process.

    python spark_job.py --spec spec.json

spec.json (written by the harness):
    group         "core" | "spill" | "tpcds"
    jobs          job names of the group to run, in order
    conf          SparkConf entries (the harness decides vanilla vs RSS)
    out           result JSON path (rewritten after every job, so a killed run keeps what it finished)
    job_timeout   seconds; a job still running then is cancelled through its Spark job group
    server_http   list of "http://127.0.0.1:<port>" of the shuffle servers ([] for the oracle run)
    coordinator_http  "http://127.0.0.1:<port>" or null
    params        per-group parameters (sizes, TPC-DS data dir and query files)

Every job returns {"digest": str, "rows": int, "checks": {name: [ok, detail]}}: the digest is
order-independent unless the job says otherwise (ordered results are checked in "checks" as well). For
an RSS run the result also carries, per job, the servers' riffle_* metric sums before/after the job, the
coordinator's app list, and the number of vanilla shuffle files found under spark.local.dir.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import hashlib
import json
import math
import os
import re
import sys
import threading
import time
import traceback
import urllib.request

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

MiB = 1024 * 1024


# ----------------------------------------------------------------------------- digests


def _canon(v) -> str:
    if v is None:
        return "\\N"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return format(v, ".9g")  # float sums legitimately differ in the last bits with another reduce order
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_canon(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{"
            + ",".join(f"{_canon(k)}:{_canon(x)}" for k, x in sorted(v.items(), key=lambda kv: _canon(kv[0])))
            + "}"
        )
    if hasattr(v, "asDict"):
        return _canon(tuple(v))
    return repr(v)


def rows_digest(rows, ordered: bool = False) -> str:
    lines = ["\x1f".join(_canon(x) for x in r) for r in rows]
    if not ordered:
        lines.sort()
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def df_digest(df):
    """Order-independent digest computed inside Spark: count + two independent hash sums."""
    cols = []
    for f in df.schema.fields:
        c = F.col(f"`{f.name}`")
        if isinstance(f.dataType, (T.DoubleType, T.FloatType)):
            c = F.round(c, 6)
        cols.append(c)
    r = df.select(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h1"),
        F.sum(F.hash(*cols).cast("decimal(38,0)")).alias("h2"),
    ).collect()[0]
    return f"n={r['n']} h1={r['h1']} h2={r['h2']}", int(r["n"])


def result(digest, rows, **checks):
    return {"digest": digest, "rows": rows, "checks": {k: list(v) for k, v in checks.items()}}


def check(ok, detail=""):
    return (bool(ok), str(detail)[:500])


# ----------------------------------------------------------------------------- core jobs


def job_rdd_basic(spark, p):
    """RDD groupByKey (Riffle CI's basic.scala) + reduceByKey, both with closed-form answers."""
    sc = spark.sparkContext
    g = sorted(
        sc.parallelize(range(1, 101), 4).map(lambda x: (x % 5, x)).groupByKey().mapValues(sum).collect()
    )
    n, k = 200_000, 1000
    r = sorted(
        sc.parallelize(range(n), 4).map(lambda x: (x % k, x)).reduceByKey(lambda a, b: a + b).collect()
    )
    expect_r = [(i, sum(range(i, n, k))) for i in range(k)]
    return result(
        rows_digest(g + r),
        len(g) + len(r),
        group_by_key=check(g == [(0, 1050), (1, 970), (2, 990), (3, 1010), (4, 1030)], g),
        reduce_by_key=check(r == expect_r, f"{len(r)} keys"),
    )


def job_groupby_agg(spark, p):
    n, k = p.get("groupby_rows", 1_000_000), 1000
    df = spark.range(0, n, 1, 4).select((F.col("id") % k).alias("k"), "id")
    agg = df.groupBy("k").agg(
        F.count("*").alias("c"), F.sum("id").alias("s"), F.min("id").alias("mn"), F.max("id").alias("mx")
    )
    rows = sorted(tuple(r) for r in agg.collect())
    per = n // k
    ok = len(rows) == k and all(
        c == per and mn == key and mx == key + (per - 1) * k and s == per * key + k * per * (per - 1) // 2
        for key, c, s, mn, mx in rows
    )
    return result(rows_digest(rows), len(rows), closed_form=check(ok, rows[:3]))


def job_join(spark, p):
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    n_a, n_b, keys = p.get("join_rows", 300_000), 100_000, 50_000
    a = spark.range(0, n_a, 1, 4).select(
        F.pmod(F.xxhash64("id"), F.lit(keys)).alias("k"), F.col("id").alias("a")
    )
    b = spark.range(0, n_b, 1, 3).select(
        (F.col("id") % keys).alias("k"),
        F.col("id").alias("b"),
        F.sha2(F.col("id").cast("string"), 256).alias("s"),
    )
    j = a.join(b, "k")
    plan = j._jdf.queryExecution().executedPlan().toString()
    digest, rows = df_digest(j)
    return result(
        digest,
        rows,
        two_rows_per_key=check(rows == 2 * n_a, rows),
        sort_merge_join=check("SortMergeJoin" in plan, plan[:300]),
    )


def job_sort(spark, p):
    n = p.get("sort_rows", 200_000)
    df = spark.range(0, n, 1, 4).select(F.pmod(F.xxhash64("id"), F.lit(1_000_003)).alias("k"), "id")
    rows = [tuple(r) for r in df.orderBy("k", "id").collect()]
    in_order = all(rows[i] <= rows[i + 1] for i in range(len(rows) - 1))
    ids = sorted(r[1] for r in rows)
    return result(
        rows_digest(rows, ordered=True),
        len(rows),
        globally_sorted=check(in_order),
        complete=check(ids == list(range(n)), f"{len(ids)} ids"),
    )


def job_skew(spark, p):
    """90 % of the rows on one key: one huge reduce partition."""
    n = p.get("skew_rows", 400_000)
    df = spark.range(0, n, 1, 4).select(
        "id",
        F.when(F.col("id") % 10 < 9, F.lit(0)).otherwise(F.col("id")).alias("k"),
        F.substring(F.sha2(F.col("id").cast("string"), 256), 1, 16).alias("s"),
    )
    digest, rows = df_digest(df.repartition(16, "k"))
    counts = df.groupBy("k").count()
    hot = counts.where("k = 0").collect()
    d2, groups = df_digest(counts)
    return result(
        digest + " | " + d2,
        rows,
        all_rows=check(rows == n, rows),
        hot_key=check(hot and hot[0]["count"] == n * 9 // 10, hot),
        groups=check(groups == 1 + n // 10, groups),
    )


def job_many_partitions(spark, p):
    """2000 reduce partitions, AQE off so all 2000 reduce tasks run (most of them read little)."""
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.shuffle.partitions", str(p.get("many_partitions", 2000)))
    try:
        df = spark.range(0, 100_000, 1, 4).select((F.col("id") % 5000).alias("k"), "id")
        agg = df.groupBy("k").agg(F.count("*").alias("c"), F.sum("id").alias("s"))
        nparts = agg.rdd.getNumPartitions()
        rows = sorted(tuple(r) for r in agg.collect())
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
        spark.conf.unset("spark.sql.shuffle.partitions")
    ok = len(rows) == 5000 and all(c == 20 and s == 20 * k + 5000 * 190 for k, c, s in rows)
    return result(
        rows_digest(rows),
        len(rows),
        closed_form=check(ok, rows[:2]),
        reduce_partitions=check(nparts == p.get("many_partitions", 2000), nparts),
    )


def _payload_longs(n_expr: str):
    """array<bigint> of n pseudo-random longs (incompressible: LZ4 cannot shrink it)."""
    return F.expr(f"transform(sequence(0, {n_expr} - 1), i -> xxhash64(id, i))")


def job_large_records(spark, p):
    """Records of 1..6 MiB each: blocks much larger than the writer buffer and than gRPC's 4 MiB default."""
    n = p.get("large_rows", 12)
    df = spark.range(0, n, 1, 2).select(
        "id", (F.col("id") % 4).alias("k"), _payload_longs(f"((id % 6) + 1) * {MiB // 8}").alias("payload")
    )
    shuffled = df.repartition(4, "k")
    r = shuffled.select(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.xxhash64("id", "payload").cast("decimal(38,0)")).alias("h"),
        F.sum(F.size("payload")).alias("longs"),
    ).collect()[0]
    expect_longs = sum(((i % 6) + 1) * (MiB // 8) for i in range(n))
    return result(
        f"n={r['n']} h={r['h']} longs={r['longs']}",
        int(r["n"]),
        all_longs=check(r["longs"] == expect_longs, r["longs"]),
        shuffled_bytes=check(True, f"~{expect_longs * 8 // MiB} MiB of payload"),
    )


def _multistage(spark, aqe: bool):
    spark.conf.set("spark.sql.adaptive.enabled", str(aqe).lower())
    spark.conf.set("spark.sql.shuffle.partitions", "64")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        a = (
            spark.range(0, 300_000, 1, 4)
            .repartition(13)
            .select((F.col("id") % 997).alias("k"), (F.col("id") * 3).alias("v"))
            .groupBy("k")
            .agg(F.sum("v").alias("sv"), F.count("*").alias("c"))
        )
        b = (
            spark.range(0, 50_000, 1, 3)
            .select(F.pmod(F.xxhash64("id"), F.lit(997)).alias("k"), F.col("id").alias("w"))
            .groupBy("k")
            .agg(F.max("w").alias("mw"), F.count("*").alias("cb"))
        )
        q = a.join(b, "k").orderBy(F.desc("sv"), "k")
        rows = [tuple(r) for r in q.collect()]
        plan = q._jdf.queryExecution().executedPlan().toString()
    finally:
        for key in (
            "spark.sql.adaptive.enabled",
            "spark.sql.shuffle.partitions",
            "spark.sql.autoBroadcastJoinThreshold",
        ):
            spark.conf.unset(key)
    keys = sorted(r[0] for r in rows)
    in_order = all(
        (-rows[i][1], rows[i][0]) <= (-rows[i + 1][1], rows[i + 1][0]) for i in range(len(rows) - 1)
    )
    return result(
        rows_digest(rows, ordered=True),
        len(rows),
        ordered=check(in_order),
        all_keys=check(keys == list(range(997)), len(keys)),
        adaptive_plan=check(("AdaptiveSparkPlan" in plan) == aqe, plan[:200]),
    )


def job_multistage_aqe_on(spark, p):
    return _multistage(spark, True)


def job_multistage_aqe_off(spark, p):
    return _multistage(spark, False)


def job_aqe_skew_join(spark, p):
    """Uniffle's AQESkewedJoinTest recipe: AQE splits the skewed partition (map-range reads, LOCAL_ORDER)."""
    conf = {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.sql.shuffle.partitions": "100",
        "spark.sql.adaptive.coalescePartitions.minPartitionNum": "1",
        "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "800",
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "800",
    }
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        df1 = spark.range(0, 1000, 1, 10).select(
            F.when(F.col("id") < 250, 249)
            .when(F.col("id") >= 750, 1000)
            .otherwise(F.col("id"))
            .alias("key1"),
            F.col("id").alias("value1"),
        )
        df2 = spark.range(0, 1000, 1, 10).select(
            F.when(F.col("id") < 250, 249).otherwise(F.col("id")).alias("key2"), F.col("id").alias("value2")
        )
        j = df1.join(df2, df1["key1"] == df2["key2"])
        rows = [tuple(r) for r in j.collect()]
        plan = j._jdf.queryExecution().executedPlan().toString()
    finally:
        for k in conf:
            spark.conf.unset(k)
    return result(
        rows_digest(rows),
        len(rows),
        skew_join_used=check("skew=true" in plan, plan[:400]),
        row_count=check(len(rows) == 250 * 250 + 500, len(rows)),
    )


def job_spill(spark, p):
    """Shuffle volume ~3x the servers' memory: the servers must spill to local files while writing/reading."""
    target = int(p.get("spill_bytes", 384 * MiB))
    row_longs = 128  # 1 KiB of incompressible payload per row
    n = target // (row_longs * 8)
    df = spark.range(0, n, 1, 4).select(
        "id", F.pmod(F.xxhash64("id"), F.lit(64)).alias("k"), _payload_longs(str(row_longs)).alias("payload")
    )
    shuffled = df.repartition(8, "k")
    r = shuffled.select(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.xxhash64("id", "payload").cast("decimal(38,0)")).alias("h"),
        F.sum(F.hash("id", "payload").cast("decimal(38,0)")).alias("h2"),
    ).collect()[0]
    return result(
        f"n={r['n']} h={r['h']} h2={r['h2']}",
        int(r["n"]),
        all_rows=check(r["n"] == n, r["n"]),
        volume=check(True, f"{n} rows x {row_longs * 8} B = {n * row_longs * 8 // MiB} MiB"),
    )


# ----------------------------------------------------------------------------- TPC-DS


def tpcds_register(spark, data_dir):
    for f in sorted(os.listdir(data_dir)):
        if f.endswith(".parquet"):
            spark.read.parquet(os.path.join(data_dir, f)).createOrReplaceTempView(f[: -len(".parquet")])


def make_tpcds_job(path):
    def job(spark, p):
        # DuckDB's query texts quote aliases with double quotes ("30 days"); Spark wants backticks.
        with open(path) as f:
            text = re.sub(r'"([^"]*)"', r"`\1`", f.read().strip().rstrip(";"))
        rows = [tuple(r) for r in spark.sql(text).collect()]
        return result(rows_digest(rows), len(rows))

    return job


CORE = {
    "rdd_basic": job_rdd_basic,
    "groupby_agg": job_groupby_agg,
    "join": job_join,
    "sort": job_sort,
    "skew": job_skew,
    "many_partitions": job_many_partitions,
    "large_records": job_large_records,
    "multistage_aqe_on": job_multistage_aqe_on,
    "multistage_aqe_off": job_multistage_aqe_off,
    "aqe_skew_join": job_aqe_skew_join,
    "spill": job_spill,
}


# ----------------------------------------------------------------------------- proof helpers


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def riffle_metrics(url):
    """Sum of every riffle_* sample over its label values, by metric name."""
    out: dict[str, float] = {}
    try:
        text = http_get(url.rstrip("/") + "/metrics")
    except Exception as e:  # noqa: BLE001 - reported in the result, the harness asserts
        return {"_error": repr(e)}
    for line in text.splitlines():
        if not line.startswith("riffle_"):
            continue
        if "{" in line:  # name{labels} value [timestamp]; label values may contain blanks
            name, rest = line[: line.index("{")], line[line.rindex("}") + 1 :].split()
        else:
            parts = line.split()
            name, rest = parts[0], parts[1:]
        try:
            out[name] = out.get(name, 0.0) + float(rest[0])
            if name == "riffle_server_rpc_total" and 'rpc="urpc:' in line:  # requests served over urpc
                out["riffle_server_urpc_rpc_total"] = out.get("riffle_server_urpc_rpc_total", 0.0) + float(rest[0])
            # the HDFS tier: bytes spilled to HDFS, and tier choices by reason
            if name == "riffle_spill_bytes_total" and 'disk="hdfs"' in line:
                out["riffle_spill_bytes_total:hdfs"] = out.get("riffle_spill_bytes_total:hdfs", 0.0) + float(rest[0])
            if name == "riffle_spill_tier_choices_total":
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                key = f"riffle_spill_tier_choices_total:{reason}"
                out[key] = out.get(key, 0.0) + float(rest[0])
        except (ValueError, IndexError):
            pass
    return out


def hdfs_listing(spark, remote, app_id):
    """{"files": n, "bytes": total, "names": [...]} of the files under <remote>/<app_id>* (every shuffle)."""
    try:
        jvm = spark.sparkContext._jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        root = jvm.org.apache.hadoop.fs.Path(remote)
        fs = root.getFileSystem(conf)
        n = total = 0
        if not fs.exists(root):
            return {"files": 0, "bytes": 0, "names": []}
        names = []
        for st in fs.listStatus(root):
            if not st.getPath().getName().startswith(app_id):
                continue
            it = fs.listFiles(st.getPath(), True)
            while it.hasNext():
                f = it.next()
                n += 1
                total += f.getLen()
                if len(names) < 20:
                    names.append(f.getPath().toString().split(remote.rstrip("/"), 1)[-1])
        return {"files": n, "bytes": total, "names": names}
    except Exception as e:  # noqa: BLE001 - reported, the harness asserts
        return {"_error": repr(e)}


def coordinator_apps(url):
    try:
        apps = json.loads(http_get(url.rstrip("/") + "/api/apps"))
        if isinstance(apps, dict):  # tolerate {"apps": [...]}
            apps = apps.get("apps", apps.get("data", []))
        return [a.get("app_id", a.get("appId")) if isinstance(a, dict) else a for a in apps]
    except Exception as e:  # noqa: BLE001
        return {"_error": repr(e)}


def spark_shuffle_bytes(spark, group):
    """Shuffle bytes written/read by the Spark jobs of one job group, from Spark's own status store."""
    sc = spark.sparkContext
    store = sc._jsc.sc().statusStore()
    write = read = stages = 0
    detail = []
    for job_id in sc.statusTracker().getJobIdsForGroup(group):
        info = sc.statusTracker().getJobInfo(job_id)
        for stage_id in info.stageIds if info else []:
            try:
                st = store.lastStageAttempt(stage_id)
            except Exception:  # noqa: BLE001, S112 - a stage that never ran (skipped) has no attempt
                continue
            write += st.shuffleWriteBytes()
            read += st.shuffleReadBytes()
            stages += 1
            detail.append(_stage_detail(stage_id, st))
    return {"write_bytes": write, "read_bytes": read, "stages": stages, "stage_detail": detail}


def _stage_detail(stage_id, st):
    """Where a stage's time went (Spark's StageData; times in seconds; used by the benchmarks)."""
    def opt_ms(o):
        return o.get().getTime() if o.isDefined() else None

    sub, done = opt_ms(st.submissionTime()), opt_ms(st.completionTime())
    return {
        "stage": stage_id,
        "tasks": st.numTasks(),
        "wall_s": (done - sub) / 1e3 if sub is not None and done is not None else None,
        "task_run_s": st.executorRunTime() / 1e3,
        "task_cpu_s": st.executorCpuTime() / 1e9,
        "shuffle_write_s": st.shuffleWriteTime() / 1e9,
        "shuffle_fetch_wait_s": st.shuffleFetchWaitTime() / 1e3,
        "shuffle_write_bytes": st.shuffleWriteBytes(),
        "shuffle_read_bytes": st.shuffleReadBytes(),
    }


def vanilla_shuffle_files(local_dir):
    n = 0
    for root, _dirs, files in os.walk(local_dir):
        n += sum(1 for f in files if f.startswith("shuffle_") and f.endswith((".data", ".index")))
    return n


# ----------------------------------------------------------------------------- main


def error_text(tb: str) -> str:
    """The exception / 'Caused by' lines of a (Py4J) traceback first, then the traceback's start."""
    salient, seen = [], set()
    for line in tb.splitlines():
        line = line.strip()
        if (
            re.search(r"(Exception|Error)\b.*:|^Caused by:", line)
            and not line.startswith("File ")
            and line not in seen
        ):
            seen.add(line)
            salient.append(line[:400])
    return "\n".join(salient[:15]) + "\n--- traceback ---\n" + tb[:4000]


def _cancel(sc, group, entry):
    entry["timed_out"] = True
    sc.cancelJobGroup(group)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    with open(ap.parse_args().spec) as f:
        spec = json.load(f)
    out_path = spec["out"]
    params = spec.get("params", {})
    servers = spec.get("server_http", [])
    coord = spec.get("coordinator_http")
    res: dict = {"group": spec["group"], "started": time.time(), "jobs": {}, "pid": os.getpid()}

    def dump():
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1, default=str)
        os.replace(tmp, out_path)

    t0 = time.time()
    builder = SparkSession.builder.appName(f"riffle-e2e-{spec['group']}")
    for k, v in spec["conf"].items():
        builder = builder.config(k, str(v))
    try:
        spark = builder.getOrCreate()
    except Exception:
        res["startup_error"] = traceback.format_exc()
        dump()
        raise
    sc = spark.sparkContext
    jsc = sc._jsc.sc()
    res["startup_s"] = round(time.time() - t0, 2)
    res["app_id"] = sc.applicationId
    res["shuffle_manager"] = jsc.env().shuffleManager().getClass().getName()
    res["rss_enabled"] = jsc.conf().get("spark.rss.enabled", "unset")
    res["spark_version"] = spark.version
    local_dir = spec["conf"].get("spark.local.dir")
    dump()

    jobs = dict(CORE)
    if spec["group"].startswith("tpcds"):
        tpcds_register(spark, params["tpcds_data"])
        jobs = {name: make_tpcds_job(path) for name, path in params["tpcds_queries"].items()}

    timeout = float(spec.get("job_timeout", 300))
    for name in spec["jobs"]:
        entry: dict = {}
        res["jobs"][name] = entry
        if servers:
            entry["metrics_before"] = [riffle_metrics(u) for u in servers]
        timer = threading.Timer(timeout, _cancel, (sc, name, entry))
        sc.setJobGroup(name, name, interruptOnCancel=True)
        timer.start()
        t = time.time()
        try:
            entry.update(jobs[name](spark, params))
        except Exception:  # noqa: BLE001 - one failing job must not hide the others
            entry["error"] = error_text(traceback.format_exc())
        finally:
            timer.cancel()
            sc.setJobGroup("idle", "idle")
        entry["seconds"] = round(time.time() - t, 2)
        try:
            entry["spark_shuffle"] = spark_shuffle_bytes(spark, name)
        except Exception as e:  # noqa: BLE001
            entry["spark_shuffle"] = {"_error": repr(e)}
        if servers:
            entry["metrics_after"] = [riffle_metrics(u) for u in servers]
        if params.get("hdfs_remote"):  # the HDFS tier: this app's files, listed through Spark's Hadoop client
            entry["hdfs_files"] = hdfs_listing(spark, params["hdfs_remote"], sc.applicationId)
        if coord:
            entry["coordinator_apps"] = coordinator_apps(coord)
        if local_dir:
            entry["vanilla_shuffle_files"] = vanilla_shuffle_files(local_dir)
        dump()
        print(
            f"[spark_job] {spec['group']}/{name}: {entry.get('seconds')} s"
            f" {'ERROR' if 'error' in entry else entry.get('digest', '')[:60]}",
            flush=True,
        )

    for i, url in enumerate(servers):  # raw per-label counters, kept for debugging (RIFFLE_E2E_KEEP=1)
        try:
            with open(os.path.join(os.path.dirname(out_path), f"metrics-server{i + 1}.prom"), "w") as f:
                f.write(http_get(url.rstrip("/") + "/metrics"))
        except Exception:  # noqa: BLE001, S110
            pass
    t = time.time()
    spark.stop()
    res["stop_s"] = round(time.time() - t, 2)
    res["total_s"] = round(time.time() - t0, 2)
    if servers:
        res["metrics_after_stop"] = [riffle_metrics(u) for u in servers]
    res["finished"] = True
    dump()


if __name__ == "__main__":
    sys.exit(main())
