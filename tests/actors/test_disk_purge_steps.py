"""A purge deletes in steps (``riffle_actors.actors.disk``): what that must not change.

the files an app id registered again writes while the old incarnation's purge is still running
survive the purge's later steps (its writes wait for the purge, untimed). That a purge longer than
``io_timeout_s`` which keeps deleting is no TIMEOUT is shown with a real daemon
(``tests/security/test_data_dirs.py``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from riffle_actors.actors.disk import DiskActor, DiskResources
from riffle_actors.actors.storage_messages import PurgeFiles, UnfenceApp, WriteBatch
from riffle_actors.io.faults import FaultyLocalIO
from riffle_actors.io.localfile import PURGE_STEP_OPS
from riffle_actors.records import Block
from riffle_actors.runtime import ChildSpec


def _old_incarnation(root: Path, entries: int) -> None:
    for sid in range(entries // 100 + 1):
        d = root / "app" / str(sid)
        d.mkdir(parents=True, exist_ok=True)
        for p in range(100):
            (d / f"partition-{p}.data").write_bytes(b"old")


async def test_a_new_incarnations_write_survives_the_old_purges_later_steps(system, tmp_path: Path, poll):
    root = tmp_path / "disk"
    _old_incarnation(root, 3 * PURGE_STEP_OPS)
    io = FaultyLocalIO()
    res = DiskResources("disk", str(root), local_io=io)
    try:
        disk = await system.start_child(None, ChildSpec("disk", lambda: DiskActor("disk", str(root), resources=res)))
        blocked = io.hang("remove_app")  # the purge's first step pauses in the writer thread
        await disk.tell(PurgeFiles(app_id="app"))
        await poll(blocked.entered.is_set)
        await disk.tell(UnfenceApp("app"))  # the app id registers again, and writes at once
        write = asyncio.ensure_future(disk.ask(WriteBatch(app_id="app", shuffle_id=9, partition_id=0,
                                                          blocks=(Block(1, 3, 3, 0, 1, b"new"),))))
        blocked.release.set()
        await write
        await poll(lambda: not res.purges)
        assert (root / "app" / "9" / "partition-0.data").read_bytes() == b"new"
        assert sorted(p.name for p in (root / "app").iterdir()) == ["9"]  # the old incarnation is gone
        assert io.calls["remove_app"] >= 3  # in steps
    finally:
        io.heal()
        res.close()

