"""Issue 8 on the coordinator: listeners, authenticated admin HTTP, heartbeat validation and admission.

Against a real in-process ``Coordinator`` (ports 0, listeners on loopback) and, for start-up
failures, the real ``python -m riffle_actors.coordinator`` process:

- the decommission endpoint answers 403 + reason with no credentials configured, 401 for
  missing or wrong ones, and works with the right Bearer token or Basic credentials;
- every bad heartbeat of the finding is refused (INVALID_REQUEST + the field) and the server
  never shows in ``/api/servers`` nor in an assignment; an id claimed from a second address is
  refused and logged once as a conflict; the registry caps hold;
- a port in use or an unusable credential stops the daemon with one line naming the config key.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from loguru import logger

from riffle_actors.runtime import ManualClock
from riffle_actors.coordinator.config import CoordinatorConfig
from riffle_actors.coordinator_server import Coordinator
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ADMIN_ENV = ("RIFFLE_ADMIN_TOKEN", "RIFFLE_ADMIN_USER", "RIFFLE_ADMIN_PASSWORD")
TOKEN = "test-admin-token-0123456789"
USER, PASSWORD = "ops", "basic-password-0123"
GOOD = "127.0.0.1-19991"


@pytest.fixture(autouse=True)
def _no_admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ADMIN_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{level} {message}")
    try:
        yield lines
    finally:
        logger.remove(sink)


def make_config(**kw: Any) -> CoordinatorConfig:
    data: dict[str, Any] = {
        "grpc_port": 0,
        "grpc_bind_address": "127.0.0.1",
        "http_port": 0,
        "http_bind_address": "127.0.0.1",
        "client_conf": {"rss.storage.type": "MEMORY_LOCALFILE"},
    }
    data.update(kw)
    return CoordinatorConfig.model_validate(data)


def beat(i: int = 1, *, sid: str | None = None, ip: str | None = None, port: int | None = None,
         **kw: Any) -> pb.ShuffleServerHeartBeatRequest:
    """Server ``i``'s heartbeat (``127.0.0.<i>:1999<i>``, id ``<ip>-<port>``); ``kw`` overrides fields."""
    ip = ip if ip is not None else f"127.0.0.{i}"
    port = port if port is not None else 19990 + i
    fields: dict[str, Any] = {"usedMemory": 10, "availableMemory": 1 << 30, "tags": ["ss_v5", "GRPC"]}
    fields.update(kw)
    sid = sid if sid is not None else f"{ip}-{port}"
    server = pb.ShuffleServerId(id=sid, ip=ip, port=port, jetty_port=20010)
    return pb.ShuffleServerHeartBeatRequest(serverId=server, **fields)


@dataclass
class Harness:
    coordinator: Coordinator
    stub: Any
    http: aiohttp.ClientSession

    async def heartbeat(self, req: pb.ShuffleServerHeartBeatRequest) -> Any:
        return await self.stub.heartbeat(req)

    async def get(self, path: str) -> Any:
        async with self.http.get(path) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()

    async def server_ids(self) -> list[str]:
        return [s["id"] for s in await self.get("/api/servers")]

    async def status_of(self, sid: str) -> str:
        return str((await self.get(f"/api/servers/{sid}"))["status"])

    async def post_status(self, sid: str, status: str, headers: dict[str, str] | None = None) -> Any:
        """POST a status override; returns (HTTP status, (JSON body, response headers))."""
        body = {"status": status}
        async with self.http.post(f"/api/servers/{sid}/status", json=body, headers=headers) as resp:
            return resp.status, (await resp.json(), resp.headers)

    async def assigned(self) -> set[tuple[str, str, int]]:
        """Servers of a 12-partition shuffle as (id, ip, port); empty when the assignment fails."""
        resp = await self.stub.getShuffleAssignments(
            pb.GetShuffleServerRequest(
                applicationId="app_1", partitionNum=12, dataReplica=1, requireTags=["ss_v5"]
            )
        )
        return {(s.id, s.ip, s.port) for a in resp.assignments for s in a.server}


