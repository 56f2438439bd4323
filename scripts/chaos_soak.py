#!/usr/bin/env python3
"""Chaos soak: real Spark jobs with replica 2 against a coordinator pair and 3+ servers under a seeded fault schedule.

    python scripts/chaos_soak.py --duration 1800 --seed 7             # the 30-minute soak (needs root)
    python scripts/chaos_soak.py --duration 150 --seed 21 --json out.json
    python scripts/chaos_soak.py --seed 7 --duration 1800 --print-schedule   # the schedule only

What runs (all on this machine, 127.0.0.1, fixed ports picked at start so restarts keep them):

- two ``riffle-coordinator`` daemons (the client's quorum lists both) and ``--servers`` (default 3)
  ``riffle-server`` daemons, each started through this script's ``_server`` entry point: the real
  server with a ``FaultyLocalIO`` (``riffle_actors.io.faults``, the IO seam of tests/fault) per data
  path, armed from command files the soak drops into the server's fault directory. Each server's data
  path is a tmpfs mount of its own (``--disk-size``), so a full disk and a read-only remount are real.
- Spark applications of the e2e job set (``tests/e2e/spark_job.py``, a rotation of ``--jobs``) back to
  back until ``--duration`` has passed, with ``spark.rss.data.replica=2``, ``replica.write=2``,
  ``replica.read=1`` and Spark's event log on. Before the soak one application on Spark's own sort
  shuffle runs every job once: its digests are the oracle (each job also checks closed-form answers).
- a fault schedule drawn from ``--seed`` alone (same seed, same schedule; printed first): the kinds
  (``FAULT_KINDS``) in a seeded shuffled cycle, at seeded gaps around ``--fault-gap``, each on a seeded
  target, held for a seeded time, then undone; the soak waits until every server is ACTIVE at every
  coordinator again and counts that as the fault's recovery time.

What it prints at the end (and writes with ``--json``): jobs run, faults injected by kind, jobs failed,
results that differ from the oracle, stages recomputed (stage attempts > 0 in the event logs, and
FetchFailed task ends), blocks lost (``riffle_recovery_lost_blocks`` of restarted servers, against the
memory a killed server held) and whether each loss was reported, worst recovery time, and the bit-flip
accounting (``integrity_accounting``: reads a corrupt-block metric of the servers when they have one,
else "not measured"). Targets (exit 1 when one fails): 0 failed jobs, 0 differing results, every loss
reported, every bit flip detected and none served; a target that could not be measured is not a pass:
exit 3 when everything measured passed but something was not measured. Exit 2: prerequisites missing
(root, java, pyspark 3.5, the client jar: ``scripts/e2e_setup.sh``).

Every process, mount and temp dir is removed on exit, also on an exception, SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FAULT_KINDS = (
    "server_sigkill",   # SIGKILL a server, restart it on the same ports and data path
    "server_sigterm",   # SIGTERM (graceful stop: flush, then exit), restart
    "disk_eio",         # the IO seam: the next appends/reads of a server's disk fail with EIO
    "disk_readonly",    # remount a server's data path read-only (EROFS), then read-write
    "disk_full",        # fill a server's data path (ENOSPC), then free it
    "bit_flip",         # flip bytes in a spilled data file of a live app on one server
    "coordinator_sigkill",  # SIGKILL one coordinator of the pair, restart it
    "memory_pressure",  # a synthetic client registers many apps on every server and fills their memory
)
DEFAULT_JOBS = ("rdd_basic", "groupby_agg", "join", "skew", "sort", "multistage_aqe_on")
JOBS_PER_APP = 3
TASK_ATTEMPTS = 4  # spark.task.maxFailures' default on a cluster; local[2,4] gives a task as many here
EXIT_TARGET_FAILED, EXIT_PREREQ, EXIT_NOT_MEASURED = 1, 2, 3

# Integrity accounting (docs/faults.md "Integrity"): the corrupt blocks each server's disk scrubber found
# and the reads it refused because of one (see integrity_accounting). The soak's servers scrub fast
# (SCRUB_RATE, SCRUB_INTERVAL_SEC) so a flipped byte is found while its app still runs.
CORRUPT_BLOCKS_METRIC = "riffle_scrub_corrupt_blocks_total"
CORRUPT_READS_REFUSED_METRIC = "riffle_server_corrupt_reads_refused_total"
SCRUB_RATE, SCRUB_INTERVAL_SEC = "64M", 2.0
DETECT_TIMEOUT_S = 30.0  # how long a bit_flip fault waits for the server's scrubber to find its flipped blocks


# ============================================================================ the server entry point

def server_main(argv: list[str]) -> int:
    """``chaos_soak.py _server --fault-dir D -c CONFIG --port-file F``: riffle-server with FaultyLocalIO disks.

    Every 0.2 s the server looks for ``D/*.cmd`` (JSON): ``{"op": "append_batch", "errno": 5, "times": 3}``
    arms a rule on every disk (``"disk": "<data path>"``: on that disk only), ``{"heal": true}`` removes
    them; each command file is renamed ``*.done`` and ``D/hits.json`` holds how often the rules fired."""
    from riffle_actors.config import load_config
    from riffle_actors.daemon import run_daemon
    from riffle_actors.io.faults import FaultyLocalIO
    from riffle_actors.server import ShuffleServer

    ap = argparse.ArgumentParser(prog="chaos_soak.py _server")
    ap.add_argument("--fault-dir", required=True)
    ours, rest = ap.parse_known_args(argv)
    fault_dir = Path(ours.fault_dir)
    faulty: dict[str, FaultyLocalIO] = {}

    def local_io(name: str, root: str) -> FaultyLocalIO:
        faulty[name] = FaultyLocalIO(name=name)
        return faulty[name]

    async def watch() -> None:
        hits: Counter[str] = Counter()
        while True:
            for cmd in sorted(fault_dir.glob("*.cmd")):
                try:
                    spec = json.loads(cmd.read_text())
                except (OSError, ValueError):
                    continue
                cmd.rename(cmd.with_suffix(".done"))
                for name, io in faulty.items():
                    if spec.get("disk") not in (None, name):
                        continue
                    if spec.get("heal"):
                        hits.update({r.op: r.hits for r in io.rules})
                        io.heal()
                    else:
                        io.fail(spec["op"], int(spec.get("errno", errno.EIO)), times=spec.get("times"))
            now = hits + Counter({r.op: r.hits for io in faulty.values() for r in io.rules})
            (fault_dir / "hits.tmp").write_text(json.dumps(dict(now)))
            os.replace(fault_dir / "hits.tmp", fault_dir / "hits.json")
            await asyncio.sleep(0.2)

    async def serve(cfg, stop_event: asyncio.Event, ports) -> int:
        server = ShuffleServer(cfg, local_io_factory=local_io)
        server.request_stop = stop_event.set
        watcher = asyncio.create_task(watch())
        try:
            await server.start()
            ports(grpc_port=server.grpc_port, http_port=server.http_port)
            await stop_event.wait()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            for io in faulty.values():
                io.heal()
            await server.stop()
        return 0

    return run_daemon(rest, prog="riffle-server (chaos soak)", load_config=load_config,
                      log_config=lambda cfg: cfg.log, serve=serve)


# ============================================================================ memory pressure client

def pressure_main(argv: list[str]) -> int:
    """``chaos_soak.py _pressure --targets H:P,... --apps N --hold S --out F``: register N apps on every
    target, send each 4 blocks of 64 KiB per partition of 4, hold S seconds, unregister them."""
    from tests.helpers.client import UniffleClient, UniffleError, make_blocks

    ap = argparse.ArgumentParser(prog="chaos_soak.py _pressure")
    ap.add_argument("--targets", required=True)
    ap.add_argument("--apps", type=int, default=40)
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    stats: Counter[str] = Counter()

    async def one(client: UniffleClient, app: str) -> None:
        try:
            await client.register_shuffle(app, 0, range(4))
            stats["registered"] += 1
            for p in range(4):
                await client.send_blocks(app, 0, make_blocks(p, 1, 4, 64 << 10))
                stats["sent_bytes"] += 4 * (64 << 10)
        except UniffleError as e:
            stats[f"refused:{e.args[0] if e.args else 'x'}"] += 1
        except Exception as e:  # noqa: BLE001 - counted: pressure may be refused, that is its point
            stats[f"error:{type(e).__name__}"] += 1

    async def run() -> None:
        clients = [UniffleClient(t, retry_deadline_s=5.0) for t in a.targets.split(",")]
        base = int(time.time() * 1000)
        apps = [f"application_{base}_{i:04d}_{base + 1}" for i in range(a.apps)]
        try:
            await asyncio.gather(*(one(c, app) for c in clients for app in apps))
            await asyncio.sleep(a.hold)
        finally:
            for c in clients:
                for app in apps:
                    with contextlib.suppress(Exception):
                        await c.unregister_app(app)
                await c.close()

    asyncio.run(run())
    Path(a.out).write_text(json.dumps(dict(stats)))
    return 0


# ============================================================================ schedule

@dataclass
class Fault:
    at: float          # seconds after the soak started
    kind: str
    target: int        # server index, or coordinator index for coordinator_sigkill
    hold: float        # seconds the fault stays before it is undone
    salt: int          # seeds what the fault itself draws (bytes to flip, ...)

    def describe(self) -> str:
        who = f"coordinator{self.target + 1}" if self.kind.startswith("coordinator") else f"server{self.target + 1}"
        return f"t+{self.at:6.1f}s  {self.kind:<20} {who:<13} hold {self.hold:4.1f}s"


def draw_schedule(seed: int, duration: float, servers: int, gap: float,
                  kinds: tuple[str, ...] = FAULT_KINDS) -> list[Fault]:
    """The fault schedule: a function of its arguments only (same seed, same schedule)."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = gap * rng.uniform(0.5, 1.0)  # the first fault after the first application started
    cycle: list[str] = []
    while t < duration - 5:
        if not cycle:
            cycle = list(kinds)
            rng.shuffle(cycle)
        kind = cycle.pop()
        target = rng.randrange(2 if kind.startswith("coordinator") else servers)
        hold = round(rng.uniform(2.0, 6.0), 1)
        out.append(Fault(round(t, 1), kind, target, hold, rng.randrange(1 << 30)))
        t += gap * rng.uniform(0.6, 1.4)
    return out


# ============================================================================ cluster

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_text(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def metric_samples(url: str) -> dict[str, list[float]]:
    """riffle_* samples by name, every label set ({} when the server does not answer)."""
    from tests.helpers import parse_metrics

    try:
        text = http_text(url + "/metrics")
    except OSError:
        return {}
    return {name: [v for _labels, v in samples] for name, samples in parse_metrics(text).items()
            if name.startswith("riffle_")}


def metrics(url: str) -> dict[str, float]:
    """riffle_* samples summed over their labels, by name ({} when the server does not answer)."""
    from tests.helpers import parse_metrics

    try:
        text = http_text(url + "/metrics")
    except OSError:
        return {}
    out: dict[str, float] = {}
    for name, samples in parse_metrics(text).items():
        if name.startswith("riffle_"):
            out[name] = sum(v for _labels, v in samples)
    return out


@dataclass
class Proc:
    name: str
    argv: list[str]
    workdir: Path
    grpc_port: int
    http_port: int
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log(self) -> Path:
        return self.workdir / "stdout.log"

    def start(self, timeout: float = 60.0) -> None:
        port_file = self.workdir / "ports.json"
        with contextlib.suppress(FileNotFoundError):
            port_file.unlink()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([*self.argv, "--port-file", str(port_file)], cwd=self.workdir, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not listening within {timeout:.0f} s:\n{tail(self.log)}")
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        if not self.wait(15):
            self.signal(signal.SIGKILL)
            self.wait(5)


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return f"<{path} missing>"


class Cluster:
    def __init__(self, root: Path, n_servers: int, server_memory: str, disk_size: str, disks: int = 2):
        self.root = root
        self.mounts: list[Path] = []
        self.coords: list[Proc] = []
        self.servers: list[Proc] = []
        self.data: list[list[Path]] = []  # per server: its data paths, each a tmpfs of its own
        self.fault_dirs: list[Path] = []
        cports = [(free_port(), free_port()) for _ in range(2)]
        quorum = [f"127.0.0.1:{g}" for g, _ in cports]
        self.quorum = ",".join(quorum)
        for i, (g, h) in enumerate(cports):
            wd = root / f"coordinator{i + 1}"
            wd.mkdir(parents=True)
            cfg = wd / "coordinator.toml"
            # heartbeat_timeout_sec 4: a SIGKILLed server is no longer assigned 4 s after its last heartbeat
            cfg.write_text(
                f"grpc_port = {g}\nhttp_port = {h}\n[server]\nheartbeat_timeout_sec = 4\n"
                '[client_conf]\n"rss.storage.type" = "MEMORY_LOCALFILE"\n'
                f'[log]\npath = {json.dumps(str(wd / "coordinator.log"))}\nlevel = "INFO"\n')
            self.coords.append(Proc(f"coordinator{i + 1}", [sys.executable, "-m", "riffle_actors.coordinator",
                                                            "--config", str(cfg)], wd, g, h))
        for i in range(n_servers):
            wd = root / f"server{i + 1}"
            data, faults = [wd / f"data{d + 1}" for d in range(disks)], wd / "faults"
            for path in data:
                path.mkdir(parents=True)
                self._mount(path, disk_size)
            faults.mkdir()
            g, h = free_port(), free_port()
            cfg = wd / "server.toml"
            cfg.write_text(f"""\
store_type = "MEMORY_LOCALFILE"
grpc_port = {g}
http_port = {h}
coordinator_quorum = {json.dumps(quorum)}
heartbeat_interval_seconds = 1
grace_period_sec = 5

[memory_store]
capacity = {json.dumps(server_memory)}
buffer_ticket_timeout_sec = 30

[localfile_store]
data_paths = {json.dumps([str(x) for x in data])}
disk_healthy_check_interval_sec = 2
disk_probe_timeout_sec = 2.0
disk_probation_probes = 2
disk_io_timeout_sec = 10.0
scrub_rate = {json.dumps(SCRUB_RATE)}
scrub_interval_sec = {SCRUB_INTERVAL_SEC}

[hybrid_store]
memory_spill_high_watermark = 0.25
memory_spill_low_watermark = 0.1
memory_single_buffer_max_spill_size = "1M"

[app_config]
app_heartbeat_timeout_min = 5

[log]
path = {json.dumps(str(wd / "server.log"))}
level = "INFO"
""")
            argv = [sys.executable, str(Path(__file__).resolve()), "_server", "--fault-dir", str(faults),
                    "--config", str(cfg)]
            self.servers.append(Proc(f"server{i + 1}", argv, wd, g, h))
            self.data.append(data)
            self.fault_dirs.append(faults)

    def _mount(self, path: Path, size: str) -> None:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"cannot mount a tmpfs at {path}: {r.stderr.strip()}")
        self.mounts.append(path)

    def remount(self, path: Path, mode: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, text=True,
                               check=False)
            if r.returncode == 0:
                return
            if "busy" not in r.stderr or time.monotonic() > deadline:
                raise RuntimeError(f"remount,{mode} of {path}: {r.stderr.strip()}")
            time.sleep(0.05)

    def start(self) -> None:
        for p in [*self.coords, *self.servers]:
            p.start()
        self.wait_healthy(90)

    def active(self, coord: Proc) -> set[str]:
        try:
            listed = json.loads(http_text(coord.http + "/api/servers"))
        except (OSError, ValueError):
            return set()
        if isinstance(listed, dict):
            listed = listed.get("servers", listed.get("data", []))
        return {str(s.get("id")) for s in listed if str(s.get("status", "")).upper() == "ACTIVE"}

    def healthy(self) -> bool:
        want = {f"-{s.grpc_port}" for s in self.servers}  # ids are <advertised ip>-<grpc port>
        if any(s.proc is None or s.proc.poll() is not None for s in self.servers):
            return False
        for c in self.coords:
            if c.proc is None or c.proc.poll() is not None:
                return False
            if not want <= {"-" + i.rsplit("-", 1)[-1] for i in self.active(c)}:
                return False
        for s in self.servers:
            m = metric_samples(s.http)
            if m.get("riffle_server_healthy", [0])[0] != 1:
                return False
            if any(v != 1 for v in m.get("riffle_disk_healthy", [0])):  # a quarantined disk is re-admitted
                return False
        return True

    def wait_healthy(self, timeout: float) -> float:
        t = time.monotonic()
        while not self.healthy():
            if time.monotonic() - t > timeout:
                raise RuntimeError(f"cluster not healthy within {timeout:.0f} s")
            time.sleep(0.25)
        return time.monotonic() - t

    def stop(self) -> None:
        for p in [*self.servers, *self.coords]:
            with contextlib.suppress(Exception):
                p.stop()
        for path in reversed(self.mounts):
            subprocess.run(["mount", "-o", "remount,rw", str(path)], capture_output=True, check=False)
            if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self.mounts.clear()


# ============================================================================ Spark applications

@dataclass
class App:
    index: int
    jobs: list[str]
    run_dir: Path
    proc: subprocess.Popen
    started: float
    deadline: float


class SparkApps:
    def __init__(self, root: Path, cluster: Cluster | None, jar: Path, time_limit: float):
        from tests.e2e.conftest import JOB_SCRIPT

        self.root, self.cluster, self.jar, self.limit = root, cluster, jar, time_limit
        self.script = JOB_SCRIPT
        self.count = 0

    def conf(self, run_dir: Path, vanilla: bool) -> dict[str, str]:
        from tests.e2e.conftest import base_conf

        conf = base_conf(run_dir / "spark-local")
        (run_dir / "spark-local").mkdir(parents=True)
        (run_dir / "events").mkdir()
        # local[2,4]: a failed task gets 4 attempts, as on a cluster (spark.task.maxFailures defaults to 4
        # there; plain local[N] gives a task one attempt). The Uniffle client refuses attempt numbers from
        # spark.task.maxFailures on, so that is set to the same 4.
        conf.update({"spark.master": f"local[2,{TASK_ATTEMPTS}]", "spark.task.maxFailures": str(TASK_ATTEMPTS),
                     "spark.eventLog.enabled": "true",
                     "spark.eventLog.dir": f"file://{run_dir / 'events'}", "spark.eventLog.compress": "false"})
        if not vanilla:
            from tests.e2e.conftest import rss_conf

            class _C:  # rss_conf wants .quorum only
                quorum = self.cluster.quorum

            conf.update(rss_conf(self.jar, _C()))  # type: ignore[arg-type]
            conf.update({
                "spark.rss.data.replica": "2", "spark.rss.data.replica.write": "2",
                "spark.rss.data.replica.read": "1",
                "spark.rss.client.assignment.shuffle.nodes.max": str(len(self.cluster.servers)),
                # The 0.9.2 client's retries, sized beyond the worst outage of a server (hold <= 6 s, a
                # graceful stop <= 5 s, a restart with recovery; docs/faults.md "Client settings"):
                # - a send (requireBuffer + sendShuffleData) is tried rpc.maxAttempts times,
                #   retry.interval.max apart: 9 x 5 s = 45 s (the defaults 3 x 10 s give 20 s); within an
                #   attempt, NO_BUFFER is retried retry.max / rpc.maxAttempts = 5 times with a back-off
                #   capped at retry.interval.max;
                # - reportShuffleResult and getShuffleResult are retried rpc.maxAttempts times at once (no
                #   pause) and not at all on an error status: a report to a server that is down fails the
                #   task attempt, the next attempt's sends wait for the server;
                # - registerShuffle on an assigned server that is down: the driver asks the coordinator
                #   again, assignment.retry.times x assignment.retry.interval (the coordinator drops a
                #   silent server after its heartbeat_timeout_sec, 4 s here)
                "spark.rss.client.assignment.retry.times": "5",
                "spark.rss.client.assignment.retry.interval": "3000",
                "spark.rss.client.retry.max": "50",
                "spark.rss.client.retry.interval.max": "5000",
                "spark.rss.client.rpc.maxAttempts": "10",
                # the client refuses retry.max x retry.interval.max above send.check.timeout.ms (250 s here)
                "spark.rss.client.send.check.timeout.ms": "300000",
            })
        return conf

    def start(self, jobs: list[str], vanilla: bool = False) -> App:
        self.count += 1
        name = "oracle" if vanilla else f"app{self.count:03d}"
        run_dir = self.root / name
        conf = self.conf(run_dir, vanilla)
        spec = {"group": "core", "jobs": jobs, "conf": conf, "out": str(run_dir / "result.json"),
                "job_timeout": self.limit, "params": {},
                "server_http": [] if vanilla else [s.http for s in self.cluster.servers]}
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS",
                                                                 "SPARK_CONF_DIR")}
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
        with open(run_dir / "driver.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, str(self.script), "--spec", str(run_dir / "spec.json")],
                                    cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        now = time.monotonic()
        return App(self.count, jobs, run_dir, proc, now, now + self.limit * (len(jobs) + 1))


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def stage_recomputes(events_dir: Path) -> dict[str, int]:
    """From Spark's event log: stage attempts beyond the first, and tasks that ended FetchFailed."""
    out = {"stage_retries": 0, "fetch_failed_tasks": 0, "failed_tasks": 0}
    for f in events_dir.glob("*"):
        with contextlib.suppress(OSError), open(f, errors="replace") as fh:
            for line in fh:
                if '"SparkListenerStageSubmitted"' in line:
                    with contextlib.suppress(ValueError):
                        if json.loads(line)["Stage Info"].get("Stage Attempt ID", 0) > 0:
                            out["stage_retries"] += 1
                elif '"SparkListenerTaskEnd"' in line and '"Task End Reason"' in line:
                    with contextlib.suppress(ValueError):
                        reason = json.loads(line)["Task End Reason"].get("Reason")
                        if reason == "FetchFailed":
                            out["fetch_failed_tasks"] += 1
                        elif reason != "Success":
                            out["failed_tasks"] += 1
    return out


# ============================================================================ the soak

@dataclass
class Report:
    seed: int
    duration: float
    schedule: list[str]
    apps_run: int = 0
    jobs_run: int = 0
    jobs_failed: list[str] = field(default_factory=list)
    results_differ: list[str] = field(default_factory=list)
    faults: Counter = field(default_factory=Counter)
    fault_log: list[dict] = field(default_factory=list)
    stage_retries: int = 0
    fetch_failed_tasks: int = 0
    failed_tasks: int = 0
    losses: list[dict] = field(default_factory=list)
    recovery_s: dict[str, float] = field(default_factory=dict)
    bit_flips: list[dict] = field(default_factory=list)
    integrity: dict = field(default_factory=dict)
    oracle_problem: str = ""
    errors: list[str] = field(default_factory=list)
    failure_details: dict[str, str] = field(default_factory=dict)  # failed job -> its exception lines


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path, jar: Path):
        self.args = args
        self.root = root
        self.schedule = draw_schedule(args.seed, args.duration, args.servers, args.fault_gap, tuple(args.faults))
        self.report = Report(args.seed, args.duration, [f.describe() for f in self.schedule])
        self.cluster = Cluster(root / "cluster", args.servers, args.server_memory, args.disk_size, args.disks)
        self.spark = SparkApps(root / "spark", self.cluster, jar, args.job_timeout)
        self.jobs = list(args.jobs)
        self.apps: list[App] = []
        self.side: list[subprocess.Popen] = []  # memory-pressure clients
        self.oracle: dict[str, dict] = {}
        self.live_app_ids: set[str] = set()
        self.oracle_app: App | None = None
        self.to_compare: list[tuple[str, str, dict]] = []
        self.deferred: set[int] = set()  # salts of deferred bit flips (each is deferred once)

    # --------------------------------------------------------------------- run
    def run(self) -> Report:
        rep = self.report
        print(f"[soak] seed {self.args.seed}, duration {self.args.duration:.0f} s, {self.args.servers} servers "
              f"with {self.args.disks} data paths each, replica 2 (write 2, read 1), {TASK_ATTEMPTS} task "
              f"attempts; schedule ({len(self.schedule)} faults):", flush=True)
        for line in rep.schedule:
            print(f"[soak]   {line}", flush=True)
        # the oracle runs while the soak starts; results are compared once it is done
        self.oracle_app = self.spark.start(self.jobs, vanilla=True)
        self.cluster.start()
        print(f"[soak] cluster up: coordinators {self.cluster.quorum}; servers "
              f"{[s.grpc_port for s in self.cluster.servers]}", flush=True)
        t0 = time.monotonic()
        pending = list(self.schedule)
        rotation = 0
        while True:
            now = time.monotonic() - t0
            self.reap()
            # applications keep coming until the duration is over and every scheduled fault was injected
            # (on a slow machine faults slip: each waits for the cluster to recover from the one before)
            if (now < self.args.duration or pending) and not self.apps:
                jobs = [self.jobs[(rotation + k) % len(self.jobs)] for k in range(JOBS_PER_APP)]
                rotation += JOBS_PER_APP
                app = self.spark.start(jobs)
                self.apps.append(app)
                print(f"[soak] t+{now:6.1f}s app{app.index:03d} starts: {', '.join(jobs)}", flush=True)
            if pending and now >= pending[0].at:
                fault = pending.pop(0)
                if self.inject(fault, now) == "deferred":  # nothing to flip yet: once more, a gap later
                    pending.append(Fault(round(now + self.args.fault_gap, 1), fault.kind, fault.target, fault.hold,
                                         fault.salt + 1))
                    pending.sort(key=lambda x: x.at)
                continue
            if now >= self.args.duration and not pending and not self.apps:
                break
            time.sleep(0.2)
        for p in self.side:
            kill_group(p)
        if self.oracle_app is not None:
            self.oracle_wait(self.oracle_app)
        self.integrity()
        return rep

    def oracle_wait(self, app: App) -> None:
        try:
            app.proc.wait(max(1.0, app.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        kill_group(app.proc)
        self.oracle_app = None
        res = self.result(app)
        for name in self.jobs:
            j = res.get("jobs", {}).get(name, {})
            bad = [k for k, v in j.get("checks", {}).items() if not v[0]]
            if "digest" not in j or bad or "error" in j:
                self.report.oracle_problem += f"{name}: {j.get('error', bad or 'no result')}\n"
            else:
                self.oracle[name] = j
        if self.report.oracle_problem:
            raise RuntimeError(f"the sort-shuffle oracle failed:\n{self.report.oracle_problem}"
                               f"{tail(app.run_dir / 'driver.log')}")
        print(f"[soak] oracle (sort shuffle) done: {len(self.oracle)} jobs", flush=True)
        self.compare()

    def compare(self) -> None:
        """Each finished job against the oracle's result of the same job (once the oracle is done)."""
        if not self.oracle:
            return
        for tag, name, j in self.to_compare:
            bad = [k for k, v in j.get("checks", {}).items() if not v[0]]
            want = self.oracle[name]
            if bad or j.get("digest") != want["digest"] or j.get("rows") != want["rows"]:
                self.report.results_differ.append(
                    f"{tag}: checks {bad}, digest {j.get('digest')} vs {want['digest']}")
        self.to_compare.clear()

    @staticmethod
    def result(app: App) -> dict:
        try:
            return json.loads((app.run_dir / "result.json").read_text())
        except (OSError, ValueError):
            return {}

    def reap(self) -> None:
        if self.oracle_app is not None and self.oracle_app.proc.poll() is not None:
            self.oracle_wait(self.oracle_app)
        for app in list(self.apps):
            res = self.result(app)
            if res.get("app_id"):
                self.live_app_ids.add(res["app_id"])
            if app.proc.poll() is None and time.monotonic() < app.deadline:
                continue
            kill_group(app.proc)
            self.apps.remove(app)
            res = self.result(app)
            self.live_app_ids.discard(res.get("app_id", ""))
            rep = self.report
            rep.apps_run += 1
            for name in app.jobs:
                rep.jobs_run += 1
                j = res.get("jobs", {}).get(name)
                tag = f"app{app.index:03d}/{name}"
                if not j or "error" in j:
                    why = (j or {}).get("error", f"no result (exit {app.proc.returncode})")
                    rep.jobs_failed.append(f"{tag}: {failure_cause(why)}")
                    rep.failure_details[tag] = why.split("--- traceback ---")[0].strip()[:6000]
                    continue
                self.to_compare.append((tag, name, j))
            self.compare()
            rc = stage_recomputes(app.run_dir / "events")
            rep.stage_retries += rc["stage_retries"]
            rep.fetch_failed_tasks += rc["fetch_failed_tasks"]
            rep.failed_tasks += rc["failed_tasks"]
            print(f"[soak] app{app.index:03d} ended (exit {app.proc.returncode}): "
                  f"{sum(1 for n in app.jobs if 'digest' in res.get('jobs', {}).get(n, {}))}/{len(app.jobs)} jobs ok, "
                  f"{rc['stage_retries']} stage retries, {rc['failed_tasks'] + rc['fetch_failed_tasks']} failed tasks",
                  flush=True)

    # --------------------------------------------------------------------- faults
    def inject(self, f: Fault, now: float) -> str | None:
        """Inject ``f``, undo it, wait for the recovery; "deferred" when a first bit_flip found nothing to flip."""
        rng = random.Random(f.salt)
        c = self.cluster
        entry = {"at": round(now, 1), "planned": f.at, "kind": f.kind, "target": f.target}
        print(f"[soak] t+{now:6.1f}s fault {f.kind} on "
              f"{'coordinator' if f.kind.startswith('coordinator') else 'server'}{f.target + 1}", flush=True)
        undo = time.monotonic()  # when the fault was undone (set again below): recovery counts from there
        try:
            if f.kind in ("server_sigkill", "server_sigterm"):
                s = c.servers[f.target]
                before = metrics(s.http)
                entry["memory_used_at_stop"] = before.get("riffle_memory_used_bytes", 0)
                at_risk = memory_of_reported_shuffles(s.http)
                entry["live_apps"] = len(self.live_app_ids)
                sig = signal.SIGKILL if f.kind == "server_sigkill" else signal.SIGTERM
                s.signal(sig)
                if not s.wait(30):
                    s.signal(signal.SIGKILL)
                    s.wait(10)
                entry["exit"] = s.proc.returncode if s.proc else None
                self.hold(f.hold)
                undo = time.monotonic()
                s.start()
                after = metrics(s.http)
                lost = after.get("riffle_recovery_lost_blocks_total", 0)
                entry.update(recovered_apps=after.get("riffle_recovery_apps", 0), lost_blocks_reported=lost)
                if sig == signal.SIGKILL:
                    # Blocks the killed server held only in memory are gone. Those of shuffles whose writers had
                    # reported block ids (at_risk) must come back as lost blocks of their app after the restart;
                    # blocks never reported are unknown to any server (their writers' tasks fail or retry).
                    lost_by_app = lost_blocks_by_app(s.http)
                    unreported = sorted(a for a in at_risk if lost_by_app.get(a, 0) <= 0)
                    self.report.losses.append({"fault": f"{f.kind}@server{f.target + 1}",
                                               "memory_bytes_at_kill": entry["memory_used_at_stop"],
                                               "reported_shuffle_memory_at_kill": at_risk,
                                               "lost_blocks_reported": lost, "lost_by_app": lost_by_app,
                                               "apps_without_report": unreported, "reported": not unreported})
            elif f.kind == "disk_eio":
                fd = c.fault_dirs[f.target]
                times = rng.randint(2, 6)
                disk = c.data[f.target][rng.randrange(len(c.data[f.target]))]
                entry["disk"] = disk.name
                for op in ("append_batch", "append_meta", "read_index", "read_data"):
                    (fd / f"{time.time_ns()}-{op}.cmd").write_text(
                        json.dumps({"op": op, "errno": errno.EIO, "times": times, "disk": str(disk)}))
                entry["times_per_op"] = times
                try:
                    self.hold(f.hold)
                    # armed until an operation hit it (the disk may be idle for a while), at most 30 s more
                    self.hold(30, until=lambda: bool(read_json(fd / "hits.json")))
                finally:
                    undo = time.monotonic()
                    (fd / f"{time.time_ns()}-heal.cmd").write_text(json.dumps({"heal": True}))
                self.hold(5, until=lambda: not list(fd.glob("*.cmd")))
                entry["hits"] = read_json(fd / "hits.json")
            elif f.kind == "disk_readonly":
                disk = c.data[f.target][rng.randrange(len(c.data[f.target]))]
                entry["disk"] = disk.name
                try:
                    c.remount(disk, "ro")
                    self.hold(f.hold)
                finally:
                    undo = time.monotonic()
                    c.remount(disk, "rw")
            elif f.kind == "disk_full":
                disk = c.data[f.target][rng.randrange(len(c.data[f.target]))]
                entry["disk"] = disk.name
                filler = disk / ".chaos-filler"
                try:
                    fill(filler)
                    entry["free_bytes"] = shutil.disk_usage(disk).free
                    self.hold(f.hold)
                finally:  # undone even when something above failed
                    undo = time.monotonic()
                    filler.unlink(missing_ok=True)
            elif f.kind == "bit_flip":
                # wait (at most 120 s) for a spilled data file of a running application on the target, or
                # on another server when the target has none
                servers = [f.target] + [i for i in range(len(c.servers)) if i != f.target]
                self.hold(120, until=lambda: any(self.spilled_files(i) for i in servers))
                server = next((i for i in servers if self.spilled_files(i)), f.target)
                entry["server"] = server + 1
                before = metrics(c.servers[server].http).get(CORRUPT_BLOCKS_METRIC, 0.0)
                entry.update(self.flip(server, rng))
                undo = time.monotonic()
                if not entry["flipped"] and f.salt not in self.deferred:
                    self.deferred.add(f.salt + 1)
                    print(f"[soak]          -> no spilled file of a running app: bit_flip deferred by "
                          f"{self.args.fault_gap:.0f} s", flush=True)
                    return "deferred"
                entry.update(self.await_detection(server, before, entry["flipped"]))
                self.report.bit_flips.append({**entry})
            elif f.kind == "coordinator_sigkill":
                co = c.coords[f.target]
                co.signal(signal.SIGKILL)
                co.wait(10)
                self.hold(f.hold)
                undo = time.monotonic()
                co.start()
            elif f.kind == "memory_pressure":
                out = self.root / f"pressure-{len(self.report.fault_log)}.json"
                targets = ",".join(f"127.0.0.1:{s.grpc_port}" for s in c.servers)
                env = {**os.environ, "PYTHONPATH": str(REPO)}
                with open(self.root / "pressure.log", "ab") as log:
                    p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_pressure", "--targets",
                                          targets, "--apps", str(self.args.pressure_apps), "--hold", str(f.hold),
                                          "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=log,
                                         start_new_session=True)
                self.side.append(p)
                try:
                    p.wait(f.hold + 60)
                except subprocess.TimeoutExpired:
                    kill_group(p)
                undo = time.monotonic()
                entry["pressure"] = read_json(out)
            c.wait_healthy(180)
            entry["recovery_s"] = round(time.monotonic() - undo, 1)
        except Exception as e:  # noqa: BLE001 - a fault the soak could not inject/undo is a failed target
            entry["error"] = repr(e)
            self.report.errors.append(f"{f.kind}: {e!r}")
        self.report.faults[f.kind] += 1
        self.report.fault_log.append(entry)
        if "recovery_s" in entry:
            self.report.recovery_s[f.kind] = max(self.report.recovery_s.get(f.kind, 0.0), entry["recovery_s"])
        print(f"[soak]          -> {json.dumps({k: v for k, v in entry.items() if k not in ('at', 'kind')})}",
              flush=True)

    def hold(self, seconds: float, until=None) -> None:
        """Wait ``seconds`` (or until ``until()`` is true), reaping finished applications meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not (until and until()):
            self.reap()
            time.sleep(0.2)

    def spilled_files(self, server: int) -> list[tuple[int, str]]:
        """(size, path) of the non-empty spilled data files of running applications on ``server`` (every
        data path)."""
        files = []
        for data in self.cluster.data[server]:
            for dirpath, _dirs, names in os.walk(data):
                app = Path(dirpath).relative_to(data).parts[:1]
                for n in names:
                    p = Path(dirpath) / n
                    if n.startswith("partition-") and n.endswith(".data") and app and any(
                            app[0].startswith(a) for a in self.live_app_ids):
                        with contextlib.suppress(OSError):
                            if p.stat().st_size > 0:
                                files.append((p.stat().st_size, str(p)))
        return sorted(files)

    def flip(self, server: int, rng: random.Random) -> dict:
        """Flip one bit in each of up to 3 spilled data files of running apps on ``server`` (the largest)."""
        root = self.cluster.servers[server].workdir
        files = self.spilled_files(server)[-3:]
        flipped = []
        for size, path in files:
            off = rng.randrange(size)
            with open(path, "r+b") as fh:
                fh.seek(off)
                b = fh.read(1)
                fh.seek(off)
                fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            flipped.append({"file": str(Path(path).relative_to(root)), "offset": off})
        return {"flipped": flipped, "candidates": len(files)}

    # --------------------------------------------------------------------- integrity accounting
    def await_detection(self, server: int, before: float, flipped: list[dict]) -> dict:
        """Wait (at most ``DETECT_TIMEOUT_S``) until the server's scrubbers count one corrupt block more than
        ``before`` per flipped file (faults run one at a time: no restart resets the counter meanwhile). A
        flipped file the server purged meanwhile (its app ended) can be served to nobody: not a miss."""
        http, data = self.cluster.servers[server].http, self.cluster.servers[server].workdir
        start = time.monotonic()
        found = 0.0
        while time.monotonic() - start < DETECT_TIMEOUT_S:
            found = metrics(http).get(CORRUPT_BLOCKS_METRIC, before) - before
            if found >= len(flipped):
                return {"detected": len(flipped), "detect_s": round(time.monotonic() - start, 1)}
            if not any((data / x["file"]).exists() for x in flipped):
                return {"detected": int(max(found, 0)), "purged_unread": True}
            time.sleep(0.5)  # a soak's polling period, not a test waiting on a condition
        return {"detected": int(max(found, 0))}

    def integrity(self) -> None:
        self.report.integrity = integrity_accounting([metrics(s.http) for s in self.cluster.servers],
                                                     self.report.bit_flips)


def integrity_accounting(server_metrics: list[dict[str, float]], bit_flips: list[dict]) -> dict:
    """Bit flips detected vs served: each bit_flip fault waited for its server's scrubber
    (``await_detection``); ``missed`` counts flipped blocks neither found nor purged with their app.
    ``measured`` is False while no server exports CORRUPT_BLOCKS_METRIC: then nothing is known about
    detection and the target is not passed. Reads refused (CORRUPT_READS_REFUSED_METRIC) are summed over
    the servers' current incarnations."""
    have = [m for m in server_metrics if CORRUPT_BLOCKS_METRIC in m]
    flips = sum(len(b.get("flipped", [])) for b in bit_flips)
    if not have:
        return {"measured": False, "flips": flips,
                "why": f"no server exports {CORRUPT_BLOCKS_METRIC} (block CRC checks not in this build)"}
    faults = [b for b in bit_flips if b.get("flipped")]
    detected = sum(b.get("detected", 0) for b in faults)
    purged = sum(len(b["flipped"]) - b.get("detected", 0) for b in faults if b.get("purged_unread"))
    missed = flips - detected - purged
    refused = sum(m.get(CORRUPT_READS_REFUSED_METRIC, 0) for m in have)
    return {"measured": True, "flips": flips, "detected": detected, "purged_before_scrub": purged,
            "missed": missed, "reads_refused": refused, "ok": missed == 0}


def failure_cause(error: str) -> str:
    """A failed job's error (``spark_job.error_text``: the exception lines first) in one line: the first
    line, and the deepest line naming the shuffle client (its RssException) or else the last 'Caused by'."""
    lines = [x.strip() for x in error.split("--- traceback ---")[0].splitlines() if x.strip()]
    if not lines:
        return "?"
    rss = [x for x in lines[1:] if "rss" in x.lower() or "uniffle" in x.lower() or "shuffle" in x.lower()]
    caused = [x for x in lines[1:] if x.startswith("Caused by:")]
    cause = (rss or caused or [""])[-1]
    return f"{lines[0]}" + (f" | {cause[:300]}" if cause else "")


def server_apps(http: str) -> list[dict]:
    try:
        apps = json.loads(http_text(http + "/apps"))
    except (OSError, ValueError):
        return []
    return apps if isinstance(apps, list) else []


def memory_of_reported_shuffles(http: str) -> dict[str, int]:
    """app -> bytes held in memory by its shuffles that have reported block ids (GET /apps)."""
    out: dict[str, int] = {}
    for app in server_apps(http):
        held = sum(int(sh.get("memory_bytes", 0)) for sh in app.get("shuffles", {}).values()
                   if sh.get("reported_block_ids", 0) > 0)
        if held > 0:
            out[app["app_id"]] = held
    return out


def lost_blocks_by_app(http: str) -> dict[str, int]:
    return {a["app_id"]: int(a.get("lost_blocks", 0)) for a in server_apps(http)}


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def fill(path: Path) -> None:
    """Write ``path`` until its file system is full (ENOSPC, also when it comes at close)."""
    chunk = b"\0" * (1 << 20)
    with contextlib.suppress(OSError), open(path, "ab", buffering=0) as f:
        while f.write(chunk):
            pass


# ============================================================================ report

def verdict(rep: Report) -> tuple[int, list[str]]:
    lines, failed, unmeasured = [], False, False

    def target(name: str, ok: bool | None, detail: str) -> None:
        nonlocal failed, unmeasured
        mark = "NOT MEASURED" if ok is None else ("ok" if ok else "FAILED")
        failed |= ok is False
        unmeasured |= ok is None
        lines.append(f"  target {name:<28} {mark:<12} {detail}")

    target("jobs ran", rep.jobs_run > 0, f"{rep.jobs_run} jobs")
    target("0 failed jobs", not rep.jobs_failed, f"{len(rep.jobs_failed)} failed")
    target("0 differing results", not rep.results_differ, f"{len(rep.results_differ)} differ")
    target("every loss reported", all(x["reported"] for x in rep.losses),
           f"{sum(1 for x in rep.losses if not x['reported'])} unreported of {len(rep.losses)} kills")
    target("faults injected and undone", not rep.errors and sum(rep.faults.values()) > 0,
           f"{sum(rep.faults.values())} faults, {len(rep.errors)} errors")
    flips = sum(len(b.get("flipped", [])) for b in rep.bit_flips)
    if rep.faults.get("bit_flip"):
        target("bit flips injected", flips > 0, f"{flips} bits flipped in {rep.faults['bit_flip']} bit_flip faults")
    integ = rep.integrity
    if not integ.get("measured"):
        target("bit flips detected, none served", None, integ.get("why", ""))
    else:
        target("bit flips detected, none served", integ["ok"] and not rep.results_differ,
               f"{integ['flips']} flipped, {integ['detected']} found by the scrubbers, "
               f"{integ['purged_before_scrub']} purged with their app first, {integ['missed']} missed, "
               f"{integ['reads_refused']:.0f} reads refused")
    return (EXIT_TARGET_FAILED if failed else EXIT_NOT_MEASURED if unmeasured else 0), lines


def print_report(rep: Report) -> int:
    code, lines = verdict(rep)
    flips = sum(len(b.get("flipped", [])) for b in rep.bit_flips)
    lost_blocks = sum(x["lost_blocks_reported"] for x in rep.losses)
    print("\n[soak] ===== chaos soak figures =====")
    print(f"seed: {rep.seed}  duration: {rep.duration:.0f} s")
    print(f"applications run: {rep.apps_run}")
    print(f"jobs run: {rep.jobs_run}")
    print(f"faults injected: {sum(rep.faults.values())} " + json.dumps(dict(sorted(rep.faults.items()))))
    print(f"jobs failed: {len(rep.jobs_failed)}")
    for x in rep.jobs_failed:
        print(f"    {x[:600]}")
        for line in rep.failure_details.get(x.split(":", 1)[0], "").splitlines()[1:8]:
            print(f"        {line[:300]}")
    print(f"results differing from sort shuffle: {len(rep.results_differ)}")
    for x in rep.results_differ:
        print(f"    {x[:300]}")
    print(f"stages recomputed: {rep.stage_retries} (FetchFailed tasks {rep.fetch_failed_tasks}, "
          f"other failed task attempts {rep.failed_tasks})")
    print(f"blocks lost (reported by restarted servers): {lost_blocks:.0f} over {len(rep.losses)} SIGKILLs; "
          f"unreported losses: {sum(1 for x in rep.losses if not x['reported'])}")
    print(f"bytes flipped: {flips} in {len(rep.bit_flips)} bit_flip faults "
          f"({sum(1 for b in rep.bit_flips if not b.get('flipped'))} found no spilled file of a live app)")
    print(f"integrity: {json.dumps(rep.integrity)}")
    worst = max(rep.recovery_s.items(), key=lambda kv: kv[1], default=("-", 0.0))
    print(f"worst recovery time: {worst[1]:.1f} s ({worst[0]}); by kind " + json.dumps(rep.recovery_s))
    for x in rep.errors:
        print(f"fault error: {x}")
    print("\n".join(lines))
    print(f"[soak] exit {code}")
    return code


# ============================================================================ main

def prerequisite_problem() -> str | None:
    if os.geteuid() != 0:
        return "the soak needs root (tmpfs mounts per server data path, read-only remounts)"
    from tests.e2e.conftest import prerequisite_problem as spark_problem

    return spark_problem()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_server":
        return server_main(argv[1:])
    if argv and argv[0] == "_pressure":
        return pressure_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of Spark applications (default 300)")
    ap.add_argument("--seed", type=int, default=1, help="draws the fault schedule (default 1)")
    ap.add_argument("--servers", type=int, default=3, help="shuffle servers (default 3, at least 3)")
    ap.add_argument("--fault-gap", type=float, default=20.0, help="mean seconds between faults (default 20)")
    ap.add_argument("--faults", type=lambda s: s.split(","), default=list(FAULT_KINDS),
                    help=f"comma-separated fault kinds (default all: {','.join(FAULT_KINDS)})")
    ap.add_argument("--jobs", type=lambda s: s.split(","), default=list(DEFAULT_JOBS),
                    help=f"e2e jobs in rotation, {JOBS_PER_APP} per application (default {','.join(DEFAULT_JOBS)})")
    ap.add_argument("--job-timeout", type=float, default=240.0, help="seconds a job may take (default 240)")
    ap.add_argument("--server-memory", default="4M",
                    help="each server's memory_store capacity (default 4M; spills start at a quarter of it, "
                         "so the jobs' shuffles reach the disks)")
    ap.add_argument("--disk-size", default="256m", help="size of each tmpfs data path (default 256m)")
    ap.add_argument("--disks", type=int, default=2,
                    help="data paths per server, each a tmpfs of its own (default 2; a disk fault hits one)")
    ap.add_argument("--pressure-apps", type=int, default=40, help="apps per memory_pressure fault (default 40)")
    ap.add_argument("--workdir", help="keep everything here (default: a temp dir, removed at the end)")
    ap.add_argument("--json", help="write the figures here as JSON")
    ap.add_argument("--print-schedule", action="store_true", help="print the schedule and exit")
    a = ap.parse_args(argv)
    unknown = set(a.faults) - set(FAULT_KINDS)
    if unknown or a.servers < 3 or a.disks < 1:
        ap.error(f"unknown fault kinds {sorted(unknown)}" if unknown else
                 "--servers must be at least 3" if a.servers < 3 else "--disks must be at least 1")
    from tests.e2e.spark_job import CORE

    if set(a.jobs) - set(CORE):
        ap.error(f"unknown jobs {sorted(set(a.jobs) - set(CORE))}; the e2e job set: {sorted(CORE)}")
    if a.print_schedule:
        for f in draw_schedule(a.seed, a.duration, a.servers, a.fault_gap, tuple(a.faults)):
            print(f.describe())
        return 0
    problem = prerequisite_problem()
    if problem:
        print(f"chaos_soak: prerequisites missing: {problem}", file=sys.stderr)
        return EXIT_PREREQ
    from tests.e2e.conftest import client_jar

    jar = client_jar()
    assert jar is not None
    root = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="riffle-soak-"))
    root.mkdir(parents=True, exist_ok=True)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    soak = None
    code = EXIT_TARGET_FAILED
    try:
        soak = Soak(a, root, jar[1])
        rep = soak.run()
        code = print_report(rep)
        if a.json:
            Path(a.json).write_text(json.dumps({**rep.__dict__, "exit": code}, indent=1, default=str))
    except KeyboardInterrupt as e:
        print(f"[soak] interrupted: {e}; the figures so far:", file=sys.stderr)
        if soak is not None:
            with contextlib.suppress(Exception):
                print_report(soak.report)
        code = 130
    except Exception as e:  # noqa: BLE001 - report, clean up, exit 1
        print(f"[soak] failed: {e!r}", file=sys.stderr)
        if soak is not None:
            for s in [*soak.cluster.servers, *soak.cluster.coords]:
                print(f"--- {s.name}:\n{tail(s.log, 1500)}", file=sys.stderr)
        code = EXIT_TARGET_FAILED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # cleanup is not interrupted
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if soak is not None:
            for app in soak.apps:
                kill_group(app.proc)
            for p in soak.side:
                kill_group(p)
            soak.cluster.stop()
        if not a.workdir:
            shutil.rmtree(root, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return code


if __name__ == "__main__":
    sys.exit(main())
