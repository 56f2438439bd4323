"""The parent of a multi-worker ``riffle-server`` host (``runtime_config.worker_number`` > 1).

One Python process uses one core; this parent runs ``N`` complete shuffle servers (the workers),
each in its own process with its share of the host (``riffle_actors.workers``: memory / N, the
subdirectory ``.worker-<k>`` of every data path, ports ``grpc_port + k`` / ``urpc_port + k``),
and registered with the coordinator as a server of its own. The parent serves no shuffle RPC:

- **start**: it locks every data path itself (so a one-process server cannot run on the same
  paths at once; each worker then locks its own subdirectory), starts every worker as
  ``python -m riffle_actors.server run -c <the same file> --port-file <tmp>`` with
  ``RIFFLE_WORKER_INDEX=k`` and ``RIFFLE_WORKER_NUMBER=N`` in its environment (the worker cuts its
  own share of the file, ``server._load_checked``), waits until every worker has written its port
  file, then listens on ``http_port`` and reports ready. A worker that fails to start fails the
  host (exit 1, the workers already up are stopped). Workers run in their own session (a
  terminal's Ctrl-C reaches the parent only) and get SIGKILL from the kernel if the parent dies
  (``PR_SET_PDEATHSIG``), so no worker outlives its host.
- **restart**: a worker that exits abnormally (a signal or a non-zero code) is started again
  after a backoff (0.5 s doubling up to 30 s, back to 0.5 s after 60 s of life). Its restart
  recovery serves everything it had spilled; what it held only in memory is lost, as for a
  crashed one-process server. A worker that exits 0 was stopped on purpose (an operator's kill,
  or the end of its decommission, reached at the worker's own HTTP port): it is not restarted,
  and the host exits 0 once no worker is left.
- **stop** (SIGTERM, or SIGINT): in order, (1) no more restarts, (2) SIGTERM to every worker at
  once, each doing what a one-process server does on SIGTERM (a DECOMMISSIONED heartbeat, the
  gRPC grace, memory flushed within ``grace_period_sec``), (3) wait for all of them (SIGKILL
  after ``grace_period_sec + 30`` s), (4) close the host's HTTP port and release its locks. The
  workers stop in parallel, not one after the other, so a host of 96 stops in one grace period.
- **HTTP** on ``http_port``: ``/metrics`` is every worker's page with a ``worker="<k>"`` label on
  each sample (``workers.merge_metrics``) plus the host's own ``riffle_host_*`` families;
  ``/health`` is 200 when every worker is up and answers 200, else 503 with each worker's
  status and reasons; ``/workers`` lists the workers (index, pid, ports, restarts, up);
  ``/apps`` is every worker's app list, each entry with its ``worker``. Everything else of a
  server (``/admin``, ``/apps/history``, ``/debug``...) is on each worker's own HTTP port.

See also: ``riffle_actors.workers``, ``riffle_actors.server.serve``, ``docs/workers.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from loguru import logger

from riffle_actors.config import LogConfig, ServerConfig
from riffle_actors.io.data_lock import DataPathLocks, lock_data_paths
from riffle_actors.transport.listen import start_tcp_site
from riffle_actors.workers import ENV_WORKER_INDEX, ENV_WORKER_NUMBER, merge_metrics

#: how long a worker may take to write its port file (recovery of a large data path included)
START_TIMEOUT_S = 300.0
HOST_DIR = ".host"  # below the first data path: the workers' port files
#: restart backoff: first delay, cap, and the life after which it starts again from the first
BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_RESET_AFTER_S = 0.5, 30.0, 60.0
#: one worker page fetched by /metrics or /health at most this long
PAGE_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class HostLaunch:
    """What ``riffle-server`` runs when ``worker_number`` > 1: the config and the file it came from
    (the workers read the same file)."""

    cfg: ServerConfig
    config_path: str

    @property
    def log(self) -> LogConfig:
        return self.cfg.log


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _local_address(bind: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind, bind)


def _read_port_file(path: str) -> dict[str, int] | None:
    """A worker's port file (written atomically: whole or absent), ``None`` while absent."""
    try:
        with open(path, encoding="utf-8") as f:
            return {k: int(v) for k, v in json.load(f).items()}
    except (FileNotFoundError, ValueError, AttributeError, TypeError):
        return None


