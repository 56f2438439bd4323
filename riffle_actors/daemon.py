"""Daemon plumbing shared by ``riffle-server`` and ``riffle-coordinator``.

Both binaries' ``main()`` are one call::

    def main(argv: list[str] | None = None) -> int:
        return run_daemon(argv, prog="riffle-coordinator", load_config=load_coordinator_config,
                          log_config=lambda cfg: cfg.log, serve=serve)

Command line built here (``PROG`` = ``prog``)::

    PROG [run] -c/--config PATH [--daemon] [--pid-file F] [--port-file F] [--start-timeout S]
    PROG stop --pid-file F [--timeout S] [--kill]
    PROG status --pid-file F

Without ``-c/--config``, the path comes from the environment variable ``config_env`` when the
binary names one (riffle-server: ``WORKER_CONFIG_PATH``, Riffle's launch line); with neither, exit 2.
``RUST_LOG`` (Riffle's log filter: ``info``, ``debug``, ``riffle=debug``, ``warn,h2=error``...)
overrides the ``[log]`` level with the most verbose level it names (``riffle_actors.log.
level_from_rust_log``); one we cannot read is reported on stderr and the config's level kept.

Contract of ``run_daemon(argv, *, prog, load_config, log_config, serve, description="")``:

- ``load_config(path) -> C`` parses the file and raises ``riffle_actors.config.ConfigError``
  on any problem; run_daemon then prints the error text (every bad dotted key) on stderr and
  returns **2** without starting anything. argparse usage errors also give 2.
- ``log_config(cfg) -> LogConfig`` selects the ``[log]`` section; run_daemon calls
  ``riffle_actors.log.setup_logging`` with it (the only place sinks are configured). Under
  ``--daemon`` logs go only to ``[log] path`` (stderr is /dev/null after detaching).
- ``serve(cfg, stop_event, ports) -> int`` is an ``async`` function run on a uvloop event loop.
  It must start its listeners, then call ``ports(grpc_port=..., http_port=..., **extra_ints)``
  exactly once with the ports actually bound (port 0 in the config = any free port), then
  ``await stop_event.wait()``, shut down gracefully (flush) and return the exit code
  (0 = clean). SIGTERM and SIGINT set ``stop_event``; a second signal exits at once with 130.
  An exception escaping ``serve`` is logged and gives exit code 1.
- ``ports(...)`` (a ``PortFileWriter``) writes ``{"grpc_port": int, "http_port": int,
  "pid": int, **extra}`` to ``--port-file`` atomically (temp file + rename) so a waiter never
  reads a partial file, and, under ``--daemon``, tells the waiting foreground process that the
  daemon is up.
- ``--pid-file`` is written (atomically, our pid) before ``serve`` starts, and both the pid and
  port files are removed at exit if they still name this process. A pid file naming a live
  process makes the start fail with exit 1 ("already running").
- ``--daemon`` double-forks and detaches (new session, stdio to /dev/null, working directory
  kept so relative paths in the config still resolve); it needs ``--pid-file``. The foreground
  process waits until the daemon called ``ports(...)`` (or failed, or ``--start-timeout``
  passed) and exits 0 only when the daemon is serving.
- ``stop`` sends SIGTERM to the pid in the pid file and waits up to ``--timeout`` (30 s) for it
  to exit: 0 when it is gone (or was not running), 1 when still alive (``--kill`` then sends
  SIGKILL). ``status`` prints the pid and exits 0 when running, 3 (LSB "not running") otherwise.
  A pid file naming a dead process, or a live one whose command line lacks "riffle" (a recycled
  pid), counts as stale: ``stop`` never signals such a process.

It does not cover: what the daemon serves (``coordinator.main``, ``riffle_actors.server``) or
restarting a crashed daemon (a supervisor such as systemd does; see ``deploy/``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from loguru import logger

from riffle_actors.config import ConfigError, LogConfig
from riffle_actors.log import level_from_rust_log, setup_logging

C = TypeVar("C")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_NOT_RUNNING = 3
EXIT_SIGNAL = 130


# --------------------------------------------------------------------------- files


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``rename``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_pid(pid_file: str) -> int | None:
    """The pid stored in ``pid_file``, or None when the file is missing or malformed."""
    try:
        with open(pid_file, encoding="utf-8") as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def daemon_alive(pid: int) -> bool:
    """``pid_alive`` and the process looks like one of ours (guards against a recycled pid)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return True  # cannot tell: assume it is ours
    return b"riffle" in cmdline


