"""The pure parts behind riffle-ctl and the coordinator's operator features: operator tags and kill
in the server registry, the server's lifecycle (decommission, kill), app counts, pipeline input, SQL error messages, index checks, the
Pushgateway pusher's failure accounting and the coordinator's metrics text."""

from __future__ import annotations

import socket
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from riffle_actors.actors.heartbeat import HeartbeatSnapshot
from riffle_actors.config import MetricsConfig
from riffle_actors.coordinator.apps import AppRegistry, AppStats
from riffle_actors.coordinator.assignment import AssignmentError, AssignmentRequest
from riffle_actors.coordinator.cluster import ClusterRegistry, ServerStatus
from riffle_actors.coordinator.metrics import CoordinatorMetrics
from riffle_actors.ctl import inspect_file, output, tables
from riffle_actors.metrics_push import MetricsPusher
from riffle_actors.protocol.index import IndexEntry, encode_index
from riffle_actors.runtime import ActorSystem, FireDue, ManualClock, TimerActor
from tests.helpers import poll_until
from tests.helpers.registry import TAGS, hb


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def actors(clock: ManualClock) -> AsyncIterator[ActorSystem]:
    """An ActorSystem on the clock with its ``timer`` (where a decommission's watch runs)."""
    system = ActorSystem(clock=clock)
    await system.spawn(TimerActor(), name="timer")
    yield system
    await system.stop_all()


async def _fire_due(system: ActorSystem) -> None:
    """Everything the timer has due is told (the barrier after ``clock.advance``)."""
    timer = system.get("timer")
    assert timer is not None
    await timer.ask(FireDue())


@pytest.fixture
def reg(clock: ManualClock) -> ClusterRegistry:
    return ClusterRegistry(clock=clock, heartbeat_timeout_s=30)


def test_operator_tags_are_matched_and_survive_expiry(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    reg.set_operator_tags("10.0.0.2-19999", add=["ssd"])
    assert [n.id for n in reg.candidates(require_tags=["ssd"])] == ["10.0.0.2-19999"]
    view = next(v for v in reg.views() if v.node.id == "10.0.0.2-19999")
    assert view.tags == TAGS | {"ssd"} and view.operator_tags == {"ssd"}
    clock.advance(31)
    reg.expire()
    reg.heartbeat(hb(2))  # back after expiry: the operator's tag is still there
    assert [n.id for n in reg.candidates(require_tags=["ssd"])] == ["10.0.0.2-19999"]
    with pytest.raises(ValueError, match="reported by server 10.0.0.2-19999 itself"):
        reg.set_operator_tags("10.0.0.2-19999", remove=["GRPC"])
    reg.set_operator_tags("10.0.0.2-19999", remove=["ssd"])
    with pytest.raises(AssignmentError, match="no server offers ssd"):
        reg.assign(AssignmentRequest(partition_num=1), require_tags=["ssd"])


def test_kill_is_decommissioned_until_cancelled(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1))
    reg.set_operator_status("10.0.0.1-19999", ServerStatus.DECOMMISSIONED)
    assert reg.views()[0].status is ServerStatus.DECOMMISSIONED and reg.candidates() == []
    reg.set_operator_status("10.0.0.1-19999", ServerStatus.ACTIVE)
    assert reg.views()[0].status is ServerStatus.ACTIVE
    with pytest.raises(ValueError):
        reg.set_operator_status("10.0.0.1-19999", ServerStatus.LOST)


