"""The block CRC of the Uniffle protocol: what the ``crc`` of a ``ShuffleBlock`` is, and how to check it.

The Uniffle client computes ``ChecksumUtils.getCrc32`` (``java.util.zip.CRC32``, the zlib / IEEE
802.3 polynomial, not CRC-32C) over exactly the bytes it sends as ``data``: the compressed block
(``WriteBufferManager.createShuffleBlock``). The same bytes land unchanged in the data file, and
the index record keeps the same ``crc`` (spec §5.2, §8), so one function checks a block on arrival,
at rest (the scrubber) and on read. Its readers check it too (``ShuffleReadClientImpl``).

``crc32`` is ISA-L's (python-isal, ``isal.isal_zlib.crc32``): about 0.1 s of CPU per GB here,
against 0.35-0.4 s for CPython's zlib 1.2 (``scripts/bench_crc.py``, docs/performance.md). It
releases the GIL, so a large check can run on a thread while the event loop keeps serving.
When the wheel is missing (it is a declared dependency) zlib's, which gives the same values, is used.

Pure functions, no IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from riffle_actors.protocol.index import IndexEntry
from riffle_actors.records import Block, BlockBatch

try:
    from isal.isal_zlib import crc32 as _crc32
    CRC_IMPL = "isal"
except ImportError:  # pragma: no cover - isal is a declared dependency
    from zlib import crc32 as _crc32
    CRC_IMPL = "zlib"

__all__ = ["CRC_IMPL", "BadBlock", "block_crc", "check_indexed", "crc32", "find_bad_block"]


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """The unsigned CRC-32 (``java.util.zip.CRC32``) of ``data``, continuing from ``value``."""
    return _crc32(data, value) & 0xFFFFFFFF


def block_crc(data: bytes | bytearray | memoryview) -> int:
    """What the client sends as a block's ``crc`` for ``data`` (an int64 holding 0..2^32-1)."""
    return _crc32(data) & 0xFFFFFFFF


class BadBlock(NamedTuple):
    """A block whose bytes do not match its ``crc``."""

    partition_id: int
    block_id: int
    expected: int  # the crc the client sent (or the index record holds)
    actual: int  # the crc of the bytes


def find_bad_block(partitions: Iterable[BlockBatch]) -> BadBlock | None:
    """The first block of a send whose ``crc`` is not the CRC-32 of its ``data``; None when all match.

    A ``crc`` outside 0..2^32-1 never matches (the client sends the unsigned value)."""
    for batch in partitions:
        for block_id, crc, data in batch.id_crc_data():
            actual = _crc32(data) & 0xFFFFFFFF
            if actual != crc:
                return BadBlock(batch.partition_id, block_id, crc, actual)
    return None


def check_indexed(buf: bytes | bytearray | memoryview, base_offset: int,
                  entries: Iterable[IndexEntry]) -> list[tuple[IndexEntry, int]]:
    """The index records (with the CRC their bytes have) whose block in ``buf`` does not match; ``buf``
    holds the data file from ``base_offset`` and covers every entry. What the scrubber checks."""
    mv = memoryview(buf)
    bad = []
    for e in entries:
        start = e.offset - base_offset
        actual = _crc32(mv[start:start + e.length]) & 0xFFFFFFFF
        if actual != e.crc:
            bad.append((e, actual))
    return bad
