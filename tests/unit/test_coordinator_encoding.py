"""The coordinator's bounded driver requests, without a daemon (issue 17).

- ``encode_assignments`` writes exactly the bytes protobuf writes for the same ranges, for any
  plan shape, and the whole response parses back;
- ``AppRegistry`` refuses a new app beyond ``max_apps`` but keeps the ones it has;
- ``assignment_problem`` / ``app_request_problem`` name the key or field that bounds the value;
- ``redact_config`` hides ``remote_storage.conf`` values.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.coordinator.apps import AppRegistry, AppRegistryFull
from riffle_actors.coordinator.assignment import AssignmentRequest, Candidate, assign
from riffle_actors.coordinator.cluster import ServerHeartbeat
from riffle_actors.coordinator.config import AssignmentStrategy, HostStrategy
from riffle_actors.coordinator.validation import app_request_problem, assignment_problem
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.runtime import ManualClock
from riffle_actors.transport.coordinator_grpc import encode_assignments, encode_server_id
from riffle_actors.coordinator.admin import redact_config


def _servers(n: int) -> dict[str, ServerHeartbeat]:
    return {f"10.0.{i}.{i}-{19990 + i}": ServerHeartbeat(id=f"10.0.{i}.{i}-{19990 + i}", ip=f"10.0.{i}.{i}",
                                                         grpc_port=19990 + i, netty_port=17000 + i * 300,
                                                         http_port=20010 if i % 2 else 0)
            for i in range(n)}


@settings(max_examples=150, deadline=None)
@given(partition_num=st.one_of(st.integers(0, 300), st.sampled_from([127, 128, 16383, 16384, 40000])),
       per_range=st.integers(1, 200), replica=st.integers(1, 3), n_servers=st.integers(3, 9))
def test_encoded_assignments_are_the_bytes_protobuf_writes(partition_num: int, per_range: int, replica: int,
                                                           n_servers: int) -> None:
    servers = _servers(n_servers)
    cands = [Candidate(id=sid, host=hb.ip, available_memory=1 << 30, assigned_partitions=0)
             for sid, hb in servers.items()]
    result = assign(AssignmentRequest(partition_num=partition_num, partitions_per_range=per_range, replica=replica),
                    cands, strategy=AssignmentStrategy.PARTITION_BALANCE, host_strategy=HostStrategy.PREFER_DIFF,
                    max_servers=9)
    ids = {sid: encode_server_id(hb) for sid, hb in servers.items()}
    expected = pb.GetShuffleAssignmentsResponse(assignments=[
        pb.PartitionRangeAssignment(startPartition=r.start, endPartition=r.end, server=[ids[s] for s in r.server_ids])
        for r in result.ranges])
    encoded = asyncio.run(encode_assignments(result, servers))
    assert encoded == expected.SerializeToString()
    head = pb.GetShuffleAssignmentsResponse(status=pb.SUCCESS, retMsg="").SerializeToString()
    assert pb.GetShuffleAssignmentsResponse.FromString(head + encoded) == expected


def test_a_full_registry_refuses_new_apps_but_keeps_the_old_ones() -> None:
    clock = ManualClock(start=0.0)
    apps = AppRegistry(clock=clock, heartbeat_timeout_s=10, history_size=5, max_apps=2)
    apps.register("a")
    apps.heartbeat("b")
    with pytest.raises(AppRegistryFull, match=r"\[app\] max_apps = 2"):
        apps.register("c")
    with pytest.raises(AppRegistryFull):
        apps.heartbeat("c")
    apps.record_assignment("c", partitions=3, server_ids=["s"])  # not credited, not an error
    apps.heartbeat("a")
    assert "c" not in apps and len(apps) == 2 and apps.stats().refused_total == 3
    clock.advance(11)
    apps.expire()
    apps.register("c")  # room again once the silent ones expired
    assert "c" in apps


@pytest.mark.parametrize("kw, words", [
    ({"partition_num": 10**9}, "max_partitions_per_assignment"),
    ({"partition_num": -1}, "max_partitions_per_assignment"),
    ({"per_range": 0}, "partitionNumPerRange"),
    ({"per_range": 10**9}, "max_partitions_per_assignment"),
    ({"replica": 4}, "max_data_replica"),
    ({"replica": 0}, "max_data_replica"),
    ({"require_tags": ["t"] * 65}, "requireTags"),
    ({"require_tags": [""]}, "requireTags[0]"),
    ({"faulty_ids": ["x" * 257]}, "faultyServerIds[0]"),
    ({"app_id": "a/b"}, "applicationId"),
    ({"app_id": "x" * 256}, "applicationId"),
    ({"shuffle_id": -1}, "shuffleId"),
])
def test_assignment_problems_name_their_bound(kw: dict[str, object], words: str) -> None:
    args: dict[str, object] = {"app_id": "app_1", "shuffle_id": 0, "partition_num": 10, "per_range": 1,
                               "replica": 1, "max_partitions": 1 << 20, "max_replica": 3}
    args.update(kw)
    problem = assignment_problem(args.pop("app_id"), args.pop("shuffle_id"), **args)  # type: ignore[arg-type]
    assert problem is not None and words in problem and len(problem) < 300


def test_an_assignment_within_the_bounds_and_without_app_id_is_fine() -> None:
    assert assignment_problem("", 0, partition_num=1 << 20, per_range=1, replica=3, max_partitions=1 << 20,
                              max_replica=3) is None


def test_app_request_problems() -> None:
    assert app_request_problem("application_1_2", user="alice", version="0.10.0") is None
    assert "appId" in (app_request_problem("") or "")
    assert "8388608 characters" in (app_request_problem("x" * (8 << 20)) or "")
    assert "user" in (app_request_problem("a", user="u" * 300) or "")
    assert "non-printable" in (app_request_problem("a", version="1\n2") or "")


def test_remote_storage_conf_values_are_redacted_and_keys_kept() -> None:
    items = [("remote_storage.conf", '{"fs.s3a.secret.key":"s3cr3t","dfs.replication":"2"}'),
             ("remote_storage.path", "hdfs://nn/rss")]
    assert redact_config(items) == [("remote_storage.conf", '{"fs.s3a.secret.key":"******","dfs.replication":"******"}'),
                                    ("remote_storage.path", "hdfs://nn/rss")]
