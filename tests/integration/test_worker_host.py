"""A ``riffle-server`` host of two worker processes (``runtime_config.worker_number = 2``, docs/workers.md).

Real daemons on loopback, port 0: one ``riffle-coordinator`` and one ``riffle-server`` whose parent
runs two workers. Both workers register with the coordinator as servers of their own (one IP, two
ports); the host's ``/metrics`` carries both workers' samples with a ``worker`` label and its
``/health`` both workers' states; a SIGKILLed worker is started again by the parent on its own
subdirectory and serves what it had spilled byte-exact; SIGTERM stops the workers (each announces
it to the coordinator) and then the parent, exit 0, no worker left. ``worker_number = 1`` is
today's server: one process, no subdirectory, no ``/workers`` page.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from tests.helpers import parse_metrics, wait_for
from tests.helpers.client import UniffleClient, make_blocks
from tests.helpers.daemon import Daemons, alive

pytestmark = pytest.mark.integration

APP = "app-workers"


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    try:
        yield d
    finally:
        d.kill_all()


def coordinator_config(root: Path) -> str:
    return (
        'grpc_port = 0\nhttp_port = 0\ngrpc_bind_address = "127.0.0.1"\nhttp_bind_address = "127.0.0.1"\n'
        "[server]\nheartbeat_timeout_sec = 120\n"
        '[client_conf]\n"rss.storage.type" = "MEMORY_LOCALFILE"\n'
        f'[log]\npath = "{root / "coord.log"}"\n'
    )


def host_config(root: Path, *, workers: int, quorum: list[str] | None = None, extra: str = "") -> str:
    return (
        'grpc_port = 0\nhttp_port = 0\ngrpc_bind_address = "127.0.0.1"\nhttp_bind_address = "127.0.0.1"\n'
        f"coordinator_quorum = {json.dumps(quorum or [])}\nheartbeat_interval_seconds = 1\ngrace_period_sec = 5\n"
        f"{extra}\n"
        '[memory_store]\ncapacity = "64M"\n'
        f'[localfile_store]\ndata_paths = ["{root / "data"}"]\n'
        f"[runtime_config]\nworker_number = {workers}\n"
        f'[log]\npath = "{root / "host.log"}"\n'
    )


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def sample(samples, name: str, **labels: str) -> float:
    values = [v for got, v in samples.get(name, []) if got == labels]
    assert len(values) == 1, (name, labels, samples.get(name))
    return values[0]


def servers(http_port: int) -> dict[str, str]:
    return {s["id"]: s["status"] for s in json.loads(get(http_port, "/api/servers")[1])}


def test_a_two_worker_host_registers_restarts_a_killed_worker_and_stops_in_order(
    daemons: Daemons, tmp_path: Path
) -> None:
    _, coord = daemons.start("riffle_actors.coordinator", "coord", coordinator_config(tmp_path))
    host, ports = daemons.start("riffle_actors.server", "host",
                                host_config(tmp_path, workers=2, quorum=[f"127.0.0.1:{coord['grpc_port']}"]))
    assert ports["worker_number"] == 2
    grpc_ports = [ports["worker_0_grpc_port"], ports["worker_1_grpc_port"]]
    assert ports["grpc_port"] == grpc_ports[0] and len(set(grpc_ports)) == 2
    ids = [f"127.0.0.1-{p}" for p in grpc_ports]
    wait_for(lambda: servers(coord["http_port"]) == {i: "ACTIVE" for i in ids}, 60, "both workers registered")

    # one /health and one /metrics for the host
    status, body = get(ports["http_port"], "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "HEALTHY", health
    assert [(w["worker"], w["status"], w["grpc_port"]) for w in health["workers"]] == [
        (0, "HEALTHY", grpc_ports[0]), (1, "HEALTHY", grpc_ports[1])]
    page = get(ports["http_port"], "/metrics")[1].decode()
    samples = parse_metrics(page)
    # each worker holds half the host's memory
    assert sample(samples, "riffle_memory_capacity_bytes", worker="0") == 32 << 20
    assert sample(samples, "riffle_memory_capacity_bytes", worker="1") == 32 << 20
    assert page.count("# TYPE riffle_memory_capacity_bytes ") == 1  # families merged, not repeated
    assert sample(samples, "riffle_host_workers") == 2

    # data written to worker 1 and spilled (finishShuffle), then the worker is SIGKILLed
    blocks = [b for p in range(4) for b in make_blocks(p, 1, 3, 5000)]

    async def write() -> set[int]:
        async with UniffleClient(f"127.0.0.1:{grpc_ports[1]}", retry_deadline_s=60) as c:
            await c.register_shuffle(APP, 0, range(4))
            await c.send_blocks(APP, 0, blocks)
            await c.report(APP, 0, 1, blocks)
            resp = await c.stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=0))
            assert resp.status == 0, resp.retMsg
            return set(await c.get_shuffle_result(APP, 0, range(4)))

    reported = asyncio.run(write())
    assert reported == {b.block_id for b in blocks}
    assert list((tmp_path / "data" / ".worker-1").glob(f"{APP}/0/*")), "worker 1 spilled into its subdirectory"
    assert not list((tmp_path / "data" / ".worker-0").glob(f"{APP}*"))
    apps = json.loads(get(ports["http_port"], "/apps")[1])
    assert [(a["app_id"], a["worker"]) for a in apps] == [(APP, 1)]
    os.kill(ports["worker_1_pid"], signal.SIGKILL)

    def restarted() -> dict | None:
        ws = json.loads(get(ports["http_port"], "/workers")[1])
        return ws[1] if ws[1]["restarts"] == 1 and ws[1]["up"] else None

    w1 = wait_for(restarted, 60, "worker 1 restarted")
    assert w1["last_exit"] == -signal.SIGKILL and w1["pid"] != ports["worker_1_pid"]
    daemons.worker_pids.add(w1["pid"])
    assert alive(ports["worker_0_pid"]), "the other worker was not touched"

    async def read() -> dict[int, bytes]:
        async with UniffleClient(f"127.0.0.1:{w1['grpc_port']}", retry_deadline_s=60) as c:
            got: dict[int, bytes] = {}
            for p in range(4):
                got.update(await c.read_partition(APP, 0, p, reported, partition_num=4))
            return got

    assert asyncio.run(read()) == {b.block_id: b.data for b in blocks}
    new_ids = [ids[0], f"127.0.0.1-{w1['grpc_port']}"]
    wait_for(lambda: all(servers(coord["http_port"]).get(i) == "ACTIVE" for i in new_ids), 60,
             "the restarted worker registered")
    samples = parse_metrics(get(ports["http_port"], "/metrics")[1].decode())
    assert sample(samples, "riffle_host_worker_restarts_total", worker="1") == 1

    # SIGTERM: the workers stop (each announcing it), then the parent; exit 0
    host.send_signal(signal.SIGTERM)
    assert host.wait(60) == 0, daemons.tail("host")
    assert not alive(ports["worker_0_pid"]) and not alive(w1["pid"])
    listed = servers(coord["http_port"])
    assert all(listed[i] == "DECOMMISSIONED" for i in new_ids), listed
    log = daemons.tail("host")
    stopped = [log.index(f"worker {k} stopped (exit 0)") for k in (0, 1)]
    assert max(stopped) < log.index("riffle-server host stopped"), log


# a resident size no Python process stays under: every worker is UNHEALTHY until restarted
HEALTH_RSS_LIMIT = '[health_service_config]\nmemory_allocated_threshold = "2M"'


def test_the_host_health_is_unhealthy_when_a_worker_is(daemons: Daemons, tmp_path: Path) -> None:
    _, ports = daemons.start("riffle_actors.server", "host",
                             host_config(tmp_path, workers=2, extra=HEALTH_RSS_LIMIT))
    def unhealthy() -> dict | None:
        status, body = get(ports["http_port"], "/health")
        return json.loads(body) if status == 503 else None

    health = wait_for(unhealthy, 30, "an unhealthy host")
    assert health["status"] == "UNHEALTHY", health
    assert [w["status"] for w in health["workers"]] == ["UNHEALTHY", "UNHEALTHY"]
    assert any(r.startswith("worker 0: ") for r in health["reasons"]), health
    assert any(r.startswith("worker 1: ") for r in health["reasons"]), health


def test_one_worker_is_todays_server_without_a_parent(daemons: Daemons, tmp_path: Path) -> None:
    proc, ports = daemons.start("riffle_actors.server", "host", host_config(tmp_path, workers=1))
    assert ports["pid"] == proc.pid and "worker_number" not in ports
    assert get(ports["http_port"], "/workers")[0] == 404
    assert not list((tmp_path / "data").glob(".worker-*"))
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    assert all("riffle_actors.server" not in Path(f"/proc/{c}/cmdline").read_text()
               for c in children.read_text().split()), "no worker process"
