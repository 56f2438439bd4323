"""``riffle-local``: a coordinator and one shuffle server on localhost, in one command.

Starts ``riffle-coordinator`` and ``riffle-server`` as child processes with the embedded
defaults in ``config/`` (or the files given), data under ``./data``, waits until the server
has registered with the coordinator, prints the ``spark.rss.*`` settings a Spark job needs,
and stops both on Ctrl-C / SIGTERM. For production, run the two daemons separately
(``--daemon`` or the systemd units in ``deploy/``).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CLIENT_JAR_HINT = "rss-client-spark3-shaded-0.9.2.jar"

_COORDINATOR_DEFAULT = """grpc_port = {grpc}
http_port = {http}
[server]
heartbeat_timeout_sec = 30
[client_conf]
"rss.storage.type" = "MEMORY_LOCALFILE"
"rss.client.type" = "GRPC"
"""

_SERVER_DEFAULT = """store_type = "MEMORY_LOCALFILE"
grpc_port = {grpc}
http_port = {http}
coordinator_quorum = ["127.0.0.1:{coordinator}"]
heartbeat_interval_seconds = 2
[memory_store]
capacity = "{capacity}"
[localfile_store]
data_paths = ["{data}"]
"""


def _die_with_parent() -> None:
    """Child-side: get SIGTERM when riffle-local itself dies, so no daemon is ever orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _wait_port_file(path: Path, proc: subprocess.Popen, what: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode} before it was ready")
        time.sleep(0.1)
    raise SystemExit(f"{what} was not ready within {timeout_s:.0f}s")


def _wait_registered(http_port: int, timeout_s: float = 60) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/servers", timeout=2) as r:
                servers = json.loads(r.read())
            if servers:
                return servers
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not register with the coordinator in time")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="riffle-local", description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="./data", help="where the server keeps spilled shuffle data")
    ap.add_argument("--capacity", default="1G", help="server memory for shuffle data")
    ap.add_argument("--coordinator-port", type=int, default=21000)
    ap.add_argument("--coordinator-http-port", type=int, default=21001)
    ap.add_argument("--server-port", type=int, default=19999)
    ap.add_argument("--server-http-port", type=int, default=20010)
    opts = ap.parse_args(argv)

    data = Path(opts.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="riffle-local-"))
    coord_cfg = run / "coordinator.toml"
    coord_cfg.write_text(_COORDINATOR_DEFAULT.format(grpc=opts.coordinator_port, http=opts.coordinator_http_port))
    server_cfg = run / "server.toml"
    procs: list[subprocess.Popen] = []

    def shutdown(*_args) -> None:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(45)
            except subprocess.TimeoutExpired:
                p.kill()

    def on_sigterm(*_args) -> None:
        raise KeyboardInterrupt  # leave the wait loop through the same path as Ctrl-C

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        coord = subprocess.Popen([sys.executable, "-m", "riffle_actors.coordinator", "--config", str(coord_cfg),
                                  "--port-file", str(run / "coordinator.json")],
                                 preexec_fn=_die_with_parent)
        procs.append(coord)
        c = _wait_port_file(run / "coordinator.json", coord, "riffle-coordinator")
        server_cfg.write_text(_SERVER_DEFAULT.format(grpc=opts.server_port, http=opts.server_http_port,
                                                     coordinator=c["grpc_port"], capacity=opts.capacity,
                                                     data=data / "riffle-server"))
        server = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(server_cfg),
                                   "--port-file", str(run / "server.json")],
                                  preexec_fn=_die_with_parent)
        procs.append(server)
        s = _wait_port_file(run / "server.json", server, "riffle-server")
        _wait_registered(c["http_port"])
        print(f"""
riffle_actors is running: coordinator 127.0.0.1:{c['grpc_port']} (HTTP {c['http_port']}),
server 127.0.0.1:{s['grpc_port']} (HTTP {s['http_port']}), data under {data}.

Spark settings (Uniffle client jar {CLIENT_JAR_HINT} on both class paths):
  --conf spark.shuffle.manager=org.apache.spark.shuffle.RssShuffleManager
  --conf spark.rss.coordinator.quorum=127.0.0.1:{c['grpc_port']}
  --conf spark.rss.storage.type=MEMORY_LOCALFILE
  --conf spark.rss.client.type=GRPC
  --conf spark.serializer=org.apache.spark.serializer.KryoSerializer
  --conf spark.driver.extraClassPath=/path/to/{CLIENT_JAR_HINT}
  --conf spark.executor.extraClassPath=/path/to/{CLIENT_JAR_HINT}

Health: curl http://127.0.0.1:{s['http_port']}/health   Servers: curl http://127.0.0.1:{c['http_port']}/api/servers
Ctrl-C stops both.""", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        failed = [p for p in procs if p.poll() not in (None, 0)]
        return 1 if failed else 0
    except KeyboardInterrupt:
        return 0
    finally:
        shutdown()
        for f in run.iterdir():
            f.unlink(missing_ok=True)
        run.rmdir()


if __name__ == "__main__":
    sys.exit(main())
