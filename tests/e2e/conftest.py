"""Spark end-to-end harness: real pyspark + the stock Apache Uniffle client jar against our daemons.

Session fixtures
    rss_cluster   one riffle-coordinator + two riffle-server daemons (subprocesses, port 0, own config and
                  data dir each); ready when the coordinator lists both servers ACTIVE; SIGTERM → SIGKILL
                  and temp-dir removal on teardown.
    spark_runs    runs a *group* of jobs as one Spark application in its own Python subprocess
                  (tests/e2e/spark_job.py), once on Spark's sort shuffle (the oracle) and once on
                  RssShuffleManager; results are memoised per (group, mode) for the session.
    tpcds         TPC-DS 'tiny' (sf=0.01) parquet files + the 99 query texts, generated with DuckDB's
                  dsdgen into the cache folder.

Prerequisites (else every test here is skipped): java on PATH, pyspark 3.5.x importable, the client jar in
the cache folder (scripts/e2e_setup.sh puts it there). Env flags: see tests/e2e/README.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parents[1]
CACHE = Path(os.environ.get("RIFFLE_E2E_CACHE", REPO / ".cache" / "spark-jars"))
JOB_SCRIPT = E2E_DIR / "spark_job.py"
LOG4J = E2E_DIR / "log4j2.properties"

SERVER_MEMORY = os.environ.get("RIFFLE_E2E_SERVER_MEMORY", "64M")
NUM_SERVERS = 2
# worker processes per riffle-server host (runtime_config.worker_number, docs/workers.md): with 2, the
# NUM_SERVERS servers of a cluster are the workers of one host (each with SERVER_MEMORY)
SERVER_WORKERS = int(os.environ.get("RIFFLE_E2E_SERVER_WORKERS", "1"))
KEEP = os.environ.get("RIFFLE_E2E_KEEP") == "1"
TIME_SCALE = float(os.environ.get("RIFFLE_E2E_TIME_SCALE", "1"))
RSS_MANAGER = "org.apache.spark.shuffle.RssShuffleManager"
# GRPC_NETTY moves the data over the servers' Netty port
CLIENT_TYPE = os.environ.get("RIFFLE_E2E_CLIENT_TYPE", "GRPC")
# the system property io.netty.noUnsafe as the shaded client jar reads it (checked with javap)
SHADED_NETTY_NO_UNSAFE = "org.apache.uniffle.shaded.io.netty.noUnsafe"
# run mode -> spark.rss.client.type ("vanilla" is Spark's own sort shuffle)
CLIENT_TYPES = {"rss": CLIENT_TYPE, "rss_netty": "GRPC_NETTY", "rss_hdfs": CLIENT_TYPE,
                "rss_workers": CLIENT_TYPE}  # rss_workers: tests/e2e/test_spark_workers.py, a 2-worker host
# the HDFS tier (tests/e2e/test_spark_hdfs.py): servers with store_type MEMORY_LOCALFILE_HDFS on which a
# partition is huge after 2 MiB and a huge partition's batches above 256 KiB go to HDFS
HDFS_SERVER_SECTIONS = {
    "hybrid_store": 'huge_partition_memory_spill_to_hdfs_threshold_size = "256K"\n',
    "app_config": 'partition_limit_enable = true\npartition_limit_threshold = "2M"\n'
                  'huge_partition_memory_single_buffer_max_spill_size = "512K"\n',
}

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def tail(path: Path | str | None, lines: int = 60) -> str:
    if not path or not Path(path).exists():
        return f"<{path}: missing>"
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 256 * 1024))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


# ============================================================================ prerequisites / collection


def client_jar() -> tuple[str, Path] | None:
    vfile = CACHE / "uniffle-client.version"
    if not vfile.exists():
        return None
    version = vfile.read_text().strip()
    jar = CACHE / f"rss-client-spark3-shaded-{version}.jar"
    return (version, jar) if jar.is_file() else None


def prerequisite_problem() -> str | None:
    if shutil.which("java") is None:
        return "java is not on PATH"
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (run scripts/e2e_setup.sh)"
    from importlib import metadata

    v = metadata.version("pyspark")
    if not v.startswith("3.5."):
        return f"pyspark {v} installed; the Uniffle Spark 3 client needs pyspark 3.5.x (run scripts/e2e_setup.sh)"
    if client_jar() is None:
        return f"no Uniffle client jar in {CACHE} (run scripts/e2e_setup.sh)"
    return None


def _in_e2e(item) -> bool:
    return E2E_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config, items):
    problem = None
    checked = False
    for item in items:
        if not _in_e2e(item):
            continue
        item.add_marker(pytest.mark.e2e)
        if not checked:
            problem, checked = prerequisite_problem(), True
        if problem:
            item.add_marker(pytest.mark.skip(reason=f"e2e prerequisites missing: {problem}"))


# ============================================================================ log tails on failure

_LOGS_KEY = pytest.StashKey[list]()
_ACTIVE_CLUSTER: list = []  # the running Cluster, if any (for failure reports)


@pytest.fixture
def attach_log(request):
    """attach_log(title, path): show the tail of that file if this test fails."""
    logs = request.node.stash.setdefault(_LOGS_KEY, [])
    return lambda title, path: logs.append((title, path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed or not _in_e2e(item):
        return
    files = list(item.stash.get(_LOGS_KEY, []))
    for cluster in _ACTIVE_CLUSTER:
        files += cluster.log_files()
    seen = set()
    for title, path in files:
        text = tail(path, 40)
        if text in seen:  # a daemon's stdout often repeats its log file
            continue
        seen.add(text)
        rep.sections.append((f"tail of {title} ({path})", text))


# ============================================================================ daemons


def http_get(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def http_json(url: str, timeout: float = 3.0):
    return json.loads(http_get(url, timeout))


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a valid TOML basic string


@dataclass
class Daemon:
    name: str
    module: str
    workdir: Path
    config: Path
    log_path: Path  # the daemon's own [log] file
    stdout_path: Path
    proc: subprocess.Popen | None = None
    grpc_port: int = 0
    http_port: int = 0

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, ready_timeout: float = 60.0) -> None:
        port_file = self.workdir / "ports.json"
        cmd = [sys.executable, "-m", self.module, "--config", str(self.config), "--port-file", str(port_file)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.stdout_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout
        while True:
            if port_file.exists():
                with contextlib.suppress(ValueError, OSError):
                    info = json.loads(port_file.read_text())
                    self.grpc_port, self.http_port = int(info["grpc_port"]), int(info["http_port"])
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before writing its port file "
                    f"({' '.join(cmd)})\n{self.tails()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} wrote no port file within {ready_timeout:.0f} s\n{self.tails()}"
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)

    def tails(self, lines: int = 40) -> str:
        out, log = tail(self.stdout_path, lines), tail(self.log_path, lines)
        text = f"--- {self.name} stdout/stderr ({self.stdout_path}):\n{out}\n"
        return text if out == log else text + f"--- {self.name} log ({self.log_path}):\n{log}\n"


@dataclass
class Cluster:
    root: Path
    coordinator: Daemon
    servers: list[Daemon] = field(default_factory=list)
    memory_capacity: int = 0
    registered_servers: int = 0  # servers the coordinator must list: the workers of every host

    @property
    def quorum(self) -> str:
        return f"127.0.0.1:{self.coordinator.grpc_port}"

    @property
    def server_http(self) -> list[str]:
        return [s.http for s in self.servers]

    def log_files(self) -> list[tuple[str, Path]]:
        out = []
        for d in [self.coordinator, *self.servers]:
            out += [(f"{d.name} log", d.log_path), (f"{d.name} stdout", d.stdout_path)]
        return out

    def tails(self) -> str:
        return "\n".join(d.tails() for d in [self.coordinator, *self.servers])

    def active_servers(self) -> list[dict]:
        servers = http_json(self.coordinator.http + "/api/servers")
        if isinstance(servers, dict):
            servers = servers.get("servers", servers.get("data", []))
        return [s for s in servers if str(s.get("status", "")).upper() == "ACTIVE"]

    def wait_servers_active(self, timeout: float = 60.0) -> None:
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            for d in [self.coordinator, *self.servers]:
                if d.proc.poll() is not None:
                    raise RuntimeError(
                        f"{d.name} exited ({d.proc.returncode}) during start-up\n{self.tails()}"
                    )
            try:
                active = self.active_servers()
                last = active
                blob = json.dumps(active)
                wanted = self.registered_servers or len(self.servers)
                if len(active) >= wanted and all(str(s.grpc_port) in blob for s in self.servers):
                    return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = repr(e)
            time.sleep(0.25)
        raise RuntimeError(
            f"coordinator did not list {self.registered_servers or len(self.servers)} ACTIVE servers within {timeout:.0f} s; "
            f"last /api/servers: {last}\n{self.tails()}"
        )

    def stop(self) -> None:
        for d in [*self.servers, self.coordinator]:
            with contextlib.suppress(Exception):
                d.stop()


def _coordinator_toml(d: Daemon, remote_storage: str = "") -> str:
    remote = f"\n[remote_storage]\npath = {toml_str(remote_storage)}\n" if remote_storage else ""
    # a pushed rss.storage.type overrides the application's own: the HDFS cluster pushes none, so an app's
    # spark.rss.storage.type=MEMORY_LOCALFILE_HDFS is all it takes (the path comes from fetchRemoteStorage)
    storage = "" if remote_storage else '"rss.storage.type" = "MEMORY_LOCALFILE"\n'
    return f"""\
