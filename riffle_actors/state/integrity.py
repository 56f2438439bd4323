"""IntegrityLedger: what the server knows about corrupt blocks, per app and per partition.

The one place this is kept. It is pure and synchronous, and every write happens on the event loop:
the service records the blocks refused at ingest (a CRC that does not match the bytes) and the
reads refused; the Disk actors record what their scrubber found in a data file and forget a
partition's findings when its files are purged. ``/apps``, the metrics page and riffle-ctl read it.

Vocabulary (docs/faults.md "Integrity"):

- *corrupt*: a block whose bytes on disk no longer match the CRC of its index record, found by a
  disk's scrubber or by the read CRC check (``[localfile_store] read_crc_check_enable``: a range
  being served is checked before it leaves). Both are recorded the same way and counted in the same
  ``corrupt_blocks``; reads of a range holding one are refused (``corrupt_in``) until the files go.
- *refused at ingest*: a block that arrived with bytes that do not match its ``crc``; its whole
  send was refused, nothing of it stored.
- *repaired*: a block refused at ingest whose block id this server later accepted intact (the
  client resent it). A corrupt block on disk is never repaired in place: its reader reads another
  replica.

Bounds: at most ``max_apps`` apps are tracked (the least recently touched is forgotten first),
``max_pending`` refused block ids per app wait for their resend, and ``max_corrupt`` corrupt
blocks per partition and disk are kept (more mark the whole partition file corrupt).

A find that raced a purge is dropped: a scrub or read takes ``mark()`` before it reads and passes it
as ``since``; if the app's files were forgotten after that mark, what the read found belonged to the
deleted files (the next scrub pass finds anything still there).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["AppIntegrity", "CorruptBlock", "IntegrityLedger"]


class CorruptBlock(NamedTuple):
    """A block of a data file whose bytes do not match its index record's CRC."""

    offset: int
    length: int
    block_id: int
    expected: int
    actual: int
    found_by: str = "scrubber"  # or "read check": what found it (named in the refusal)


@dataclass(slots=True)
class AppIntegrity:
    """The counts of one app (``/apps`` fields ``corrupt_blocks``, ``refused_blocks``, ``repaired_blocks``,
    ``corrupt_reads_refused``)."""

    corrupt_blocks: int = 0
    refused_blocks: int = 0
    repaired_blocks: int = 0
    corrupt_reads_refused: int = 0
    pending: set[int] = field(default_factory=set)  # block ids refused at ingest, not yet resent


PartitionKey = tuple[str, int, int]  # (app id, shuffle id, partition id)


