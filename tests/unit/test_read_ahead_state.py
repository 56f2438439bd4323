"""Read-ahead decisions (``riffle_actors.state.read_ahead``, Riffle's rules) and the index consistency
check (``riffle_actors.protocol.index.index_inconsistency``), both pure."""

from __future__ import annotations

from riffle_actors.protocol.index import encode_index, index_inconsistency
from riffle_actors.state.read_ahead import (
    ClientReadAhead,
    ReadPlans,
    SequentialTracks,
    client_read_ahead,
)

M = 1 << 20
KEY = ("app", 0, 1)


def test_a_sequential_reader_is_loaded_ahead_as_riffle_does():
    t = SequentialTracks(batch_size=2 * M, batch_number=4)
    assert t.on_read(KEY, 5) is None  # a file's read-ahead starts with its first read, at offset 0
    assert t.on_read(KEY, 0) == (0, 8 * M)
    assert t.on_read(KEY, 1 * M) is None  # 7 MiB still loaded ahead of the reader
    assert t.on_read(KEY, 4 * M + 1) == (8 * M, 4 * M)  # within two batches of the end: two more
    assert t.on_read(KEY, 5 * M) is None
    assert t.on_read(KEY, 20 * M) is None  # the reader outran the loads: nothing more (Riffle's too)


def test_a_client_may_lower_the_batches_not_raise_them():
    t = SequentialTracks(batch_size=2 * M, batch_number=4)
    assert t.on_read(KEY, 0, ClientReadAhead(batch_size=M, batch_number=2)) == (0, 2 * M)
    assert t.on_read(("app", 0, 2), 0, ClientReadAhead(batch_size=1 << 40, batch_number=1000)) == (0, 8 * M)


def test_tracks_are_bounded_and_forgotten_with_their_app():
    t = SequentialTracks(batch_size=M, batch_number=1, max_files=3)
    for p in range(5):
        t.on_read(("a", 0, p), 0)
    assert len(t) == 3
    t.on_read(("b", 1, 0), 0)
    assert t.forget("a", 0) == 2 and len(t) == 1 and t.forget("b") == 1


def test_client_options_come_from_the_registration_properties():
    assert client_read_ahead({}) is None
    assert client_read_ahead({"spark.rss.riffle.readAheadEnabled": "false"}) is None
    assert client_read_ahead({"spark.rss.riffle.readAheadEnabled": "TRUE"}) == ClientReadAhead(None, None)
    assert client_read_ahead({"spark.rss.riffle.readAheadEnabled": "true", "spark.rss.riffle.readAheadBatchSize": "4m",
                              "spark.rss.riffle.readAheadBatchNumber": "3"}) == ClientReadAhead(4 * M, 3)
    assert client_read_ahead({"spark.rss.riffle.readAheadEnabled": "true", "spark.rss.riffle.readAheadBatchSize": "x",
                              "spark.rss.riffle.readAheadBatchNumber": "-2"}) == ClientReadAhead(None, None)


def test_read_plans_load_each_announced_segment_once_per_reader():
    plans = ReadPlans(max_readers=2)
    cursor, new = plans.on_read(KEY, 7, 0, [(100, 10), (200, 10), (50, 10)])
    assert new == [(100, 10), (200, 10)] and cursor.reading == 0  # 50 is behind what was planned
    cursor, new = plans.on_read(KEY, 7, 150, [(200, 10), (300, 0), (400, 10)])
    assert new == [(400, 10)] and cursor.reading == 150
    _, new = plans.on_read(KEY, 8, 0, [(200, 10)])  # another task attempt has its own plan
    assert new == [(200, 10)]
    plans.on_read(("x", 0, 0), 1, 0, [])
    assert len(plans) == 2 and plans.forget("app") == 1


def test_index_inconsistency_compares_the_last_record_with_the_data_length():
    index = encode_index([(0, 10, 10, 0, 1, 1), (10, 30, 30, 0, 2, 1)])
    assert index_inconsistency(index, 40) is None
    assert "ends at 40, the data file holds 41 bytes" in index_inconsistency(index, 41)
    assert "ends at 40, the data file holds 39 bytes" in index_inconsistency(index, 39)
    assert index_inconsistency(b"", 0) is None
    assert "no index record" in index_inconsistency(b"", 5)
    assert "not a whole number" in index_inconsistency(index[:-1], 40)
    bad = encode_index([(-5, 10, 10, 0, 1, 1)])
    assert "offset -5" in index_inconsistency(bad, 5)
