"""Safe on a shared network: the server's process tree listens on its gRPC and HTTP ports only.

The disk probes run in child processes (``riffle_actors.io.probe_fleet``). They used to be a
thespian multiprocTCPBase system: after the first probe round, processes of the server listened
on 0.0.0.0 at random ports and un-pickled whatever arrived. These tests run a real server,
force a probe round, and list every socket of the server process and all of its children with
psutil; and they SIGKILL the owner of a fleet to check that no probe worker survives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.fault.probes import HANGING
from tests.helpers import poll_until, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def process_tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def tcp_listeners(procs: list[psutil.Process]) -> set[tuple[int, str, int]]:
    """``(pid, address, port)`` of every listening TCP (v4 and v6) socket of ``procs``."""
    found = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found |= {(p.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


def named_unix_sockets(procs: list[psutil.Process]) -> set[tuple[int, str]]:
    """``(pid, path)`` of unix sockets bound to a path or an abstract name: others could connect to them."""
    found = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="unix")
        except psutil.NoSuchProcess:
            continue
        found |= {(p.pid, c.laddr) for c in conns if c.laddr}
    return found


def socket_fds(pid: int) -> list[str]:
    """Every open socket of ``pid``, of any family (also those psutil does not decode, e.g. netlink)."""
    out = []
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except FileNotFoundError:
            continue
        if target.startswith("socket:"):
            out.append(f"fd {fd} -> {target}")
    return out


def gone(pid: int) -> bool:
    """Exited (a zombie counts: whoever is its parent now reaps it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_after_a_probe_round_the_server_listens_only_on_its_grpc_and_http_ports(server_factory):
    baseline = tcp_listeners(process_tree())  # whatever the test process held before the server
    srv = await server_factory()
    results = await srv.admin.probe_disks()
    assert len(results) == 2 and all(r is not None and r.ok for r in results.values()), results
    workers = (await srv.admin.probe_stats()).worker_pids
    assert len(workers) == 2

    tree = process_tree()
    assert set(workers.values()) <= {p.pid for p in tree[1:]}, "the probe workers are children of the server"
    new = tcp_listeners(tree) - baseline
    assert {port for _, _, port in new} == {srv.grpc_port, srv.http_port}, f"listening: {sorted(new)}"
    assert {pid for pid, _, _ in new} == {os.getpid()}, "only the server process itself listens"
    assert not named_unix_sockets(tree), "no unix socket another process could connect to"
    for disk, pid in workers.items():  # the workers talk over pipes: not a single socket
        proc = psutil.Process(pid)
        assert proc.net_connections(kind="all") == [], f"probe worker of {disk}"
        assert socket_fds(pid) == [], f"probe worker of {disk}"

    # a replaced worker is no different
    killed = next(iter(workers.values()))
    psutil.Process(killed).kill()
    await poll_until(lambda: gone(killed))  # else the round could see it die and give no verdict
    results = await srv.admin.probe_disks()
    assert all(r is not None and r.ok for r in results.values()), results
    tree = process_tree()
    new = tcp_listeners(tree) - baseline
    assert {port for _, _, port in new} == {srv.grpc_port, srv.http_port}, f"listening: {sorted(new)}"
    for pid in (await srv.admin.probe_stats()).worker_pids.values():
        assert socket_fds(pid) == []


OWNER_SCRIPT = """
import json, os, sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, {repo!r})
from riffle_actors.io.probe import probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet, ProbeTarget
from tests.fault.probes import HANG, announced_hang

idle, hung = sys.argv[1], sys.argv[2]
fleet = ProbeFleet()
targets = [ProbeTarget("idle", idle, probe_disk), ProbeTarget("hung", hung, announced_hang)]
probe_thread = ThreadPoolExecutor(1)  # like the DiskMonitor: the fleet lives on one thread of its own
first = probe_thread.submit(fleet.probe, targets, 30).result()
assert all(r is not None and r.ok for r in first.values()), first
print(json.dumps(probe_thread.submit(fleet.worker_pids).result()), flush=True)
open(os.path.join(hung, HANG), "w").close()
probe_thread.submit(fleet.probe, targets, 3600).result()  # the test SIGKILLs this process in here
"""


def test_no_probe_worker_outlives_an_owner_killed_without_shutdown(tmp_path: Path):
    idle, hung = tmp_path / "idle", tmp_path / "hung"
    idle.mkdir()
    hung.mkdir()
    script = tmp_path / "owner.py"
    script.write_text(OWNER_SCRIPT.format(repo=str(REPO)))
    owner = subprocess.Popen([sys.executable, str(script), str(idle), str(hung)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    workers: dict[str, int] = {}
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        if not line:
            owner.wait()
            pytest.fail(f"the owner process failed: {owner.stderr.read() if owner.stderr else ''}")
        workers = json.loads(line)
        assert set(workers) == {"idle", "hung"}
        assert {p.pid for p in psutil.Process(owner.pid).children()} >= set(workers.values())
        # the hung worker is stuck in its probe: it will never read the end of its request pipe
        wait_for(lambda: (hung / HANGING).exists() or owner.poll() is not None,
                 what="worker stuck in its probe")
        assert owner.poll() is None, owner.stderr.read() if owner.stderr else ""

        owner.send_signal(signal.SIGKILL)  # no shutdown(), no atexit, no finally
        assert owner.wait() == -signal.SIGKILL
        for disk, pid in workers.items():
            wait_for(lambda pid=pid: gone(pid),
                     what=f"probe worker of {disk} (pid {pid}) exits with its owner")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for stream in (owner.stdout, owner.stderr):
            if stream is not None:
                stream.close()
        for pid in workers.values():
            if not gone(pid):
                psutil.Process(pid).kill()
