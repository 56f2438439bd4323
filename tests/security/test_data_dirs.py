"""Issue 17 item 4: data directories are checked, not trusted (docs/security.md, docs/recovery.md).

Each test runs real ``riffle-server`` processes on real data paths and plants what an attacker
(or an accident) could leave there, then checks the server neither follows it nor dies of it:

- a symlinked shuffle directory and symlinked partition files pointing outside: the restart
  (and the purge after it) leaves every outside file exactly as it was;
- a symlinked ``partition-N.data`` in a live shuffle: a client's bytes never land in the outside
  file; the blocks stay readable from memory and the disk stays healthy;
- a FIFO named ``partition-0.index``: start-up completes and SIGTERM stops the server;
- ``shuffle.meta`` -> ``/dev/zero``: start-up completes, peak RSS stays small;
- a checksummed ``BLOCK_IDS`` record holding id 2^64 - 1, a shuffle directory named
  ``99999999999999999999`` or ``²``: start-up completes, ``/apps`` answers 200, the rest of the
  app is served;
- a second server on the same data path: refused (exit 1, one line naming the path and the
  holder's pid) before recovery touches anything; the first keeps serving;
- the disk probe never writes through a symlink planted at its file name;
- the purge of an app with tens of thousands of shuffle directories and a small
  ``disk_io_timeout_sec``: no disk is quarantined, ``/health`` stays 200.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from array import array
from pathlib import Path

import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.shuffle_meta import BLOCK_IDS, encode_block_ids, frame
from tests.helpers import wait_for
from tests.helpers.client import UniffleClient, make_blocks

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CMD = [sys.executable, "-m", "riffle_actors.server"]
APP = "application_1700000000000_0017_1700000000004"
PARTITIONS = list(range(4))


class Daemon:
    """One riffle-server process on ``data_paths``; ``start`` again reuses the ports and paths."""

    def __init__(self, tmp: Path, data_paths: list[Path], extra: str = "", name: str = "server") -> None:
        self.tmp, self.data_paths, self.extra, self.name = tmp, data_paths, extra, name
        self.ports = {"grpc_port": 0, "http_port": 0}
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.stderr = b""

    @property
    def log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.tmp.glob(f"{self.name}-*.log")))

    def launch(self) -> Path:
        self.starts += 1
        cfg = self.tmp / f"{self.name}.toml"
        cfg.write_text(f"""grpc_port = {self.ports['grpc_port']}
