"""SendTicket and BufferAdmission, without a loop: a send's settlement as ``Commit`` instructions (one per
send, flushed early before a spill, the rest given back once), and requireBuffer's huge-partition
backpressure and split decisions over a size table."""

from __future__ import annotations

from riffle_actors.state.app_state import PartitionEntry
from riffle_actors.state.send import Backpressure, BufferAdmission, Commit, SendTicket, flush_all, release_all

APP = "app1"


def test_a_send_ticket_turns_each_reserved_byte_into_used_or_released_once() -> None:
    ticket = SendTicket(APP, 1000)
    registry: set[SendTicket] = set()
    ticket.expect(3, registry)
    assert ticket.part_done(300, 300) is None  # committed once per send, not per part
    assert ticket.flush() == Commit(APP, 300, 300)  # a partition about to mark a spill of these bytes
    assert ticket.flush() is None
    assert ticket.part_done(200, 100) is None  # 100 bytes were duplicates
    assert ticket.release_rest() == Commit(APP, 700, 100) and registry == set()  # the app stopped
    assert not ticket.complete and ticket.settled
    assert ticket.part_done(200, 200) == Commit(APP, 0, 200)  # late: counted as used, not reserved twice
    assert ticket.release_rest() is None


def test_the_last_part_settles_the_whole_send_with_its_slack() -> None:
    registry: set[SendTicket] = set()
    whole = SendTicket(APP, 500)
    whole.expect(2, registry)
    assert whole in registry
    assert whole.part_done(100, 100) is None and not whole.complete
    assert whole.part_done(300, 300) == Commit(APP, 500, 400)
    assert whole.complete and whole.accepted == 400 and registry == set()


def test_one_commit_for_every_open_send_of_an_app() -> None:
    registry: set[SendTicket] = set()
    a, b, c = SendTicket(APP, 100), SendTicket(APP, 200), SendTicket(APP, 300)
    for t in (a, b, c):
        t.expect(2, registry)
    a.part_done(50, 50)
    b.part_done(200, 150)
    assert flush_all(registry, APP) == Commit(APP, 250, 200)
    assert flush_all(registry, APP) is None
    assert release_all(registry, APP) == Commit(APP, 50 + 0 + 300, 0) and registry == set()


def table(**parts: tuple[int, int, int, bool, bool]) -> dict[int, PartitionEntry]:
    """partition id -> (staging, in flight, total, huge, split)."""
    out = {}
    for key, (staging, in_flight, total, huge, split) in parts.items():
        e = PartitionEntry()
        f = e.figures
        f.staging_bytes, f.in_flight_bytes, f.total_bytes, f.huge, f.split = staging, in_flight, total, huge, split
        out[int(key[1:])] = e
    return out


def test_backpressure_holds_a_huge_partition_above_the_limit_and_spills_it_when_nothing_is_in_flight() -> None:
    t = table(p1=(900, 0, 5000, True, False), p2=(600, 500, 6000, True, False), p3=(5000, 0, 5000, False, False))
    assert BufferAdmission.backpressure(t, (3, 7), 1000) is None  # not huge / unknown
    assert BufferAdmission.backpressure(t, (1,), 1000) is None  # 900 <= 1000
    assert BufferAdmission.backpressure(t, (1, 2), None) is None  # the limit is off
    assert BufferAdmission.backpressure(t, (3, 2), 1000) == Backpressure(2, False, 6000, 1100)
    assert BufferAdmission.backpressure(t, (1,), 800) == Backpressure(1, True, 5000, 900)


def test_split_names_the_partitions_above_the_threshold_sorted() -> None:
    t = table(p1=(0, 0, 100, False, True), p2=(0, 0, 2000, False, False), p3=(0, 0, 10, False, False))
    assert BufferAdmission.split(t, (3, 2, 1, 9), 1000) == (1, 2)
    assert BufferAdmission.split(t, (3, 2, 1), None) == ()
