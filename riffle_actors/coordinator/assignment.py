"""Shuffle assignment strategies: which servers hold which partitions (pure, no IO).

This module owns the answer to ``getShuffleAssignments`` once the candidate servers are known
(spec §7.3): every partition in ``[0, partition_num)`` lands in exactly one range, each range
gets ``replica`` *distinct* servers, and the servers are chosen by a strategy:

- ``partition_balance`` (Uniffle's default): rank candidates by
  ``available_memory / (assigned_partitions + 1)`` (descending, ties by id) and take the best
  ``n`` (``n`` = the client's ``assignmentShuffleServerNumber`` when it is in ``1..max_servers``,
  else ``max_servers`` (as upstream: a client cannot ask for more), never more than there are
  candidates and never fewer than ``replica``);
- ``basic``: round robin over the candidates sorted by id, starting at a cursor that the
  caller keeps between requests (so consecutive shuffles start on different servers).

Ranges then take their replicas round robin from the chosen list. The ranges are not built one
object each: ``RangePlan`` computes range ``i`` on demand from the at most ``n`` distinct
replica lists the round robin repeats, and the per-server partition counts are arithmetic, so
the cost of an assignment does not grow with ``partition_num`` (the gRPC adapter encodes the
ranges in slices). The request's bounds (``max_partitions_per_assignment``, ``max_data_replica``)
are checked by the service before it gets here. The host strategy decides
whether replicas of one range may share an IP: ``prefer_diff`` avoids it when it can,
``must_diff`` fails the request when it cannot, ``none`` ignores hosts. A host is an IP: the
workers of a multi-worker riffle-server (one IP, several ports) are one host, and with a host
strategy the chosen servers are walked host by host, so each of them takes partitions.

It does not cover: filtering candidates (status, tags, exclusion: ``cluster.py``) or the
protobuf conversion (``transport.coordinator_grpc``). Failures raise ``AssignmentError`` whose message is sent
to the client as retMsg with INTERNAL_ERROR.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import gcd
from typing import overload

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

    ranges: RangePlan
    partitions_per_server: dict[str, int]
    next_cursor: int = 0  # where the next ``basic`` round robin starts


def range_count(partition_num: int, per_range: int) -> int:
    """How many ranges ``[0, partition_num)`` is cut into, ``per_range`` partitions each (the last may be shorter)."""
    per_range = max(1, per_range)
    return -(-max(0, partition_num) // per_range)


@dataclass(frozen=True, slots=True)
class RangePlan(Sequence[PartitionRange]):
    """The ranges of one assignment, computed on demand instead of held one object per range.

    Range ``i`` is partitions ``i * per_range`` .. ``min((i + 1) * per_range, partition_num) - 1``
    and its replicas are ``replica_sets[i % len(replica_sets)]``: the round robin over the chosen
    servers repeats with a period of at most their number, so an assignment of a million
    partitions costs a few tuples here. ``len()``, indexing and iteration give ``PartitionRange``.
    """

    partition_num: int
    per_range: int
    replica_sets: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return range_count(self.partition_num, self.per_range) if self.replica_sets else 0

    @overload
    def __getitem__(self, index: int) -> PartitionRange: ...
    @overload
    def __getitem__(self, index: slice) -> list[PartitionRange]: ...
    def __getitem__(self, index: int | slice) -> PartitionRange | list[PartitionRange]:
        n = len(self)
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(n))]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"range {index} of {n}")
        return self._at(index)

    def _at(self, i: int) -> PartitionRange:
        start = i * self.per_range
        end = min(start + self.per_range, self.partition_num) - 1
        return PartitionRange(start=start, end=end, server_ids=self.replica_sets[i % len(self.replica_sets)])

    def __iter__(self) -> Iterator[PartitionRange]:
        for i in range(len(self)):
            yield self._at(i)

    def partitions_per_server(self) -> dict[str, int]:
        """Partition replicas each server holds, counted arithmetically (one step per replica set)."""
        n_ranges, period = len(self), len(self.replica_sets)
        counts: Counter[str] = Counter()
        if n_ranges == 0:
            return {}
        short = self.per_range - (self.partition_num - (n_ranges - 1) * self.per_range)  # the last range's gap
        for k, servers in enumerate(self.replica_sets):
            if k >= n_ranges:
                break
            partitions = ((n_ranges - 1 - k) // period + 1) * self.per_range
            if (n_ranges - 1) % period == k:
                partitions -= short
            for sid in servers:
                counts[sid] += partitions
        return dict(counts)


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


def _interleave_hosts(chosen: list[Candidate]) -> list[Candidate]:
    """``chosen`` reordered host by host (the best of each host, then the second of each...), each
    host's servers kept in ranking order: walked round robin ``replica`` at a time, consecutive
    servers are on different hosts, so the workers of one host (a multi-worker riffle-server:
    one IP, several ports) all take partitions instead of the walk skipping past them."""
    by_host: dict[str, list[Candidate]] = {}
    for c in chosen:
        by_host.setdefault(c.host, []).append(c)
    out: list[Candidate] = []
    for i in range(max((len(v) for v in by_host.values()), default=0)):
        out.extend(v[i] for v in by_host.values() if i < len(v))
    return out


def _replicas_for(chosen: list[Candidate], cursor: int, replica: int, host_strategy: HostStrategy) -> list[Candidate]:
    """``replica`` distinct servers for one range, walking ``chosen`` round robin from ``cursor``."""
    n = len(chosen)
    if host_strategy is HostStrategy.NONE:
        return [chosen[(cursor + i) % n] for i in range(min(replica, n))]
    picked: list[Candidate] = []
    hosts: set[str] = set()
    for i in range(n):
        if len(picked) == replica:
            break
        c = chosen[(cursor + i) % n]
        if c.host not in hosts:
            picked.append(c)
            hosts.add(c.host)
    if len(picked) < replica and host_strategy is HostStrategy.PREFER_DIFF:
        ids = {c.id for c in picked}
        for i in range(n):
            if len(picked) == replica:
                break
            c = chosen[(cursor + i) % n]
            if c.id not in ids:
                picked.append(c)
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
    # as upstream's strategies: the client may ask for fewer servers than max_servers, never for more
    wanted = request.server_number if 0 < request.server_number < max_servers else max_servers
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
    if host_strategy is not HostStrategy.NONE and request.replica > 1:
        chosen = _interleave_hosts(chosen)

    # Range i starts its round robin at (i * replica) % n: the replica lists repeat with this period,
    # so at most n of them are computed, whatever the number of partitions.
    n_ranges = range_count(request.partition_num, request.partitions_per_range)
    period = len(chosen) // gcd(len(chosen), request.replica)
    per_range = max(1, request.partitions_per_range)
    replica_sets: list[tuple[str, ...]] = []
    for k in range(min(n_ranges, period)):
        replicas = _replicas_for(chosen, (k * request.replica) % len(chosen), request.replica, host_strategy)
        if len(replicas) < request.replica:  # only reachable with must_diff
            start_p = k * per_range
            end_p = min(start_p + per_range, request.partition_num) - 1
            raise AssignmentError(
                f"assignment_host_strategy=must_diff: cannot place {request.replica} replicas of "
                f"partitions {start_p}-{end_p} on different hosts"
            )
        replica_sets.append(tuple(c.id for c in replicas))
    plan = RangePlan(partition_num=request.partition_num, per_range=per_range, replica_sets=tuple(replica_sets))
    return Assignment(ranges=plan, partitions_per_server=plan.partitions_per_server(), next_cursor=next_cursor)