grpc_port = 0
http_port = 0

[server]
heartbeat_timeout_sec = 10

[app]
heartbeat_timeout_sec = 60

[client_conf]
{storage}{remote}
[log]
path = {toml_str(str(d.log_path))}
level = "INFO"
"""


def _server_toml(d: Daemon, quorum: str, data_dir: Path, hdfs_remote: str = "",
                 sections: dict[str, str] | None = None, workers: int = 1) -> str:
    """``hdfs_remote``: the HDFS tier on, with that base allowed (the coordinator hands clients the same path).
    ``sections``: more lines for ``[hybrid_store]`` / ``[app_config]`` (section name -> TOML lines).
    ``workers``: a host of that many worker servers, each with ``SERVER_MEMORY``."""
    extra = dict(HDFS_SERVER_SECTIONS if hdfs_remote else {})
    for name, lines in (sections or {}).items():
        extra[name] = extra.get(name, "") + lines
    hdfs_store = f"\n[[hdfs_store.remote_storage]]\npath = {toml_str(hdfs_remote)}\n" if hdfs_remote else ""
    return f"""\
store_type = "{'MEMORY_LOCALFILE_HDFS' if hdfs_remote else 'MEMORY_LOCALFILE'}"
grpc_port = 0
urpc_port = 0
http_port = 0
coordinator_quorum = [{toml_str(quorum)}]
heartbeat_interval_seconds = 1

