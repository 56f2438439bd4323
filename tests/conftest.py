"""Shared fixtures of the riffle_actors test suite.

- ``manual_clock``: a ``ManualClock`` to hand to a server (``server_factory(clock=manual_clock)``);
  the test moves time with ``advance()`` and then waits on a condition.
- ``server_config(tmp_path, **overrides)`` / ``server_factory``: a ``ServerConfig`` built through
  ``validate_config`` (ports 0, data paths under ``tmp_path``, a small memory capacity) and an
  in-process ``ShuffleServer`` on 127.0.0.1 that is always stopped at teardown.
- ``server`` / ``client`` / ``stub``: one default server, a ``UniffleClient`` to it and its raw
  ``ShuffleServerStub`` (our proto).
- autouse ``_no_leaked_tasks``: after every async test, no asyncio task may be left running
  (servers, channels and actors must all have been stopped).
- ``RIFFLE_TESTS_REQUIRE_ALL=1`` (set by ``.ci/run``): a skipped test fails instead, with its skip
  reason (a module skipped at collection fails too), so a CI machine without Java, Spark, root or network namespaces cannot go green having
  run none of those tests. The skip summary (``-rs``) is printed on every run.

Tests wait on conditions (``tests.helpers.poll_until``), never on fixed sleeps.
See also: ``tests.helpers`` and ``tests.helpers.client``; style guide §2.6-2.7.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from riffle_actors.runtime import Clock, ManualClock
from riffle_actors.config import ServerConfig, validate_config
from riffle_actors.server import ShuffleServer
from tests.helpers import leftover_tasks, poll_until
from tests.helpers.client import UniffleClient

DEFAULT_CAPACITY = "4M"
REQUIRE_ALL_ENV = "RIFFLE_TESTS_REQUIRE_ALL"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Under ``RIFFLE_TESTS_REQUIRE_ALL=1`` a skip is a failure (see the module docstring)."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get(REQUIRE_ALL_ENV) == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"this test was skipped ({reason}), but {REQUIRE_ALL_ENV}=1 requires every test "
                           f"to run: install its prerequisite (scripts/test.sh does) or run as root")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """The same for a skip at collection (a module-level ``pytest.importorskip`` or ``pytest.skip``):
    it would skip a whole module before any test of it reaches ``pytest_runtest_makereport``."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get(REQUIRE_ALL_ENV) == "1" and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid} was skipped while being collected ({reason}), but "
                           f"{REQUIRE_ALL_ENV}=1 requires every test to run: install its prerequisite "
                           f"(scripts/test.sh does) or run as root")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def server_config(tmp_path: Path, *, capacity: str | int = DEFAULT_CAPACITY, disks: int = 2,
                  **overrides: Any) -> ServerConfig:
    """A test ``ServerConfig``: ports 0, ``disks`` data paths under ``tmp_path``, small capacity.

    ``overrides`` are merged section by section, e.g. ``hybrid_store={"memory_spill_high_watermark": 0.5}``.
    """
    base = {
        "grpc_port": 0,
        "grpc_bind_address": "127.0.0.1",
        "http_port": 0,
        "http_bind_address": "127.0.0.1",
        "grace_period_sec": 0,
        "memory_store": {"capacity": capacity},
        "localfile_store": {"data_paths": [str(tmp_path / f"disk{i}") for i in range(disks)]},
        "hybrid_store": {"memory_single_buffer_max_spill_size": "1M"},
    }
    return validate_config(ServerConfig, _merge(base, overrides))


ServerFactory = Callable[..., Awaitable[ShuffleServer]]


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def server_factory(tmp_path: Path) -> AsyncIterator[ServerFactory]:
    """``await server_factory(clock=None, **config_overrides)`` -> a started ShuffleServer.

    Every server is stopped at teardown, even when the test failed; a test that stops one
    itself calls ``await stop_server(srv)`` (idempotent) instead of ``srv.stop()``.
    """
    started: list[ShuffleServer] = []
    count = 0

    async def make(*, clock: Clock | None = None, **overrides: Any) -> ShuffleServer:
        nonlocal count
        count += 1
        cfg = server_config(tmp_path / f"server{count}", **overrides)
        srv = ShuffleServer(cfg, clock=clock)
        started.append(srv)
        await srv.start()
        return srv

    yield make
    for srv in reversed(started):
        await stop_server(srv)


async def stop_server(srv: ShuffleServer, grace_s: float = 0) -> None:
    """Stop a test server once (ShuffleServer.stop is not meant to be called twice)."""
    if getattr(srv, "_test_stopped", False):
        return
    srv._test_stopped = True  # type: ignore[attr-defined]
    await srv.stop(grace_s)


@pytest_asyncio.fixture
async def server(server_factory: ServerFactory) -> ShuffleServer:
    return await server_factory()


@pytest_asyncio.fixture
async def client(server: ShuffleServer) -> AsyncIterator[UniffleClient]:
    c = UniffleClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    await c.close()


@pytest.fixture
def stub(client: UniffleClient) -> Any:
    """The raw ``ShuffleServerStub`` (our proto) of the default server."""
    return client.stub


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> Any:
    """Async tests only: request the async leak check (sync tests get no event loop)."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("_task_leak_check")
    yield


@pytest_asyncio.fixture
async def _task_leak_check() -> AsyncIterator[None]:
    before = leftover_tasks()
    yield
    # tasks that end on their own shortly after the test (a closing channel) are fine
    try:
        await poll_until(lambda: not (leftover_tasks() - before), timeout=2.0)
    except AssertionError:
        leaked = leftover_tasks() - before
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"leaked asyncio tasks: {sorted(t.get_name() for t in leaked)}")


@pytest.fixture(scope="module")
def minihdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real HDFS (MiniDFSCluster, one DataNode, ephemeral ports) shared by one test module; stopped
    at the module's end even when a test failed. Skips (CI: fails) without Java or the jars."""
    from tests.helpers.minihdfs import MiniHdfs, hdfs_prerequisite

    reason = hdfs_prerequisite()
    if reason:
        pytest.skip(reason)
    hdfs = MiniHdfs.start(tmp_path_factory.mktemp("minihdfs"))
    try:
        yield hdfs
    finally:
        hdfs.stop()