def _remove_if_ours(path: str | None, *, pid: int, json_pid: bool) -> None:
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        owner = json.loads(text).get("pid") if json_pid else int(text.strip())
    except (OSError, ValueError, AttributeError):
        return
    if owner == pid:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class PortFileWriter:
    """Called once by ``serve`` with the bound ports; see the module docstring."""

    def __init__(self, path: str | None, ready_fd: int | None = None):
        self.path = path
        self._ready_fd = ready_fd
        self.ports: dict[str, int] | None = None

    def __call__(self, *, grpc_port: int, http_port: int, **extra: int) -> None:
        self.ports = {"grpc_port": int(grpc_port), "http_port": int(http_port), **{k: int(v) for k, v in extra.items()}}
        if self.path:
            write_atomic(self.path, json.dumps({**self.ports, "pid": os.getpid()}))
        logger.info("listening: {}", " ".join(f"{k}={v}" for k, v in self.ports.items()))
        self.notify(f"ready {os.getpid()}")

    def notify(self, message: str) -> None:
        """Send one line to the waiting foreground process (``--daemon`` only), then close the pipe."""
        if self._ready_fd is None:
            return
        try:
            os.write(self._ready_fd, (message.replace("\n", " ") + "\n").encode())
        except OSError:
            pass
        finally:
            os.close(self._ready_fd)
            self._ready_fd = None


# --------------------------------------------------------------------------- argparse


@dataclass(frozen=True, slots=True)
class RunArgs:
    config: str
    daemon: bool
    pid_file: str | None
    port_file: str | None
    start_timeout: float


