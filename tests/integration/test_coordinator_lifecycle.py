"""The coordinator's composition root (riffle_actors.coordinator_server): timers, ordered start, rollback.

In process, port 0, a ManualClock: its periodic work (server and app expiry, the exclude-file
poll) runs on the runtime's TimerActor and no task of it sleeps; a start that fails half-way
stops what it started; ``/api/health`` and ``/api/coordinator/info`` keep their JSON shapes now that
the service layer (coordinator.admin) builds them.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from riffle_actors.coordinator.config import CoordinatorConfig
from riffle_actors.coordinator_server import Coordinator
from riffle_actors.runtime import FireDue, ManualClock
from tests.helpers import leftover_tasks, poll_until
from tests.helpers.registry import hb

pytestmark = pytest.mark.integration


def make_config(**kw: Any) -> CoordinatorConfig:
    data: dict[str, Any] = {"grpc_port": 0, "grpc_bind_address": "127.0.0.1", "http_port": 0,
                            "http_bind_address": "127.0.0.1"}
    data.update(kw)
    return CoordinatorConfig.model_validate(data)


def sleeping_frames() -> list[str]:
    """Frames of this package's code that some task of the loop is suspended in and that sleep."""
    out = []
    for task in asyncio.all_tasks():
        for frame in task.get_stack():
            code = frame.f_code
            if "riffle_actors" in code.co_filename and ("sleep" in code.co_name or code.co_name == "_ticker"):
                out.append(f"{task.get_name()}: {code.co_filename}:{code.co_name}")
    return out


async def test_periodic_work_runs_on_the_timer_and_no_task_of_the_coordinator_sleeps(tmp_path: Path) -> None:
    clock = ManualClock(start=1000.0, wall_start=1_800_000_000.0)
    exclude = tmp_path / "exclude"
    exclude.write_text("10.0.0.2-19999\n")
    cfg = make_config(exclude_nodes_file=str(exclude), exclude_nodes_check_interval_sec=5,
                      expiry_check_interval_sec=10)
    async with Coordinator(cfg, clock=clock) as c:
        assert sleeping_frames() == []
        assert c.service is not None and c.timer_ref is not None
        # the file was read before the first heartbeat was taken
        for i in (1, 2):
            await c.service.server_heartbeat(hb(i), "127.0.0.1")
        assert [(v.node.id, v.excluded) for v in await c.service.list_servers()] == [
            ("10.0.0.1-19999", False), ("10.0.0.2-19999", True)]
        await c.service.register_app("application_1_0001")

        clock.advance(25)
        await c.service.server_heartbeat(hb(2), "127.0.0.1")
        clock.advance(6)  # server 1 silent for 31 s > heartbeat_timeout_sec (30); expiry due at 30
        assert await c.timer_ref.ask(FireDue()) >= 3  # every tell due has been sent (FIFO after it)
        assert [v.node.id for v in await c.service.list_servers()] == ["10.0.0.2-19999"]

        exclude.write_text("# nobody\n")
        clock.advance(5)
        await c.timer_ref.ask(FireDue())  # the poll reads the file in a thread, then applies it
        await poll_until(lambda: _excluded(c, set()))

        clock.advance(30)  # the app silent 66 s > [app] heartbeat_timeout_sec (60)
        await c.timer_ref.ask(FireDue())
        assert [a.app_id for a in await c.service.list_apps(historical=True)] == ["application_1_0001"]
        assert sleeping_frames() == []
    assert leftover_tasks() == set()


async def _excluded(c: Coordinator, want: set[str]) -> bool:
    assert c.service is not None
    return {v.node.id for v in await c.service.list_servers() if v.excluded} == want


async def test_a_start_that_fails_half_way_stops_what_it_started_in_reverse_order() -> None:
    with socket.socket() as held:  # the HTTP port is taken: the fourth step fails
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        c = Coordinator(make_config(http_port=busy), clock=ManualClock())
        with pytest.raises(OSError, match="http_port"):
            await c.start()
        assert c.grpc_port != 0  # gRPC had started ...
        with socket.socket() as probe:  # ... and was closed again
            probe.bind(("127.0.0.1", c.grpc_port))
        assert c.system.children() == {}  # the actors are stopped
        await c.stop()  # idempotent after a failed start
    assert leftover_tasks() == set()


async def test_health_and_info_keep_their_json_shapes() -> None:
    clock = ManualClock(start=1000.0, wall_start=1_800_000_000.0)
    async with Coordinator(make_config(), clock=clock) as c:
        assert c.service is not None
        await c.service.server_heartbeat(hb(1), "127.0.0.1")
        clock.advance(1.25)
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{c.http_port}") as http:
            async with http.get("/api/health") as resp:
                health = await resp.json()
            async with http.get("/api/coordinator/info") as resp:
                info = (await resp.json())["data"]
    assert list(health) == ["status", "servers", "active_servers", "apps", "uptime_s", "version", "rpc_calls",
                            "max_servers", "server_id_conflicts", "heartbeats_refused", "requests_refused"]
    assert (health["status"], health["servers"], health["active_servers"], health["apps"]) == ("ok", 1, 1, 0)
    assert health["uptime_s"] == 1.25 and health["max_servers"] == 10_000
    assert info == {"coordinatorId": f"127.0.0.1-{c.grpc_port}", "serverIp": "127.0.0.1",
                    "serverPort": str(c.grpc_port), "serverWebPort": str(c.http_port),
                    "version": info["version"], "gitCommitId": "", "startTime": 1_800_000_000_000}


async def test_the_metrics_push_runs_on_the_timer_first_at_once_then_every_push_interval() -> None:
    """``[metrics] push_gateway_endpoint``: a PeriodicJobActor the timer wakes; no pushing task sleeps."""
    from aiohttp import web

    pushes: list[str] = []

    async def put(request: web.Request) -> web.Response:
        body = await request.text()
        pushes.append(request.path if "riffle_coordinator_servers" in body else "no metrics in the body")
        return web.Response(status=200)

    app = web.Application()
    app.router.add_route("PUT", "/{tail:.*}", put)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    clock = ManualClock()
    cfg = make_config(metrics={"push_gateway_endpoint": f"http://127.0.0.1:{port}", "push_interval_sec": 30})
    try:
        async with Coordinator(cfg, clock=clock) as c:
            assert c.timer_ref is not None and c.pusher is not None
            await poll_until(lambda: c.pusher is not None and c.pusher.pushes == 1)  # the first push is done
            assert pushes[0].startswith("/metrics/job/riffle-coordinator/instance/127.0.0.1:")
            assert sleeping_frames() == []
            clock.advance(29)
            await c.timer_ref.ask(FireDue())
            assert len(pushes) == 1 and c.pusher.pushes == 1
            clock.advance(1)
            await c.timer_ref.ask(FireDue())
            await poll_until(lambda: c.pusher is not None and c.pusher.pushes == 2)
            assert len(pushes) == 2
    finally:
        await runner.cleanup()
    assert leftover_tasks() == set()
