"""``conf_reload_enable``: re-read the server's config file periodically and apply what may change live.

As Riffle (``riffle-server/src/config_reconfigure.rs``: its ``ReconfigurableConfManager`` re-reads
the file every 60 s), the file is read again every ``conf_reload_interval_sec`` (60 s, Riffle's
fixed period; ours is a key so tests can shorten it). A file whose bytes did not change since the
last look is not parsed again, so every outcome below is logged once per edit.

What may change live (``RELOADABLE``): Riffle's reloadable keys that exist here (its code registers
``app_config.partition_limit_threshold``, ``partition_limit_memory_backpressure_ratio`` and
``partition_split_threshold``) plus the spill watermarks, the disk throttle's rate and the log
level. Riffle's fourth, ``hybrid_store.memory_spill_to_hdfs_concurrency``, is the HDFS writer
thread count here and needs a restart.

A new file is used whole or not at all: one that does not load (bad TOML, an unknown key, a bad
value: the same checks as at start) is logged as an ERROR with every problem and ignored; one that
changes a key outside ``RELOADABLE`` is logged as an ERROR naming those keys ("needs a restart")
and ignored whole, its reloadable changes too, so the server never runs a mix of two files. Each
change applied is logged as a WARNING ``from -> to``. The server applies a change in one synchronous
step on the event loop (``ShuffleServer.apply_reload``), so no request sees half of it.

It does not cover: what each change does (``riffle_actors.server``) or the file's format
(``riffle_actors.config``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from riffle_actors.config import ConfigError, ServerConfig, apply_riffle_keys, load_config

#: dotted key -> what a change does at once (docs/riffle-compat.md, docs/operations.md)
RELOADABLE: dict[str, str] = {
    "app_config.partition_limit_threshold": "partitions above it become huge on their next write",
    "app_config.partition_limit_memory_backpressure_ratio": "the huge-partition memory limit of requireBuffer",
    "app_config.partition_split_threshold": "requireBuffer names the partitions above it for a split",
    "hybrid_store.memory_spill_high_watermark": "the spill trigger",
    "hybrid_store.memory_spill_low_watermark": "where a spill round stops",
    "hybrid_store.sensitive_watermark_spill_enable": "whether in-flight bytes count in the spill trigger",
    "localfile_store.io_limiter.capacity": "every disk's throughput limit (when io_limiter was set at start)",
    "log.level": "the log level (unless RUST_LOG sets it)",
    "log.log_level": "the log level (Riffle's name; unless RUST_LOG sets it)",
    "conf_reload_interval_sec": "the period of this check, from the next one",
}


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value
    return out


def config_changes(old: ServerConfig, new: ServerConfig) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs (a section set on one side only: the section's key)."""
    a = _flatten(old.model_dump(mode="json"), "", {})
    b = _flatten(new.model_dump(mode="json"), "", {})
    changes: dict[str, tuple[Any, Any]] = {}
    for key in sorted(a.keys() | b.keys()):
        before, after = a.get(key), b.get(key)
        if before != after:
            changes[key] = (before, after)
    return changes


def _not_reloadable(changes: dict[str, tuple[Any, Any]]) -> list[str]:
    return [k for k in changes if k not in RELOADABLE]


class ConfigReloader:
    """The periodic check of one config file; ``apply(new_cfg, changes)`` is the server's."""

    def __init__(self, path: str | Path, *, current: Callable[[], ServerConfig],
                 apply: Callable[[ServerConfig, dict[str, tuple[Any, Any]]], None],
                 load: Callable[[str], ServerConfig] = load_config):
        self.path = str(path)
        self._current = current
        self._apply = apply
        self._load = load
        self._seen: bytes | None = None  # digest of the file's bytes last looked at
        self.reloads_applied = 0
        self.reloads_refused = 0

    def remember_current_file(self) -> None:
        """Called at start: the file as it is now is the one in force (no reload of it)."""
        self._seen = self._digest()

    def _digest(self) -> bytes | None:
        try:
            return hashlib.sha256(Path(self.path).read_bytes()).digest()
        except OSError:
            return None

    async def check_logged(self) -> None:
        """``check``, a failure logged (a reload never takes the server down). The server runs it every
        ``conf_reload_interval_sec`` (read from the config in force: a new period applies from the next
        look) as a ``PeriodicJobActor`` on its timer."""
        try:
            await self.check()
        except Exception:  # noqa: BLE001 - a reload never takes the server down
            logger.exception("config reload of {} failed; the config in force is kept", self.path)

    async def check(self) -> str:
        """One look at the file: "unchanged", "applied", "no change", "invalid" or "refused"."""
        loop = asyncio.get_running_loop()
        digest = await loop.run_in_executor(None, self._digest)
        if digest == self._seen:
            return "unchanged"
        self._seen = digest
        try:
            # the same parsing and checks as at start, off the event loop (file IO, validation)
            raw = await loop.run_in_executor(None, self._load, self.path)
            new = apply_riffle_keys(raw)
        except ConfigError as e:
            self.reloads_refused += 1
            logger.error("config reload: {} not applied, the config in force is kept:\n{}", self.path,
                         "\n".join(f"  {k}: {r}" for k, r in e.problems))
            return "invalid"
        old = self._current()
        changes = config_changes(old, new)
        if not changes:
            logger.info("config reload: {} read again, nothing changed", self.path)
            return "no change"
        refused = _not_reloadable(changes)
        if refused:
            self.reloads_refused += 1
            logger.error("config reload: {} not applied (none of its changes): {} cannot change without a "
                         "restart (reloadable: {})", self.path,
                         ", ".join(f"{k} ({changes[k][0]!r} -> {changes[k][1]!r})" for k in refused),
                         ", ".join(RELOADABLE))
            return "refused"
        self._apply(new, changes)
        self.reloads_applied += 1
        for key, (before, after) in changes.items():
            logger.warning("config reload: {} changed from {!r} to {!r} ({})", key, before, after, RELOADABLE[key])
        return "applied"
