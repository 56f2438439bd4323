"""Read-ahead decisions for a disk's data files (``[localfile_store.read_ahead_options]``, Riffle's).

Pure and synchronous: this says *which* byte ranges of which data file to ask the kernel for
(``posix_fadvise(POSIX_FADV_WILLNEED)``, ``riffle_actors.io.localfile.advise_willneed``), the Disk
actor does the asking on its read-ahead threads. Nothing here holds shuffle bytes: the page cache
does, so read-ahead is not counted against ``memory_store.capacity``; what is kept is a few integers
per file being read, for at most ``max_files`` files (the least recently read are forgotten).

Riffle's rules (``store/local/io_layer_read_ahead``), kept here:

- Only for apps whose client asked (``spark.rss.riffle.readAheadEnabled = true`` in the registration's
  properties; ``spark.rss.riffle.readAheadBatchSize`` / ``readAheadBatchNumber`` may lower the
  server's ``batch_size`` / ``batch_number``; here they cannot raise them: a client does not size
  the server's IO), ``client_read_ahead``.
- **Sequential** reads (a partition whose memory was read without a task filter, i.e. a whole
  partition read in order, not an AQE skew read): the read at offset 0 loads
  ``batch_number x batch_size`` bytes; from then on, each read that comes within two batches of
  the loaded end loads two more batches after it (``SequentialTracks.on_read``). A read past the
  loaded end (the reader outran it) loads nothing more, as in Riffle.
- **Read plans** (``read_plan_enable``; urpc getLocalShuffleDataV3 carries the client's next
  segments): each next segment beyond what this reader (file, task attempt) already planned is
  loaded, unless the reader has passed it when its turn comes (``ReadPlans``).

See also: ``riffle_actors.actors.disk`` (where it runs), ``riffle_actors.io.localfile``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from riffle_actors.config import parse_byte_size

READ_AHEAD_ENABLED = "spark.rss.riffle.readAheadEnabled"
READ_AHEAD_BATCH_SIZE = "spark.rss.riffle.readAheadBatchSize"
READ_AHEAD_BATCH_NUMBER = "spark.rss.riffle.readAheadBatchNumber"

FileKey = tuple[str, int, int]  # app id, shuffle id, partition id


@dataclass(frozen=True, slots=True)
class ClientReadAhead:
    """An app's read-ahead request (its registration properties); None fields: the server's values."""

    batch_size: int | None = None
    batch_number: int | None = None


def client_read_ahead(properties: Mapping[str, str]) -> ClientReadAhead | None:
    """The app's read-ahead request, or None when it did not ask (Riffle's client options).
    Unparsable or non-positive sizes are ignored (the server's values apply)."""
    if properties.get(READ_AHEAD_ENABLED, "").strip().lower() != "true":
        return None
    size = number = None
    try:
        size = parse_byte_size(properties[READ_AHEAD_BATCH_SIZE]) or None
    except (KeyError, ValueError, TypeError):
        pass
    try:
        number = int(properties[READ_AHEAD_BATCH_NUMBER]) or None
    except (KeyError, ValueError):
        pass
    if size is not None and size < 0:
        size = None
    if number is not None and number < 0:
        number = None
    return ClientReadAhead(size, number)


class SequentialTracks:
    """Per data file: how far its sequential reader has been loaded ahead (bounded LRU)."""

    def __init__(self, batch_size: int, batch_number: int, max_files: int = 4096):
        self.batch_size = batch_size
        self.batch_number = batch_number
        self.max_files = max_files
        self._loaded: OrderedDict[FileKey, int] = OrderedDict()  # file -> end of what was loaded

    def __len__(self) -> int:
        return len(self._loaded)

    def on_read(self, key: FileKey, offset: int, client: ClientReadAhead | None = None) -> tuple[int, int] | None:
        """A sequential read at ``offset``: the ``(offset, length)`` to load now, or None."""
        size = min(self.batch_size, client.batch_size or self.batch_size) if client else self.batch_size
        number = min(self.batch_number, client.batch_number or self.batch_number) if client else self.batch_number
        loaded = self._loaded.get(key)
        if loaded is None:
            if offset != 0:
                return None  # Riffle starts a file's read-ahead with its first read only
            self._remember(key, number * size)
            return 0, number * size
        self._loaded.move_to_end(key)
        if 0 < loaded - offset < 2 * size:
            self._loaded[key] = loaded + 2 * size
            return loaded, 2 * size
        return None

    def _remember(self, key: FileKey, loaded: int) -> None:
        self._loaded[key] = loaded
        while len(self._loaded) > self.max_files:
            self._loaded.popitem(last=False)

    def forget(self, app_id: str, shuffle_id: int | None = None) -> int:
        """Drop the app's (shuffle's) files (purged); how many were dropped."""
        return _forget(self._loaded, app_id, shuffle_id)


class PlanCursor:
    """One reader's read plan: the furthest segment planned and where it reads now."""

    __slots__ = ("planned", "reading")

    def __init__(self) -> None:
        self.planned = -1
        self.reading = 0


class ReadPlans:
    """Per (data file, task attempt): which of the client's next segments are new (bounded LRU)."""

    def __init__(self, max_readers: int = 4096):
        self.max_readers = max_readers
        self._cursors: OrderedDict[tuple[FileKey, int], PlanCursor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cursors)

    def on_read(self, key: FileKey, task_attempt_id: int, offset: int,
                next_segments: Sequence[tuple[int, int]]) -> tuple[PlanCursor, list[tuple[int, int]]]:
        """A read at ``offset`` announcing ``next_segments``: the reader's cursor (its ``reading`` is
        checked again when a load's turn comes) and the segments not planned before, in order."""
        ck = (key, task_attempt_id)
        cursor = self._cursors.get(ck)
        if cursor is None:
            cursor = self._cursors[ck] = PlanCursor()
            while len(self._cursors) > self.max_readers:
                self._cursors.popitem(last=False)
        else:
            self._cursors.move_to_end(ck)
        cursor.reading = max(cursor.reading, offset)
        new = []
        for off, length in next_segments:
            if off > cursor.planned and length > 0:
                new.append((off, length))
                cursor.planned = off
        return cursor, new

    def forget(self, app_id: str, shuffle_id: int | None = None) -> int:
        return _forget(self._cursors, app_id, shuffle_id, key_of=lambda k: k[0])


def _forget(table: OrderedDict[Any, Any], app_id: str, shuffle_id: int | None,
            key_of: Callable[[Any], Any] = lambda k: k) -> int:
    gone = [k for k in table if key_of(k)[0] == app_id and (shuffle_id is None or key_of(k)[1] == shuffle_id)]
    for k in gone:
        del table[k]
    return len(gone)