def test_views_carry_the_heartbeat_age(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    clock.advance(7.5)
    assert reg.views()[0].heartbeat_age_s == pytest.approx(7.5)


def test_app_registry_counts(clock: ManualClock) -> None:
    apps = AppRegistry(clock=clock, heartbeat_timeout_s=10, history_size=1)
    apps.register("a")
    apps.register("b")
    apps.heartbeat("a")
    clock.advance(11)
    apps.register("c")
    apps.expire()
    assert apps.stats() == AppStats(active=1, historical=1, expired_total=2, registered_total=3, refused_total=0)


@pytest.mark.parametrize("text", [
    '{"ip": "10.0.0.1", "http_port": 19998, "id": "s1"}\n{"ip": "10.0.0.2", "http_port": 19998}\n',
    ('[{"ip": "10.0.0.1", "http_port": 19998}, {"ip": "10.0.0.2", "http_port": "19998"}, '
    '{"ip": "10.0.0.1", "http_port": 19998}]'),
    "[\n{\"ip\": \"10.0.0.1\", \"http_port\": 19998},\n{\"ip\": \"10.0.0.2\", \"http_port\": 19998}\n]\n",
    "ip,http_port,status\n10.0.0.1,19998,UNHEALTHY\n10.0.0.2,19998,UNHEALTHY\n",
])
def test_pipeline_input_formats(text: str) -> None:
    targets = output.read_targets(text)
    assert [(t["ip"], t["http_port"]) for t in targets] == [("10.0.0.1", 19998), ("10.0.0.2", 19998)]


def test_pipeline_input_without_targets() -> None:
    assert output.read_targets("") == [] and output.read_targets("[]") == []
    with pytest.raises(ValueError, match="needs ip and http_port.*'status'"):
        output.read_targets('{"status": "ACTIVE"}')
    with pytest.raises(ValueError, match="needs ip and http_port"):
        output.read_targets('{"ip": "10.0.0.1", "http_port": 0}')
    with pytest.raises(ValueError, match="neither JSON lines nor JSON"):
        output.read_targets("{nope")


def test_json_output_is_json_lines() -> None:
    import io as io_

    out = io_.StringIO()
    output.render(["ip", "http_port"], [("10.0.0.1", 1), ("10.0.0.2", 2)], "json", out)
    assert out.getvalue() == '{"ip": "10.0.0.1", "http_port": 1}\n{"ip": "10.0.0.2", "http_port": 2}\n'


def test_the_bench_throttle_is_the_servers_disk_throttle(tmp_path, monkeypatch) -> None:
    from riffle_actors.actors import disk
    from riffle_actors.ctl.bench import run_append

    for bad, why in ((0, "needs --disk-throughput"), (-5, "must be positive")):
        with pytest.raises(ValueError, match=why):
            run_append(str(tmp_path), concurrency=1, batch_number=1, write_size=4096, disk_throughput=bad,
                       throttle=True)
    charged: list[tuple[str, int]] = []
    real_wait = disk.DiskThrottle.wait

    def counting_wait(self, op: str, n: int) -> float:
        charged.append((op, n))
        return real_wait(self, op, n)

    monkeypatch.setattr(disk.DiskThrottle, "wait", counting_wait)
    run_append(str(tmp_path), concurrency=2, batch_number=3, write_size=4096, disk_throughput=1 << 30, throttle=True)
    assert charged == [("write", 4096)] * 6  # every batch of every writer through the io_limiter bucket


def test_service_tags_keep_the_builtin_ones() -> None:
    from riffle_actors.decommission import ServiceTags, TagError

    tags = ServiceTags(["ssd", "GRPC"])
    assert tags.current == ("ssd",)  # built-in tags are the heartbeat's, not held here
    tags.update(["a1", "a2", "ss_v5"])
    tags.add("a3")
    tags.delete("a1")
    assert tags.current == ("a2", "a3")
    for builtin in ("GRPC", "ss_v4", "ss_v5", "GRPC_NETTY"):
        with pytest.raises(TagError, match="built-in tag"):
            tags.delete(builtin)
    with pytest.raises(TagError, match="has no tag 'nope'"):
        tags.delete("nope")
    with pytest.raises(TagError, match="printable"):
        tags.add("x" * 200)
    with pytest.raises(TagError, match="too many tags"):
        tags.update([f"t{i}" for i in range(65)])
    assert tags.current == ("a2", "a3")


async def test_lifecycle_update_state_in_riffles_names(actors: ActorSystem) -> None:
    from riffle_actors.decommission import Lifecycle

    announced: list[str] = []

    async def announce() -> None:
        announced.append(life.riffle_state)

    life = Lifecycle(apps={"app-1": object()}, system=actors, check_interval_s=5.0, request_stop=lambda: None,
                     announce=announce, tags=("rack1",))
    snap = HeartbeatSnapshot(ip="10.0.0.1", grpc_port=1)
    assert life.heartbeat_status(snap).tags == ("rack1",) and life.riffle_state == "ACTIVE"
    assert (await life.update_state("unhealthy")).message == "ACTIVE -> UNHEALTHY"
    sent = life.heartbeat_status(snap)
    assert (sent.status, sent.is_healthy, announced) == ("UNHEALTHY", False, ["UNHEALTHY"])
    assert (await life.update_state("unhealthy")).ok and announced == ["UNHEALTHY"]  # no change, no round
    assert (await life.update_state("HEALTHY")).message == "UNHEALTHY -> ACTIVE"
    assert life.heartbeat_status(snap).status == "ACTIVE" and life.heartbeat_status(snap).is_healthy
    await life.update_state("decommissioning")
    assert life.riffle_state == "DECOMMISSIONING"
    await life.update_state("active")  # Riffle's single state: ACTIVE ends the decommission too
    assert life.riffle_state == "ACTIVE" and life.state.value == "ACTIVE"
    with pytest.raises(ValueError, match="one of: ACTIVE, DECOMMISSIONING, CANCEL_DECOMMISSION"):
        await life.update_state("sleepy")
    refused = await life.kill(force=False)
    assert not refused.ok and "still 1 app(s)" in refused.message and life.state.value == "ACTIVE"
    assert (await life.kill(force=True)).ok and life.riffle_state == "DECOMMISSIONED"


def test_query_errors_name_the_table_or_column() -> None:
    rows = {"instances": [{"id": "s1", "status": "ACTIVE", "tags": ["a", "b"], "disks": [{"capacity": 10,
                                                                                          "used_bytes": 4}]}]}
    names, result = tables.run_query("select id, tags, disk_capacity, disk_used, status from instances",
                                     lambda t: rows.get(t, []))
    assert names == ["id", "tags", "disk_capacity", "disk_used", "status"]
    assert result == [("s1", "a,b", 10, 4, "ACTIVE")]
    with pytest.raises(tables.QueryError, match="unknown table 'apps': the tables are instances, active_apps"):
        tables.run_query("select * from apps", lambda t: [])
    with pytest.raises(tables.QueryError, match=r"unknown column 'nme'\. Columns of active_apps: app_id"):
        tables.run_query("select nme from active_apps", lambda t: [])
    assert tables.run_query("select count(*) from historical_apps", lambda t: []) == (["count_star()"], [(0,)])


def _files(tmp_path: Path, blocks: list[bytes], *, torn: bytes = b"", gap: int = 0) -> tuple[Path, Path]:
    entries, offset = [], 0
    for i, b in enumerate(blocks):
        entries.append(IndexEntry(offset, len(b), len(b), zlib.crc32(b), i, 0))
        offset += len(b) + (gap if i == 0 else 0)
    index, data = tmp_path / "p.index", tmp_path / "p.data"
    index.write_bytes(encode_index(entries) + torn)
    data.write_bytes(blocks[0] + b"\0" * gap + b"".join(blocks[1:]))
    return index, data


def test_inspect_reports_torn_tails_and_gaps(tmp_path: Path) -> None:
    index, data = _files(tmp_path, [b"a" * 10, b"b" * 20])
    assert inspect_file.inspect(str(index), str(data)).ok
    index, data = _files(tmp_path, [b"a" * 10, b"b" * 20], torn=b"xyz")
    report = inspect_file.inspect(str(index), str(data))
    assert report.torn_tail == 3 and not report.ok and "torn tail: 3 byte(s)" in report.problems[0]
    index, data = _files(tmp_path, [b"a" * 10, b"b" * 20], gap=4)
    report = inspect_file.inspect(str(index), str(data))
    assert any("record 1 starts at offset 14, the previous block ends at 10 (gap)" in p for p in report.problems)
    assert not report.bad_blocks


async def test_pusher_counts_failures_and_keeps_going(clock: ManualClock) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = CoordinatorMetrics()
    refreshed = []

    async def refresh() -> None:
        refreshed.append(1)

    pusher = MetricsPusher(MetricsConfig(push_gateway_endpoint=f"http://127.0.0.1:{port}", push_interval_sec=1),
                           registry=metrics.registry, job="riffle-coordinator", grouping={"instance": "x"},
                           refresh=refresh, clock=clock)
    assert await pusher.push_once() is False and await pusher.push_once() is False
    assert pusher.failures == 2 and pusher.pushes == 0 and len(refreshed) == 2


def test_coordinator_metrics_text() -> None:
    m = CoordinatorMetrics()
    m.snapshot.servers_by_status = {"ACTIVE": 2, "LOST": 0}
    m.snapshot.heartbeat_ages_s = [0.5, 12.0]
    m.snapshot.rpc_calls = {"heartbeat": 5}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}
    assert samples[("riffle_coordinator_servers", (("status", "ACTIVE"),))] == 2
    assert samples[("riffle_coordinator_heartbeat_lag_seconds", ())] == 12.0
    assert samples[("riffle_coordinator_heartbeat_age_seconds_bucket", (("le", "10.0"),))] == 1
    assert samples[("riffle_coordinator_heartbeat_age_seconds_count", ())] == 2
    assert samples[("riffle_coordinator_rpc_total", (("rpc", "heartbeat"),))] == 5


