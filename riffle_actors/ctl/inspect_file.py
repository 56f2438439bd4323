"""``riffle-ctl inspect INDEX [DATA]``: decode a partition's index file and check its blocks.

The index is a sequence of 40-byte records (``riffle_actors.protocol.index``). With the data
file, each block is checked: its ``[offset, offset + length)`` lies inside the data file, and the
CRC-32 of those bytes equals the record's ``crc`` (the client's checksum, which the server
passes through). Also reported: a torn index tail (not a multiple of 40 bytes), blocks that
overlap or leave gaps, and a data file longer than the indexed bytes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from riffle_actors.protocol.index import INDEX_RECORD_SIZE, IndexEntry, decode_index

_CHUNK = 1 << 20


@dataclass
class Report:
    entries: list[IndexEntry]
    torn_tail: int = 0  # bytes after the last whole record
    data_size: int | None = None
    problems: list[str] = field(default_factory=list)  # whole-file findings
    bad_blocks: dict[int, str] = field(default_factory=dict)  # record number -> why

    @property
    def ok(self) -> bool:
        return not self.problems and not self.bad_blocks and not self.torn_tail


def _crc(f, offset: int, length: int) -> int:
    f.seek(offset)
    crc, left = 0, length
    while left:
        chunk = f.read(min(left, _CHUNK))
        if not chunk:
            break
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    return crc


def inspect(index_path: str, data_path: str | None = None) -> Report:
    with open(index_path, "rb") as f:
        raw = f.read()
    report = Report(entries=decode_index(raw), torn_tail=len(raw) % INDEX_RECORD_SIZE)
    if report.torn_tail:
        report.problems.append(f"the index has a torn tail: {report.torn_tail} byte(s) after record "
                               f"{len(report.entries) - 1} (not a multiple of {INDEX_RECORD_SIZE})")
    if data_path is None:
        return report
    with open(data_path, "rb") as data:
        size = data.seek(0, 2)
        report.data_size = size
        expected_offset = 0
        for i, e in enumerate(report.entries):
            if e.offset != expected_offset:
                report.problems.append(f"record {i} starts at offset {e.offset}, the previous block ends at "
                                       f"{expected_offset} ({'gap' if e.offset > expected_offset else 'overlap'})")
            expected_offset = e.offset + e.length
            if e.offset < 0 or e.length < 0 or e.offset + e.length > size:
                report.bad_blocks[i] = (f"bytes [{e.offset}, {e.offset + e.length}) lie outside the data file "
                                        f"({size} bytes)")
                continue
            actual = _crc(data, e.offset, e.length)
            if actual != (e.crc & 0xFFFFFFFF) or e.crc < 0 or e.crc > 0xFFFFFFFF:
                report.bad_blocks[i] = f"CRC mismatch: index says {e.crc}, the data has {actual}"
        indexed = sum(max(e.length, 0) for e in report.entries)
        if indexed != size:
            report.problems.append(f"the index covers {indexed} bytes, the data file has {size}")
    return report
