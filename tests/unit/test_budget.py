"""MemoryBudget: capacity / allocated / used / in-flight, per-app usage, purge."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.state.budget import MemoryBudget


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        MemoryBudget(0)


def test_allocate_within_capacity() -> None:
    b = MemoryBudget(100)
    assert b.try_allocate(60)
    assert not b.try_allocate(41)
    assert b.try_allocate(40)
    assert b.snapshot().available == 0
    assert not b.try_allocate(1)
    b.release_allocated(60)
    assert b.allocated == 40
    b.release_allocated(1000)  # never negative
    assert b.allocated == 0


def test_negative_allocation_is_refused() -> None:
    with pytest.raises(ValueError):
        MemoryBudget(10).try_allocate(-1)


def test_used_counts_against_capacity() -> None:
    b = MemoryBudget(100)
    b.add_used("a", 70)
    assert not b.try_allocate(31)
    assert b.try_allocate(30)
    assert b.snapshot().available == 0


def test_ticket_conversion_cycle() -> None:
    """requireBuffer reserves, the send converts it to used, the spill releases it."""
    b = MemoryBudget(1000)
    assert b.try_allocate(300)
    b.release_allocated(300)
    b.add_used("a", 280)  # a retried block was dropped: less used than reserved
    assert (b.allocated, b.used, b.in_flight) == (0, 280, 0)
    b.mark_in_flight("a", 280)
    assert b.spillable() == 0
    assert b.release_used("a", 280, was_in_flight=True) == 280
    assert (b.allocated, b.used, b.in_flight) == (0, 0, 0)
    assert b.used_by_app("a") == 0


def test_release_is_per_app_and_bounded() -> None:
    b = MemoryBudget(1000)
    b.add_used("a", 100)
    b.add_used("b", 50)
    assert b.release_used("a", 500, was_in_flight=False) == 100  # never more than the app holds
    assert b.used == 50 and b.used_by_app("a") == 0
    assert b.release_used("zzz", 10, was_in_flight=False) == 0


def test_purge_app_gives_everything_back() -> None:
    b = MemoryBudget(1000)
    b.add_used("a", 100)
    b.mark_in_flight("a", 60)
    b.add_used("b", 10)
    assert b.purge_app("a") == 100
    assert (b.used, b.in_flight) == (10, 0)
    # a late spill completion of the purged app changes nothing
    assert b.release_used("a", 60, was_in_flight=True) == 0
    assert (b.used, b.in_flight) == (10, 0)
    assert b.purge_app("a") == 0


def test_spillable_excludes_in_flight() -> None:
    b = MemoryBudget(1000)
    b.add_used("a", 400)
    b.mark_in_flight("a", 150)
    assert b.spillable() == 250
    b.release_used("a", 150, was_in_flight=True)
    assert (b.used, b.in_flight, b.spillable()) == (250, 0, 250)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "use", "spill", "done", "purge"]),
                          st.sampled_from(["a", "b"]), st.integers(0, 400)), max_size=80))
def test_invariants_hold_under_any_sequence(ops) -> None:
    b = MemoryBudget(1000)
    flying = {"a": 0, "b": 0}  # what the callers marked in flight and did not complete yet
    for op, app, n in ops:
        if op == "alloc":
            b.try_allocate(n)
        elif op == "free":
            b.release_allocated(n)
        elif op == "use":
            b.add_used(app, n)
        elif op == "spill":
            # a spill only ever takes bytes that are used and not in flight yet
            size = min(n, b.used_by_app(app) - flying[app])
            b.mark_in_flight(app, size)
            flying[app] += size
        elif op == "done":
            size = min(n, flying[app])
            assert b.release_used(app, size, was_in_flight=True) == size
            flying[app] -= size
        else:
            b.purge_app(app)
            flying[app] = 0
        assert 0 <= b.in_flight <= b.used
        assert b.allocated >= 0
        assert b.used == b.used_by_app("a") + b.used_by_app("b")
    b.purge_app("a")
    b.purge_app("b")
    assert (b.used, b.in_flight) == (0, 0)
