"""Coordinator state (pure): the server registry (cluster.py) and the app registry (apps.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from riffle_actors.coordinator.apps import AppRegistry
from riffle_actors.coordinator.assignment import AssignmentError, AssignmentRequest
from riffle_actors.coordinator.cluster import ClusterRegistry, ServerHeartbeat, ServerStatus
from riffle_actors.io.exclude_file import ExcludeFile, parse_exclude_list
from riffle_actors.runtime import ManualClock
from tests.helpers.registry import TAGS, hb


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def reg(clock: ManualClock) -> ClusterRegistry:
    return ClusterRegistry(clock=clock, heartbeat_timeout_s=30)


def ids(nodes) -> list[str]:  # type: ignore[no-untyped-def]
    return [n.id for n in nodes]


# ----------------------------------------------------------------------------- membership and expiry


def test_heartbeat_registers_and_refreshes_a_server(reg: ClusterRegistry) -> None:
    assert reg.heartbeat(hb(1)) is True
    assert reg.heartbeat(hb(1, used_memory=5)) is False
    assert len(reg) == 1 and reg.get("10.0.0.1-19999").heartbeat.used_memory == 5  # type: ignore[union-attr]


def test_silent_server_expires_after_the_timeout(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    clock.advance(20)
    reg.heartbeat(hb(2))
    clock.advance(10.5)
    assert reg.expire() == ["10.0.0.1-19999"]
    assert ids(reg.candidates()) == ["10.0.0.2-19999"]
    assert reg.lost_total == 1
    clock.advance(30)
    assert reg.expire() == ["10.0.0.2-19999"] and len(reg) == 0


def test_stale_server_is_no_candidate_even_before_the_sweep(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    clock.advance(31)
    assert reg.candidates() == []
    assert reg.views()[0].status is ServerStatus.LOST


def test_expired_server_comes_back_with_its_next_heartbeat(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    clock.advance(31)
    reg.expire()
    assert reg.heartbeat(hb(1)) is True
    assert ids(reg.candidates()) == ["10.0.0.1-19999"]


def test_epoch_times_come_from_the_clock(clock: ManualClock) -> None:
    clock = ManualClock(start=50.0, wall_start=1_700_000_000.0)
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30)
    reg.heartbeat(hb(1))
    clock.advance(2)
    reg.heartbeat(hb(1))
    view = reg.views()[0]
    assert view.registered_epoch_ms == 1_700_000_000_000
    assert view.last_heartbeat_epoch_ms == 1_700_000_002_000


# ----------------------------------------------------------------------------- status and health


def test_unhealthy_flag_makes_the_server_unhealthy(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1, is_healthy=False))
    reg.heartbeat(hb(2, is_healthy=True))
    reg.heartbeat(hb(3))  # Java servers do not send isHealthy
    assert ids(reg.candidates()) == ["10.0.0.2-19999", "10.0.0.3-19999"]
    assert reg.views()[0].status is ServerStatus.UNHEALTHY


def test_reported_decommissioning_is_no_candidate(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1, status=ServerStatus.DECOMMISSIONING, is_healthy=False))
    assert reg.candidates() == []
    assert reg.views()[0].status is ServerStatus.DECOMMISSIONING


def test_operator_override_drains_a_server_until_cleared(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    reg.set_operator_status("10.0.0.1-19999", ServerStatus.DECOMMISSIONING)
    assert ids(reg.candidates()) == ["10.0.0.2-19999"]
    # The override survives expiry and re-registration (a restarted server stays drained).
    clock.advance(31)
    reg.expire()
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    assert ids(reg.candidates()) == ["10.0.0.2-19999"]
    assert reg.views()[0].operator_status is ServerStatus.DECOMMISSIONING
    reg.set_operator_status("10.0.0.1-19999", ServerStatus.ACTIVE)
    assert ids(reg.candidates()) == ["10.0.0.1-19999", "10.0.0.2-19999"]
    with pytest.raises(ValueError):
        reg.set_operator_status("10.0.0.1-19999", ServerStatus.LOST)


# ----------------------------------------------------------------------------- candidate filters


def test_candidates_must_offer_every_required_tag(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1, tags=frozenset({"ss_v5", "GRPC"})))
    reg.heartbeat(hb(2, tags=frozenset({"ss_v5", "GRPC", "ssd"})))
    reg.heartbeat(hb(3, tags=frozenset({"GRPC"})))
    assert ids(reg.candidates({"ss_v5", "GRPC"})) == ["10.0.0.1-19999", "10.0.0.2-19999"]
    assert ids(reg.candidates({"ss_v5", "ssd"})) == ["10.0.0.2-19999"]
    assert ids(reg.candidates()) == ["10.0.0.1-19999", "10.0.0.2-19999", "10.0.0.3-19999"]


def test_excluded_and_faulty_servers_are_no_candidates(reg: ClusterRegistry) -> None:
    for i in (1, 2, 3):
        reg.heartbeat(hb(i))
    reg.set_excluded({"10.0.0.1-19999", "not-registered-yet"})
    assert ids(reg.candidates(faulty_ids={"10.0.0.2-19999"})) == ["10.0.0.3-19999"]
    assert reg.views()[0].status is ServerStatus.EXCLUDED and reg.views()[0].excluded
    reg.set_excluded(())
    assert len(reg.candidates()) == 3


def test_grpc_netty_request_fails_with_a_hint_to_use_grpc(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    with pytest.raises(AssignmentError) as err:
        reg.assign(AssignmentRequest(partition_num=2), require_tags={"ss_v5", "GRPC_NETTY"})
    msg = str(err.value)
    assert "only 0 candidate" in msg
    assert "no server offers GRPC_NETTY" in msg and "set spark.rss.client.type=GRPC" in msg
    assert "2 server(s) registered" in msg and "2 lack a required tag" in msg


def test_no_candidate_error_counts_each_reason(reg: ClusterRegistry, clock: ManualClock) -> None:
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2, is_healthy=False))
    reg.heartbeat(hb(3))
    reg.heartbeat(hb(4, tags=frozenset({"ss_v5"})))
    reg.set_excluded({"10.0.0.3-19999"})
    with pytest.raises(AssignmentError) as err:
        reg.assign(AssignmentRequest(partition_num=2, replica=2), require_tags=TAGS, faulty_ids={"10.0.0.1-19999"})
    msg = str(err.value)
    for part in (
        "need 2 distinct server(s) (dataReplica=2) but only 0 candidate",
        "4 server(s) registered",
        "requireTags=['GRPC', 'ss_v5']",
        "1 lack a required tag",
        "1 excluded by the operator",
        "1 listed in faultyServerIds",
        "1 UNHEALTHY",
    ):
        assert part in msg, (part, msg)
    assert "no server offers" not in msg


# ----------------------------------------------------------------------------- exclude file


def test_exclude_list_format() -> None:
    text = "# drained for maintenance\n10.0.0.1-19999\n\n  10.0.0.2-19999  # bad disk\n"
    assert parse_exclude_list(text) == {"10.0.0.1-19999", "10.0.0.2-19999"}


def test_exclude_file_is_reread_only_when_it_changes(tmp_path: Path, reg: ClusterRegistry) -> None:
    path = tmp_path / "exclude.txt"
    ex = ExcludeFile(str(path))
    assert ex.poll() == frozenset()  # missing file: nobody excluded
    assert ex.poll() is None
    path.write_text("10.0.0.1-19999\n")
    assert ex.poll() == {"10.0.0.1-19999"}
    assert ex.poll() is None  # unchanged
    # A rewrite within the same mtime tick is still noticed (size / inode change).
    tmp = tmp_path / "exclude.new"
    tmp.write_text("10.0.0.1-19999\n10.0.0.2-19999\n")
    st = path.stat()
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    assert ex.poll() == {"10.0.0.1-19999", "10.0.0.2-19999"}
    path.unlink()
    assert ex.poll() == frozenset()
    assert ex.poll() is None


def test_exclude_file_drives_the_registry(tmp_path: Path, reg: ClusterRegistry) -> None:
    path = tmp_path / "exclude.txt"
    path.write_text("10.0.0.2-19999\n")
    ex = ExcludeFile(str(path))
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    reg.set_excluded(ex.poll() or ())
    assert ids(reg.candidates()) == ["10.0.0.1-19999"]
    path.write_text("")
    new = ex.poll()
    assert new == frozenset()
    reg.set_excluded(new)
    assert len(reg.candidates()) == 2


# ----------------------------------------------------------------------------- balance bookkeeping


def test_consecutive_shuffles_spread_over_servers(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1))
    reg.heartbeat(hb(2))
    used = []
    for _ in range(4):
        _, servers = reg.assign(AssignmentRequest(partition_num=1, server_number=1), require_tags=TAGS)
        used.append(next(iter(servers)))
    assert used.count("10.0.0.1-19999") == 2 and used.count("10.0.0.2-19999") == 2


def test_more_free_memory_gets_more_partitions(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1, available_memory=3 << 30))
    reg.heartbeat(hb(2, available_memory=1 << 30))
    counts = {"10.0.0.1-19999": 0, "10.0.0.2-19999": 0}
    for _ in range(40):
        result, _ = reg.assign(AssignmentRequest(partition_num=1, server_number=1))
        for sid, n in result.partitions_per_server.items():
            counts[sid] += n
    assert counts["10.0.0.1-19999"] == 30 and counts["10.0.0.2-19999"] == 10


def test_assigned_partitions_reset_on_heartbeat_and_total_is_kept(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1))
    reg.assign(AssignmentRequest(partition_num=7))
    view = reg.views()[0]
    assert (view.assigned_partitions, view.total_assigned_partitions) == (7, 7)
    reg.heartbeat(hb(1))  # fresh memory figures already include those partitions
    view = reg.views()[0]
    assert (view.assigned_partitions, view.total_assigned_partitions) == (0, 7)


def test_assign_returns_the_heartbeat_of_every_used_server(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1, netty_port=0, http_port=20010))
    _, servers = reg.assign(AssignmentRequest(partition_num=3))
    assert set(servers) == {"10.0.0.1-19999"}
    assert servers["10.0.0.1-19999"].http_port == 20010


# ----------------------------------------------------------------------------- app registry


def test_apps_register_heartbeat_and_expire_to_history(clock: ManualClock) -> None:
    apps = AppRegistry(clock=clock, heartbeat_timeout_s=60, history_size=2)
    apps.register("a1", user="alice", version="0.10.0")
    apps.heartbeat("a2")  # an unknown app's heartbeat registers it
    apps.record_assignment("a1", partitions=10, server_ids=["s1", "s2"])
    assert [a.app_id for a in apps.active()] == ["a1", "a2"]
    a1 = apps.active()[0]
    assert (a1.user, a1.version, a1.shuffles, a1.partitions, a1.servers) == ("alice", "0.10.0", 1, 10, ("s1", "s2"))
    clock.advance(40)
    apps.heartbeat("a2")
    clock.advance(21)
    assert apps.expire() == ["a1"]
    assert "a1" not in apps and "a2" in apps
    assert apps.history()[0].app_id == "a1" and apps.history()[0].expired_epoch_ms is not None


def test_app_history_is_bounded_newest_first(clock: ManualClock) -> None:
    apps = AppRegistry(clock=clock, heartbeat_timeout_s=1, history_size=2)
    for i in range(4):
        apps.heartbeat(f"a{i}")
        clock.advance(2)
        apps.expire()
    assert [a.app_id for a in apps.history()] == ["a3", "a2"]
    assert apps.expired_total == 4


def test_reregistering_keeps_known_fields(clock: ManualClock) -> None:
    apps = AppRegistry(clock=clock, heartbeat_timeout_s=60)
    apps.register("a1", user="alice", version="0.10.0")
    apps.register("a1")
    assert apps.active()[0].user == "alice"


def test_grpc_netty_apps_are_assigned_only_to_servers_with_a_netty_port(reg: ClusterRegistry) -> None:
    reg.heartbeat(hb(1))  # gRPC only
    netty_tags = TAGS | {"GRPC_NETTY"}
    reg.heartbeat(ServerHeartbeat(id="10.0.0.2-19999-21100", ip="10.0.0.2", grpc_port=19999, netty_port=21100,
                                  tags=netty_tags, available_memory=1 << 30))
    result, beats = reg.assign(AssignmentRequest(partition_num=4), require_tags={"ss_v5", "GRPC_NETTY"})
    assert set(beats) == {"10.0.0.2-19999-21100"} and beats["10.0.0.2-19999-21100"].netty_port == 21100
    # a GRPC app may use both: the netty server advertises GRPC too
    _, beats = reg.assign(AssignmentRequest(partition_num=4), require_tags={"ss_v5", "GRPC"})
    assert set(beats) == {"10.0.0.1-19999", "10.0.0.2-19999-21100"}


def test_workers_of_one_host_count_as_one_host_for_replicas(clock: ManualClock) -> None:
    """A multi-worker riffle-server host (runtime_config.worker_number) registers one server per worker:
    one IP, several ports. Replicas of a partition go to different IPs, never to two workers of a host."""
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30)
    for ip in ("10.0.0.1", "10.0.0.2"):
        for port in (19999, 20000, 20001):  # three workers per host, and more free memory on host 1
            reg.heartbeat(ServerHeartbeat(id=f"{ip}-{port}", ip=ip, grpc_port=port, tags=TAGS,
                                          available_memory=(4 << 30) if ip == "10.0.0.1" else 1 << 30))
    result, _ = reg.assign(AssignmentRequest(partition_num=12, replica=2))
    assert len(result.ranges) == 12
    for r in result.ranges:
        assert len({sid.rsplit("-", 1)[0] for sid in r.server_ids}) == 2, r
    # every worker of both hosts takes partitions
    assert len(result.partitions_per_server) == 6
