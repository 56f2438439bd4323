"""MemoryLedger, without a loop: a send's bytes from reservation to release, the app's ticket share, and
the watermark trigger's instructions (``SpillRound``) with their one-round-at-a-time rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riffle_actors.errors import NoBufferError, TicketExceededError, TicketNotFoundError
from riffle_actors.runtime import ManualClock
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.memory_ledger import SPILL_ROUND_TIMEOUT_S, MemoryLedger, SpillRound
from riffle_actors.state.send import SendTicket

APP = "app-1"


def ledger(capacity: int = 1000, *, high: float = 0.8, low: float = 0.2, sensitive: bool = False,
           app_bytes: int | None = None, app_tickets: int | None = None) -> MemoryLedger:
    from riffle_actors.state.tickets import TicketBook

    clock = ManualClock()
    return MemoryLedger(MemoryBudget(capacity), TicketBook(clock, 60.0), clock, high_watermark=high,
                        low_watermark=low, sensitive=sensitive, app_max_ticket_bytes=app_bytes,
                        app_max_tickets=app_tickets)


def figures(led: MemoryLedger) -> tuple[int, int, int]:
    b = led.budget
    return b.allocated, b.used, b.in_flight


def test_a_send_takes_one_path_from_its_reservation_to_its_release() -> None:
    led = ledger()
    tid = led.require(APP, 0, 300)
    assert figures(led) == (300, 0, 0)
    size = led.take(tid, APP, needed=250)
    assert size == 300 and len(led.tickets) == 0
    ticket = SendTicket(APP, size)
    ticket.expect(2, set())
    assert ticket.part_done(100, 100) is None
    commit = ticket.part_done(150, 120)  # 30 bytes were duplicates; 50 of slack
    assert commit is not None and (commit.ticket_bytes, commit.used_bytes) == (300, 220)
    assert led.commit(commit.app_id, commit.ticket_bytes, commit.used_bytes) is None
    assert figures(led) == (0, 220, 0)
    led.mark_in_flight(APP, 220)
    led.release(APP, 220, was_in_flight=True)
    assert figures(led) == (0, 0, 0)


def test_a_taken_ticket_is_spent_whatever_follows() -> None:
    led = ledger()
    tid = led.require(APP, 0, 100)
    with pytest.raises(TicketExceededError, match="reserved 100"):
        led.take(tid, APP, needed=101)
    assert figures(led) == (0, 0, 0)  # the reservation went back at once
    with pytest.raises(TicketNotFoundError):
        led.take(tid, APP)  # and the ticket is gone
    other = led.require("app-2", 0, 50)
    with pytest.raises(TicketNotFoundError, match="another app"):
        led.take(other, APP)
    assert figures(led) == (0, 0, 0)


def test_refusals_past_capacity_and_past_the_apps_share() -> None:
    led = ledger(app_bytes=600, app_tickets=2)
    led.require(APP, 0, 500)
    with pytest.raises(NoBufferError, match="app_buffer_ticket_max_ratio"):
        led.require(APP, 0, 200)
    led.require(APP, 0, 100)
    with pytest.raises(NoBufferError, match="app_buffer_ticket_max_number"):
        led.require(APP, 0, 1)
    led.require("app-2", 0, 400)
    with pytest.raises(NoBufferError, match="capacity 1000"):
        led.require("app-3", 0, 1)
    assert figures(led) == (1000, 0, 0)


def test_expiry_and_purge_give_reservations_back() -> None:
    led = ledger()
    led.require(APP, 0, 100)
    led.require(APP, 1, 200)
    led.purge_app(APP, 1)
    assert figures(led) == (100, 0, 0)
    led.commit(APP, 0, 300)
    led.clock.advance(61)  # type: ignore[attr-defined]
    expired, spill = led.expire()
    assert [t.size for t in expired] == [100] and spill is None and led.expired_tickets_total == 1
    led.purge_app(APP)
    assert figures(led) == (0, 0, 0)


def test_the_trigger_asks_one_round_at_a_time() -> None:
    led = ledger()
    assert led.commit(APP, 0, 700) is None  # 700 <= 800
    spill = led.commit(APP, 0, 150)
    assert spill == SpillRound(850 - 200)
    led.round_started()
    assert led.commit(APP, 0, 10) is None  # a round is under way
    assert led.round_done(0) is None  # it put nothing in flight: wait for the next event
    assert led.commit(APP, 0, 0) == SpillRound(860 - 200)
    led.round_started()
    led.clock.advance(SPILL_ROUND_TIMEOUT_S)  # type: ignore[attr-defined]
    assert led.commit(APP, 0, 0) == SpillRound(660, overdue=True)  # its answer was lost
    assert led.spill_rounds_total == 2 and led.above_high_since is not None


def test_a_refused_reservation_forces_a_round_on_reserved_pressure() -> None:
    led = ledger()
    led.commit(APP, 0, 500)
    led.require(APP, 0, 400)
    assert led.spill() is None  # 500 not in flight < 800
    assert led.spill(force=True) == SpillRound(300)  # 900 used + allocated > 800


def test_sensitive_mode_counts_in_flight_and_skips_below_low() -> None:
    led = ledger(sensitive=True)
    led.commit(APP, 0, 600)
    led.mark_in_flight(APP, 500)
    assert led.commit(APP, 0, 300) == SpillRound(400 - 200)
    led2 = ledger(sensitive=True)
    led2.commit(APP, 0, 790)
    led2.mark_in_flight(APP, 750)
    assert led2.commit(APP, 0, 50) is None  # 90 not in flight, below the low watermark
    assert led2.set_watermarks(0.9, 0.05, sensitive=False) is None
    assert led2.set_watermarks(0.05, 0.01, sensitive=False) == SpillRound(90 - 10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.lists(st.tuples(st.integers(0, 200), st.booleans()),
                                                            max_size=5), st.booleans()), max_size=12))
def test_every_reserved_byte_is_used_or_given_back_once(sends: list[tuple[int, list[tuple[int, bool]], bool]]) -> None:
    """Random sends, each reserving, taking, appending some parts (a part may be a duplicate), and
    perhaps ending early (the app stopped): nothing stays reserved, used equals what was accepted."""
    led = ledger(capacity=10_000)
    held = 0
    for size, parts, stopped in sends:
        tid = led.require(APP, 0, size)
        offered = [min(p, size) for p, _ in parts]
        if sum(offered) > size:
            with pytest.raises(TicketExceededError):
                led.take(tid, APP, needed=sum(offered))
            continue
        ticket = SendTicket(APP, led.take(tid, APP, needed=sum(offered)))
        registry: set[SendTicket] = set()
        ticket.expect(max(1, len(parts)), registry)
        commits = []
        cut = len(parts) // 2 if stopped else len(parts)
        for (_, dup), off in zip(parts[:cut], offered[:cut], strict=True):
            commits.append(ticket.part_done(off, 0 if dup else off))
            held += 0 if dup else off
        if stopped or not parts:
            commits.append(ticket.release_rest())
        for (_, dup), off in zip(parts[cut:], offered[cut:], strict=True):  # late parts still count
            commits.append(ticket.part_done(off, 0 if dup else off))
            held += 0 if dup else off
        for c in commits:
            if c is not None:
                led.commit(c.app_id, c.ticket_bytes, c.used_bytes)
        assert registry == set()
    assert figures(led) == (0, held, 0)


def test_a_refused_send_spends_its_ticket_and_gives_all_of_it_back() -> None:
    led = ledger()
    tid = led.require(APP, 0, 400)
    assert led.take(tid, APP, release=True) == 400
    assert figures(led) == (0, 0, 0) and len(led.tickets) == 0
