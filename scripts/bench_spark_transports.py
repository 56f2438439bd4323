#!/usr/bin/env python3
"""The shuffle-heavy Spark job with GRPC and with GRPC_NETTY against one cluster, interleaved.

Starts the e2e cluster (one riffle-coordinator, two riffle-server daemons with gRPC and urpc ports,
the same configs as ``tests/e2e/conftest.py``), then runs the 2000-reduce-partition job of
``tests/e2e/spark_job.py`` (``many_partitions``: 100k rows, 4 map tasks, AQE off) as its own Spark
application per run, alternating ``spark.rss.client.type=GRPC`` and ``GRPC_NETTY`` (the order flips
every round), and prints per run:

- wall time of the Spark application and of the job alone,
- CPU seconds of the two servers and the coordinator over the run (psutil), and of the Spark
  driver process tree (the JVM runs the executors: ``local[2]``),
- Spark's stage breakdown of the job (stage wall time, task run time, task CPU, shuffle write time,
  shuffle fetch wait: what the tasks spent waiting for shuffle data),
- the servers' RPC counts and server-side seconds per RPC type (``riffle_server_rpc_*`` metrics).

    python scripts/bench_spark_transports.py [--rounds 2] [--partitions 2000] [--keep]

Needs what the Spark e2e tier needs (java, pyspark 3.5, the Uniffle client jar: scripts/e2e_setup.sh).
Numbers vary run to run on a shared 2-core box: compare runs of one invocation (interleaved), and
read the load average printed with each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e import conftest as e2e

_SAMPLE = re.compile(r'^(riffle_server_rpc_total|riffle_server_rpc_duration_seconds_sum)\{([^}]*)\} (\S+)')


def scrape(http: str) -> dict[tuple[str, str], float]:
    """(metric, rpc) -> value, summed over statuses."""
    with urllib.request.urlopen(http + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = defaultdict(float)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels.get("rpc", "?"))] += float(m.group(3))
    return out


def cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def spark_tree_cpu(proc: subprocess.Popen, deadline: float) -> float:
    """CPU seconds of the Spark driver process and its descendants (the JVM), sampled every 0.5 s until
    it exits (the last half second of each process is not seen)."""
    import psutil

    seen: dict[int, float] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    c = p.cpu_times()
                    seen[p.pid] = c.user + c.system
        except psutil.Error:
            pass
        time.sleep(0.5)
    return sum(seen.values())


def spark_conf(run_dir: Path, jar: Path, cluster, client_type: str) -> dict[str, str]:
    local_dir = run_dir / "spark-local"
    local_dir.mkdir(parents=True)
    conf = e2e.base_conf(local_dir)
    conf.update(e2e.rss_conf(jar, cluster, client_type))
    if client_type == "GRPC_NETTY":  # the client's Netty reader bug on Java >= 9 (see tests/e2e/conftest.py)
        opt = f" -D{e2e.SHADED_NETTY_NO_UNSAFE}=true"
        conf["spark.driver.extraJavaOptions"] += opt
        conf["spark.executor.extraJavaOptions"] = opt
    return conf


def run_once(root: Path, n: int, jar: Path, cluster, client_type: str, partitions: int) -> dict:
    run_dir = root / f"run{n}-{client_type}"
    run_dir.mkdir()
    spec = {"group": "core", "jobs": ["many_partitions"], "conf": spark_conf(run_dir, jar, cluster, client_type),
            "out": str(run_dir / "result.json"), "job_timeout": 600, "server_http": cluster.server_http,
            "coordinator_http": cluster.coordinator.http, "params": {"many_partitions": partitions}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONUNBUFFERED="1")
    servers = [s.proc.pid for s in cluster.servers]
    before = [scrape(h) for h in cluster.server_http]
    cpu0, coord0 = cpu_of(servers), cpu_of([cluster.coordinator.proc.pid])
    load = os.getloadavg()[0]
    t = time.monotonic()
    with open(run_dir / "driver.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(e2e.JOB_SCRIPT), "--spec", str(run_dir / "spec.json")],
                                cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            spark_cpu = spark_tree_cpu(proc, deadline=t + 900)
        finally:
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
    wall = time.monotonic() - t
    cpu1, coord1 = cpu_of(servers), cpu_of([cluster.coordinator.proc.pid])
    after = [scrape(h) for h in cluster.server_http]
    result = json.loads((run_dir / "result.json").read_text())
    job = result["jobs"]["many_partitions"]
    failed = {k: v for k, v in job.get("checks", {}).items() if not v[0]}
    if rc != 0 or "error" in job or failed:
        raise SystemExit(f"{client_type} run failed (exit {rc}, failed checks {failed}): {job.get('error', '')[:2000]}\n"
                         f"see {run_dir / 'driver.log'}")
    rpcs: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for b, a in zip(before, after):
        for (metric, rpc), value in a.items():
            rpcs[rpc][0 if metric == "riffle_server_rpc_total" else 1] += value - b.get((metric, rpc), 0.0)
    return {"client": client_type, "wall_s": wall, "load": load, "startup_s": result.get("startup_s"),
            "job_s": job["seconds"], "stop_s": result.get("stop_s"), "server_cpu_s": cpu1 - cpu0,
            "coordinator_cpu_s": coord1 - coord0,
            "spark_cpu_s": spark_cpu,
            "stages": job.get("spark_shuffle", {}).get("stage_detail", []),
            "rpcs": {k: v for k, v in rpcs.items() if v[0] > 0}, "checks": job.get("checks", {})}


def report(runs: list[dict]) -> None:
    print(f"\n{'run':4} {'client':11} {'load':>5} {'app s':>6} {'start s':>7} {'job s':>6} {'stop s':>6} "
          f"{'server CPU s':>12} {'coord CPU s':>11} {'Spark CPU s':>11} {'RPCs':>6}")
    for i, r in enumerate(runs):
        print(f"{i:4} {r['client']:11} {r['load']:5.2f} {r['wall_s']:6.1f} {r['startup_s'] or 0:7.1f} {r['job_s']:6.1f} "
              f"{r['stop_s'] or 0:6.1f} {r['server_cpu_s']:12.2f} {r['coordinator_cpu_s']:11.2f} "
              f"{r['spark_cpu_s']:11.1f} {sum(v[0] for v in r['rpcs'].values()):6.0f}")
    print("(Spark CPU: the driver JVM, which runs the tasks with local[2], and its Python process)")
    print("\nstages of the job (per run): stage, tasks, wall s, task run s, task CPU s, shuffle write s, "
          "shuffle fetch wait s")
    for i, r in enumerate(runs):
        parts = [f"#{s['stage']} {s['tasks']}t {s['wall_s'] or 0:.1f}/{s['task_run_s']:.1f}/{s['task_cpu_s']:.1f}/"
                 f"{s['shuffle_write_s']:.2f}/{s['shuffle_fetch_wait_s']:.2f}" for s in r["stages"]]
        print(f"{i:4} {r['client']:11} " + "  ".join(parts))
    print("\nserver RPCs (per run): rpc count / server-side seconds")
    for i, r in enumerate(runs):
        top = sorted(r["rpcs"].items(), key=lambda kv: -kv[1][1])
        print(f"{i:4} {r['client']:11} " + ", ".join(f"{k} {v[0]:.0f}/{v[1]:.2f}s" for k, v in top))
    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[r["client"]].append(r)
    print("\nmedians:")
    for client, rs in by.items():
        def med(key, rs=rs):
            return statistics.median(x[key] for x in rs)
        print(f"  {client:11} job {med('job_s'):.1f} s, app {med('wall_s'):.1f} s, server CPU {med('server_cpu_s'):.2f} s, "
              f"Spark CPU {med('spark_cpu_s'):.1f} s over {len(rs)} runs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=2, help="each round runs both client types (order alternates)")
    ap.add_argument("--partitions", type=int, default=2000, help="reduce partitions of the job")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs, results)")
    opts = ap.parse_args()
    problem = e2e.prerequisite_problem()
    if problem:
        raise SystemExit(f"cannot run Spark here: {problem} (run scripts/e2e_setup.sh)")
    _, jar = e2e.client_jar()
    root = Path(tempfile.mkdtemp(prefix="riffle-bench-spark-"))
    cluster = e2e.start_cluster(root / "cluster")
    runs = []
    try:
        print(f"cluster: coordinator {cluster.quorum}, servers {cluster.server_http}; job many_partitions "
              f"({opts.partitions} reduce partitions)", flush=True)
        for rnd in range(opts.rounds):
            order = ["GRPC", "GRPC_NETTY"] if rnd % 2 == 0 else ["GRPC_NETTY", "GRPC"]
            for client in order:
                r = run_once(root, len(runs), jar, cluster, client, opts.partitions)
                runs.append(r)
                print(f"  run {len(runs) - 1}: {client} job {r['job_s']:.1f} s, app {r['wall_s']:.1f} s, "
                      f"server CPU {r['server_cpu_s']:.2f} s (load {r['load']:.2f})", flush=True)
        report(runs)
        return 0
    finally:
        cluster.stop()
        if opts.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