def _run_parser(prog: str, description: str, config_env: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("-c", "--config", required=config_env is None, metavar="PATH",
                   help="TOML config file" + (f" (default: ${config_env})" if config_env else ""))
    p.add_argument("--daemon", action="store_true", help="detach into the background (needs --pid-file)")
    p.add_argument("--pid-file", metavar="F", help="write the daemon's pid here")
    p.add_argument("--port-file", metavar="F", help='write {"grpc_port", "http_port", "pid"} here once listening')
    p.add_argument(
        "--start-timeout", type=float, default=60.0, metavar="S", help="--daemon: wait this long for start-up"
    )
    return p


def _stop_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{prog} stop", description="SIGTERM the daemon and wait for it to exit")
    p.add_argument("--pid-file", required=True, metavar="F")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to wait (default 30)")
    p.add_argument("--kill", action="store_true", help="SIGKILL it if still running after the timeout")
    return p


def _status_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{prog} status", description="exit 0 when running, 3 when not")
    p.add_argument("--pid-file", required=True, metavar="F")
    return p


# --------------------------------------------------------------------------- commands


def cmd_status(pid_file: str, prog: str) -> int:
    pid = read_pid(pid_file)
    if pid is not None and daemon_alive(pid):
        print(f"{prog} running, pid {pid}")
        return EXIT_OK
    print(f"{prog} not running" + (f" (stale pid {pid} in {pid_file})" if pid is not None else ""))
    return EXIT_NOT_RUNNING


def cmd_stop(pid_file: str, prog: str, timeout_s: float, kill: bool) -> int:
    pid = read_pid(pid_file)
    if pid is None or not daemon_alive(pid):
        print(f"{prog} not running")
        return EXIT_OK
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return EXIT_OK
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            print(f"{prog} stopped (pid {pid})")
            return EXIT_OK
        time.sleep(0.05)
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        print(f"{prog} killed (pid {pid}) after {timeout_s}s", file=sys.stderr)
        return EXIT_OK
    print(f"{prog} still running (pid {pid}) after {timeout_s}s", file=sys.stderr)
    return EXIT_FAILURE


def _daemonize(timeout_s: float, prog: str) -> tuple[int | None, int | None]:
    """Double-fork. Returns ``(exit_code, None)`` in the foreground process, ``(None, ready_fd)`` in the daemon."""
    r, w = os.pipe()
    first = os.fork()
    if first > 0:
        os.close(w)
        os.waitpid(first, 0)  # the intermediate child exits right after the second fork
        return _await_ready(r, timeout_s, prog), None
    os.close(r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.umask(0o022)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return None, w


def _await_ready(fd: int, timeout_s: float, prog: str) -> int:
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"{prog}: daemon not ready after {timeout_s}s; see its log", file=sys.stderr)
                return EXIT_FAILURE
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(fd)
    line = buf.decode(errors="replace").strip()
    if line.startswith("ready "):
        print(f"{prog} started, pid {line.split()[1]}")
        return EXIT_OK
    print(f"{prog}: daemon failed to start: {line.removeprefix('error ') or 'exited early; see its log'}", file=sys.stderr)
    return EXIT_FAILURE


async def _serve_with_signals(serve: Callable[..., Awaitable[int]], cfg: Any, ports: PortFileWriter) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signalled = False  # a stop asked for otherwise (an operator's kill) is not a first signal

    def on_signal(signum: int) -> None:
        nonlocal signalled
        if signalled:
            logger.warning("second {}: exiting now", signal.Signals(signum).name)
            os._exit(EXIT_SIGNAL)
        signalled = True
        if stop.is_set():
            logger.info("{} received: already stopping gracefully", signal.Signals(signum).name)
            return
        logger.info("{} received: shutting down", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return int(await serve(cfg, stop, ports))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Daemon(Generic[C]):
    def __init__(
        self,
        prog: str,
        load_config: Callable[[str], C],
        log_config: Callable[[C], LogConfig],
        serve: Callable[[C, asyncio.Event, PortFileWriter], Awaitable[int]],
    ):
        self.prog, self.load_config, self.log_config, self.serve = prog, load_config, log_config, serve

    def run(self, args: RunArgs) -> int:
        try:
            cfg = self.load_config(args.config)
        except ConfigError as e:
            print(str(e), file=sys.stderr)
            return EXIT_CONFIG
        if args.daemon and not args.pid_file:
            print(f"{self.prog}: --daemon needs --pid-file", file=sys.stderr)
            return EXIT_CONFIG
        if args.pid_file:
            other = read_pid(args.pid_file)
            if other is not None and other != os.getpid() and daemon_alive(other):
                print(f"{self.prog} already running, pid {other} ({args.pid_file})", file=sys.stderr)
                return EXIT_FAILURE
        log_cfg = self.log_config(cfg)
        rust_log = os.environ.get("RUST_LOG", "").strip()
        if rust_log:  # Riffle's log filter wins over the config, as there
            try:
                log_cfg = log_cfg.model_copy(update={"level": level_from_rust_log(rust_log), "log_level": None})
            except ValueError as e:
                print(f"{self.prog}: warning: RUST_LOG ignored: {e}", file=sys.stderr)
        if args.daemon and not log_cfg.path:
            print(f"{self.prog}: warning: [log] path is not set, the daemon's log is discarded", file=sys.stderr)
        ready_fd = None
        if args.daemon:
            code, ready_fd = _daemonize(args.start_timeout, self.prog)
            if code is not None:
                return code
        setup_logging(log_cfg, to_stderr=not args.daemon)
        ports = PortFileWriter(args.port_file, ready_fd)
        pid = os.getpid()
        try:
            if args.pid_file:
                write_atomic(args.pid_file, f"{pid}\n")
            logger.info("{} starting (pid {}, config {})", self.prog, pid, os.path.abspath(args.config))
            with asyncio.Runner(loop_factory=_new_loop) as runner:
                code = runner.run(_serve_with_signals(self.serve, cfg, ports))
            logger.info("{} stopped (exit {})", self.prog, code)
            return code
        except Exception as e:  # noqa: BLE001 - any start/serve failure becomes exit code 1
            if isinstance(e, OSError):  # e.g. a port in use: the message says it all
                logger.error("{} failed: {}", self.prog, e)
            else:
                logger.exception("{} failed: {}", self.prog, e)
            ports.notify(f"error {type(e).__name__}: {e}")
            return EXIT_FAILURE
        finally:
            ports.notify("error exited before listening")  # no-op once ready was sent
            _remove_if_ours(args.port_file, pid=pid, json_pid=True)
            _remove_if_ours(args.pid_file, pid=pid, json_pid=False)


def run_daemon(
    argv: list[str] | None,
    *,
    prog: str,
    load_config: Callable[[str], C],
    log_config: Callable[[C], LogConfig],
    serve: Callable[[C, asyncio.Event, PortFileWriter], Awaitable[int]],
    description: str = "",
    config_env: str | None = None,
) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run / stop / query the daemon; returns the exit code.
    ``config_env``: the environment variable holding the config path when ``-c/--config`` is not given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in ("run", "stop", "status") else "run"
    if argv and argv[0] == command:
        argv = argv[1:]
    if command == "stop":
        a = _stop_parser(prog).parse_args(argv)
        return cmd_stop(a.pid_file, prog, a.timeout, a.kill)
    if command == "status":
        a = _status_parser(prog).parse_args(argv)
        return cmd_status(a.pid_file, prog)
    a = _run_parser(prog, description, config_env).parse_args(argv)
    config = a.config or (os.environ.get(config_env, "").strip() if config_env else "")
    if not config:
        print(f"{prog}: no config file: pass -c/--config PATH or set {config_env}", file=sys.stderr)
        return EXIT_CONFIG
    args = RunArgs(
        config=config, daemon=a.daemon, pid_file=a.pid_file, port_file=a.port_file, start_timeout=a.start_timeout
    )
    return _Daemon(prog, load_config, log_config, serve).run(args)