class IntegrityLedger:
    def __init__(self, *, max_apps: int = 10_000, max_pending: int = 100_000, max_corrupt: int = 10_000):
        self.max_apps = max_apps
        self.max_pending = max_pending
        self.max_corrupt = max_corrupt
        self._apps: OrderedDict[str, AppIntegrity] = OrderedDict()
        # partition -> disk -> corrupt blocks sorted by offset
        self._corrupt: dict[PartitionKey, dict[str, list[CorruptBlock]]] = {}
        self._whole: set[tuple[PartitionKey, str]] = set()  # over max_corrupt: every read refused
        self.total = AppIntegrity()  # the server's totals (apps forgotten or purged included)
        self._purges = 0  # forget_files calls so far (the marks of reads in flight)
        self._purged_at: OrderedDict[str, int] = OrderedDict()  # app id -> mark of its last forget_files

    def _app(self, app_id: str) -> AppIntegrity:
        a = self._apps.get(app_id)
        if a is None:
            a = self._apps[app_id] = AppIntegrity()
            while len(self._apps) > self.max_apps:
                self._apps.popitem(last=False)
        else:
            self._apps.move_to_end(app_id)
        return a

    def app(self, app_id: str) -> AppIntegrity | None:
        """The app's counts, or None when nothing was ever recorded for it."""
        return self._apps.get(app_id)

    def has_pending(self, app_id: str) -> bool:
        a = self._apps.get(app_id)
        return a is not None and bool(a.pending)

    # ------------------------------------------------------------- ingest
    def on_refused(self, app_id: str, block_ids: Iterable[int]) -> int:
        """Blocks of a send refused for a CRC mismatch (the whole send); how many were counted."""
        a = self._app(app_id)
        n = 0
        for bid in block_ids:
            n += 1
            if len(a.pending) < self.max_pending:
                a.pending.add(bid)
        a.refused_blocks += n
        self.total.refused_blocks += n
        return n

    def on_accepted(self, app_id: str, block_ids: Iterable[int]) -> int:
        """Blocks of an accepted send; those refused earlier count as repaired (returned)."""
        a = self._apps.get(app_id)
        if a is None or not a.pending:
            return 0
        n = 0
        for bid in block_ids:
            if bid in a.pending:
                a.pending.discard(bid)
                n += 1
        a.repaired_blocks += n
        self.total.repaired_blocks += n
        return n

    # ------------------------------------------------------------- at rest
    def mark(self) -> int:
        """Taken before a scrub or checked read starts reading; passed back as ``since``."""
        return self._purges

    def on_scrubbed(self, app_id: str, shuffle_id: int, partition_id: int, disk: str,
                    found: Iterable[CorruptBlock], since: int | None = None) -> int:
        """Corrupt blocks a scrub of one data file found; returns how many were new. With ``since``
        (a ``mark()`` taken before the read), nothing is recorded when the app's files were purged
        after it."""
        if since is not None and self._purged_at.get(app_id, -1) >= since:
            return 0
        key = (app_id, shuffle_id, partition_id)
        per_disk = self._corrupt.setdefault(key, {})
        known = per_disk.setdefault(disk, [])
        offsets = {c.offset for c in known}
        new = [c for c in found if c.offset not in offsets]
        if not new:
            if not known:
                del per_disk[disk]
                if not per_disk:
                    del self._corrupt[key]
            return 0
        room = self.max_corrupt - len(known)
        if len(new) > room:
            self._whole.add((key, disk))
        known.extend(new[:max(0, room)])
        known.sort()
        self._app(app_id).corrupt_blocks += len(new)
        self.total.corrupt_blocks += len(new)
        return len(new)

    def on_read_checked(self, app_id: str, shuffle_id: int, partition_id: int, disk: str,
                        found: Iterable[CorruptBlock], since: int | None = None) -> int:
        """Corrupt blocks the read CRC check found in a range being served (recorded as a scrub's
        finds are, so every later read of them is refused by ``corrupt_in``); how many were new."""
        return self.on_scrubbed(app_id, shuffle_id, partition_id, disk, found, since)

    def corrupt_in(self, app_id: str, shuffle_id: int, partition_id: int, disk: str, offset: int,
                   length: int) -> CorruptBlock | None:
        """The first known corrupt block overlapping ``[offset, offset + length)`` of the data file on
        ``disk``; None when the range holds none known."""
        per_disk = self._corrupt.get((app_id, shuffle_id, partition_id))
        if not per_disk:
            return None
        known = per_disk.get(disk)
        if not known:
            return None
        if ((app_id, shuffle_id, partition_id), disk) in self._whole:
            return known[0]
        end = offset + length
        # the last block starting before the range may reach into it
        i = bisect.bisect_left(known, (offset,)) - 1
        for c in known[max(0, i):]:
            if c.offset >= end:
                break
            if c.offset + c.length > offset and length > 0:
                return c
        return None

    @staticmethod
    def refusal(corrupt: CorruptBlock, partition_id: int, disk: str) -> str:
        """The message of a read refused for ``corrupt`` (one wording, whoever found it)."""
        return (f"block {corrupt.block_id} at offset {corrupt.offset} of partition {partition_id}'s data file on "
                f"disk {disk} is corrupt (its bytes have crc {corrupt.actual}, its index record says "
                f"{corrupt.expected}; found by the {corrupt.found_by}); read another replica")

    def on_read_refused(self, app_id: str) -> None:
        self._app(app_id).corrupt_reads_refused += 1
        self.total.corrupt_reads_refused += 1

    def forget_files(self, app_id: str, shuffle_id: int | None, disk: str) -> None:
        """A purge deleted the app's (shuffle's) files on ``disk``: their findings go with them (an id
        registered again must not have its new files refused). The app's counts stay, and finds of
        reads that started before this are dropped (``since``)."""
        self._purged_at[app_id] = self._purges
        self._purged_at.move_to_end(app_id)
        self._purges += 1
        while len(self._purged_at) > self.max_apps:
            self._purged_at.popitem(last=False)
        for key in [k for k in self._corrupt if k[0] == app_id and (shuffle_id is None or k[1] == shuffle_id)]:
            per_disk = self._corrupt[key]
            per_disk.pop(disk, None)
            self._whole.discard((key, disk))
            if not per_disk:
                del self._corrupt[key]

    def totals(self) -> tuple[tuple[str, int], ...]:
        """The server's totals as (name, count) pairs (the heartbeat's displayMetrics)."""
        t = self.total
        return (("corrupt_blocks", t.corrupt_blocks), ("corrupt_reads_refused", t.corrupt_reads_refused),
                ("refused_blocks", t.refused_blocks), ("repaired_blocks", t.repaired_blocks))

    def corrupt_partitions(self) -> dict[PartitionKey, dict[str, list[CorruptBlock]]]:
        """Every partition with known corrupt blocks (a read-only view for operators)."""
        return self._corrupt
