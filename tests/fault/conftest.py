"""Fixtures of the fault-injection suite: real mounts where they are cheap, seams where they are not.

- ``mounts``: ``mounts.tmpfs(name, size="8m")`` mounts a small tmpfs (ENOSPC for real) and
  ``mounts.remount(path, "ro"|"rw")`` flips it read-only (EROFS for real). Needs root and a
  kernel that lets this container mount; otherwise the test is skipped with the reason.
  Every mount is made writable again and unmounted in the finalizer, even when the test
  failed (lazily if something still holds it).
- ``fault_server(**overrides)``: an in-process ``ShuffleServer`` whose disks use a
  ``FaultyLocalIO`` each (``srv.faulty[disk_name]``), with fast disk probes (the fleet starts
  on the first probe round a test asks for). Finalizer: heal every fault (releasing paused
  operations), then stop the server -- before the mounts go away.
- ``invariants``: the cleanup checks every fault test ends with (see ``Invariants``).

Tests wait on conditions (``poll_until``), never on fixed sleeps; a probe round is run with
``await srv.admin.probe_disks()``, which returns when the round is done.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from riffle_actors.config import ServerConfig, validate_config
from riffle_actors.io.data_lock import LOCK_FILE
from riffle_actors.io.faults import FaultyLocalIO
from riffle_actors.runtime import Clock
from riffle_actors.server import ShuffleServer
from tests.helpers import app_dirs, budget_figures, poll_until, wait_server_clean
from tests.helpers.client import UniffleClient

pytestmark = pytest.mark.fault


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fault/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.fault)


# ---------------------------------------------------------------------------- mounts
class Mounts:
    def __init__(self, base: Path):
        self.base = base
        self.mounted: list[Path] = []

    def tmpfs(self, name: str = "tmpfs", size: str = "8m") -> Path:
        """Mount a tmpfs of ``size`` at ``<tmp>/<name>``; skips the test when that is impossible."""
        if os.geteuid() != 0:
            pytest.skip("needs root to mount a tmpfs (mount -t tmpfs); run the fault suite as root")
        path = self.base / name
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs at {path} (no CAP_SYS_ADMIN in this container?): "
                        f"{r.stderr.strip() or r.returncode}")
        self.mounted.append(path)
        return path

    def remount(self, path: Path, mode: str, timeout_s: float = 30.0) -> None:
        """``mode`` "ro" (writes then fail with EROFS) or "rw".

        A remount to read-only fails with "busy" while a file on it is open for writing (a spill or
        a probe in progress); the kernel's own remount after an error does not wait, so this tries
        again until the file system is read-only, within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, text=True,
                               check=False)
            if r.returncode == 0:
                return
            if "busy" not in r.stderr or time.monotonic() > deadline:
                raise RuntimeError(f"remount,{mode} of {path} failed: {r.stderr.strip()}")

    def fill(self, path: Path, *, leave_bytes: int = 0, name: str = "filler") -> Path:
        """Write a file that fills the file system at ``path`` (up to ``leave_bytes`` free)."""
        filler = path / name
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize - leave_bytes
        with open(filler, "ab") as f:
            chunk = b"\0" * (1 << 16)
            while free > 0:
                try:
                    free -= f.write(chunk[: min(len(chunk), free)])
                    f.flush()
                except OSError:
                    break
        return filler

    def cleanup(self) -> None:
        for path in reversed(self.mounted):
            subprocess.run(["mount", "-o", "remount,rw", str(path)], capture_output=True, check=False)
            r = subprocess.run(["umount", str(path)], capture_output=True, check=False)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self.mounted.clear()


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    m = Mounts(tmp_path / "mnt")
    try:
        yield m
    finally:
        m.cleanup()


# ---------------------------------------------------------------------------- servers
def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def fault_config(tmp_path: Path, *, data_paths: list[str] | None = None, capacity: str | int = "4M",
                 **overrides: Any) -> ServerConfig:
    """A fault-test config: ports 0, two data paths, 4 MiB of memory, 256 KiB single-buffer spills,
    fast probe timeout and probation (2 probes), 5 s IO timeout; ``overrides`` merge per section."""
    base: dict[str, Any] = {
        "grpc_port": 0,
        "grpc_bind_address": "127.0.0.1",
        "http_port": 0,
        "http_bind_address": "127.0.0.1",
        "grace_period_sec": 0,
        "memory_store": {"capacity": capacity},
        "localfile_store": {
            "data_paths": data_paths or [str(tmp_path / "disk0"), str(tmp_path / "disk1")],
            "disk_probe_timeout_sec": 2.0,
            "disk_probation_probes": 2,
            "disk_io_timeout_sec": 5.0,
        },
        "hybrid_store": {"memory_single_buffer_max_spill_size": "256K"},
    }
    return validate_config(ServerConfig, _merge(base, overrides))


