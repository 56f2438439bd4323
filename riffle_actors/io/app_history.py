"""The record of finished (purged) apps behind ``/apps/history`` (Riffle's ``historical_apps_config``).

``AppHistory`` keeps the records in memory, newest last, one per app id (a later purge of the same
id replaces it), at most ``max_apps`` of them and none older than ``retention_days`` (by its
``end_timestamp``; an expired one is dropped when the next record is added and is never listed).
``list()`` and ``record()`` are memory operations, cheap enough for the event loop.

With a database (``backend = "SLED"``, Riffle's persistent store; here ``<db_path>/apps.sqlite3``,
SQLite from the standard library, one JSON object per app, never pickle) every change is also
written there, in order, by one worker thread of its own (``record()`` never waits for the disk),
and ``open_app_history`` loads it at start, so the history survives a restart. The file is bounded
like the memory (``max_apps`` rows, pruned as records are added). A row that does not decode into
a record of the expected shape is skipped (counted in the log); a file SQLite cannot read is moved
aside to ``apps.sqlite3.corrupt-<ms>`` (logged as an ERROR) and a new one started: the history
is a convenience, never a reason not to serve.

Without ``historical_apps_config`` the server keeps the last 1000 purged apps in memory, no
retention in days (as before that section existed).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loguru import logger

DB_FILE = "apps.sqlite3"
DAY_MS = 86_400_000

#: the fields of one record and their types (Riffle's ``HistoricalAppInfo`` plus ``reason`` and
#: ``purged_epoch_ms`` of ours); a stored row with other shapes is skipped at load
FIELDS: dict[str, type | tuple[type, ...]] = {
    "app_id": str,
    "reason": str,
    "purged_epoch_ms": int,
    "total_bytes": int,
    "partition_num": int,
    "huge_partition_num": int,
    "avg_huge_partition_bytes": int,
    "max_huge_partition_bytes": int,
    "min_huge_partition_bytes": int,
    "start_timestamp": int,
    "end_timestamp": int,
    "partition_split_triggered": bool,
}
_MAX_ROW_BYTES = 4096  # a record is ~400 bytes; a larger row was not written by us


def _valid(rec: Any) -> bool:
    if not isinstance(rec, dict) or set(rec) != set(FIELDS):
        return False
    for key, kind in FIELDS.items():
        value = rec[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return False
        if not isinstance(value, kind):
            return False
    return True


class _Database:
    """``<dir>/apps.sqlite3``: one row per app id. Every method runs on the one writer thread."""

    def __init__(self, directory: Path):
        self.path = directory / DB_FILE
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS apps (app_id TEXT PRIMARY KEY, end_ms INTEGER NOT NULL, "
                     "record TEXT NOT NULL)")
        conn.execute("CREATE INDEX IF NOT EXISTS apps_end ON apps (end_ms)")
        return conn

    def load(self) -> tuple[list[dict[str, Any]], int]:
        """Every valid record, oldest first, and the number of rows skipped."""
        try:
            self._conn = self._connect()
            rows = self._conn.execute("SELECT record FROM apps ORDER BY end_ms, rowid").fetchall()
        except sqlite3.DatabaseError as e:
            aside = self.path.with_name(f"{DB_FILE}.corrupt-{int(os.path.getmtime(self.path) * 1000)}")
            logger.error("historical apps: {} is not a readable database ({}); moved aside to {}, starting "
                         "a new one", self.path, e, aside)
            if self._conn is not None:
                self._conn.close()
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self._conn = self._connect()
            return [], 0
        records: list[dict[str, Any]] = []
        skipped = 0
        for (text,) in rows:
            try:
                rec = json.loads(text) if isinstance(text, str) and len(text) <= _MAX_ROW_BYTES else None
            except ValueError:
                rec = None
            if isinstance(rec, dict) and _valid(rec):
                records.append(rec)
            else:
                skipped += 1
        return records, skipped

    def apply(self, upsert: dict[str, Any] | None, delete: list[str]) -> None:
        if self._conn is None:
            self._conn = self._connect()
        with self._conn:  # one transaction: the row and the rows it evicts
            self._conn.execute("BEGIN")
            if delete:
                self._conn.executemany("DELETE FROM apps WHERE app_id = ?", [(a,) for a in delete])
            if upsert is not None:
                self._conn.execute("INSERT OR REPLACE INTO apps (app_id, end_ms, record) VALUES (?, ?, ?)",
                                   (upsert["app_id"], upsert["end_timestamp"], json.dumps(upsert)))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class AppHistory:
    """Finished apps, newest last; see the module docstring. ``now_ms()`` is the server's clock."""

    def __init__(self, *, max_apps: int = 1000, retention_days: int | None = None,
                 now_ms: Callable[[], int] | None = None, database: _Database | None = None,
                 records: list[dict[str, Any]] | None = None):
        self.max_apps = max_apps
        self.retention_ms = retention_days * DAY_MS if retention_days is not None else None
        self._now_ms = now_ms or (lambda: 0)
        self._apps: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._db = database
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="app-history") if database is not None else None
        self._lock = threading.Lock()
        self.write_failures = 0
        for rec in records or ():
            self._apps[rec["app_id"]] = rec
            self._apps.move_to_end(rec["app_id"])
        evicted = self._prune()
        if evicted:
            self._submit(None, evicted)

    @property
    def persistent(self) -> bool:
        return self._db is not None

    def _prune(self) -> list[str]:
        evicted = []
        if self.retention_ms is not None:
            cutoff = self._now_ms() - self.retention_ms
            for app_id, rec in list(self._apps.items()):
                if rec["end_timestamp"] < cutoff:
                    del self._apps[app_id]
                    evicted.append(app_id)
        while len(self._apps) > self.max_apps:
            app_id, _ = self._apps.popitem(last=False)
            evicted.append(app_id)
        return evicted

    def record(self, rec: dict[str, Any]) -> None:
        """Add (or replace) one app's record; bounded and written through (see the module docstring)."""
        self._apps.pop(rec["app_id"], None)
        self._apps[rec["app_id"]] = rec
        self._submit(rec, self._prune())

    def _submit(self, upsert: dict[str, Any] | None, delete: list[str]) -> None:
        if self._writer is None or self._db is None:
            return
        db = self._db

        def write() -> None:
            try:
                db.apply(upsert, delete)
            except sqlite3.Error as e:  # the memory copy stays right; the file misses this change
                with self._lock:
                    self.write_failures += 1
                logger.error("historical apps: writing {} failed: {}", db.path, e)

        self._writer.submit(write)

    def list(self) -> list[dict[str, Any]]:
        """The records, oldest first, without those past the retention."""
        if self.retention_ms is None:
            return list(self._apps.values())
        cutoff = self._now_ms() - self.retention_ms
        return [r for r in self._apps.values() if r["end_timestamp"] >= cutoff]

    def __len__(self) -> int:
        return len(self._apps)

    def close(self) -> None:
        """Write what is queued and close the file (blocks: call it off the event loop)."""
        if self._writer is not None:
            if self._db is not None:
                self._writer.submit(self._db.close)  # on the thread that opened it
            self._writer.shutdown(wait=True)
            self._writer = None


def open_app_history(*, backend: str | None, retention_days: int | None, db_path: str | None, max_apps: int,
                     now_ms: Callable[[], int]) -> AppHistory:
    """The server's history: in memory (``backend`` MEM or None) or loaded from ``db_path`` (SLED).
    Blocks on the file: call it off the event loop."""
    if backend != "SLED":
        return AppHistory(max_apps=max_apps, retention_days=retention_days, now_ms=now_ms)
    assert db_path is not None
    directory = Path(db_path)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    db = _Database(directory)
    records, skipped = db.load()
    db.close()  # sqlite3 connections belong to their thread: the writer thread opens its own
    if skipped:
        logger.warning("historical apps: {} rows of {} were not records written by this server; skipped",
                       skipped, db.path)
    history = AppHistory(max_apps=max_apps, retention_days=retention_days, now_ms=now_ms, database=db,
                         records=records)
    logger.info("historical apps: {} finished apps loaded from {} (kept {} days, at most {})", len(history),
                db.path, retention_days, max_apps)
    return history

