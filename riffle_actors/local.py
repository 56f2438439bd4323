"""``riffle-local``: a coordinator and one shuffle server on localhost, in one command.

Starts ``riffle-coordinator`` and ``riffle-server`` as child processes with embedded defaults,
data under ``./data``, waits until the server has registered with the coordinator, prints the
``spark.rss.*`` settings a Spark job needs, and stops both on Ctrl-C / SIGTERM. For production,
run the two daemons separately (``--daemon`` or the systemd units in ``deploy/``).

Local means local: every port binds 127.0.0.1 and the server advertises 127.0.0.1, so nothing
is reachable from another host. The admin endpoints (coordinator and server) get a fresh random token
(``RIFFLE_ADMIN_TOKEN`` in the children's environment, printed once; ``--admin-token`` or the
variable itself choose one). The children run in their own process group: a Ctrl-C in the
terminal reaches only this launcher, which sends each daemon exactly one SIGTERM, so each
flushes once and exits 0.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CLIENT_JAR_HINT = "rss-client-spark3-shaded-0.9.2.jar"

_COORDINATOR_DEFAULT = """grpc_port = {grpc}
grpc_bind_address = "127.0.0.1"
http_port = {http}
http_bind_address = "127.0.0.1"
# loopback only, one token for every daemon: a decommission may reach the server itself
tell_servers_on_decommission = true
[server]
heartbeat_timeout_sec = 30
[client_conf]
"rss.storage.type" = "MEMORY_LOCALFILE"
"rss.client.type" = "GRPC"
"""

_SERVER_DEFAULT = """store_type = "MEMORY_LOCALFILE"
grpc_port = {grpc}
grpc_bind_address = "127.0.0.1"
http_port = {http}
http_bind_address = "127.0.0.1"
urpc_port = {urpc}
urpc_bind_address = "127.0.0.1"
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


def find_client_jar() -> str | None:
    """The Uniffle Spark 3 client jar, if ``scripts/e2e_setup.sh`` or Maven put one on this machine."""
    roots = [Path.cwd() / ".cache" / "spark-jars", Path(__file__).resolve().parent.parent / ".cache" / "spark-jars",
             Path.home() / ".m2" / "repository" / "org" / "apache" / "uniffle" / "rss-client-spark3-shaded"]
    for root in roots:
        found = sorted(glob.glob(str(root / "**" / "rss-client-spark3-shaded-*.jar"), recursive=True))
        found = [f for f in found if not f.endswith(("-sources.jar", "-javadoc.jar"))]
        if found:
            return found[-1]
    return None


