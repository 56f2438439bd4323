"""A server whose only disk refuses metadata for a while (read-only, full, EIO): registerShuffle and
reportShuffleResult wait and succeed once the disk takes the record again, within
``[localfile_store] meta_write_retry_timeout_sec``; after that the request fails with a message naming the key.
The 0.9.2 client does not retry either RPC on an error status, so a refusal here fails a Spark task."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from riffle_actors.io.faults import FaultyLocalIO
from riffle_actors.server import ShuffleServer
from tests.conftest import server_config, stop_server
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, UniffleError, make_blocks

pytestmark = pytest.mark.integration

APP = "app-meta-retry"


async def _start(tmp_path: Path, faulty: dict[str, FaultyLocalIO], **ls: object) -> ShuffleServer:
    def local_io(name: str, root: str) -> FaultyLocalIO:
        faulty[name] = FaultyLocalIO(name=name)
        return faulty[name]

    cfg = server_config(tmp_path, disks=1, localfile_store={"data_paths": [str(tmp_path / "disk0")], **ls})
    srv = ShuffleServer(cfg, local_io_factory=local_io)
    await srv.start()
    return srv


async def test_a_single_disk_refusing_metadata_for_a_while_delays_the_rpcs_instead_of_failing_them(
        tmp_path: Path) -> None:
    faulty: dict[str, FaultyLocalIO] = {}
    srv = await _start(tmp_path, faulty)
    (disk,) = faulty.values()
    blocks = [b for p in range(4) for b in make_blocks(p, 1, 2, 2000)]
    try:
        assert srv.meta_log is not None
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            # a few failures in a row (EIO, then ENOSPC): retried until the disk takes it
            disk.fail("append_meta", errno.EIO, times=2)
            disk.fail("append_meta", errno.ENOSPC, times=2)
            await c.register_shuffle(APP, 0, range(4))
            assert srv.meta_log.retries >= 4
            await c.send_blocks(APP, 0, blocks)
            # read-only until healed: the report waits, parked, and is answered once the disk is back
            disk.fail("append_meta", errno.EROFS)
            report = asyncio.ensure_future(c.report(APP, 0, 1, blocks))
            await poll_until(lambda: srv.meta_log is not None and srv.meta_log.parked > 0)
            assert not report.done()
            disk.heal()
            await asyncio.wait_for(report, 10)
            assert srv.meta_log.parked == 0 and srv.meta_log.retry_failures == 0
            assert set(await c.get_shuffle_result(APP, 0, range(4))) == {b.block_id for b in blocks}
    finally:
        await stop_server(srv)
    # a restart finds the registration and the report in the log
    srv = await _start(tmp_path, {})
    try:
        assert srv.recovery is not None and srv.recovery.apps == 1
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            assert set(await c.get_shuffle_result(APP, 0, range(4))) == {b.block_id for b in blocks}
    finally:
        await stop_server(srv)


async def test_a_disk_that_stays_read_only_fails_the_report_after_the_retry_timeout(tmp_path: Path) -> None:
    faulty: dict[str, FaultyLocalIO] = {}
    srv = await _start(tmp_path, faulty, meta_write_retry_timeout_sec=0.5)
    (disk,) = faulty.values()
    blocks = make_blocks(0, 1, 2, 1000)
    try:
        assert srv.meta_log is not None
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            await c.register_shuffle(APP, 0, range(1))
            await c.send_blocks(APP, 0, blocks)
            disk.fail("append_meta", errno.EROFS)
            with pytest.raises(UniffleError) as e:
                await c.report(APP, 0, 1, blocks)
            assert "meta_write_retry_timeout_sec=0.5s" in str(e.value) and "Read-only" in str(e.value)
            assert srv.meta_log.retry_failures == 1 and srv.meta_log.parked == 0
    finally:
        await stop_server(srv)


async def test_retry_timeout_zero_fails_at_once(tmp_path: Path) -> None:
    faulty: dict[str, FaultyLocalIO] = {}
    srv = await _start(tmp_path, faulty, meta_write_retry_timeout_sec=0)
    (disk,) = faulty.values()
    try:
        assert srv.meta_log is not None
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as c:
            disk.fail("append_meta", errno.ENOSPC, times=1)
            with pytest.raises(UniffleError, match="no disk could take the shuffle metadata"):
                await c.register_shuffle(APP, 0, range(1))
            assert srv.meta_log.retries == 0
    finally:
        await stop_server(srv)