grpc_bind_address = "127.0.0.1"
http_port = {self.ports['http_port']}
http_bind_address = "127.0.0.1"
grace_period_sec = 10
{self.extra}
[memory_store]
capacity = "64M"
[localfile_store]
data_paths = [{", ".join(f'"{p}"' for p in self.data_paths)}]
{self.localfile_extra}
[log]
path = "{self.tmp / f'{self.name}-{self.starts}.log'}"
""")
        port_file = self.tmp / f"{self.name}-ports.json"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([*CMD, "--config", str(cfg), "--port-file", str(port_file)], env=ENV,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return port_file

    localfile_extra = ""

    def start(self, timeout: float = 60) -> dict:
        port_file = self.launch()

        def ports() -> dict | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"riffle-server exited with {self.proc.returncode}:\n{self.log[-3000:]}")
            try:
                return json.loads(port_file.read_text())
            except (FileNotFoundError, ValueError):
                return None

        got = wait_for(ports, timeout, f"{self.name} port file")
        self.ports = {k: got[k] for k in self.ports}
        return got

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def get(self, path: str) -> tuple[int, object]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['http_port']}{path}", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def client(self) -> UniffleClient:
        return UniffleClient(f"127.0.0.1:{self.ports['grpc_port']}", retry_deadline_s=30)


@pytest.fixture
def daemons(tmp_path: Path):
    made: list[Daemon] = []

    def make(data_paths: list[Path] | None = None, extra: str = "", name: str = "server",
             localfile_extra: str = "") -> Daemon:
        d = Daemon(tmp_path, data_paths or [tmp_path / "data1", tmp_path / "data2"], extra, name)
        d.localfile_extra = localfile_extra
        made.append(d)
        return d

    yield make
    for d in made:
        d.kill()


def run(coro):
    return asyncio.run(coro)


async def _write_app(d: Daemon, shuffles: tuple[int, ...] = (0, 1)) -> dict[int, dict[int, bytes]]:
    """Register ``shuffles`` of APP, write, report and flush (finishShuffle) them; their blocks by id."""
    written: dict[int, dict[int, bytes]] = {}
    async with d.client() as c:
        for sid in shuffles:
            await c.register_shuffle(APP, sid, PARTITIONS)
            blocks = [b for p in PARTITIONS for b in make_blocks(p, 1, 2, 2000 + sid)]
            await c.send_blocks(APP, sid, blocks)
            await c.report(APP, sid, 1, blocks)
            resp = await c.stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=sid))
            assert resp.status == 0, resp.retMsg
            written[sid] = {b.block_id: b.data for b in blocks}
    return written


async def _read(d: Daemon, sid: int, expected: dict[int, bytes]) -> None:
    async with d.client() as c:
        got: dict[int, bytes] = {}
        for p in PARTITIONS:
            got.update(await c.read_partition(APP, sid, p, set(expected), partition_num=len(PARTITIONS)))
    assert got == expected


def _snapshot(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry below ``root`` (not following symlinks): its kind and, for files, a digest."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            if p.is_symlink():
                out[str(p)] = ("link", os.readlink(p).encode())
            elif p.is_dir():
                out[str(p)] = ("dir", b"")
            else:
                out[str(p)] = ("file", hashlib.sha256(p.read_bytes()).digest())
    return out


def _shuffle_dirs(d: Daemon, sid: int) -> list[Path]:
    return [p / APP / str(sid) for p in d.data_paths if (p / APP / str(sid)).is_dir()]


def _assert_apps_ok(d: Daemon) -> list[dict]:
    status, apps = d.get("/apps")
    assert status == 200, apps
    assert isinstance(apps, list)
    return apps


# ---------------------------------------------------------------------------- symlinks
def test_symlinks_pointing_outside_are_never_followed_by_recovery_or_purge(daemons, tmp_path: Path) -> None:
    d = daemons()
    d.start()
    written = run(_write_app(d))
    assert d.stop() == 0
    outside = tmp_path / "outside"
    (outside / "shuffle").mkdir(parents=True)
    victims = {
        # what recovery would repair or delete if it followed the links
        outside / "shuffle" / "shuffle.meta": b"RSHM\x01\x00\x00\x00" + b"\x05\x00",  # a "torn" record
        outside / "shuffle" / "partition-0.index": b"\x01" * 57,  # a "torn" index record
        outside / "shuffle" / "partition-0.data": b"D" * 500,  # "bytes after the last indexed block"
        outside / "shuffle" / "partition-9.data": b"no index",  # "data without an index": unlinked
        outside / "victim.index": b"\x02" * 45,
        outside / "victim.data": b"V" * 300,
        outside / "app" / "3" / "shuffle.meta": b"XXXX",
    }
    for path, data in victims.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    before = _snapshot(outside)
    root = d.data_paths[0]
    (root / APP).mkdir(exist_ok=True)
    (root / APP / "7").symlink_to(outside / "shuffle", target_is_directory=True)  # a symlinked shuffle dir
    (root / "app-link").symlink_to(outside / "app", target_is_directory=True)  # a symlinked app dir
    real = _shuffle_dirs(d, 0)[0]
    (real / "partition-13.index").symlink_to(outside / "victim.index")  # symlinked files in a real shuffle
    (real / "partition-13.data").symlink_to(outside / "victim.data")
    (real / "partition-18.data").symlink_to(outside / "victim.data")

    d.start()
    assert _snapshot(outside) == before, "recovery changed files outside the data path"
    apps = _assert_apps_ok(d)
    assert [a["app_id"] for a in apps] == [APP]
    log = d.log
    assert "foreign entry" in log and "symlink" in log
    run(_read(d, 1, written[1]))

    async def unregister():
        async with d.client() as c:
            await c.unregister_app(APP)

    run(unregister())
    wait_for(lambda: not any((p / APP).exists() or (p / APP).is_symlink() for p in d.data_paths), 30,
             "the purge of the app")
    assert _snapshot(outside) == before, "the purge changed files outside the data path"
    assert d.stop() == 0


def test_a_symlinked_partition_data_file_never_receives_a_clients_bytes(daemons, tmp_path: Path) -> None:
    d = daemons(extra='[hybrid_store]\nmemory_single_buffer_max_spill_size = "16K"')
    d.start()
    victim = tmp_path / "outside-victim"
    victim.write_bytes(b"precious" * 100)
    before = victim.read_bytes()

    async def scenario():
        async with d.client() as c:
            await c.register_shuffle(APP, 0, [0])
            # the shuffle directory exists (its metadata log) on the app's home disk; plant the links on
            # every disk, so the spill finds one wherever it goes
            for root in d.data_paths:
                (root / APP / "0").mkdir(parents=True, exist_ok=True)
                (root / APP / "0" / "partition-0.data").symlink_to(victim)
            blocks = make_blocks(0, 1, 8, 8000)  # 64 KB > the 16 KB single-buffer spill size
            await c.send_blocks(APP, 0, blocks)
            wait_for(lambda: "spill of" in d.log and "failed" in d.log, 30, "the spill to be refused")
            got = await c.read_partition(APP, 0, 0, {b.block_id for b in blocks}, partition_num=1)
            assert got == {b.block_id: b.data for b in blocks}  # still served, from memory
            return blocks

    run(scenario())
    assert victim.read_bytes() == before, "a client's bytes landed in a file outside the data path"
    assert "Too many levels of symbolic links" in d.log
    status, health = d.get("/health")
    assert status == 200 and all(disk["healthy"] for disk in health["disks"]), health  # not a disk fault
    assert d.stop() == 0
    assert victim.read_bytes() == before


# ---------------------------------------------------------------------------- odd files
def test_a_fifo_index_does_not_hang_start_up_and_sigterm_works(daemons) -> None:
    d = daemons()
    d.start()
    written = run(_write_app(d))
    assert d.stop() == 0
    shuffle_dir = _shuffle_dirs(d, 0)[0]
    os.mkfifo(shuffle_dir / "partition-77.index")
    (shuffle_dir / "partition-77.data").write_bytes(b"x" * 10)
    d.start(timeout=30)
    apps = _assert_apps_ok(d)
    assert [a["app_id"] for a in apps] == [APP]
    assert "FIFO" in d.log
    run(_read(d, 0, written[0]))
    assert d.stop(timeout=30) == 0
    assert (shuffle_dir / "partition-77.index").exists()  # left alone


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_shuffle_meta_linked_to_dev_zero_is_not_read(daemons) -> None:
    d = daemons()
    d.start()
    written = run(_write_app(d))
    assert d.stop() == 0
    (meta,) = [p / "shuffle.meta" for p in _shuffle_dirs(d, 1) if (p / "shuffle.meta").exists()]
    meta.unlink()
    meta.symlink_to("/dev/zero")
    d.start(timeout=30)
    assert d.proc is not None
    assert _vm_hwm(d.proc.pid) < 400 << 20
    apps = _assert_apps_ok(d)
    assert [a["app_id"] for a in apps] == [APP]
    assert "not a regular file" in d.log
    run(_read(d, 0, written[0]))
    assert d.stop() == 0


def test_a_checksummed_block_id_of_2_64_minus_1_makes_the_shuffle_corrupt_not_the_start_fail(daemons) -> None:
    d = daemons()
    d.start()
    written = run(_write_app(d))
    assert d.stop() == 0
    (meta,) = [p / "shuffle.meta" for p in _shuffle_dirs(d, 1) if (p / "shuffle.meta").exists()]
    with open(meta, "ab") as f:
        f.write(frame(BLOCK_IDS, encode_block_ids([(0, array("Q", [(1 << 64) - 1]))])))
    d.start(timeout=30)
    apps = _assert_apps_ok(d)
    assert [a["app_id"] for a in apps] == [APP]
    assert "corrupt" in d.log and "above 2^63 - 1" in d.log
    run(_read(d, 0, written[0]))
    assert d.stop() == 0


@pytest.mark.parametrize("name", ["99999999999999999999", "²", "00", "-1"])
def test_a_shuffle_directory_name_the_server_never_writes_is_foreign(daemons, name: str) -> None:
    d = daemons()
    d.start()
    written = run(_write_app(d))
    assert d.stop() == 0
    odd = d.data_paths[0] / APP / name
    odd.mkdir(parents=True, exist_ok=True)
    (odd / "partition-0.data").write_bytes(b"x")
    d.start(timeout=30)
    apps = _assert_apps_ok(d)
    assert [a["app_id"] for a in apps] == [APP]
    assert odd.exists() and "foreign entry" in d.log
    run(_read(d, 0, written[0]))
    assert d.stop() == 0


# ---------------------------------------------------------------------------- two servers
def test_a_second_server_on_the_same_data_path_is_refused_before_recovery(daemons, tmp_path: Path) -> None:
    first = daemons(name="first")
    first.start()
    written = run(_write_app(first, shuffles=(0,)))

    async def in_memory_only():
        async with first.client() as c:  # acknowledged, reported, not flushed: the second must not "lose" it
            await c.register_shuffle(APP, 5, PARTITIONS)
            blocks = [b for p in PARTITIONS for b in make_blocks(p, 2, 1, 700)]
            await c.send_blocks(APP, 5, blocks)
            await c.report(APP, 5, 2, blocks)
            return {b.block_id: b.data for b in blocks}

    memory = run(in_memory_only())
    for root in first.data_paths:  # what the second's recovery would "repair" or remove
        torn = root / APP / "0" / "partition-0.index"
        if torn.exists():
            with open(torn, "ab") as f:
                f.write(b"\x01" * 17)
    (first.data_paths[1] / "app-without-meta" / "3").mkdir(parents=True)
    (first.data_paths[1] / "app-without-meta" / "3" / "partition-0.data").write_bytes(b"z")
    before = {str(p): _snapshot(p) for p in first.data_paths}

    second = daemons(name="second")
    second.data_paths = [tmp_path / "other", first.data_paths[1]]
    second.launch()
    assert second.proc is not None
    code = second.proc.wait(60)
    stderr = second.proc.stderr.read().decode() if second.proc.stderr else ""
    second.proc = None
    assert code == 1
    lines = [ln for ln in (stderr + second.log).splitlines() if "in use by another riffle-server" in ln]
    assert lines, stderr + second.log
    assert f"data path {first.data_paths[1]}" in lines[0] and f"pid {first.proc.pid}" in lines[0]
    assert "recovery" not in second.log and "lost" not in second.log
    assert {str(p): _snapshot(p) for p in first.data_paths} == before, "the refused server touched the data"

    run(_read(first, 0, written[0]))  # the first keeps serving, memory and disk alike
    run(_read(first, 5, memory))
    assert first.stop() == 0


# ---------------------------------------------------------------------------- purge
def test_the_purge_of_a_huge_app_is_not_a_disk_fault(daemons) -> None:
    # tmpfs: building the tree takes seconds there, not minutes; the purge is still far longer than the
    # timeout when done as one operation
    base = Path(tempfile.mkdtemp(prefix="riffle-purge-", dir="/dev/shm"))
    try:
        d = daemons(data_paths=[base / "d1", base / "d2"],
                    localfile_extra="disk_io_timeout_sec = 0.3\ndisk_failures_to_quarantine = 1")
        d.start()
        written = run(_write_app(d, shuffles=(0,)))
        # 20k shuffle directories per disk, as an app with that many shuffles leaves them (registering
        # them over gRPC would take minutes; the purge's cost is the entries, not the registrations)
        for root in d.data_paths:
            app_dir = root / APP
            app_dir.mkdir(exist_ok=True)
            for sid in range(1000, 21000):
                sub = app_dir / str(sid)
                sub.mkdir()
                (sub / "partition-0.data").write_bytes(b"")
        run(_read(d, 0, written[0]))

        async def unregister():
            async with d.client() as c:
                await c.unregister_app(APP)

        run(unregister())
        wait_for(lambda: not any((p / APP).exists() for p in d.data_paths), 300, "the purge of the app")
        status, health = d.get("/health")
        assert status == 200, health
        assert all(disk["healthy"] and disk["status"] == "HEALTHY" for disk in health["disks"]), health
        assert "TIMEOUT" not in d.log
        assert d.stop() == 0
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_the_disk_probe_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    # the probe runs in the probe worker processes; its file name is ``.riffle-health-probe-<pid>``
    from riffle_actors.io.probe import PROBE_FILE, probe_disk

    root = tmp_path / "data"
    root.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me" * 10)
    (root / f"{PROBE_FILE}-{os.getpid()}").symlink_to(victim)
    result = probe_disk(str(root))
    assert result.ok, result
    assert victim.read_bytes() == b"keep me" * 10
    assert not (root / f"{PROBE_FILE}-{os.getpid()}").exists()
