"""How one host's ``riffle-server`` is cut into ``runtime_config.worker_number`` worker servers (pure).

With ``worker_number = N > 1`` a parent process (``riffle_actors.host``) runs N complete shuffle
servers, one per core. This module decides, from the operator's one ``ServerConfig``, what each
worker ``k`` (``0 <= k < N``) is given; nothing here starts a process or touches a file:

- **ports**: gRPC ``grpc_port + k``, urpc ``urpc_port + k`` (when urpc is on); a port of 0 stays
  0 (any free port) for every worker. The HTTP port ``http_port`` is the parent's (one
  ``/metrics`` and ``/health`` for the host); each worker's own HTTP port is any free one
  (``/workers`` on the parent lists them, and each worker reports its own in its heartbeat).
  ``check_layout`` refuses ranges that leave 0..65535 or overlap each other or ``http_port``.
- **memory**: ``memory_store.capacity // N`` each, and so for every other byte budget that is
  the host's: ``max_reply_bytes`` and ``health_service_config.memory_allocated_threshold``
  (per process RSS) and the per-disk ``localfile_store.io_limiter.capacity`` (the workers share
  each disk). The floors of the config models (1 MiB for reply budgets) still hold.
- **disks**: every data path ``D`` becomes ``D/.worker-<k>``: each worker has a subdirectory of
  every disk, holds its own data lock there (``riffle_actors.io.data_lock``) and recovers only
  what it wrote. The leading dot keeps the subdirectories out of the restart recovery of a
  one-process server on the same path (its scan skips dot names), so going from N workers back
  to 1 never removes them (their data is then not served, which the docs say).
- **logs**: ``[log] path`` ``server.log`` becomes ``server.worker-<k>.log`` (one rotating file
  per process); unset (stderr) stays stderr, inherited from the parent.

Every other key is the same in every worker (thread pools, limits per app, tags, the coordinator
quorum): each worker is a server of its own to the coordinator and the clients. ``N = 1`` is
today's single server: no parent, no subdirectory, the config used as is.

See also: ``riffle_actors.host`` (the parent), ``docs/workers.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from riffle_actors.config import ServerConfig

#: the subdirectory of every data path that worker ``k`` owns
WORKER_DIR_PREFIX = ".worker-"
#: environment of a worker process: its index (set by the parent; its absence means "not a worker")
ENV_WORKER_INDEX = "RIFFLE_WORKER_INDEX"
#: environment of a worker process: the number of workers the parent runs (checked against the config)
ENV_WORKER_NUMBER = "RIFFLE_WORKER_NUMBER"
#: the smallest reply budget the config models accept (``max_reply_bytes``)
_MIN_REPLY_BYTES = 1 << 20


class WorkerLayoutError(ValueError):
    """The config cannot be cut into its workers; ``key`` is the dotted key to change."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class WorkerPorts:
    """The ports worker ``k`` is configured with (0 = any free port, ``None`` = urpc off)."""

    grpc_port: int
    urpc_port: int | None


def worker_ports(cfg: ServerConfig, k: int) -> WorkerPorts:
    """``grpc_port + k`` and ``urpc_port + k``; 0 stays 0."""
    grpc = cfg.grpc_port + k if cfg.grpc_port else 0
    urpc = None if cfg.urpc_port is None else (cfg.urpc_port + k if cfg.urpc_port else 0)
    return WorkerPorts(grpc, urpc)


def worker_data_path(data_path: str, k: int) -> str:
    return os.path.join(data_path, f"{WORKER_DIR_PREFIX}{k}")


def worker_log_path(path: str, k: int) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}.worker-{k}{ext}"


