"""TicketBook: one-shot requireBuffer tickets, server-wide ids from 1, expiry on an injected clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.runtime import ManualClock
from riffle_actors.state.tickets import TicketBook


def test_ids_start_at_one_and_increase() -> None:
    book = TicketBook(ManualClock(), 20)
    ids = [book.issue("a", 0, 10).ticket_id for _ in range(3)]
    assert ids == [1, 2, 3]
    assert len(book) == 3 and book.total_size() == 30


def test_take_is_one_shot() -> None:
    book = TicketBook(ManualClock(), 20)
    t = book.issue("a", 1, 100)
    assert book.take(t.ticket_id) == t
    assert book.take(t.ticket_id) is None
    assert book.take(12345) is None
    assert book.take(-1) is None
    assert len(book) == 0


def test_expire_after_timeout() -> None:
    clock = ManualClock()
    book = TicketBook(clock, 20)
    old = book.issue("a", 0, 1)
    clock.advance(10)
    young = book.issue("a", 0, 2)
    clock.advance(9.5)
    assert book.expire() == []
    clock.advance(0.5)  # old is exactly 20 s old
    assert book.expire() == [old]
    assert book.take(old.ticket_id) is None
    clock.advance(10)
    assert book.expire() == [young]
    assert len(book) == 0


def test_expired_ticket_is_not_taken_twice() -> None:
    clock = ManualClock()
    book = TicketBook(clock, 5)
    t = book.issue("a", 0, 1)
    clock.advance(6)
    assert book.expire() == [t]
    assert book.expire() == []
    assert book.take(t.ticket_id) is None


def test_purge_app_and_shuffle() -> None:
    book = TicketBook(ManualClock(), 20)
    a0 = book.issue("a", 0, 1)
    a1 = book.issue("a", 1, 2)
    b0 = book.issue("b", 0, 4)
    assert book.purge_app("a", 1) == [a1]
    assert book.purge_app("a") == [a0]
    assert book.purge_app("a") == []
    assert len(book) == 1 and book.take(b0.ticket_id) == b0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["issue", "take", "advance", "expire"]), st.integers(0, 30)),
                max_size=60))
def test_every_ticket_leaves_exactly_once(ops) -> None:
    """Whatever the interleaving, each issued ticket comes back once: by take, expire or purge."""
    clock = ManualClock()
    book = TicketBook(clock, 10)
    issued: dict[int, int] = {}
    returned: list[int] = []
    for op, n in ops:
        if op == "issue":
            t = book.issue("app", n % 3, n)
            issued[t.ticket_id] = n
        elif op == "take":
            t = book.take(n + 1)
            if t is not None:
                returned.append(t.ticket_id)
        elif op == "advance":
            clock.advance(n)
        else:
            expired = book.expire()
            assert all(clock.monotonic() - t.created_monotonic >= 10 for t in expired)
            returned.extend(t.ticket_id for t in expired)
        assert book.total_size() == sum(issued[i] for i in issued if i not in returned)
    returned.extend(t.ticket_id for t in book.purge_app("app"))
    assert sorted(returned) == sorted(issued)
    assert len(book) == 0