@asynccontextmanager
async def running(cfg: CoordinatorConfig) -> AsyncIterator[Harness]:
    clock = ManualClock(start=1000.0, wall_start=1_800_000_000.0)  # nobody expires unless a test advances it
    async with (
        Coordinator(cfg, clock=clock) as c,
        grpc.aio.insecure_channel(f"{cfg.grpc_bind_address}:{c.grpc_port}") as channel,
        aiohttp.ClientSession(base_url=f"http://{cfg.http_bind_address}:{c.http_port}") as http,
    ):
        yield Harness(c, pb_grpc.CoordinatorServerStub(channel), http)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


BEARER = {"Authorization": f"Bearer {TOKEN}"}


# ----------------------------------------------------------------------------- admin HTTP


async def test_decommission_is_refused_with_the_reason_when_no_credentials_are_configured() -> None:
    async with running(make_config()) as h:
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS
        for headers in (None, BEARER, basic(USER, PASSWORD)):
            status, (body, _) = await h.post_status(GOOD, "DECOMMISSIONING", headers)
            assert status == 403
            assert "no credentials are configured" in body["error"] and "RIFFLE_ADMIN_TOKEN" in body["error"]
        assert await h.status_of(GOOD) == "ACTIVE"
        assert await h.server_ids() == [GOOD]  # read-only endpoints stay open
        assert (await h.get("/api/health"))["status"] == "ok"


