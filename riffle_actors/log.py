"""Logging setup for the daemons: the only place loguru sinks are configured.

Library code only does ``from loguru import logger`` and ``logger.bind(app_id=...)``; the
daemon entry point (``riffle_actors.daemon``) calls ``setup_logging`` once with the ``[log]``
section. With ``path`` set the log goes to that file (``<path>/riffle-server.log`` when it names a
directory, as in Riffle) with loguru rotation/retention (and also
to stderr unless ``to_stderr`` is False, which is what ``--daemon`` uses since a detached
daemon's stderr is /dev/null); without it, to stderr only.

It does not cover: metrics, or rate limiting of repetitive warnings (callers use
``RateLimitedLog`` below where a warning may repeat every tick).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from riffle_actors.config import LogConfig

_FORMAT = (
    "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <7} | {process} | {name}:{line} | {message}"
    "{extra[ctx]}"
)


def _add_context(record: dict[str, Any]) -> None:
    # Render bound context (app_id=..., trace_id=...) after the message without a custom sink.
    extra = {k: v for k, v in record["extra"].items() if k != "ctx"}
    record["extra"]["ctx"] = (" | " + " ".join(f"{k}={v}" for k, v in extra.items())) if extra else ""


#: what the daemon's ``setup_logging`` was called with (None: not called, e.g. a server in a test
#: process, whose sinks belong to the test); ``set_level`` re-runs it with another level
_SETUP: dict[str, object] = {}


def set_level(level: str) -> bool:
    """A config reload: the daemon's sinks log at ``level`` from now on (they are set up again with
    it; the log file is reopened in append mode). False when ``setup_logging`` never ran here."""
    cfg = _SETUP.get("cfg")
    if not isinstance(cfg, LogConfig):
        return False
    setup_logging(cfg.model_copy(update={"level": level.upper(), "log_level": None}),
                  to_stderr=bool(_SETUP["to_stderr"]))
    return True


def current_level() -> str | None:
    cfg = _SETUP.get("cfg")
    return cfg.effective_level if isinstance(cfg, LogConfig) else None


def setup_logging(cfg: LogConfig, *, to_stderr: bool = True) -> None:
    """Replace every loguru sink with the ones ``cfg`` asks for."""
    _SETUP.update(cfg=cfg, to_stderr=to_stderr)
    logger.remove()
    logger.configure(patcher=_add_context)  # type: ignore[arg-type]
    level = cfg.effective_level  # Riffle's log_level when only that is set
    path = cfg.file_path  # Riffle's [log] path is a directory: <path>/riffle-server.log
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        logger.add(
            path,
            level=level,
            format=_FORMAT,
            rotation=cfg.effective_rotation,
            retention=cfg.effective_retention,
            enqueue=False,
            backtrace=False,
            diagnose=False,
        )
    if to_stderr or not path:
        logger.add(sys.stderr, level=level, format=_FORMAT, backtrace=False, diagnose=False)


#: Riffle's (tracing/env_logger) level names -> loguru's; "off" logs errors that stop the daemon only
_RUST_LEVELS = {"trace": "TRACE", "debug": "DEBUG", "info": "INFO", "warn": "WARNING", "warning": "WARNING",
                "error": "ERROR", "off": "CRITICAL"}
_VERBOSITY = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def level_from_rust_log(value: str) -> str:
    """The loguru level for a ``RUST_LOG`` filter (Riffle's launch line: ``RUST_LOG=info``).

    A filter is comma-separated directives, ``level``, ``target=level`` or a bare ``target`` (all
    of its levels). There is one level here, so the most verbose one named wins:
    ``warn,riffle_server=debug`` gives DEBUG. Raises ``ValueError`` for a level word we do not know.
    """
    levels = []
    for directive in value.split(","):
        directive = directive.strip()
        if not directive:
            continue
        _target, sep, level = directive.rpartition("=")
        word = (level if sep else directive).strip().lower()
        if word in _RUST_LEVELS:
            levels.append(_RUST_LEVELS[word])
        elif sep:
            raise ValueError(f"unknown level {level!r} in {value!r} (trace, debug, info, warn, error, off)")
        elif directive.replace("::", "").replace("_", "").replace("-", "").isalnum():
            levels.append("TRACE")  # a bare target: every level of it
        else:
            raise ValueError(f"cannot read {directive!r} in {value!r}")
    if not levels:
        raise ValueError(f"no level in {value!r}")
    return min(levels, key=_VERBOSITY.index)


class RateLimitedLog:
    """Lets a repeated message through at most once per ``interval_s`` per key.

    ``should_log(key)`` returns ``(True, suppressed)`` when the caller should log now, where
    ``suppressed`` counts the calls swallowed since the last one, so the log line can say so.
    """

    def __init__(self, interval_s: float, *, monotonic: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self._monotonic = monotonic
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def should_log(self, key: str) -> tuple[bool, int]:
        now = self._monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False, 0
        self._last[key] = now
        return True, self._suppressed.pop(key, 0)

    def reset(self, key: str) -> None:
        """Forget ``key`` (e.g. the coordinator answered again), so the next failure logs at once."""
        self._last.pop(key, None)
        self._suppressed.pop(key, None)
