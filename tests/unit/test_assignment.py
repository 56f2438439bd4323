"""Assignment strategies (riffle_actors.coordinator.assignment): coverage, replicas, balance, hosts."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.coordinator.assignment import (
    AssignmentError,
    AssignmentRequest,
    Candidate,
    RangePlan,
    assign,
    range_count,
)
from riffle_actors.coordinator.config import AssignmentStrategy, HostStrategy

PB = AssignmentStrategy.PARTITION_BALANCE
BASIC = AssignmentStrategy.BASIC


def cands(n: int, *, hosts: int | None = None, memory: list[int] | None = None) -> list[Candidate]:
    return [
        Candidate(
            id=f"s{i}",
            host=f"10.0.0.{i % hosts if hosts else i}",
            available_memory=memory[i] if memory else 1 << 30,
            assigned_partitions=0,
        )
        for i in range(n)
    ]


def run(req: AssignmentRequest, cs: list[Candidate], **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("strategy", PB)
    kw.setdefault("host_strategy", HostStrategy.PREFER_DIFF)
    kw.setdefault("max_servers", 9)
    return assign(req, cs, **kw)


def covered(result) -> list[int]:  # type: ignore[no-untyped-def]
    return [p for r in result.ranges for p in range(r.start, r.end + 1)]


@settings(max_examples=300, deadline=None)
@given(
    partition_num=st.integers(0, 300),
    per_range=st.integers(1, 7),
    replica=st.integers(1, 3),
    n_servers=st.integers(1, 12),
    n_hosts=st.integers(1, 12),
    strategy=st.sampled_from(list(AssignmentStrategy)),
    host_strategy=st.sampled_from(list(HostStrategy)),
    server_number=st.integers(-1, 12),
)
def test_every_partition_gets_exactly_one_range_with_replica_distinct_servers(
    partition_num, per_range, replica, n_servers, n_hosts, strategy, host_strategy, server_number
):  # type: ignore[no-untyped-def]
    cs = cands(n_servers, hosts=n_hosts)
    req = AssignmentRequest(
        partition_num=partition_num, partitions_per_range=per_range, replica=replica, server_number=server_number
    )
    distinct_hosts = len({c.host for c in cs})
    must_diff = host_strategy is HostStrategy.MUST_DIFF
    if replica > n_servers or (must_diff and replica > distinct_hosts):
        with pytest.raises(AssignmentError):
            run(req, cs, strategy=strategy, host_strategy=host_strategy)
        return
    result = run(req, cs, strategy=strategy, host_strategy=host_strategy)
    host_of = {c.id: c.host for c in cs}
    if host_strategy is not HostStrategy.NONE and replica <= distinct_hosts:
        for r in result.ranges:  # different hosts whenever the cluster has enough of them
            assert len({host_of[s] for s in r.server_ids}) == replica
    assert sorted(covered(result)) == list(range(partition_num))
    for r in result.ranges:
        assert r.end - r.start + 1 <= per_range
        assert len(r.server_ids) == replica and len(set(r.server_ids)) == replica
    used = {s for r in result.ranges for s in r.server_ids}
    wanted = server_number if server_number > 0 else 9
    assert len(used) <= max(replica, min(wanted, n_servers))
    counts = Counter(s for r in result.ranges for s in r.server_ids for _ in range(r.start, r.end + 1))
    assert dict(counts) == result.partitions_per_server


def test_spark_shape_one_range_per_partition() -> None:
    result = run(AssignmentRequest(partition_num=5, partitions_per_range=1, replica=1), cands(3))
    assert [(r.start, r.end) for r in result.ranges] == [(i, i) for i in range(5)]


def test_ranges_longer_than_one_partition_are_contiguous_and_clipped() -> None:
    def bounds(partition_num: int, per_range: int) -> list[tuple[int, int]]:
        plan = RangePlan(partition_num=partition_num, per_range=max(1, per_range), replica_sets=(("s",),))
        assert len(plan) == range_count(partition_num, per_range)
        return [(r.start, r.end) for r in plan]

    assert bounds(10, 4) == [(0, 3), (4, 7), (8, 9)]
    assert bounds(0, 4) == []
    assert bounds(3, 0) == [(0, 0), (1, 1), (2, 2)]  # 0 treated as 1


def test_a_billion_partitions_are_planned_without_one_object_per_range() -> None:
    started = time.perf_counter()
    result = run(AssignmentRequest(partition_num=10**9, replica=2), cands(9, hosts=3))
    assert time.perf_counter() - started < 0.05
    assert len(result.ranges) == 10**9 and len(result.ranges.replica_sets) <= 9
    assert sum(result.partitions_per_server.values()) == 2 * 10**9
    last = result.ranges[-1]
    assert (last.start, last.end) == (10**9 - 1, 10**9 - 1) and len(set(last.server_ids)) == 2


def test_the_client_cannot_ask_for_more_servers_than_max_assignment_servers() -> None:
    result = run(AssignmentRequest(partition_num=100, server_number=50), cands(20), max_servers=4)
    assert len(result.partitions_per_server) == 4


def test_zero_partitions_is_an_empty_success() -> None:
    result = run(AssignmentRequest(partition_num=0), cands(2))
    assert len(result.ranges) == 0 and list(result.ranges) == [] and result.partitions_per_server == {}


def test_partitions_spread_evenly_over_the_chosen_servers() -> None:
    result = run(AssignmentRequest(partition_num=90, replica=1), cands(3))
    assert sorted(result.partitions_per_server.values()) == [30, 30, 30]
    result = run(AssignmentRequest(partition_num=90, replica=2), cands(3))
    assert sorted(result.partitions_per_server.values()) == [60, 60, 60]


def test_partition_balance_prefers_free_memory_per_assigned_partition() -> None:
    cs = [
        Candidate(id="busy", host="h1", available_memory=1000, assigned_partitions=9),  # 100 per partition
        Candidate(id="idle", host="h2", available_memory=500, assigned_partitions=0),  # 500
        Candidate(id="small", host="h3", available_memory=300, assigned_partitions=0),  # 300
    ]
    result = run(AssignmentRequest(partition_num=4, server_number=2), cs)
    assert set(result.partitions_per_server) == {"idle", "small"}
    assert result.ranges[0].server_ids == ("idle",)


def test_client_server_number_caps_the_servers_used() -> None:
    result = run(AssignmentRequest(partition_num=100, server_number=2), cands(5))
    assert len(result.partitions_per_server) == 2
    result = run(AssignmentRequest(partition_num=100), cands(12), max_servers=4)
    assert len(result.partitions_per_server) == 4


def test_server_number_below_replica_still_uses_replica_servers() -> None:
    result = run(AssignmentRequest(partition_num=3, replica=3, server_number=1), cands(4))
    assert all(len(set(r.server_ids)) == 3 for r in result.ranges)


def test_basic_strategy_rotates_over_servers_between_requests() -> None:
    cs = cands(4)
    first = run(AssignmentRequest(partition_num=2, server_number=2), cs, strategy=BASIC, cursor=0)
    second = run(AssignmentRequest(partition_num=2, server_number=2), cs, strategy=BASIC, cursor=first.next_cursor)
    assert set(first.partitions_per_server) == {"s0", "s1"}
    assert set(second.partitions_per_server) == {"s2", "s3"}
    third = run(AssignmentRequest(partition_num=2, server_number=2), cs, strategy=BASIC, cursor=second.next_cursor)
    assert set(third.partitions_per_server) == {"s0", "s1"}


def test_prefer_diff_puts_replicas_on_different_hosts_when_it_can() -> None:
    # s0, s2 on host 0; s1, s3 on host 1: every pair of replicas must span both hosts.
    result = run(AssignmentRequest(partition_num=20, replica=2), cands(4, hosts=2))
    for r in result.ranges:
        assert len({int(s[1:]) % 2 for s in r.server_ids}) == 2


def test_prefer_diff_falls_back_to_one_host() -> None:
    result = run(AssignmentRequest(partition_num=4, replica=2), cands(3, hosts=1))
    assert all(len(set(r.server_ids)) == 2 for r in result.ranges)


def test_prefer_diff_picks_a_second_host_even_if_it_ranks_lower() -> None:
    cs = [
        Candidate(id="a1", host="A", available_memory=900, assigned_partitions=0),
        Candidate(id="a2", host="A", available_memory=800, assigned_partitions=0),
        Candidate(id="b1", host="B", available_memory=100, assigned_partitions=0),
    ]
    result = run(AssignmentRequest(partition_num=6, replica=2, server_number=2), cs)
    assert set(result.partitions_per_server) == {"a1", "b1"}


def test_must_diff_fails_when_there_are_fewer_hosts_than_replicas() -> None:
    with pytest.raises(AssignmentError, match="must_diff needs 2 different hosts .* on 1 host"):
        run(AssignmentRequest(partition_num=4, replica=2), cands(3, hosts=1), host_strategy=HostStrategy.MUST_DIFF)


def test_must_diff_succeeds_with_enough_hosts() -> None:
    result = run(AssignmentRequest(partition_num=9, replica=2), cands(4, hosts=2), host_strategy=HostStrategy.MUST_DIFF)
    for r in result.ranges:
        assert len({int(s[1:]) % 2 for s in r.server_ids}) == 2


def test_host_strategy_none_may_share_hosts() -> None:
    result = run(AssignmentRequest(partition_num=4, replica=2), cands(2, hosts=1), host_strategy=HostStrategy.NONE)
    assert all(len(set(r.server_ids)) == 2 for r in result.ranges)


def test_too_few_candidates_says_how_many() -> None:
    with pytest.raises(AssignmentError, match=r"need 3 distinct server\(s\) \(dataReplica=3\) but only 2 candidate"):
        run(AssignmentRequest(partition_num=1, replica=3), cands(2))
    with pytest.raises(AssignmentError, match="only 0 candidate"):
        run(AssignmentRequest(partition_num=1), [])


def test_malformed_requests_are_rejected() -> None:
    with pytest.raises(AssignmentError, match="partitionNum"):
        run(AssignmentRequest(partition_num=-1), cands(1))
    with pytest.raises(AssignmentError, match="dataReplica"):
        run(AssignmentRequest(partition_num=1, replica=0), cands(1))
