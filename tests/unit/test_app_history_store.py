"""``riffle_actors.io.app_history``: the finished-app record behind ``/apps/history`` (retention in
days, the ``max_apps`` bound, one record per app id) and its SQLite file (survives a reopen, stays
bounded, foreign rows skipped, an unreadable file moved aside), on a real file under tmp_path."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from riffle_actors.io.app_history import DAY_MS, DB_FILE, AppHistory, open_app_history


def rec(app_id: str, end_ms: int, total: int = 1) -> dict:
    return {"app_id": app_id, "reason": "unregistered by client", "purged_epoch_ms": end_ms, "total_bytes": total,
            "partition_num": 1, "huge_partition_num": 0, "avg_huge_partition_bytes": 0,
            "max_huge_partition_bytes": 0, "min_huge_partition_bytes": 0, "start_timestamp": end_ms - 5,
            "end_timestamp": end_ms, "partition_split_triggered": False}


class Now:
    def __init__(self) -> None:
        self.ms = 100 * DAY_MS

    def __call__(self) -> int:
        return self.ms


def _open(db: Path, now: Now, max_apps: int = 3, days: int = 2) -> AppHistory:
    return open_app_history(backend="SLED", retention_days=days, db_path=str(db), max_apps=max_apps, now_ms=now)


def test_retention_bound_and_replacement_in_memory():
    now = Now()
    h = AppHistory(max_apps=3, retention_days=2, now_ms=now)
    h.record(rec("a", now.ms - 3 * DAY_MS))  # older than 2 days: dropped at once
    assert h.list() == []
    for i, app in enumerate("bcd"):
        h.record(rec(app, now.ms + i))
    h.record(rec("b", now.ms + 10, total=7))  # the same id again: replaced, now the newest
    h.record(rec("e", now.ms + 11))  # one more than max_apps: the oldest (c) goes
    assert [(r["app_id"], r["total_bytes"]) for r in h.list()] == [("d", 1), ("b", 7), ("e", 1)]
    now.ms += 2 * DAY_MS + 5  # d is past the retention now, b and e not
    assert [r["app_id"] for r in h.list()] == ["b", "e"]


def test_the_database_survives_a_reopen_and_stays_bounded(tmp_path: Path):
    now, db = Now(), tmp_path / "hist"
    h = _open(db, now)
    for i in range(5):
        h.record(rec(f"app-{i}", now.ms + i))
    h.close()
    rows = sqlite3.connect(db / DB_FILE).execute("SELECT app_id FROM apps ORDER BY end_ms").fetchall()
    assert [r[0] for r in rows] == ["app-2", "app-3", "app-4"]  # bounded on disk too
    h = _open(db, now)
    assert [r["app_id"] for r in h.list()] == ["app-2", "app-3", "app-4"]
    h.close()
    now.ms += 3 * DAY_MS  # all past the retention at the next start: pruned from the file too
    h = _open(db, now)
    assert h.list() == []
    h.close()
    assert sqlite3.connect(db / DB_FILE).execute("SELECT COUNT(*) FROM apps").fetchone() == (0,)


def test_foreign_rows_are_skipped_and_an_unreadable_file_is_moved_aside(tmp_path: Path):
    now, db = Now(), tmp_path / "hist"
    h = _open(db, now)
    h.record(rec("good", now.ms))
    h.close()
    conn = sqlite3.connect(db / DB_FILE)
    with conn:
        bad = {**rec("typed", now.ms), "total_bytes": "lots"}
        conn.executemany("INSERT INTO apps VALUES (?, ?, ?)", [
            ("junk", now.ms, "not json"), ("typed", now.ms, json.dumps(bad)),
            ("extra", now.ms, json.dumps({**rec("extra", now.ms), "pickle": "no"})),
            ("big", now.ms, json.dumps({**rec("big", now.ms), "reason": "x" * 10_000}))])
    conn.close()
    h = _open(db, now)
    assert [r["app_id"] for r in h.list()] == ["good"]
    h.close()

    (db / DB_FILE).write_bytes(b"this is not an SQLite database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{db / DB_FILE}{suffix}").unlink(missing_ok=True)
    h = _open(db, now)
    assert h.list() == []
    h.record(rec("after", now.ms))
    h.close()
    assert len(list(db.glob(f"{DB_FILE}.corrupt-*"))) == 1
    h = _open(db, now)
    assert [r["app_id"] for r in h.list()] == ["after"]
    h.close()
