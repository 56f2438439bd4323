"""``[historical_apps_config]`` against real ``riffle-server`` processes: a finished app's record in
``GET /apps/history`` carries Riffle's per-app totals, and with ``backend = "SLED"`` it is still
there after the server restarts (same ``db_path``, a new process); with ``MEM`` it is gone.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, make_blocks
from tests.helpers.daemon import server_process

APP = "application_1700000000000_0099_1700000000001"
OVERHEAD = 32  # budget bytes per block


def _history(http_port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/apps/history", timeout=10) as r:
        return json.loads(r.read())


def _tables(backend: str, db: Path) -> str:
    return (f'[historical_apps_config]\nretention_days = 7\nbackend = "{backend}"\ndb_path = "{db}"\n'
            '[app_config]\npartition_limit_enable = true\npartition_limit_threshold = "8K"\n'
            'partition_split_enable = true\npartition_split_threshold = "4K"\n')


async def _run_one_app(target: str) -> None:
    async with UniffleClient(target) as client:
        await client.register_shuffle(APP, 0, range(3))
        await client.send_blocks(APP, 0, make_blocks(0, 1, 5, 2000) + make_blocks(1, 1, 1, 1000))
        await client.send_blocks(APP, 0, make_blocks(2, 1, 3, 3000))
        await client.require_buffer(APP, 0, 100, [0, 1])  # partition 0 is above the split threshold
        await client.unregister_app(APP)


async def test_sled_history_has_riffle_totals_and_survives_a_restart(tmp_path: Path):
    db = tmp_path / "history-db"
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    with server_process(tmp_path / "run1", tables=_tables("SLED", db)) as srv:
        await _run_one_app(srv.target)
        rec = (await poll_until(lambda: _history(srv.http_port), timeout=30))[0]
    p0, p1, p2 = 5 * (2000 + OVERHEAD), 1000 + OVERHEAD, 3 * (3000 + OVERHEAD)
    assert rec["app_id"] == APP and rec["reason"] == "unregistered by client"
    assert rec["total_bytes"] == p0 + p1 + p2 and rec["partition_num"] == 3
    assert (rec["huge_partition_num"], rec["max_huge_partition_bytes"], rec["min_huge_partition_bytes"],
            rec["avg_huge_partition_bytes"]) == (2, p0, p2, (p0 + p2) // 2)  # both above 8K
    assert rec["partition_split_triggered"] is True
    assert 0 < rec["start_timestamp"] <= rec["end_timestamp"] == rec["purged_epoch_ms"]
    assert (db / "apps.sqlite3").is_file()

    with server_process(tmp_path / "run2", tables=_tables("SLED", db)) as srv:  # a new process, same db_path
        assert _history(srv.http_port) == [rec]
        assert "1 finished apps loaded from" in srv.log.read_text()


async def test_mem_history_is_lost_at_restart(tmp_path: Path):
    db = tmp_path / "unused"
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    with server_process(tmp_path / "run1", tables=_tables("MEM", db)) as srv:
        await _run_one_app(srv.target)
        rec = (await poll_until(lambda: _history(srv.http_port), timeout=30))[0]
        assert rec["total_bytes"] > 0 and rec["partition_split_triggered"] is True
    with server_process(tmp_path / "run2", tables=_tables("MEM", db)) as srv:
        assert _history(srv.http_port) == []
    assert not db.exists()
