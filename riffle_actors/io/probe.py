"""The disk health probe: write + fsync + read back a small file, and read the capacity.

``probe_disk(root)`` is a plain blocking function returning a ``ProbeResult``: ``ok``, or the
``IOErrorKind`` and the step (``usage``, ``write``, ``fsync``, ``read``, ``remove``) that failed,
plus the file system's capacity and used bytes (``psutil.disk_usage``). It never raises.

It runs **out of process**: a dying disk can block a syscall in the kernel for minutes, and a
thread stuck there cannot be interrupted. ``riffle_actors.io.probe_worker`` is the process
that hosts it, one per disk, spoken to over pipes by ``riffle_actors.io.probe_fleet``.

This module is imported by the spawned worker processes: keep its imports light and free of
side effects (no actor runtime, no gRPC, no logging setup).

Tests replace the probe function with another module-level function taking ``root`` (named
to the worker as ``module:qualname`` and imported there), e.g. one that hangs while a marker
file exists.

See also: ``riffle_actors.io.probe_fleet`` (timeouts, kill and replace),
``riffle_actors.actors.disk_monitor`` (what the server does with the results).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from riffle_actors.io.local import IOErrorKind, classify

PROBE_FILE = ".riffle-health-probe"
PROBE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe found; ``kind``/``op``/``detail`` are set when ``ok`` is False."""

    ok: bool
    capacity_bytes: int = 0
    used_bytes: int = 0
    kind: str | None = None  # an IOErrorKind value
    op: str | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


ProbeFn = Callable[[str], ProbeResult]


def probe_disk(root: str) -> ProbeResult:
    """Capacity via psutil, then write + fsync + read back + remove ``<root>/.riffle-health-probe-<pid>``."""
    import time

    import psutil

    started = time.monotonic()
    capacity = used = 0
    op = "usage"
    path = os.path.join(root, f"{PROBE_FILE}-{os.getpid()}")
    try:
        usage = psutil.disk_usage(root)
        capacity, used = usage.used + usage.free, usage.used
        op = "write"
        payload = os.urandom(PROBE_BYTES)
        # whatever sits at the probe's name (a leftover, or a planted symlink or FIFO) is removed, never
        # followed: the probe writes only a file it just created
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            op = "fsync"
            os.fsync(fd)
        finally:
            os.close(fd)
        op = "read"
        rfd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(rfd, "rb") as f:
            back = f.read()
        op = "remove"
        os.unlink(path)
        if back != payload:
            return ProbeResult(False, capacity, used, IOErrorKind.CORRUPT.value, "read",
                               f"read back {len(back)} bytes that differ from the {len(payload)} written",
                               time.monotonic() - started)
    except Exception as e:  # noqa: BLE001 - a probe reports, it never raises
        if op in ("write", "fsync", "read"):
            try:
                os.unlink(path)
            except OSError:
                pass
        return ProbeResult(False, capacity, used, classify(e).value, op, f"{type(e).__name__}: {e}",
                           time.monotonic() - started)
    return ProbeResult(True, capacity, used, seconds=time.monotonic() - started)