async def test_missing_or_wrong_credentials_get_401() -> None:
    cfg = make_config(admin={"token": TOKEN, "basic_user": USER, "basic_password": PASSWORD})
    async with running(cfg) as h:
        await h.heartbeat(beat(1))
        wrong = [
            None,
            {"Authorization": "Bearer wrong-token-0123456789"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": TOKEN},
            basic(USER, "wrong-password-0123"),
            basic("root", PASSWORD),
            {"Authorization": "Basic not-base64!"},
        ]
        for headers in wrong:
            status, (body, resp_headers) = await h.post_status(GOOD, "DECOMMISSIONING", headers)
            assert status == 401, headers
            assert "credentials required" in body["error"] and "Bearer" in resp_headers["WWW-Authenticate"]
        assert await h.status_of(GOOD) == "ACTIVE"


async def test_the_right_bearer_token_or_basic_credentials_change_the_status() -> None:
    cfg = make_config(admin={"token": TOKEN, "basic_user": USER, "basic_password": PASSWORD})
    async with running(cfg) as h:
        await h.heartbeat(beat(1))
        await h.heartbeat(beat(2))
        status, (body, _) = await h.post_status(GOOD, "DECOMMISSIONING", BEARER)
        assert status == 200 and body["status"] == "DECOMMISSIONING"
        assert await h.status_of(GOOD) == "DECOMMISSIONING"
        assert {s[0] for s in await h.assigned()} == {"127.0.0.2-19992"}
        status, (body, _) = await h.post_status(GOOD, "ACTIVE", basic(USER, PASSWORD))
        assert status == 200 and body["status"] == "ACTIVE"
        assert await h.status_of(GOOD) == "ACTIVE"


# ----------------------------------------------------------------------------- heartbeat validation

BAD_HEARTBEATS = {
    "shell in ip": (beat(sid="evil-1", ip="127.0.0.1; rm -rf", port=19999), "serverId.ip"),
    "hostname ip": (beat(sid="evil-2", ip="evil.example.com", port=19999), "serverId.ip"),
    "wildcard ip": (beat(sid="evil-3", ip="0.0.0.0", port=19999), "serverId.ip"),
    "port 70000": (beat(sid="evil-4", port=70000), "serverId.port"),
    "port 0": (beat(sid="evil-5", port=0), "serverId.port"),
    "negative used memory": (beat(5, usedMemory=-1), "usedMemory"),
    "negative available memory": (beat(5, availableMemory=-(10**12)), "availableMemory"),
    "negative pre-allocated memory": (beat(5, preAllocatedMemory=-5), "preAllocatedMemory"),
    "negative events": (beat(5, eventNumInFlush=-3), "eventNumInFlush"),
    "negative disk": (beat(5, storageInfo={"/d": pb.StorageInfo(capacity=-1)}), "storageInfo"),
    "too many tags": (beat(5, tags=["ss_v5", "GRPC", *(f"t{i}" for i in range(63))]), "tags"),
    "huge tag": (beat(5, tags=["ss_v5", "GRPC", "x" * 100_000]), "tags[2]"),
    "control characters in a tag": (beat(5, tags=["ss_v5", "GRPC\n[fake] log line"]), "tags[1]"),
    "huge id": (beat(5, sid="i" * 1000), "serverId.id"),
    "id of another address": (beat(5, sid=GOOD), "serverId.id"),
    "too many disks": (beat(5, storageInfo={f"/d{i}": pb.StorageInfo() for i in range(300)}), "storageInfo"),
}


@pytest.mark.parametrize("name", list(BAD_HEARTBEATS))
async def test_a_bad_heartbeat_is_refused_and_never_registered(name: str, log_lines: list[str]) -> None:
    req, field = BAD_HEARTBEATS[name]
    async with running(make_config()) as h:
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS
        good = {(GOOD, "127.0.0.1", 19991)}
        assert await h.assigned() == good
        for _ in range(2):
            resp = await h.heartbeat(req)
            assert resp.status == pb.INVALID_REQUEST
            assert resp.retMsg.startswith(f"invalid heartbeat: {field}"), resp.retMsg
            assert len(resp.retMsg) < 600 and "\n" not in resp.retMsg
        assert await h.server_ids() == [GOOD]
        assert await h.assigned() == good
        health = await h.get("/api/health")
        assert health["servers"] == 1 and health["heartbeats_refused"] == {"invalid": 2}
    refusals = [line for line in log_lines if "refused heartbeat from 127.0.0.1" in line]
    assert len(refusals) == 1 and field in refusals[0]  # a repeat of the same refusal is not logged again
    assert not any("\n" in line.rstrip("\n") for line in refusals)


async def test_a_server_claiming_a_terabyte_of_free_memory_is_not_invalid() -> None:
    async with running(make_config()) as h:
        resp = await h.heartbeat(beat(7, availableMemory=10**12))
        assert resp.status == pb.SUCCESS
        assert await h.server_ids() == ["127.0.0.7-19997"]


# ----------------------------------------------------------------------------- id conflicts and caps


async def test_an_id_claimed_from_a_second_address_is_refused_and_logged_once(log_lines: list[str]) -> None:
    async with running(make_config()) as h:
        assert (await h.heartbeat(beat(1, sid="shuffle-a"))).status == pb.SUCCESS
        for _ in range(3):
            resp = await h.heartbeat(beat(2, sid="shuffle-a", availableMemory=10**12))
            assert resp.status == pb.ACCESS_DENIED
            assert "shuffle-a is registered from 127.0.0.1:19991" in resp.retMsg
            assert "not 127.0.0.2:19992" in resp.retMsg
            assert (await h.heartbeat(beat(1, sid="shuffle-a"))).status == pb.SUCCESS  # the holder goes on
        [server] = await h.get("/api/servers")
        assert (server["id"], server["ip"], server["grpc_port"], server["peer_host"]) == (
            "shuffle-a", "127.0.0.1", 19991, "127.0.0.1"
        )
        assert await h.assigned() == {("shuffle-a", "127.0.0.1", 19991)}
        health = await h.get("/api/health")
        assert health["server_id_conflicts"] == 1 and health["heartbeats_refused"] == {"id_conflict": 3}
    conflicts = [line for line in log_lines if "server id conflict" in line]
    assert len(conflicts) == 1
    assert conflicts[0].startswith("WARNING")
    assert "127.0.0.1:19991" in conflicts[0] and "127.0.0.2:19992" in conflicts[0]


async def test_a_flood_of_fake_ids_stops_at_the_registry_cap(log_lines: list[str]) -> None:
    async with running(make_config(server={"max_servers": 3})) as h:
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS  # the real server
        refused = 0
        for i in range(20):
            fake = beat(sid=f"fake-{i}", ip=f"10.66.0.{i + 1}", port=19999, availableMemory=10**12)
            resp = await h.heartbeat(fake)
            if resp.status != pb.SUCCESS:
                assert resp.status == pb.ACCESS_DENIED and "registry is full" in resp.retMsg
                assert "[server] max_servers" in resp.retMsg
                refused += 1
        assert refused == 18
        ids = await h.server_ids()
        assert len(ids) == 3 and GOOD in ids
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS  # a registered server keeps heartbeating
        assert (GOOD, "127.0.0.1", 19991) in await h.assigned()
        health = await h.get("/api/health")
        assert health["max_servers"] == 3 and health["heartbeats_refused"] == {"registry_full": 18}
    assert len([line for line in log_lines if "server registry full" in line]) == 1


async def test_ids_registered_from_one_source_host_are_capped() -> None:
    async with running(make_config(server={"max_servers_per_host": 2})) as h:
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS
        assert (await h.heartbeat(beat(2))).status == pb.SUCCESS
        resp = await h.heartbeat(beat(3))
        assert resp.status == pb.ACCESS_DENIED
        assert "already registered from 127.0.0.1" in resp.retMsg and "max_servers_per_host" in resp.retMsg
        assert await h.server_ids() == [GOOD, "127.0.0.2-19992"]


async def test_heartbeats_from_outside_the_allowed_networks_are_refused() -> None:
    async with running(make_config(server={"allowed_networks": ["10.0.0.0/8"]})) as h:
        resp = await h.heartbeat(beat(1))
        assert resp.status == pb.ACCESS_DENIED and "source 127.0.0.1 is not in" in resp.retMsg
        assert await h.server_ids() == []
    async with running(make_config(server={"allowed_networks": ["127.0.0.0/8"]})) as h:
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS
        resp = await h.heartbeat(beat(sid="", ip="10.0.0.1", port=19999))
        assert resp.status == pb.ACCESS_DENIED and "advertised address 10.0.0.1" in resp.retMsg
        assert await h.server_ids() == [GOOD]
        assert (await h.get("/api/health"))["heartbeats_refused"] == {"source_not_allowed": 1}


# ----------------------------------------------------------------------------- listeners


def _refused(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.connect((host, port))
        except ConnectionRefusedError:
            return True
    return False


async def test_listeners_bind_exactly_the_configured_addresses() -> None:
    cfg = make_config(grpc_bind_address="127.0.0.2", http_bind_address="127.0.0.3")
    async with running(cfg) as h:
        assert (await h.heartbeat(beat(1))).status == pb.SUCCESS  # via 127.0.0.2
        assert await h.server_ids() == [GOOD]  # via 127.0.0.3
        grpc_port, http_port = h.coordinator.grpc_port, h.coordinator.http_port
        assert _refused("127.0.0.1", grpc_port) and _refused("127.0.0.3", grpc_port)
        assert _refused("127.0.0.1", http_port) and _refused("127.0.0.2", http_port)


# ----------------------------------------------------------------------------- the daemon


def _run_daemon(tmp_path: Path, config: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the coordinator binary until it exits; returns (exit code, stderr, log file)."""
    cfg = tmp_path / "coordinator.toml"
    log = tmp_path / "coordinator.log"
    cfg.write_text(f'{config}\n[log]\npath = "{log}"\n')
    base = {k: v for k, v in os.environ.items() if k not in ADMIN_ENV}
    base["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "riffle_actors.coordinator", "--config", str(cfg)],
        env={**base, **(env or {})}, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    return proc.returncode, proc.stderr, log.read_text() if log.exists() else ""


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test holds (listening) for its whole duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_in_use_stops_the_daemon_with_one_line_naming_its_keys(
    tmp_path: Path, held_port: int, which: str
) -> None:
    other = "http" if which == "grpc" else "grpc"
    config = (
        f'{which}_port = {held_port}\n{which}_bind_address = "127.0.0.1"\n'
        f'{other}_port = 0\n{other}_bind_address = "127.0.0.1"\n'
    )
    code, stderr, log = _run_daemon(tmp_path, config)
    assert code == 1, stderr
    for output in (stderr, log):
        assert "Traceback" not in output
        [line] = [line for line in output.splitlines() if "cannot listen" in line]
        assert f"127.0.0.1:{held_port}" in line and f"config keys {which}_port / {which}_bind_address" in line
        assert "address already in use" in line and "riffle-coordinator failed" in line


def test_unusable_admin_credentials_stop_the_daemon_with_exit_2(tmp_path: Path) -> None:
    ports = "grpc_port = 0\nhttp_port = 0\n"
    code, stderr, _ = _run_daemon(tmp_path, ports + '[admin]\ntoken_file = "absent.token"\n')
    assert code == 2 and "admin.token_file: cannot read" in stderr and "Traceback" not in stderr
    code, stderr, _ = _run_daemon(tmp_path, ports, env={"RIFFLE_ADMIN_TOKEN": "short"})
    assert code == 2 and "RIFFLE_ADMIN_TOKEN" in stderr and "16 characters" in stderr
    assert "Traceback" not in stderr
