#!/usr/bin/env python3
"""Spark jobs with GRPC and with GRPC_NETTY against one cluster (and a Riffle cluster), interleaved.

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
        [--jobs rdd_basic groupby_agg join sort multistage_aqe_on] [--clients GRPC]
        [--riffle-bin PATH/riffle-server]

``--jobs`` runs other jobs of ``tests/e2e/spark_job.py`` (in one Spark application per run; the job
time is their sum). ``--riffle-bin`` also starts a second cluster, one riffle-coordinator of ours and
two Riffle (Rust) servers from that binary (``scripts/rust_riffle.py``; the same memory capacity,
one data directory each), runs every (client type, round) against both clusters (the cluster order
flips every round) and prints the medians of each and the ratios ours / Riffle of server CPU and of
job time. Each run's results are checked against Spark's own shuffle (the jobs' checks).

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
    """(metric, rpc) -> value, summed over statuses (none for a server without these metrics: Riffle)."""
    try:
        with urllib.request.urlopen(http + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
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


def start_riffle_cluster(root: Path, binary: str):
    """One riffle-coordinator of ours (the e2e configuration) and ``NUM_SERVERS`` Riffle servers
    heartbeating to it, as an ``e2e.Cluster`` (its servers are ``RiffleProcess``es)."""
    from scripts.rust_riffle import start_riffle

    coord = e2e._daemon(root, "coordinator", "riffle_actors.coordinator")
    coord.config.write_text(e2e._coordinator_toml(coord))
    cluster = e2e.Cluster(root=root, coordinator=coord, memory_capacity=e2e.parse_size(e2e.SERVER_MEMORY),
                          registered_servers=e2e.NUM_SERVERS)
    try:
        coord.start()
        for i in range(e2e.NUM_SERVERS):
            cluster.servers.append(start_riffle(
                binary, root / f"riffle{i + 1}", quorum=cluster.quorum, capacity=e2e.SERVER_MEMORY,
                data_dir=root / f"riffle{i + 1}" / "d1", urpc=True, heartbeat_s=1))
        cluster.wait_servers_active()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def run_once(root: Path, n: int, jar: Path, cluster, client_type: str, partitions: int,
             jobs: list[str] | None = None, label: str = "riffle_actors") -> dict:
    jobs = jobs or ["many_partitions"]
    run_dir = root / f"run{n}-{label}-{client_type}"
    run_dir.mkdir()
    spec = {"group": "core", "jobs": jobs, "conf": spark_conf(run_dir, jar, cluster, client_type),
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
    done = [result["jobs"].get(name, {"error": "did not run"}) for name in jobs]
    failed = {f"{name}.{k}": v for name, job in zip(jobs, done) for k, v in job.get("checks", {}).items() if not v[0]}
    errors = "; ".join(f"{name}: {job['error'][:1000]}" for name, job in zip(jobs, done) if "error" in job)
    if rc != 0 or errors or failed:
        raise SystemExit(f"{label} {client_type} run failed (exit {rc}, failed checks {failed}): {errors}\n"
                         f"see {run_dir / 'driver.log'}")
    rpcs: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for b, a in zip(before, after):
        for (metric, rpc), value in a.items():
            rpcs[rpc][0 if metric == "riffle_server_rpc_total" else 1] += value - b.get((metric, rpc), 0.0)
    return {"client": client_type, "cluster": label, "wall_s": wall, "load": load,
            "startup_s": result.get("startup_s"), "job_s": sum(job["seconds"] for job in done),
            "stop_s": result.get("stop_s"), "server_cpu_s": cpu1 - cpu0,
            "coordinator_cpu_s": coord1 - coord0,
            "spark_cpu_s": spark_cpu,
            "stages": [st for job in done for st in job.get("spark_shuffle", {}).get("stage_detail", [])],
            "rpcs": {k: v for k, v in rpcs.items() if v[0] > 0},
            "checks": {f"{name}.{k}": v for name, job in zip(jobs, done) for k, v in job.get("checks", {}).items()}}


def report(runs: list[dict]) -> None:
    print(f"\n{'run':4} {'cluster':13} {'client':11} {'load':>5} {'app s':>6} {'start s':>7} {'job s':>6} {'stop s':>6} "
          f"{'server CPU s':>12} {'coord CPU s':>11} {'Spark CPU s':>11} {'RPCs':>6}")
    for i, r in enumerate(runs):
        print(f"{i:4} {r['cluster']:13} {r['client']:11} {r['load']:5.2f} {r['wall_s']:6.1f} {r['startup_s'] or 0:7.1f} {r['job_s']:6.1f} "
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
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        by[(r["cluster"], r["client"])].append(r)
    print("\nmedians:")
    meds: dict[tuple[str, str], dict[str, float]] = {}
    for (cluster, client), rs in by.items():
        meds[(cluster, client)] = m = {key: statistics.median(x[key] for x in rs)
                                       for key in ("job_s", "wall_s", "server_cpu_s", "spark_cpu_s")}
        print(f"  {cluster:13} {client:11} job {m['job_s']:.1f} s, app {m['wall_s']:.1f} s, "
              f"server CPU {m['server_cpu_s']:.2f} s, Spark CPU {m['spark_cpu_s']:.1f} s over {len(rs)} runs")
    for (cluster, client), m in meds.items():
        theirs = meds.get(("Riffle", client))
        if cluster == "riffle_actors" and theirs:
            print(f"  ours / Riffle, {client}: server CPU x{m['server_cpu_s'] / theirs['server_cpu_s']:.2f}, "
                  f"job time x{m['job_s'] / theirs['job_s']:.2f}, app time x{m['wall_s'] / theirs['wall_s']:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=2, help="each round runs both client types (order alternates)")
    ap.add_argument("--partitions", type=int, default=2000, help="reduce partitions of the job")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs, results)")
    ap.add_argument("--jobs", nargs="+", default=["many_partitions"], help="jobs of tests/e2e/spark_job.py per run")
    ap.add_argument("--clients", nargs="+", default=["GRPC", "GRPC_NETTY"], choices=("GRPC", "GRPC_NETTY"))
    ap.add_argument("--riffle-bin", default=None,
                    help="a Riffle (Rust) riffle-server binary (not part of this project): a second cluster of it")
    opts = ap.parse_args()
    problem = e2e.prerequisite_problem()
    if problem:
        raise SystemExit(f"cannot run Spark here: {problem} (run scripts/e2e_setup.sh)")
    _, jar = e2e.client_jar()
    root = Path(tempfile.mkdtemp(prefix="riffle-bench-spark-"))
    clusters = {"riffle_actors": e2e.start_cluster(root / "cluster")}
    runs = []
    try:
        if opts.riffle_bin:
            clusters["Riffle"] = start_riffle_cluster(root / "riffle-cluster", opts.riffle_bin)
        for name, cluster in clusters.items():
            print(f"{name} cluster: coordinator {cluster.quorum}, servers {cluster.server_http}", flush=True)
        print(f"jobs {' '.join(opts.jobs)} ({opts.partitions} reduce partitions for many_partitions)", flush=True)
        for rnd in range(opts.rounds):
            order = opts.clients if rnd % 2 == 0 else opts.clients[::-1]
            names = list(clusters) if rnd % 2 == 0 else list(clusters)[::-1]
            for client in order:
                for name in names:
                    r = run_once(root, len(runs), jar, clusters[name], client, opts.partitions, opts.jobs, name)
                    runs.append(r)
                    print(f"  run {len(runs) - 1}: {name} {client} job {r['job_s']:.1f} s, app {r['wall_s']:.1f} s, "
                          f"server CPU {r['server_cpu_s']:.2f} s (load {r['load']:.2f})", flush=True)
        report(runs)
        return 0
    finally:
        for cluster in clusters.values():
            cluster.stop()
        if opts.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