def test_coordinator_conf_listing_leaves_secrets_out() -> None:
    from riffle_actors.coordinator.admin import flatten_config

    items = dict(flatten_config({"admin": {"token": "s" * 20}, "grpc_port": 21000,
                                 "metrics": {"push_gateway_endpoint": "http://user:pw@gw:9091", "labels": {"a": "b"}},
                                 "server": {"allowed_networks": ["10.0.0.0/8"]}}))
    assert items == {"grpc_port": "21000", "metrics.push_gateway_endpoint": "http://***@gw:9091",
                     "metrics.labels": '{"a":"b"}', "server.allowed_networks": '["10.0.0.0/8"]'}


def test_a_drained_server_that_announces_its_stop_shows_decommissioned(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1))
    reg.set_operator_status("10.0.0.1-19999", ServerStatus.DECOMMISSIONING)
    assert reg.views()[0].status is ServerStatus.DECOMMISSIONING
    reg.heartbeat(hb(1, status=ServerStatus.DECOMMISSIONED))  # its decommission ended: it is stopping
    assert reg.views()[0].status is ServerStatus.DECOMMISSIONED and reg.candidates() == []


async def test_lifecycle_decommission_waits_for_the_last_app(clock: ManualClock, actors: ActorSystem) -> None:
    from riffle_actors.decommission import WATCH_NAME, Lifecycle

    apps: dict[str, object] = {"app-1": object()}
    stops: list[str] = []
    announced: list[str] = []

    async def announce() -> None:
        announced.append(life.state.value)

    life = Lifecycle(apps=apps, system=actors, check_interval_s=5.0, request_stop=lambda: stops.append("stop"),
                     announce=announce)
    noop = await life.cancel_decommission()  # nothing to cancel: a no-op that succeeds, as upstream
    assert noop.ok and noop.message == "nothing to cancel: the server is ACTIVE" and announced == []
    done = await life.decommission()
    assert done.ok and done.state == "DECOMMISSIONING" and done.apps == 1 and announced == ["DECOMMISSIONING"]
    assert life.heartbeat_status(HeartbeatSnapshot(ip="10.0.0.1", grpc_port=1)).status == "DECOMMISSIONING"
    again = await life.decommission()
    assert again.ok and again.message == "already decommissioning; 1 app(s) left" and len(announced) == 1
    await _fire_due(actors)
    await poll_until(lambda: life.checks == 1)  # the watch's first check, at once
    for n in range(2, 5):  # the app is still there: checks come and go, no stop
        await poll_until(lambda: clock.pending() == 1)  # the next check is scheduled
        clock.advance(4.9)
        await _fire_due(actors)
        assert life.checks == n - 1
        clock.advance(0.1)
        await _fire_due(actors)
        await poll_until(lambda n=n: life.checks == n)
        assert stops == [] and life.state.value == "DECOMMISSIONING"
    apps.clear()
    await poll_until(lambda: clock.pending() == 1)
    clock.advance(5.0)
    await _fire_due(actors)
    await poll_until(lambda: stops == ["stop"])
    assert life.state.value == "STOPPING"
    late = await life.cancel_decommission()  # too late: it is stopping
    assert not late.ok and late.message == "cannot cancel: the server is STOPPING"
    assert not (await life.decommission()).ok
    await life.close()  # the server's stop ends the watch
    assert actors.get(WATCH_NAME) is None


