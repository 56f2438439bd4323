"""AppManager sweep decisions: expiry verdicts, spill targets, one round at a time; no event loop."""

from __future__ import annotations

import pytest

from riffle_actors.state.app_sweep import Answer, ExpiryBook, RoundGate, SpillCandidate, pick_spill


def test_expired_and_gone_apps_are_purged_alive_ones_are_not() -> None:
    book = ExpiryBook()
    purge = book.decide({"a": Answer.EXPIRED, "b": Answer.ALIVE, "c": Answer.GONE})
    assert purge == [("a", "heartbeat timeout"), ("c", "app actor stopped")]


def test_an_unanswered_check_is_no_verdict_until_it_repeats() -> None:
    book = ExpiryBook(misses_to_purge=3)
    assert book.decide({"slow": Answer.NO_ANSWER}) == []
    assert book.decide({"slow": Answer.NO_ANSWER}) == []
    purge = book.decide({"slow": Answer.NO_ANSWER})
    assert purge == [("slow", "heartbeat timeout (expiry check not answered 3 times in a row)")]
    assert book.misses == {}


def test_an_answer_resets_the_misses() -> None:
    book = ExpiryBook(misses_to_purge=2)
    book.decide({"x": Answer.NO_ANSWER})
    book.decide({"x": Answer.ALIVE})
    assert book.decide({"x": Answer.NO_ANSWER}) == []


def test_apps_no_longer_asked_are_forgotten() -> None:
    book = ExpiryBook(misses_to_purge=2)
    book.decide({"x": Answer.NO_ANSWER})
    book.decide({})  # x was purged meanwhile
    assert book.misses == {}
    assert book.decide({"x": Answer.NO_ANSWER}) == []  # a new app with the same id starts afresh


def test_pick_spill_takes_the_largest_buffers_until_the_target() -> None:
    candidates = [SpillCandidate(10, "a", 0, 1), SpillCandidate(50, "b", 0, 2), SpillCandidate(30, "a", 1, 3),
                  SpillCandidate(5, "c", 0, 0)]
    assert pick_spill(candidates, 60) == {"b": ((0, 2),), "a": ((1, 3),)}
    assert pick_spill(candidates, 50) == {"b": ((0, 2),)}
    assert pick_spill(candidates, 10**9) == {"b": ((0, 2),), "a": ((1, 3), (0, 1)), "c": ((0, 0),)}
    assert pick_spill(candidates, 0) == {}
    assert pick_spill([], 100) == {}


def test_round_gate_runs_one_round_and_coalesces_requests() -> None:
    gate: RoundGate[str] = RoundGate()
    assert gate.request("first")
    assert not gate.request("second")
    assert not gate.request("third")  # replaces "second": one more round, not two
    assert gate.finished() == "third"
    assert gate.running
    assert gate.finished() is None
    assert not gate.running
    assert (gate.rounds, gate.coalesced) == (2, 1)
    assert gate.request("again")
    with pytest.raises(ValueError):
        gate.request(None)  # type: ignore[arg-type]
