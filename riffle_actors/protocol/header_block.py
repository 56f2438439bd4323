"""HPACK header blocks (RFC 7541) decoded for the gRPC port's LOOP engine.

This module owns ``HeaderDecoder``: one connection's decoding context (its dynamic table) and the
decoding of each header block into ``(name, value)`` byte pairs. It does what ``hpack.Decoder``
does, in fewer Python steps per field (a gRPC request's block is mostly indexed fields: one table
lookup each), and reuses ``hpack``'s static table and Huffman decoder. Bounds: the dynamic table
never exceeds the size we announced (a size update above it is an error), integers are at most
32 bits, string lengths are checked against the bytes left, and the decoded list is refused once
it exceeds ``max_header_list_size`` (the SETTINGS value; entries counted as RFC 7541 §4.1 does).

Errors: ``HeaderBlockError`` (the block cannot be decoded: the connection must end with
COMPRESSION_ERROR, its table being out of step) and its subclass ``HeaderListTooLarge``.
"""

from __future__ import annotations

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
_STATIC_LEN = len(_STATIC)
_ENTRY_OVERHEAD = 32  # RFC 7541 §4.1
_MAX_INT = 1 << 32


class HeaderBlockError(Exception):
    """The block is not valid HPACK (or not in step with our table)."""


class HeaderListTooLarge(HeaderBlockError):
    """The decoded header list exceeds ``max_header_list_size``."""


class HeaderDecoder:
    """One connection's HPACK decoding context (see the module docstring)."""

    __slots__ = ("_allowed", "_entries", "_max", "_size", "max_header_list_size")

    def __init__(self, max_table_size: int = 4096, max_header_list_size: int = 65536):
        self._entries: list[tuple[bytes, bytes]] = []  # the dynamic table, oldest first
        self._size = 0
        self._max = max_table_size  # the table's current maximum (size updates lower or restore it)
        self._allowed = max_table_size  # what we announced (SETTINGS_HEADER_TABLE_SIZE)
        self.max_header_list_size = max_header_list_size

    def _field(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        dynamic = index - _STATIC_LEN
        if 0 < dynamic <= len(self._entries):
            return self._entries[-dynamic]
        raise HeaderBlockError(f"header table index {index} out of range")

    def _add(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + _ENTRY_OVERHEAD
        entries = self._entries
        if size > self._max:  # larger than the whole table: it empties the table (RFC 7541 §4.4)
            entries.clear()
            self._size = 0
            return
        self._size += size
        while self._size > self._max:
            old_name, old_value = entries.pop(0)
            self._size -= len(old_name) + len(old_value) + _ENTRY_OVERHEAD
        entries.append((name, value))

    def _resize(self, size: int) -> None:
        if size > self._allowed:
            raise HeaderBlockError(f"a table size update to {size}, above the {self._allowed} we allow")
        self._max = size
        entries = self._entries
        while self._size > size:
            old_name, old_value = entries.pop(0)
            self._size -= len(old_name) + len(old_value) + _ENTRY_OVERHEAD

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The header list of ``block`` (raw bytes, in order)."""
        out: list[tuple[bytes, bytes]] = []
        n = len(block)
        pos = 0
        listed = 0
        limit = self.max_header_list_size
        fields_seen = False
        while pos < n:
            b = block[pos]
            if b & 0x80:  # indexed field
                if b != 0xFF:
                    index, pos = b & 0x7F, pos + 1
                else:
                    index, pos = _integer(block, pos, 7)
                if not index:
                    raise HeaderBlockError("header table index 0")
                name, value = self._field(index)
            elif b & 0x40:  # literal with incremental indexing
                name, value, pos = self._literal(block, pos, 6)
                self._add(name, value)
            elif b & 0x20:  # dynamic table size update: only before the block's first field
                if fields_seen:
                    raise HeaderBlockError("a table size update after a header field")
                size, pos = _integer(block, pos, 5)
                self._resize(size)
                continue
            else:  # literal without indexing (0000) or never indexed (0001)
                name, value, pos = self._literal(block, pos, 4)
            fields_seen = True
            listed += len(name) + len(value) + _ENTRY_OVERHEAD
            if listed > limit:
                raise HeaderListTooLarge(f"header list above {limit} bytes")
            out.append((name, value))
        return out

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[bytes, bytes, int]:
        index, pos = _integer(block, pos, prefix)
        if index:
            name = self._field(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return name, value, pos


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541 §5.1) of ``prefix`` bits at ``pos``; the value and the position after it."""
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    n = len(block)
    while True:
        if pos >= n:
            raise HeaderBlockError("an integer cut short")
        b = block[pos]
        pos += 1
        value += (b & 0x7F) << shift
        if value >= _MAX_INT:
            raise HeaderBlockError("an integer above 2^32")
        if not b & 0x80:
            return value, pos
        shift += 7


def _string(block: bytes, pos: int) -> tuple[bytes, int]:
    """An HPACK string literal (RFC 7541 §5.2) at ``pos``; its bytes and the position after it."""
    if pos >= len(block):
        raise HeaderBlockError("a string literal cut short")
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 7)
    end = pos + length
    if end > len(block):
        raise HeaderBlockError("a string literal longer than its block")
    raw = block[pos:end]
    if huffman:
        try:
            return decode_huffman(raw), end
        except Exception as e:  # noqa: BLE001 - hpack's HPACKDecodingError, or a bad table walk
            raise HeaderBlockError(f"bad Huffman string: {e}") from None
    return raw, end