async def test_lifecycle_cancel_ends_the_watch_and_kill_stops_at_once(clock: ManualClock,
                                                                     actors: ActorSystem) -> None:
    from riffle_actors.decommission import WATCH_NAME, Lifecycle

    apps: dict[str, object] = {"app-1": object()}
    stops: list[str] = []
    life = Lifecycle(apps=apps, system=actors, check_interval_s=5.0, request_stop=lambda: stops.append("stop"))
    await life.decommission()
    await _fire_due(actors)
    await poll_until(lambda: life.checks == 1 and clock.pending() == 1)  # the watch checked and waits
    cancelled = await life.cancel_decommission()
    assert cancelled.ok and cancelled.state == "ACTIVE"
    assert life.heartbeat_status(HeartbeatSnapshot(ip="10.0.0.1", grpc_port=1)).status == "ACTIVE"
    assert actors.get(WATCH_NAME) is None
    assert await actors.get("timer").ask(FireDue()) == 0  # type: ignore[union-attr]  # nothing can check
    checks = life.checks
    apps.clear()
    for _ in range(3):
        clock.advance(5.0)
        await _fire_due(actors)
    assert life.checks == checks
    assert stops == [] and life.state.value == "ACTIVE"
    await life.decommission()  # a second watch, ended by the kill
    assert actors.get(WATCH_NAME) is not None
    apps["app-2"] = object()
    killed = await life.kill()
    assert killed.ok and stops == ["stop"] and killed.state == "STOPPING"
    assert actors.get(WATCH_NAME) is None
    assert (await life.kill()).message == "already stopping" and stops == ["stop"]


