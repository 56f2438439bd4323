"""The scrubber of one disk: re-reads its spilled data files at a bounded rate and checks every block's CRC.

A task owned by the disk (started by its Disk actor, kept in its ``DiskResources`` so a restarted
actor does not start a second one). Each pass lists the partition index files under the data path
(``LocalIO.list_partitions``: ``safe_fs``, never through a symlink), then per partition reads its
index and its data file in chunks of at most ``chunk_bytes`` on the disk's reader pool, and checks
each block against the CRC of its index record (``riffle_actors.protocol.crc.check_indexed``).
What it finds goes to the ``IntegrityLedger`` (per partition and disk; reads of a range holding a
corrupt block are refused from then on) and to ``on_checked`` (the server's metrics).

Rate: ``[localfile_store] scrub_rate`` bytes per second (a token bucket of its own), and every chunk
is charged to the disk throttle (``io_limiter``) too when reads are limited there. Both waits are
slept here, on the event loop, before the chunk is handed to a reader thread: the scrubber never
holds an IO thread while it waits, and a chunk (4 MB by default) keeps a reader thread for one pread
plus its CRC (ISA-L, ~0.4 ms). A pass ends with a pause of ``scrub_interval_sec``.

Partitions of a purged app or shuffle are skipped (``is_fenced``), and what a chunk read that raced
a purge found is dropped (``IntegrityLedger.mark``); a file that vanishes mid-pass
(purged) or an index that points past its data file end (recovery cuts those) is skipped quietly;
any other ``OSError`` is logged and the pass goes on with the next partition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from loguru import logger

from riffle_actors.errors import RiffleError
from riffle_actors.io.local import LocalIO
from riffle_actors.protocol.crc import check_indexed
from riffle_actors.protocol.index import IndexEntry, decode_index
from riffle_actors.state.integrity import CorruptBlock, IntegrityLedger
from riffle_actors.state.throttle import TokenBucket


@dataclass(frozen=True, slots=True)
class ScrubSettings:
    rate: int  # [localfile_store] scrub_rate, bytes per second (> 0)
    interval_s: float  # [localfile_store] scrub_interval_sec
    chunk_bytes: int = 4 << 20


def _chunks(entries: list[IndexEntry], data_len: int, chunk_bytes: int):
    """Runs of index records contiguous in the data file, each spanning at most ``chunk_bytes`` (a
    bigger block alone); records past the data file's end are left out."""
    run: list[IndexEntry] = []
    start = end = 0
    for e in entries:
        if e.length < 0 or e.offset < 0 or e.offset + e.length > data_len:
            continue
        if run and (e.offset != end or e.offset + e.length - start > chunk_bytes):
            yield start, end, run
            run = []
        if not run:
            start = e.offset
        run.append(e)
        end = e.offset + e.length
    if run:
        yield start, end, run


def _read_entries(local_io: LocalIO, root: str, app_id: str, shuffle_id: int, pid: int):
    index, data_len = local_io.read_index(root, app_id, shuffle_id, pid)
    return decode_index(index), data_len


def _read_and_check(local_io: LocalIO, root: str, app_id: str, shuffle_id: int, pid: int, start: int, end: int,
                    entries: list[IndexEntry]):
    buf = local_io.read_data(root, app_id, shuffle_id, pid, start, end - start)
    return check_indexed(buf, start, entries)


async def run_scrubber(*, disk: str, root: str, local_io: LocalIO, reader: Callable[[], Executor],
                       ledger: IntegrityLedger, settings: ScrubSettings,
                       is_fenced: Callable[[str, int], bool],
                       throttle=None,
                       on_checked: Callable[[str, int, int, int], None] | None = None,
                       on_pass: Callable[[str], None] | None = None) -> None:
    """Scrub ``root`` for ever (cancel the task to stop). ``reader()`` gives the disk's reader pool (it
    is recreated after a close); ``throttle`` a ``DiskThrottle`` or None; ``on_checked(disk, bytes,
    blocks, corrupt)`` after each chunk, ``on_pass(disk)`` after each pass."""
    loop = asyncio.get_running_loop()
    bucket = TokenBucket(settings.rate, now=time.monotonic())
    log = logger.bind(disk=disk)
    while True:
        try:
            parts = await loop.run_in_executor(reader(), local_io.list_partitions, root)
        except OSError as e:
            log.warning("disk {}: scrubber cannot list {}: {}", disk, root, e)
            parts = []
        for app_id, shuffle_id, pid in parts:
            if is_fenced(app_id, shuffle_id):
                continue
            try:
                await _scrub_partition(loop, disk, root, local_io, reader, ledger, settings, bucket, throttle,
                                       on_checked, is_fenced, app_id, shuffle_id, pid)
            except (FileNotFoundError, RiffleError):
                continue  # purged meanwhile, or the index points past the data file's end
            except OSError as e:
                log.warning("disk {}: scrubbing {}/{}/{} failed: {}", disk, app_id, shuffle_id, pid, e)
        if on_pass is not None:
            on_pass(disk)
        await asyncio.sleep(settings.interval_s)


async def _scrub_partition(loop, disk, root, local_io, reader, ledger, settings, bucket, throttle, on_checked,
                           is_fenced, app_id, shuffle_id, pid) -> None:
    entries, data_len = await loop.run_in_executor(reader(), _read_entries, local_io, root, app_id, shuffle_id, pid)
    for start, end, run in _chunks(entries, data_len, settings.chunk_bytes):
        n = end - start
        wait = bucket.acquire(n, time.monotonic())
        if throttle is not None and throttle.read:
            wait = max(wait, throttle.charge("read", n))
        if wait > 0:
            await asyncio.sleep(wait)
        if is_fenced(app_id, shuffle_id):
            return
        mark = ledger.mark()
        bad = await loop.run_in_executor(reader(), _read_and_check, local_io, root, app_id, shuffle_id, pid,
                                         start, end, run)
        new = 0
        if bad:
            new = ledger.on_scrubbed(app_id, shuffle_id, pid, disk, [
                CorruptBlock(e.offset, e.length, e.block_id, e.crc, actual) for e, actual in bad], since=mark)
            if new:
                logger.bind(disk=disk, app_id=app_id).error(
                    "disk {}: {} corrupt block(s) in {}/{}/partition-{}.data (first: block {} at offset {}, "
                    "index crc {}, bytes crc {}); reads of them are refused", disk, new, app_id, shuffle_id, pid,
                    bad[0][0].block_id, bad[0][0].offset, bad[0][0].crc, bad[0][1])
        if on_checked is not None:
            on_checked(disk, n, len(run), new)
