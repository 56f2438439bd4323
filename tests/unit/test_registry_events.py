"""The coordinator's pure registries return what an operator should read as events, and never log.

``ClusterRegistry`` / ``AppRegistry`` (riffle_actors.coordinator.cluster / apps) append a
``RegistryEvent`` per decision; the owning actor (coordinator.actors) takes and logs them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loguru import logger

from riffle_actors.coordinator.actors import (
    AppRegistryActor,
    ClusterActor,
    ExpireServers,
    ListServers,
    RecordHeartbeat,
)
from riffle_actors.coordinator.apps import AppRegistry
from riffle_actors.coordinator.cluster import ClusterRegistry, HeartbeatRefused, ServerStatus
from riffle_actors.runtime import ActorSystem, ManualClock
from tests.helpers.registry import hb


@pytest.fixture
def log() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip("\n")), level="DEBUG", format="{level} {message}")
    yield lines
    logger.remove(sink)


def kinds(reg: ClusterRegistry | AppRegistry) -> list[str]:
    return [e.kind for e in reg.take_events()]


def test_registry_decisions_come_back_as_events_and_nothing_is_logged(log: list[str]) -> None:
    clock = ManualClock()
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30, capacity=2)
    reg.heartbeat(hb(1), peer_host="10.0.0.1")
    reg.heartbeat(hb(1, status=ServerStatus.DECOMMISSIONED), peer_host="10.0.0.1")
    reg.heartbeat(hb(2), peer_host="10.0.0.2")
    with pytest.raises(HeartbeatRefused):
        reg.heartbeat(hb(3), peer_host="10.0.0.3")
    with pytest.raises(HeartbeatRefused):
        reg.heartbeat(hb(3), peer_host="10.0.0.3")  # the full registry is reported once
    reg.set_operator_status("10.0.0.2-19999", ServerStatus.DECOMMISSIONING)
    reg.set_excluded({"10.0.0.2-19999"})
    clock.advance(31)
    assert reg.expire() == ["10.0.0.1-19999", "10.0.0.2-19999"]
    events = reg.take_events()
    assert [e.kind for e in events] == ["registered", "status", "registered", "registry_full", "operator_status",
                                        "excluded", "lost", "lost"]
    assert events[1].message == "server 10.0.0.1-19999 announced that it is stopping: no new assignments"
    assert events[3].level == "WARNING" and "[server] max_servers" in events[3].message
    assert reg.take_events() == []  # taken once

    apps = AppRegistry(clock=clock, heartbeat_timeout_s=60)
    apps.register("app-1")
    clock.advance(61)
    apps.expire()
    assert [(e.kind, e.message) for e in apps.take_events()] == [
        ("app_registered", "app app-1 registered"), ("app_expired", "app app-1 expired: no heartbeat for 60s")]
    assert log == []  # pure: the registries wrote nothing


async def test_the_owning_actors_log_the_events_even_when_the_message_is_refused(log: list[str]) -> None:
    clock = ManualClock()
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30, capacity=1)
    system = ActorSystem(clock=clock)
    try:
        cluster = await system.spawn(ClusterActor(reg))
        await system.spawn(AppRegistryActor(AppRegistry(clock=clock, heartbeat_timeout_s=60)))
        await cluster.ask(RecordHeartbeat(heartbeat=hb(1), peer_host="10.0.0.1"))
        with pytest.raises(HeartbeatRefused):
            await cluster.ask(RecordHeartbeat(heartbeat=hb(2), peer_host="10.0.0.2"))
        clock.advance(31)
        await cluster.tell(ExpireServers())
        assert await cluster.ask(ListServers()) == []
    finally:
        await system.stop_all()
    assert "INFO server 10.0.0.1-19999 registered (10.0.0.1:19999, tags ['GRPC', 'ss_v5'], from 10.0.0.1)" in log
    assert any(line.startswith("WARNING server registry full (1 servers") for line in log), log
    assert "WARNING server 10.0.0.1-19999 lost: no heartbeat for 30s" in log