def _jar_hint() -> tuple[str, str]:
    """(path to put on the class paths, a line saying where it is or how to get it)."""
    jar = find_client_jar()
    if jar:
        return jar, f"Uniffle client jar: {jar}"
    return (f"/path/to/{CLIENT_JAR_HINT}",
            f"Uniffle client jar not found here; get it with\n  mvn dependency:copy "
            f"-Dartifact=org.apache.uniffle:rss-client-spark3-shaded:0.9.2 -DoutputDirectory=.\n"
            f"(or run scripts/e2e_setup.sh from a riffle_actors checkout: it fetches it into .cache/spark-jars/)")


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
    ap.add_argument("--server-urpc-port", type=int, default=20000,
                    help="the server's Netty (urpc) port, for spark.rss.client.type=GRPC_NETTY")
    ap.add_argument("--admin-token", default=None,
                    help="token for the coordinator's admin endpoints (default: $RIFFLE_ADMIN_TOKEN, else a new "
                         "random one, printed)")
    opts = ap.parse_args(argv)
    token = opts.admin_token or os.environ.get("RIFFLE_ADMIN_TOKEN") or secrets.token_urlsafe(24)
    if len(token) < 16:
        ap.error("--admin-token must be at least 16 characters")
    child_env = {**os.environ, "RIFFLE_ADMIN_TOKEN": token, "WORKER_IP": "127.0.0.1"}

    data = Path(opts.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="riffle-local-"))
    coord_cfg = run / "coordinator.toml"
    coord_cfg.write_text(_COORDINATOR_DEFAULT.format(grpc=opts.coordinator_port, http=opts.coordinator_http_port))
    server_cfg = run / "server.toml"
    procs: list[subprocess.Popen] = []

    def shutdown() -> int:
        """One SIGTERM to each daemon (server first), then wait; 0 when every daemon exited 0."""
        # further Ctrl-C / SIGTERM while the daemons flush: say so, do not interrupt the flush
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: print("riffle-local: stopping, waiting for the daemons to flush",
                                                file=sys.stderr, flush=True))
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in reversed(procs):
            try:
                codes.append(p.wait(45))
            except subprocess.TimeoutExpired:
                print(f"riffle-local: pid {p.pid} did not stop within 45s; killing it", file=sys.stderr)
                p.kill()
                codes.append(p.wait())
        return 0 if all(code == 0 for code in codes) else 1

    def on_sigterm(*_args) -> None:
        raise KeyboardInterrupt  # leave the wait loop through the same path as Ctrl-C

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        coord = subprocess.Popen([sys.executable, "-m", "riffle_actors.coordinator", "--config", str(coord_cfg),
                                  "--port-file", str(run / "coordinator.json")],
                                 preexec_fn=_die_with_parent, process_group=0, env=child_env)
        procs.append(coord)
        c = _wait_port_file(run / "coordinator.json", coord, "riffle-coordinator")
        server_cfg.write_text(_SERVER_DEFAULT.format(grpc=opts.server_port, http=opts.server_http_port,
                                                     urpc=opts.server_urpc_port,
                                                     coordinator=c["grpc_port"], capacity=opts.capacity,
                                                     data=data / "riffle-server"))
        server = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(server_cfg),
                                   "--port-file", str(run / "server.json")],
                                  preexec_fn=_die_with_parent, process_group=0, env=child_env)
        procs.append(server)
        s = _wait_port_file(run / "server.json", server, "riffle-server")
        _wait_registered(c["http_port"])
        jar, jar_line = _jar_hint()
        print(f"""
riffle_actors is running: coordinator 127.0.0.1:{c['grpc_port']} (HTTP {c['http_port']}),
server 127.0.0.1:{s['grpc_port']} (urpc {s.get('urpc_port')}, HTTP {s['http_port']}), data under {data}.

{jar_line}
Spark settings (the client jar on both class paths):
  --conf spark.shuffle.manager=org.apache.spark.shuffle.RssShuffleManager
  --conf spark.rss.coordinator.quorum=127.0.0.1:{c['grpc_port']}
  --conf spark.rss.storage.type=MEMORY_LOCALFILE
  --conf spark.rss.client.type=GRPC
  --conf spark.serializer=org.apache.spark.serializer.KryoSerializer
  --conf spark.driver.extraClassPath={jar}
  --conf spark.executor.extraClassPath={jar}
For the Netty data transport instead: spark.rss.client.type=GRPC_NETTY, and on Java 9 or later
  --conf spark.driver.extraJavaOptions=-Dorg.apache.uniffle.shaded.io.netty.noUnsafe=true
  --conf spark.executor.extraJavaOptions=-Dorg.apache.uniffle.shaded.io.netty.noUnsafe=true

Health: curl http://127.0.0.1:{s['http_port']}/health   Servers: curl http://127.0.0.1:{c['http_port']}/api/servers
Admin token (coordinator and server admin endpoints; Authorization: Bearer ...): {token}
Everything listens on 127.0.0.1 only. Ctrl-C stops both.""", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        for p in procs:
            if p.poll() is not None:
                name = p.args[2] if isinstance(p.args, list) else p.args  # [python, -m, module, ...]
                print(f"riffle-local: {name!s} exited with code {p.returncode}; stopping", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 0
    finally:
        stopped = shutdown()
        for f in run.iterdir():
            f.unlink(missing_ok=True)
        run.rmdir()
    return code or stopped


if __name__ == "__main__":
    sys.exit(main())