[memory_store]
capacity = {parse_size(SERVER_MEMORY) * workers}
buffer_ticket_timeout_sec = 30

[runtime_config]
worker_number = {workers}

[localfile_store]
data_paths = [{toml_str(str(data_dir))}]

[hybrid_store]
memory_spill_high_watermark = 0.8
memory_spill_low_watermark = 0.2
{extra.get("hybrid_store", "")}
[app_config]
app_heartbeat_timeout_min = 5
{extra.get("app_config", "")}{hdfs_store}
[log]
path = {toml_str(str(d.log_path))}
level = "INFO"
"""


def _daemon(root: Path, name: str, module: str) -> Daemon:
    wd = root / name
    wd.mkdir(parents=True)
    return Daemon(
        name=name,
        module=module,
        workdir=wd,
        config=wd / f"{name}.toml",
        log_path=wd / f"{name}.log",
        stdout_path=wd / "stdout.log",
    )


def start_cluster(root: Path, hdfs_remote: str = "", server_sections: dict[str, str] | None = None,
                  workers: int = SERVER_WORKERS, servers: int = NUM_SERVERS,
                  edit_server_toml: Callable[[str], str] | None = None) -> Cluster:
    """``hdfs_remote``: the HDFS tier on (servers MEMORY_LOCALFILE_HDFS, the coordinator's remote storage);
    ``server_sections``: more ``[hybrid_store]`` / ``[app_config]`` lines for every server.
    ``workers`` > 1: the ``servers`` servers are the workers of ``servers / workers`` hosts.
    ``edit_server_toml``: applied to each server's config text before it starts."""
    coord = _daemon(root, "coordinator", "riffle_actors.coordinator")
    coord.config.write_text(_coordinator_toml(coord, hdfs_remote))
    hosts = -(-servers // workers)
    cluster = Cluster(root=root, coordinator=coord, memory_capacity=parse_size(SERVER_MEMORY),
                      registered_servers=hosts * workers)
    try:
        coord.start()
        for i in range(hosts):
            s = _daemon(root, f"server{i + 1}", "riffle_actors.server")
            data = s.workdir / "d1"
            data.mkdir()
            text = _server_toml(s, cluster.quorum, data, hdfs_remote=hdfs_remote, sections=server_sections,
                                workers=workers)
            s.config.write_text(edit_server_toml(text) if edit_server_toml else text)
            cluster.servers.append(s)
            s.start()
        cluster.wait_servers_active()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def e2e_root():
    root = Path(tempfile.mkdtemp(prefix="riffle-e2e-"))
    yield root
    if KEEP:
        print(f"\n[e2e] RIFFLE_E2E_KEEP=1: kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


_HANDLER_OWNER_PID = os.getpid()


def _sigterm_as_interrupt(signum, frame):
    if os.getpid() != _HANDLER_OWNER_PID:
        # a process forked from pytest (pyroute2's netns helper, for one) inherits this handler: it
        # must die of the signal as it would by default, not unwind a copy of the pytest session
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def rss_cluster(e2e_root):
    # the daemons run in their own sessions: make a SIGTERM to pytest unwind through this fixture's teardown
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    t = time.monotonic()
    try:
        cluster = start_cluster(e2e_root / "cluster")
        _ACTIVE_CLUSTER.append(cluster)
        print(
            f"\n[e2e] cluster ready in {time.monotonic() - t:.1f} s: coordinator grpc {cluster.quorum} "
            f"http {cluster.coordinator.http}; servers {cluster.server_http}"
        )
        try:
            yield cluster
        finally:
            _ACTIVE_CLUSTER.remove(cluster)
            cluster.stop()
    finally:
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


# ============================================================================ Spark runs


def base_conf(local_dir: Path) -> dict[str, str]:
    return {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": "8",
        "spark.default.parallelism": "4",
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.local.dir": str(local_dir),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J}",
    }


def rss_conf(jar: Path, cluster: Cluster, client_type: str = CLIENT_TYPE) -> dict[str, str]:
    return {
        "spark.shuffle.manager": RSS_MANAGER,  # never DelegationRssShuffleManager: it falls back silently
        "spark.driver.extraClassPath": str(jar),
        "spark.executor.extraClassPath": str(jar),
        "spark.rss.coordinator.quorum": cluster.quorum,
        "spark.rss.storage.type": "MEMORY_LOCALFILE",
        "spark.rss.client.type": client_type,
        "spark.rss.data.replica": "1",
        "spark.rss.data.replica.write": "1",
        "spark.rss.data.replica.read": "1",
        "spark.rss.client.assignment.shuffle.nodes.max": str(NUM_SERVERS),
        # fail fast instead of the production back-offs (retry.max x interval must stay <= send.check.timeout)
        "spark.rss.client.retry.max": "5",
        "spark.rss.client.retry.interval.max": "1000",
        "spark.rss.client.send.check.timeout.ms": "60000",
        "spark.rss.client.send.check.interval.ms": "500",
        "spark.rss.client.assignment.retry.times": "1",
        "spark.rss.client.assignment.retry.interval": "1000",
        "spark.rss.client.rpc.timeout.ms": "30000",
        "spark.rss.client.unregister.request.timeout.sec": "5",
        "spark.rss.heartbeat.interval": "2000",
        # many small blocks and several read round trips on small data
        "spark.rss.writer.buffer.size": "64k",
        "spark.rss.writer.buffer.spill.size": "1m",
        "spark.rss.writer.serializer.buffer.size": "32k",
        "spark.rss.writer.buffer.segment.size": "16k",
        "spark.rss.client.read.buffer.size": "256k",
        "spark.rss.index.read.limit": "100",
    }


# group → (wall-clock limit of the whole application, per-job cancel limit), seconds
GROUP_LIMITS = {"core": (900, 240), "workers": (900, 240), "spill": (600, 420), "hdfs": (600, 300), "split": (600, 300), "tpcds": (900, 180), "tpcds_all": (2400, 180)}


@dataclass
class SparkRun:
    group: str
    mode: str  # "vanilla" | "rss" | "rss_netty" (CLIENT_TYPES)
    run_dir: Path
    driver_log: Path
    result: dict
    wall_s: float
    returncode: int | None
    timed_out: bool
    started_epoch: float = 0.0
    ended_epoch: float = 0.0

    def job(self, name: str) -> dict:
        return self.result.get("jobs", {}).get(name, {})

    def problem(self, name: str) -> str | None:
        """Why this job has no usable result (None if it has one)."""
        if "startup_error" in self.result:
            return f"{self.mode} Spark application failed to start:\n{self.result['startup_error'][-3000:]}"
        j = self.job(name)
        if not j:
            why = "timed out" if self.timed_out else f"exit code {self.returncode}"
            return f"{self.mode} run of group {self.group!r} has no result for {name!r} ({why})"
        if "error" in j:
            return (
                f"{self.mode} job {name!r} failed{' (cancelled: timeout)' if j.get('timed_out') else ''}:\n"
                f"{j['error'][:5000]}"
            )
        return None


class SparkRunner:
    def __init__(self, root: Path, jar: tuple[str, Path]):
        self.root = root
        self.client_version, self.jar = jar
        self.cache: dict[tuple[str, str], SparkRun] = {}
        self.timings: list[tuple[str, str, float]] = []

    def get(
        self, group: str, mode: str, jobs: list[str], params: dict, cluster: Cluster | None = None
    ) -> SparkRun:
        return self.get_many(group, [mode], jobs, params, cluster)[0]

    def get_many(
        self, group: str, modes: list[str], jobs: list[str], params: dict, cluster: Cluster | None = None
    ) -> list[SparkRun]:
        """The runs of ``group`` in each mode; those not run yet run at the same time (one process each)."""
        todo = [m for m in modes if (group, m) not in self.cache]
        started = []
        try:
            for mode in todo:
                started.append(self._start(group, mode, jobs, params, cluster))
        finally:  # also on a failed start or KeyboardInterrupt: every started process is waited for or killed
            pending = list(started)
            try:
                while pending:
                    run = pending.pop(0)
                    self.cache[(group, run["mode"])] = self._finish(run)
            finally:
                for run in pending:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(run["proc"].pid, signal.SIGKILL)
                    run["proc"].wait(10)
        return [self.cache[(group, m)] for m in modes]

    def _start(self, group, mode, jobs, params, cluster) -> dict:
        run_dir = self.root / f"{group}-{mode}"
        local_dir = run_dir / "spark-local"
        local_dir.mkdir(parents=True)
        conf = base_conf(local_dir)
        if mode != "vanilla":
            conf.update(rss_conf(self.jar, cluster, CLIENT_TYPES[mode]))
            if mode == "rss_hdfs":  # nothing else: the remote storage path comes from the coordinator
                conf["spark.rss.storage.type"] = "MEMORY_LOCALFILE_HDFS"
            if CLIENT_TYPES[mode] == "GRPC_NETTY":
                # Uniffle 0.9/0.10 client bug on Java >= 9: its reader frees the direct ByteBuffer of every
                # Netty read response with Unsafe.invokeCleaner, which throws "duplicate or slice" for the
                # slices its frame decoder hands out (netty/netty#14567). Without Unsafe the shaded Netty
                # frees nothing by hand (GC does). Not needed with GRPC, which never reads through Netty.
                opt = f" -D{SHADED_NETTY_NO_UNSAFE}=true"
                conf["spark.driver.extraJavaOptions"] += opt
                conf["spark.executor.extraJavaOptions"] = conf.get("spark.executor.extraJavaOptions", "") + opt
        app_limit, job_limit = GROUP_LIMITS[group]
        spec = {
            "group": group,
            "jobs": jobs,
            "conf": conf,
            "out": str(run_dir / "result.json"),
            "job_timeout": job_limit * TIME_SCALE,
            "server_http": cluster.server_http if cluster else [],
            "coordinator_http": cluster.coordinator.http if cluster else None,
            "params": params,
        }
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")
        }
        env.update(
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            PYTHONUNBUFFERED="1",
        )
        driver_log = run_dir / "driver.log"
        t = time.monotonic()
        with open(driver_log, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(JOB_SCRIPT), "--spec", str(run_dir / "spec.json")],
                cwd=run_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return {"group": group, "mode": mode, "run_dir": run_dir, "driver_log": driver_log, "proc": proc,
                "t": t, "epoch": time.time(), "deadline": t + app_limit * TIME_SCALE}

    def _finish(self, run: dict) -> SparkRun:
        group, mode, run_dir, driver_log, proc, t = (run[k] for k in ("group", "mode", "run_dir", "driver_log",
                                                                      "proc", "t"))
        timed_out = False
        try:
            proc.wait(max(0.0, run["deadline"] - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also on KeyboardInterrupt / pytest-timeout: never leave a JVM behind
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        wall = time.monotonic() - t
        self.timings.append((group, mode, wall))
        try:
            result = json.loads((run_dir / "result.json").read_text())
        except (OSError, ValueError):
            result = {}
        print(
            f"\n[e2e] {group}/{mode}: {wall:.1f} s (exit {proc.returncode}{', TIMED OUT' if timed_out else ''})"
        )
        return SparkRun(group, mode, run_dir, driver_log, result, wall, proc.returncode, timed_out,
                        run["epoch"], time.time())


@pytest.fixture(scope="session")
def spark_runner(e2e_root):
    jar = client_jar()
    assert jar is not None, "client jar vanished"
    runner = SparkRunner(e2e_root / "spark", jar)
    (e2e_root / "spark").mkdir(exist_ok=True)
    _RUNNERS.append(runner)
    yield runner


_RUNNERS: list[SparkRunner] = []


def pytest_terminal_summary(terminalreporter):
    for runner in _RUNNERS:
        if not runner.timings:
            continue
        tr = terminalreporter
        tr.section(f"e2e Spark applications (Uniffle client {runner.client_version})")
        for g, m, w in runner.timings:
            run = runner.cache[(g, m)]
            startup = run.result.get("startup_s", "?")
            jobs = ", ".join(f"{n} {j.get('seconds', '?')}s" for n, j in run.result.get("jobs", {}).items())
            tr.write_line(f"{g:<10} {m:<8} {w:7.1f} s wall (SparkSession {startup} s): {jobs}")
        tr.write_line(f"total {sum(w for _, _, w in runner.timings):.1f} s")


# ============================================================================ TPC-DS data


TPCDS_SCALE = "0.01"  # 'tiny'


def _tpcds_extension() -> str:
    import duckdb_extension_tpcds

    found = sorted(
        (Path(duckdb_extension_tpcds.__file__).parent / "extensions").glob("*/tpcds.duckdb_extension")
    )
    if not found:
        raise FileNotFoundError("tpcds.duckdb_extension not found in duckdb_extension_tpcds")
    return str(found[-1])


@pytest.fixture(scope="session")
def tpcds() -> dict:
    """{"data": dir of <table>.parquet, "queries": {"q01": path, ...}} (generated once into the cache)."""
    root = CACHE / f"tpcds-sf{TPCDS_SCALE}"
    data, queries, done = root / "data", root / "queries", root / "COMPLETE"
    if not done.exists():
        try:
            import duckdb

            ext = _tpcds_extension()
        except ImportError as e:
            pytest.skip(f"TPC-DS tier needs duckdb + duckdb-extension-tpcds (scripts/e2e_setup.sh): {e}")
        shutil.rmtree(root, ignore_errors=True)
        data.mkdir(parents=True)
        queries.mkdir()
        con = duckdb.connect()
        con.execute(f"LOAD '{ext}'")
        con.execute(f"CALL dsdgen(sf={TPCDS_SCALE})")
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
            con.execute(f"COPY {table} TO '{data / (table + '.parquet')}' (FORMAT parquet)")
        for nr, text in con.execute("SELECT query_nr, query FROM tpcds_queries() ORDER BY 1").fetchall():
            (queries / f"q{nr:02d}.sql").write_text(text)
        con.close()
        done.write_text("ok\n")
    return {"data": str(data), "queries": {p.stem: str(p) for p in sorted(queries.glob("q*.sql"))}}


# ============================================================================ shared assertions

RECEIVED = "riffle_server_received_bytes_total"
READ = "riffle_server_read_bytes_total"
URPC_RPCS = "riffle_server_urpc_rpc_total"  # spark_job.riffle_metrics: rpc_total samples of urpc:* RPCs


def metric_delta(job: dict, name: str) -> float:
    """Growth of a riffle_* metric over one job, summed over the servers."""
    total = 0.0
    for before, after in zip(job.get("metrics_before", []), job.get("metrics_after", [])):
        assert "_error" not in after, f"GET /metrics failed after the job: {after['_error']}"
        total += after.get(name, 0.0) - before.get(name, 0.0)
    return total


def metric_names(job: dict) -> set[str]:
    return {k for m in job.get("metrics_after", []) for k in m if not k.startswith("_")}


def failed_checks(job: dict) -> dict:
    return {k: v[1] for k, v in job.get("checks", {}).items() if not v[0]}


def assert_oracle_ok(vanilla: SparkRun, job: str) -> dict:
    problem = vanilla.problem(job)
    assert problem is None, problem
    assert vanilla.result["shuffle_manager"] == "org.apache.spark.shuffle.sort.SortShuffleManager"
    j = vanilla.job(job)
    assert not failed_checks(j), f"oracle (sort shuffle) fails its own checks: {failed_checks(j)}"
    return j


_RSS_LOG_LINE = re.compile(
    r"RssShuffleManager: .*(RegisterShuffle with ShuffleId|Generate application id used in rss)"
)


def spark_shuffled(run: SparkRun, job: str, what: str = "write_bytes") -> int:
    """Shuffle bytes Spark itself counted for the job (write_bytes | read_bytes; -1 if unknown)."""
    s = run.job(job).get("spark_shuffle", {})
    return -1 if "_error" in s or not s else int(s[what])


def assert_rss_carried(
    rss: SparkRun, job: str, cluster: Cluster, min_received: float = 1, oracle: SparkRun | None = None
) -> dict:
    """The job ran on RssShuffleManager and its shuffle data went through our servers.

    With an oracle run given, a job that writes (reads) no shuffle bytes on sort shuffle either (e.g. a TPC-DS
    query whose filters leave nothing, so AQE drops the exchanges) needs no server writes (reads); its result
    is still compared.
    """
    problem = rss.problem(job)
    assert problem is None, problem
    res, j = rss.result, rss.job(job)
    assert res["shuffle_manager"] == RSS_MANAGER, f"Spark used {res['shuffle_manager']}"
    # 0.10 sets spark.rss.enabled=true in the manager; 0.9 only through RssShuffleDriverComponents (DataIo plugin)
    assert res["rss_enabled"] != "false", "spark.rss.enabled = false: the client fell back to sort shuffle"
    log = rss.driver_log.read_text(errors="replace")
    assert _RSS_LOG_LINE.search(log), "driver log shows no RssShuffleManager activity"
    assert j.get("vanilla_shuffle_files") == 0, (
        f"{j.get('vanilla_shuffle_files')} sort-shuffle files in spark.local.dir"
    )
    apps = j.get("coordinator_apps")
    assert isinstance(apps, list), f"GET /api/apps failed: {apps}"
    assert any(str(a).startswith(res["app_id"]) for a in apps), (
        f"coordinator /api/apps does not list {res['app_id']}_*: {apps}"
    )
    names = metric_names(j)
    assert RECEIVED in names and READ in names, f"servers' /metrics lack {RECEIVED}/{READ}: {sorted(names)}"

    def expected(what: str) -> bool:
        return oracle is None or spark_shuffled(oracle, job, what) != 0 or spark_shuffled(rss, job, what) != 0

    received, read = metric_delta(j, RECEIVED), metric_delta(j, READ)
    if expected("write_bytes"):
        assert received >= min_received, (
            f"{RECEIVED} grew by {received:.0f} (< {min_received:.0f}) during {job}"
        )
    if expected("read_bytes"):  # AQE skips reading a join side once the other side turned out empty
        assert read > 0, f"{READ} did not grow during {job}"
    return j


def assert_same_result(vanilla: SparkRun, rss: SparkRun, job: str) -> None:
    v, r = vanilla.job(job), rss.job(job)
    assert not failed_checks(r), f"RSS run fails the job's checks: {failed_checks(r)}"
    assert r["rows"] == v["rows"], f"row count: RSS {r['rows']} vs sort shuffle {v['rows']}"
    assert r["digest"] == v["digest"], f"result digest differs:\n  RSS  {r['digest']}\n  sort {v['digest']}"


@pytest.fixture(scope="session")
def e2e():
    """The helpers above, for the test modules (which should not import conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        assert_oracle_ok=assert_oracle_ok,
        assert_rss_carried=assert_rss_carried,
        assert_same_result=assert_same_result,
        metric_delta=metric_delta,
        metric_names=metric_names,
        http_json=http_json,
        http_get=http_get,
        server_memory=parse_size(SERVER_MEMORY),
        num_servers=NUM_SERVERS,
        tail=tail,
        RECEIVED=RECEIVED,
        READ=READ,
        URPC_RPCS=URPC_RPCS,
        client_types=CLIENT_TYPES,
        start_cluster=start_cluster,
    )