def check_layout(cfg: ServerConfig) -> None:
    """Raise ``WorkerLayoutError`` when ``worker_number`` workers do not fit ``cfg``'s ports or memory."""
    n = cfg.runtime_config.worker_number
    if n == 1:
        return
    key = "runtime_config.worker_number"
    ranges: list[tuple[str, int, int]] = []
    for name, base in (("grpc_port", cfg.grpc_port), ("urpc_port", cfg.urpc_port)):
        if not base:
            continue
        if base + n - 1 > 65535:
            raise WorkerLayoutError(key, f"{n} workers need {name} {base}..{base + n - 1}, beyond port 65535")
        ranges.append((name, base, base + n - 1))
    if cfg.http_port:
        ranges.append(("http_port", cfg.http_port, cfg.http_port))
    for i, (a, lo_a, hi_a) in enumerate(ranges):
        for b, lo_b, hi_b in ranges[i + 1:]:
            if lo_a <= hi_b and lo_b <= hi_a:
                raise WorkerLayoutError(key, f"{n} workers use {a} {lo_a}..{hi_a}, which overlaps {b} "
                                             f"{lo_b}..{hi_b}; move one of them or use fewer workers")
    if cfg.memory_store.capacity // n < 1:
        raise WorkerLayoutError(key, f"memory_store.capacity {cfg.memory_store.capacity} cannot be shared by "
                                     f"{n} workers")


def _split(value: int | None, n: int, floor: int = 1) -> int | None:
    return None if value is None else max(floor, value // n)


def worker_config(cfg: ServerConfig, k: int) -> ServerConfig:
    """The config worker ``k`` of ``cfg.runtime_config.worker_number`` runs with (see the module docstring)."""
    n = cfg.runtime_config.worker_number
    if not 0 <= k < n:
        raise ValueError(f"worker {k} of {n}")
    if n == 1:
        return cfg
    ports = worker_ports(cfg, k)
    ls = cfg.localfile_store
    ls_up: dict = {"data_paths": [worker_data_path(p, k) for p in ls.data_paths]}
    if ls.io_limiter is not None:
        ls_up["io_limiter"] = ls.io_limiter.model_copy(update={"capacity": _split(ls.io_limiter.capacity, n)})
    hc = cfg.health_service_config
    update: dict = {
        "grpc_port": ports.grpc_port,
        "urpc_port": ports.urpc_port,
        "http_port": 0,
        "memory_store": cfg.memory_store.model_copy(update={"capacity": _split(cfg.memory_store.capacity, n)}),
        "max_reply_bytes": _split(cfg.max_reply_bytes, n, _MIN_REPLY_BYTES),
        "localfile_store": ls.model_copy(update=ls_up),
        "health_service_config": hc.model_copy(
            update={"memory_allocated_threshold": _split(hc.memory_allocated_threshold, n)}),
        "runtime_config": cfg.runtime_config.model_copy(update={"worker_number": 1}),
    }
    if cfg.log.path:
        update["log"] = cfg.log.model_copy(update={"path": worker_log_path(cfg.log.path, k)})
    return cfg.model_copy(update=update)


# --------------------------------------------------------------------------- the host's pages


def label_sample(line: str, worker: int) -> str:
    """One Prometheus sample line with ``worker="<k>"`` as its first label."""
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = line[brace + 1:]
        sep = "" if rest.startswith("}") else ","
        return f'{line[:brace]}{{worker="{worker}"{sep}{rest}'
    if space == -1:
        return line
    return f'{line[:space]}{{worker="{worker}"}}{line[space:]}'


def merge_metrics(pages: list[tuple[int, str]], own: str = "") -> str:
    """The host's ``/metrics``: every worker's page with a ``worker`` label on each sample, families
    merged (each ``# HELP`` / ``# TYPE`` once, then the samples of every worker, as the text format
    wants), then ``own`` (the parent's families, unlabelled)."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for worker, text in pages:
        family = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    if family not in heads:
                        order.append(family)
                        heads[family], samples[family] = [], []
                    if line not in heads[family]:
                        heads[family].append(line)
                continue
            if family not in heads:  # a sample before any HELP/TYPE line
                order.append(family)
                heads[family], samples[family] = [], []
            samples[family].append(label_sample(line, worker))
    out: list[str] = []
    for family in order:
        out.extend(heads[family])
        out.extend(samples[family])
    text = "\n".join(out) + ("\n" if out else "")
    return text + own