def test_server_start_refuses_an_unusable_admin_credential(tmp_path: Path) -> None:
    from riffle_actors.config import ConfigError
    from riffle_actors.server import _load_checked

    token_file = tmp_path / "missing-token"
    cfg = tmp_path / "server.toml"
    cfg.write_text(f'[localfile_store]\ndata_paths = ["{tmp_path}"]\n[admin]\ntoken_file = "{token_file}"\n')
    with pytest.raises(ConfigError, match="token_file"):
        _load_checked(str(cfg))


def test_the_hosts_table_groups_the_workers_of_a_host() -> None:
    servers = [
        {"id": "10.0.0.2-19999", "ip": "10.0.0.2", "grpc_port": 19999, "status": "ACTIVE", "is_healthy": True,
         "used_memory": 5, "available_memory": 10, "app_count": 1, "assigned_partitions": 3},
        {"id": "10.0.0.1-20000", "ip": "10.0.0.1", "grpc_port": 20000, "status": "DECOMMISSIONED",
         "is_healthy": True, "used_memory": 1, "available_memory": 2, "app_count": 0, "assigned_partitions": 0},
        {"id": "10.0.0.1-19999", "ip": "10.0.0.1", "grpc_port": 19999, "status": "ACTIVE", "is_healthy": False,
         "used_memory": 3, "available_memory": 4, "app_count": 2, "assigned_partitions": 7},
    ]
    _, rows = tables.run_query(
        "select ip, workers, servers, grpc_ports, active, healthy, used_memory, available_memory, app_count, "
        "assigned_partitions from hosts order by ip", lambda t: tables.host_rows(servers))
    assert rows == [("10.0.0.1", 2, "10.0.0.1-19999,10.0.0.1-20000", "19999,20000", 1, 1, 4, 6, 2, 7),
                    ("10.0.0.2", 1, "10.0.0.2-19999", "19999", 1, 1, 5, 10, 1, 3)]