@pytest_asyncio.fixture
async def fault_server(tmp_path: Path, mounts: Mounts) -> AsyncIterator[Any]:
    """``await fault_server(clock=None, probe_fn=None, data_paths=None, **config)`` -> a started server.

    ``srv.faulty[name]`` is the disk's ``FaultyLocalIO``; ``srv.disk_names`` the names in order.
    """
    started: list[ShuffleServer] = []

    async def make(*, clock: Clock | None = None, probe_fn: Any = None, **overrides: Any) -> ShuffleServer:
        cfg = fault_config(tmp_path / f"server{len(started)}", **overrides)
        faulty: dict[str, FaultyLocalIO] = {}

        def local_io(name: str, root: str) -> FaultyLocalIO:
            faulty[name] = FaultyLocalIO(name=name)
            return faulty[name]

        kwargs: dict[str, Any] = {"local_io_factory": local_io}
        if probe_fn is not None:
            kwargs["probe_fn"] = probe_fn
        srv = ShuffleServer(cfg, clock=clock, **kwargs)
        srv.faulty = faulty  # type: ignore[attr-defined]
        started.append(srv)
        await srv.start()
        return srv

    try:
        yield make
    finally:
        for srv in reversed(started):
            for io in getattr(srv, "faulty", {}).values():
                io.heal()
            if not getattr(srv, "_test_stopped", False):
                srv._test_stopped = True  # type: ignore[attr-defined]
                await srv.stop(0)


@pytest_asyncio.fixture
async def client_factory() -> AsyncIterator[Any]:
    clients: list[UniffleClient] = []

    def make(srv: ShuffleServer, **kwargs: Any) -> UniffleClient:
        c = UniffleClient(f"127.0.0.1:{srv.grpc_port}", **kwargs)
        clients.append(c)
        return c

    try:
        yield make
    finally:
        for c in clients:
            await c.close()


# ---------------------------------------------------------------------------- invariants
def open_files_under(paths: list[str]) -> list[str]:
    """Files of this process that are open under any of ``paths`` (fd leak check), besides the data path
    locks a running server holds by design (``riffle_actors.io.data_lock``)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target) == LOCK_FILE:
            continue
        if any(target == p or target.startswith(p.rstrip("/") + "/") for p in paths):
            found.append(target)
    return found


class Invariants:
    """The checks every fault test ends with (style guide §2.6, dask's assert_worker_cleanup)."""

    async def after_purge(self, srv: ShuffleServer, client: UniffleClient, app_id: str, *,
                          disk_restarts: dict[str, int] | None = None) -> None:
        """Unregister ``app_id`` and check: memory, tickets, files and fds released, tree as expected."""
        if app_id in srv.directory:
            await client.unregister_app(app_id)
        await wait_server_clean(srv, app_id)
        assert budget_figures(srv) == (0, 0, 0)
        assert len(srv.tickets) == 0
        assert not app_dirs(srv, app_id, with_data=False)
        paths = list(srv.cfg.localfile_store.data_paths)
        # a purge closes its directory descriptors just after its last rmdir: wait for that, not longer
        await poll_until(lambda: not open_files_under(paths), 5.0,
                         message=f"file descriptors left open: {open_files_under(paths)}")
        self.tree(srv, disk_restarts=disk_restarts)

    def tree(self, srv: ShuffleServer, *, disk_restarts: dict[str, int] | None = None) -> None:
        """Supervisor tree: nothing escalated, every permanent actor alive, app actors only for live apps."""
        assert srv.escalated is None, f"supervisor tree gave up: {srv.escalated!r}"
        stats = {s.name: s for s in srv.system.statistics()}
        for name in ("timer", "storage", "memory", "spill", "apps", "app_manager", "disk_monitor"):
            assert name in stats and stats[name].state == "running", f"{name}: {stats.get(name)}"
        for name, _ in srv.disks:
            st = stats[f"disk:{name}"]
            assert st.state == "running", st
            if disk_restarts is not None:
                assert st.restarts == disk_restarts.get(name, 0), f"disk {name} restarted {st.restarts} times"
        apps = {n.removeprefix("app:") for n in stats if n.startswith("app:")}
        assert apps == set(srv.directory), f"app actors {apps} != registered apps {set(srv.directory)}"


@pytest.fixture
def invariants() -> Invariants:
    return Invariants()
