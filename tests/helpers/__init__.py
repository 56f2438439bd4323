"""Test helpers shared by every test directory: wait on conditions, never on fixed sleeps.

- ``poll_until(pred, timeout)``: yield to the loop until ``pred()`` (sync or async) holds.
- ``leftover_tasks()``: asyncio tasks still pending besides the current one (leak checks).
- ``parse_metrics(text)``: a Prometheus text page as ``{sample name: [(labels, value)]}``.
- ``server_invariants(server)``: the cleanup invariants of a ShuffleServer once its apps are gone
  (budget used/allocated/in-flight back to 0, no tickets, no app directory on any data path).

See also: ``tests.helpers.client`` (a Uniffle client over gRPC), ``tests.helpers.upstream_proto``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

Predicate = Callable[[], Any]
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """sample name -> [(labels, value)] of a Prometheus text page (``/metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def metric_total(server: Any, name: str) -> float:
    """Sum of every sample of ``name`` (all label values) on an in-process server's metrics page."""
    return sum(v for _labels, v in parse_metrics(server.metrics.render().decode()).get(name, []))


async def poll_until(pred: Predicate, timeout: float = 10.0, *, interval: float = 0.005,
                     message: str | None = None) -> Any:
    """Wait until ``pred()`` is truthy (``pred`` may be async); return its value.

    Fails with ``AssertionError`` after ``timeout`` seconds of wall time. The interval is a
    short poll period, not a guess of how long something takes.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(message or f"condition not met within {timeout}s: {getattr(pred, '__name__', pred)}")
        await asyncio.sleep(interval)


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Blocking twin of ``poll_until`` for tests that drive subprocesses: wait until ``pred()`` is truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout}s (last: {last!r})")
        time.sleep(interval)


def leftover_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not current and not t.done()}


def app_dirs(server: Any, app_id: str | None = None, *, with_data: bool = True) -> list[str]:
    """Directories of ``app_id`` (or of any app) on the server's data paths.

    ``with_data`` (the default): only those holding partition files, i.e. something was spilled
    (registerShuffle alone writes the shuffle's metadata log, ``shuffle.meta``, on the app's home
    disk); False: every directory, whatever it holds.
    """
    found = []
    for root in server.cfg.localfile_store.data_paths:
        if app_id is not None:
            paths = [os.path.join(root, app_id)]
        elif os.path.isdir(root):
            paths = [os.path.join(root, name) for name in os.listdir(root) if not name.startswith(".")]
        else:
            paths = []
        for path in paths:
            if os.path.exists(path) and (not with_data or _has_partition_files(path)):
                found.append(path)
    return found


def _has_partition_files(path: str) -> bool:
    for _dir, _subdirs, files in os.walk(path):
        if any(f.startswith("partition-") for f in files):
            return True
    return False


def budget_figures(server: Any) -> tuple[int, int, int]:
    """(used, allocated, in_flight) of the server's memory budget (read on the loop thread)."""
    b = server.budget
    return b.used, b.allocated, b.in_flight


async def wait_server_clean(server: Any, app_id: str | None = None, timeout: float = 10.0) -> None:
    """Wait for the cleanup invariants after a purge (see module docstring), then assert them."""

    def clean() -> bool:
        return (budget_figures(server) == (0, 0, 0) and len(server.tickets) == 0
                and not app_dirs(server, app_id, with_data=False)
                and (not server.directory if app_id is None else app_id not in server.directory))

    try:
        await poll_until(clean, timeout)
    except AssertionError:
        raise AssertionError(
            f"server not clean: budget (used, allocated, in_flight) = {budget_figures(server)}, "
            f"tickets = {len(server.tickets)}, app dirs = {app_dirs(server, app_id, with_data=False)}, "
            f"apps = {list(server.directory)}") from None


async def gather_all(*aws: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather`` that cancels the siblings when one fails (no orphan tasks after a failure)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def flip_byte(path: Any, offset: int, mask: int = 0x10) -> None:
    """XOR the byte at ``offset`` of the file at ``path`` with ``mask`` and fsync it (bit rot on disk)."""
    fd = os.open(path, os.O_RDWR)
    try:
        (b,) = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b ^ mask]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)
