"""Shuffle assignment strategies: which servers hold which partitions (pure, no IO).

This module owns the answer to ``getShuffleAssignments`` once the candidate servers are known
(spec §7.3): every partition in ``[0, partition_num)`` lands in exactly one range, each range
gets ``replica`` *distinct* servers, and the servers are chosen by a strategy:

- ``partition_balance`` (Uniffle's default): rank candidates by
  ``available_memory / (assigned_partitions + 1)`` (descending, ties by id) and take the best
  ``n`` (``n`` = the client's ``assignmentShuffleServerNumber`` when > 0, else
  ``max_servers``, never more than there are candidates and never fewer than ``replica``);
- ``basic``: round robin over the candidates sorted by id, starting at a cursor that the
  caller keeps between requests (so consecutive shuffles start on different servers).

Ranges then take their replicas round robin from the chosen list. The host strategy decides
whether replicas of one range may share an IP: ``prefer_diff`` avoids it when it can,
``must_diff`` fails the request when it cannot, ``none`` ignores hosts.

It does not cover: filtering candidates (status, tags, exclusion: ``cluster.py``) or the
protobuf conversion (``transport.coordinator_grpc``). Failures raise ``AssignmentError`` whose message is sent
to the client as retMsg with INTERNAL_ERROR.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from riffle_actors.coordinator.config import AssignmentStrategy, HostStrategy


class AssignmentError(Exception):
    """The request cannot be satisfied; the message says why (it becomes the client's retMsg)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """What a strategy needs to know about one eligible server."""

    id: str
    host: str
    available_memory: int
    assigned_partitions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AssignmentRequest:
    """The shape of a ``GetShuffleServerRequest`` (field names in our units)."""

    partition_num: int
    partitions_per_range: int = 1
    replica: int = 1
    server_number: int = -1  # assignmentShuffleServerNumber; <= 0 = the coordinator decides


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRange:
    """Partitions ``start..end`` (both inclusive) and their replica servers, in order."""

    start: int
    end: int
    server_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    """A strategy's answer; ``partitions_per_server`` counts partition replicas per server."""

    ranges: tuple[PartitionRange, ...]
    partitions_per_server: dict[str, int]
    next_cursor: int = 0  # where the next ``basic`` round robin starts


def split_ranges(partition_num: int, per_range: int) -> list[tuple[int, int]]:
    """``[0, partition_num)`` cut into inclusive ranges of ``per_range`` (the last one may be shorter)."""
    per_range = max(1, per_range)
    return [(s, min(s + per_range, partition_num) - 1) for s in range(0, partition_num, per_range)]


def _rank_partition_balance(candidates: Sequence[Candidate]) -> list[Candidate]:
    # Uniffle's PartitionBalanceAssignmentStrategy sorts by free memory per assigned partition.
    return sorted(candidates, key=lambda c: (-(c.available_memory / (c.assigned_partitions + 1)), c.id))


def _pick_servers(ranked: list[Candidate], n: int, replica: int, host_strategy: HostStrategy) -> list[Candidate]:
    """The best ``n`` of ``ranked``, but with up to ``replica`` distinct hosts when hosts matter."""
    if host_strategy is HostStrategy.NONE:
        return ranked[:n]
    seeds: list[Candidate] = []
    hosts: set[str] = set()
    for c in ranked:  # the best server of each host first, until a range can span `replica` hosts
        if len(seeds) >= min(replica, n):
            break
        if c.host not in hosts:
            hosts.add(c.host)
            seeds.append(c)
    seed_ids = {c.id for c in seeds}
    rest = [c for c in ranked if c.id not in seed_ids][: n - len(seeds)]
    chosen = {c.id for c in seeds} | {c.id for c in rest}
    return [c for c in ranked if c.id in chosen]  # keep the ranking order


def _replicas_for(chosen: list[Candidate], cursor: int, replica: int, host_strategy: HostStrategy) -> list[Candidate]:
    """``replica`` distinct servers for one range, walking ``chosen`` round robin from ``cursor``."""
    order = [chosen[(cursor + i) % len(chosen)] for i in range(len(chosen))]
    if host_strategy is HostStrategy.NONE:
        return order[:replica]
    picked: list[Candidate] = []
    hosts: set[str] = set()
    for c in order:
        if len(picked) == replica:
            break
        if c.host not in hosts:
            picked.append(c)
            hosts.add(c.host)
    if len(picked) < replica and host_strategy is HostStrategy.PREFER_DIFF:
        ids = {c.id for c in picked}
        picked += [c for c in order if c.id not in ids][: replica - len(picked)]
    return picked


def assign(
    request: AssignmentRequest,
    candidates: Sequence[Candidate],
    *,
    strategy: AssignmentStrategy,
    host_strategy: HostStrategy,
    max_servers: int,
    cursor: int = 0,
) -> Assignment:
    """Assign every partition of ``request`` to ``replica`` distinct candidates.

    ``cursor`` is the ``basic`` strategy's round-robin position (ignored by partition_balance);
    the result's ``next_cursor`` is where the following request should start.
    Raises ``AssignmentError`` when the request is malformed or cannot be satisfied.
    """
    if request.partition_num < 0:
        raise AssignmentError(f"partitionNum must be >= 0, got {request.partition_num}")
    if request.replica < 1:
        raise AssignmentError(f"dataReplica must be >= 1, got {request.replica}")
    if len(candidates) < request.replica:
        raise AssignmentError(
            f"need {request.replica} distinct server(s) (dataReplica={request.replica}) "
            f"but only {len(candidates)} candidate(s)"
        )
    if host_strategy is HostStrategy.MUST_DIFF:
        n_hosts = len({c.host for c in candidates})
        if n_hosts < request.replica:
            raise AssignmentError(
                f"assignment_host_strategy=must_diff needs {request.replica} different hosts "
                f"(dataReplica={request.replica}) but the {len(candidates)} candidate(s) are on {n_hosts} host(s)"
            )
    wanted = request.server_number if request.server_number > 0 else max_servers
    n = max(request.replica, min(wanted, len(candidates)))

    if strategy is AssignmentStrategy.BASIC:
        by_id = sorted(candidates, key=lambda c: c.id)
        start = cursor % len(by_id)
        ranked = by_id[start:] + by_id[:start]
        next_cursor = (start + n) % len(by_id)
    else:
        ranked = _rank_partition_balance(candidates)
        next_cursor = cursor
    chosen = _pick_servers(ranked, n, request.replica, host_strategy)

    ranges: list[PartitionRange] = []
    counts: Counter[str] = Counter()
    rr = 0
    for start_p, end_p in split_ranges(request.partition_num, request.partitions_per_range):
        replicas = _replicas_for(chosen, rr, request.replica, host_strategy)
        if len(replicas) < request.replica:  # only reachable with must_diff
            raise AssignmentError(
                f"assignment_host_strategy=must_diff: cannot place {request.replica} replicas of "
                f"partitions {start_p}-{end_p} on different hosts"
            )
        rr = (rr + request.replica) % len(chosen)
        ranges.append(PartitionRange(start=start_p, end=end_p, server_ids=tuple(c.id for c in replicas)))
        for c in replicas:
            counts[c.id] += end_p - start_p + 1
    return Assignment(ranges=tuple(ranges), partitions_per_server=dict(counts), next_cursor=next_cursor)