@dataclass(slots=True)
class Worker:
    """One worker process and what the parent knows of it."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    ports: dict[str, int] = field(default_factory=dict)
    started_monotonic: float = 0.0
    restarts: int = 0
    exits: list[int] = field(default_factory=list)  # return codes, newest last (bounded)
    done: bool = False  # exited 0 on its own: not restarted

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and bool(self.ports)

    def to_json(self) -> dict:
        return {"worker": self.index, "pid": self.proc.pid if self.proc else None, "up": self.up,
                "grpc_port": self.ports.get("grpc_port"), "urpc_port": self.ports.get("urpc_port"),
                "http_port": self.ports.get("http_port"), "restarts": self.restarts,
                "last_exit": self.exits[-1] if self.exits else None, "stopped": self.done}


class WorkerHost:
    """See the module docstring. ``start()``, then ``run(stop_event)`` until the host stops."""

    def __init__(self, launch: HostLaunch, *, python: str = sys.executable):
        self.cfg = launch.cfg
        self.config_path = os.path.abspath(launch.config_path)
        self.n = launch.cfg.runtime_config.worker_number
        self.python = python
        self.workers = [Worker(k) for k in range(self.n)]
        self.http_port = 0
        self._stopping = False
        # the workers' port files: under the first data path (the host holds its lock), so a host that
        # is SIGKILLed leaves nothing behind that its next start does not clear
        self._tmp = os.path.join(os.path.abspath(self.cfg.localfile_store.data_paths[0]), HOST_DIR)
        self._locks: DataPathLocks | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._watchers: list[asyncio.Task] = []
        self._all_done = asyncio.Event()

    # ------------------------------------------------------------------ workers
    def _port_file(self, k: int) -> str:
        return os.path.join(self._tmp, f"worker-{k}.json")

    async def _spawn(self, w: Worker) -> None:
        pf = self._port_file(w.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pf)
        env = {**os.environ, ENV_WORKER_INDEX: str(w.index), ENV_WORKER_NUMBER: str(self.n)}
        w.ports = {}
        w.proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "riffle_actors.server", "run", "-c", self.config_path, "--port-file", pf,
            env=env, stdin=asyncio.subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        w.started_monotonic = time.monotonic()
        logger.info("worker {} started (pid {})", w.index, w.proc.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the port file appears (atomically) once the worker listens
            if w.proc.returncode is not None:
                raise RuntimeError(f"worker {w.index} exited with {w.proc.returncode} before listening; see its log")
            ports = _read_port_file(pf)
            if ports is not None and ports.get("pid") == w.proc.pid:
                w.ports = {k: v for k, v in ports.items() if k != "pid"}
                break
            if time.monotonic() > deadline:
                w.proc.kill()
                raise RuntimeError(f"worker {w.index} not listening after {START_TIMEOUT_S}s")
            await asyncio.sleep(0.05)
        logger.info("worker {} listening: grpc {} urpc {} http {}", w.index, w.ports.get("grpc_port"),
                    w.ports.get("urpc_port", "-"), w.ports.get("http_port"))

    async def _watch(self, w: Worker) -> None:
        """Wait for the worker to exit; restart it unless the host is stopping or it exited 0."""
        delay = BACKOFF_FIRST_S
        while True:
            assert w.proc is not None
            code = await w.proc.wait()
            w.exits = (w.exits + [code])[-10:]
            if self._stopping:
                break
            if code == 0:
                logger.info("worker {} stopped itself (exit 0: kill or decommission); not restarted", w.index)
                w.done = True
                break
            lived = time.monotonic() - w.started_monotonic
            if lived > BACKOFF_RESET_AFTER_S:
                delay = BACKOFF_FIRST_S
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            logger.error("worker {} died ({}, after {:.1f}s): restarting in {}s", w.index, how, lived, delay)
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)
            if self._stopping:
                break
            try:
                await self._spawn(w)
                w.restarts += 1
            except (RuntimeError, OSError) as e:  # it exited (or was killed) before listening, or no process
                logger.error("worker {}: {}", w.index, e)  # could start: its wait() returns next, and it is retried
        if all(x.done or x.proc is None or x.proc.returncode is not None for x in self.workers):
            self._all_done.set()

    # ------------------------------------------------------------------ start / run / stop
    async def start(self) -> None:
        self._locks = lock_data_paths(self.cfg.localfile_store.data_paths)
        try:
            os.makedirs(self._tmp, mode=0o700, exist_ok=True)
            for name in os.listdir(self._tmp):  # a SIGKILLed host's, whatever its worker number was
                if name.startswith("worker-") and name.endswith(".json"):
                    os.unlink(os.path.join(self._tmp, name))
            for w in self.workers:  # one after the other: each recovers its own subdirectories
                await self._spawn(w)
            self._watchers = [asyncio.get_running_loop().create_task(self._watch(w), name=f"worker-{w.index}")
                              for w in self.workers]
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PAGE_TIMEOUT_S))
            self._runner = web.AppRunner(self._app(), access_log=None)
            await self._runner.setup()
            self.http_port = await start_tcp_site(self._runner, what="HTTP", keys="http_port",
                                                  host=self.cfg.http_bind_address, port=self.cfg.http_port)
        except BaseException:
            await self.stop()
            raise
        logger.info("riffle-server host: {} workers, http {}:{}", self.n, self.cfg.http_bind_address, self.http_port)

    async def run(self, stop_event: asyncio.Event) -> None:
        """Until SIGTERM (``stop_event``) or every worker stopped itself."""
        stop = asyncio.ensure_future(stop_event.wait())
        done = asyncio.ensure_future(self._all_done.wait())
        try:
            await asyncio.wait({stop, done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            done.cancel()

    async def stop(self) -> None:
        self._stopping = True
        for t in self._watchers:  # first: no restart from now on (a spawn under way is cut short)
            t.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers = []
        live = [w for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for w in live:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        if live:
            logger.info("stopping {} workers (each flushes within {}s)", len(live), self.cfg.grace_period_sec)
            waits = [asyncio.ensure_future(w.proc.wait()) for w in live]  # type: ignore[union-attr]
            _, pending = await asyncio.wait(waits, timeout=self.cfg.grace_period_sec + 30)
            for w in live:
                if w.proc is not None and w.proc.returncode is None:
                    logger.error("worker {} still running after the grace period: SIGKILL", w.index)
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.kill()
            if pending:
                await asyncio.wait(pending)
            for w in live:
                logger.info("worker {} stopped (exit {})", w.index, w.proc.returncode)  # type: ignore[union-attr]
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._locks is not None:
            self._locks.release()
            self._locks = None
        for k in range(self.n):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._port_file(k))
        with contextlib.suppress(OSError):
            os.rmdir(self._tmp)

    # ------------------------------------------------------------------ HTTP
    async def _page(self, w: Worker, path: str) -> tuple[int, str] | None:
        if not w.up or self._session is None:
            return None
        url = f"http://{_local_address(self.cfg.http_bind_address)}:{w.ports['http_port']}{path}"
        if ":" in _local_address(self.cfg.http_bind_address):
            url = f"http://[{_local_address(self.cfg.http_bind_address)}]:{w.ports['http_port']}{path}"
        try:
            async with self._session.get(url) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError) as e:
            logger.warning("worker {}: {} unreachable: {}", w.index, path, e)
            return None

    def _own_metrics(self) -> str:
        lines = ["# HELP riffle_host_workers worker processes this host runs (runtime_config.worker_number)",
                 "# TYPE riffle_host_workers gauge", f"riffle_host_workers {self.n}",
                 "# HELP riffle_host_worker_up 1 when the worker process is running and listening",
                 "# TYPE riffle_host_worker_up gauge"]
        lines += [f'riffle_host_worker_up{{worker="{w.index}"}} {int(w.up)}' for w in self.workers]
        lines += ["# HELP riffle_host_worker_restarts_total restarts of a worker after it died",
                  "# TYPE riffle_host_worker_restarts_total counter"]
        lines += [f'riffle_host_worker_restarts_total{{worker="{w.index}"}} {w.restarts}' for w in self.workers]
        return "\n".join(lines) + "\n"

    def _app(self) -> web.Application:
        async def metrics(_request: web.Request) -> web.Response:
            got = await asyncio.gather(*(self._page(w, "/metrics") for w in self.workers))
            pages = [(w.index, r[1]) for w, r in zip(self.workers, got) if r is not None and r[0] == 200]
            return web.Response(text=merge_metrics(pages, self._own_metrics()), content_type="text/plain",
                                charset="utf-8", headers={"X-Content-Type-Options": "nosniff"})

        async def health(_request: web.Request) -> web.Response:
            got = await asyncio.gather(*(self._page(w, "/health") for w in self.workers))
            workers, reasons = [], []
            for w, r in zip(self.workers, got):
                entry = w.to_json()
                if r is None:
                    entry["status"] = "STOPPED" if w.done else "DOWN"
                    if not w.done:
                        reasons.append(f"worker {w.index} is not running")
                else:
                    try:
                        body = json.loads(r[1])
                    except ValueError:
                        body = {}
                    entry["status"] = body.get("status", "UNHEALTHY")
                    entry["reasons"] = body.get("reasons", [])
                    if r[0] != 200:
                        reasons += [f"worker {w.index}: {why}" for why in entry["reasons"] or ["UNHEALTHY"]]
                workers.append(entry)
            healthy = not reasons
            body = {"status": "HEALTHY" if healthy else "UNHEALTHY", "reasons": reasons, "workers": workers}
            return web.json_response(body, status=200 if healthy else 503)

        async def listing(_request: web.Request) -> web.Response:
            return web.json_response([w.to_json() for w in self.workers])

        async def apps(request: web.Request) -> web.Response:
            fmt = request.query.get("format", "Json").lower()
            if fmt != "json":
                return web.json_response({"error": f"format {fmt[:20]!r}: the host lists apps as Json only; "
                                                   f"each worker's HTTP port (/workers) has Html"}, status=400)
            got = await asyncio.gather(*(self._page(w, "/apps") for w in self.workers))
            out = []
            for w, r in zip(self.workers, got):
                if r is not None and r[0] == 200:
                    with contextlib.suppress(ValueError, TypeError):
                        out += [{**a, "worker": w.index} for a in json.loads(r[1])]
            return web.json_response(out)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        app.router.add_get("/workers", listing)
        app.router.add_get("/apps", apps)
        return app


async def serve_host(launch: HostLaunch, stop_event: asyncio.Event, ports) -> int:
    """``serve`` of ``riffle-server`` when ``worker_number`` > 1 (see ``riffle_actors.daemon``)."""
    host = WorkerHost(launch)
    try:
        await host.start()
        extra: dict[str, int] = {"worker_number": host.n}
        for w in host.workers:
            for name in ("grpc_port", "urpc_port", "http_port"):
                if name in w.ports:
                    extra[f"worker_{w.index}_{name}"] = w.ports[name]
            extra[f"worker_{w.index}_pid"] = w.proc.pid  # type: ignore[union-attr]
        first = host.workers[0].ports
        if "urpc_port" in first:
            extra["urpc_port"] = first["urpc_port"]
        ports(grpc_port=first["grpc_port"], http_port=host.http_port, **extra)
        await host.run(stop_event)
    finally:
        await host.stop()
    logger.info("riffle-server host stopped")
    return 0
