"""Atheris fuzz targets for every decoder of untrusted input in ``riffle_actors.protocol``, and for
the coordinator's checks of the requests hostile peers send it (server heartbeats, driver
assignments and app requests, the HTTP applications filter).

This module owns the fuzz harnesses, their seed corpora and the registry ``HARNESSES``
(name -> ``Harness``) that ``tests.fuzz.run``, ``tests/fuzz/test_fuzz.py`` and
``scripts/fuzz.py`` read. Each harness is a plain ``fuzz_<decoder>(data: bytes) -> None``:

- the only exception it lets through from the code under test is the documented one,
  ``ProtocolError``, which it swallows; anything else escaping (``IndexError``,
  ``struct.error``, ``OverflowError``, ``MemoryError``, a pyroaring ``ValueError``...) is a
  decoder bug and crashes the fuzzer;
- it checks cheap properties of what decodes (round trips, stable re-encoding, ranges, the
  same answer for any buffer type, agreement between two decoders of the same bytes and with
  a naive reference decoder written from the spec) with ``_check``, which raises
  ``FuzzPropertyError`` (an exception of its own, so the checks also run under ``python -O``).

Byte decoders get the fuzzer's bytes verbatim, so a seed corpus of real encodings is
useful; decoders of client-supplied ints (proto ``int32``/``int64`` fields) draw them
with ``atheris.FuzzedDataProvider``, biased towards the boundaries of the wire types.

Adding a decoder is one function (``fuzz_urpc_frame`` at the end, the Netty frame decoder of
spec §6, is one)::

    @harness(max_len=4096, seeds=lambda: [encode_frame(...)])
    def fuzz_netty_frame(data: bytes) -> None:
        try:
            frame = decode_frame(data)
        except ProtocolError:
            return
        _check(decode_frame(encode_frame(frame)) == frame, "frame round trip")

The recovery decoders of what a data path holds (``decode_log`` of a ``shuffle.meta``,
``scan_index`` of a partition index) are fuzzed too: a file on disk is untrusted input.

Nothing here runs the fuzzer; importing this module only registers the harnesses.
"""

from __future__ import annotations

import asyncio
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import atheris
import orjson
from google.protobuf.message import DecodeError
from pyroaring import BitMap

from riffle_actors.coordinator.apps import AppRegistry, AppRegistryFull
from riffle_actors.coordinator.assignment import (
    AssignmentError,
    AssignmentRequest,
    Candidate,
    assign,
)
from riffle_actors.coordinator.cluster import ServerHeartbeat
from riffle_actors.coordinator.config import AssignmentStrategy, HostStrategy
from riffle_actors.coordinator.validation import (
    MAX_ID_CHARS,
    MAX_PAGE_SIZE,
    AppFilter,
    InvalidFilter,
    MalformedHeartbeat,
    app_request_problem,
    assignment_problem,
)
from riffle_actors.protocol import urpc
from riffle_actors.protocol.bitmap import (
    MAX_ID,
    BlockIdSet,
    TaskIdFilter,
    deserialize_block_ids,
    id_array,
    serialize_block_ids,
)
from riffle_actors.protocol.blockid import SPARK_DEFAULT, BlockIdLayout
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.ids import check_app_id
from riffle_actors.protocol.index import (
    INDEX_RECORD_SIZE,
    IndexEntry,
    build_index,
    decode_index,
    encode_index,
    scan_index,
)
from riffle_actors.protocol.shuffle_meta import (
    BLOCK_IDS,
    FILE_HEADER,
    HEADER_SIZE,
    REGISTER,
    SEGMENT,
    BlockIdsRecord,
    MetaFormatError,
    decode_log,
    encode_block_ids,
    encode_register,
    encode_segment,
    frame,
)
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.records import Block
from riffle_actors.runtime import ManualClock
from riffle_actors.transport.coordinator_grpc import (
    decode_heartbeat_request,
    encode_assignments,
    encode_server_id,
)

__all__ = [
    "HARNESSES",
    "FuzzPropertyError",
    "Harness",
    "check_block_id_layout",
    "check_index_fields",
    "check_reported_ids",
    "harness",
    "write_seed_corpus",
]


class FuzzPropertyError(AssertionError):
    """A decoded value broke a property (round trip, range, agreement)."""


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise FuzzPropertyError(what)


FuzzTarget = Callable[[bytes], None]


@dataclass(frozen=True)
class Harness:
    """One fuzz target: ``fn(data)``, its libFuzzer ``-max_len`` and a seed-corpus factory."""

    name: str
    fn: FuzzTarget
    max_len: int
    seeds: Callable[[], list[bytes]]


HARNESSES: dict[str, Harness] = {}


def harness(*, max_len: int, seeds: Callable[[], list[bytes]]) -> Callable[[FuzzTarget], FuzzTarget]:
    """Register ``fuzz_<name>`` under ``<name>``, with libFuzzer's ``-max_len`` and its seed factory."""

    def register(fn: FuzzTarget) -> FuzzTarget:
        name = fn.__name__.removeprefix("fuzz_")
        if name in HARNESSES:
            raise RuntimeError(f"harness {name!r} registered twice")
        HARNESSES[name] = Harness(name=name, fn=fn, max_len=max_len, seeds=seeds)
        return fn

    return register


def write_seed_corpus(name: str, directory: Path) -> int:
    """Write the seeds of harness ``name`` as files ``seed-<i>`` in ``directory``; returns their count."""
    directory.mkdir(parents=True, exist_ok=True)
    seeds = HARNESSES[name].seeds()
    for i, seed in enumerate(seeds):
        (directory / f"seed-{i:03d}").write_bytes(seed)
    return len(seeds)


# --------------------------------------------------------------------------------------
# Client-supplied ints
# --------------------------------------------------------------------------------------

_INT32 = 1 << 31
_INT64 = 1 << 63
_EDGES = (
    0, 1, -1, 2, 31, 32, 33, 62, 63, 64,
    (1 << 16) - 1, 1 << 16, _INT32 - 1, -_INT32, 1 << 32, (1 << 32) - 1,
    _INT64 - 1, -_INT64, 1 << 62, (1 << 62) - 1,
    _INT64, 1 << 64, -(1 << 64) - 1, 1 << 100,  # beyond int64: a Python caller's mistake, still no crash
)  # fmt: skip


def _wire_int(fdp: atheris.FuzzedDataProvider, bits: int = 64) -> int:
    """An int as a proto field could carry it, mostly within the signed ``bits`` range."""
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return _EDGES[fdp.ConsumeIntInRange(0, len(_EDGES) - 1)]
    if kind == 1:
        return fdp.ConsumeIntInRange(-2, 70)  # small values: widths, counts, ids
    if kind == 2:
        return fdp.ConsumeIntInRange(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return fdp.ConsumeIntInRange(-(1 << 70), 1 << 70)


def _int_seeds() -> list[bytes]:
    return [b"", bytes(range(64)), b"\xff" * 64, bytes(range(255, 0, -1)), b"\x01\x00" * 40]


# --------------------------------------------------------------------------------------
# Bitmaps (spec §3): BlockIdSet.deserialize / deserialize_block_ids / TaskIdFilter.from_bytes
# --------------------------------------------------------------------------------------

_ITERATE_AT_MOST = 1 << 14  # a 1 KiB bitmap of run containers can hold 2**32 ids: never list them all


def _legacy(buckets: list[tuple[int, bytes]], signed_longs: int = 0) -> bytes:
    """LEGACY bytes from ``(high, 32-bit portable bitmap)`` pairs, written by hand (not by the codec)."""
    out = bytearray([signed_longs]) + len(buckets).to_bytes(4, "big", signed=True)
    for high, portable in buckets:
        out += high.to_bytes(4, "big") + portable
    return bytes(out)


def _bitmap_seeds() -> list[bytes]:
    runs = BitMap(range(10, 70_000))
    runs.run_optimize()  # cookie 12347, run containers
    mixed = BitMap(range(0, 200_000, 3)) | BitMap(range(300_000, 300_500))
    mixed.run_optimize()
    spark = [
        SPARK_DEFAULT.get_block_id(seq, part, task) for seq in range(3) for part in (0, 7) for task in (1, 2)
    ]
    return [
        b"",
        serialize_block_ids([]),
        serialize_block_ids([1, 2, 3]),
        serialize_block_ids([0, MAX_ID, 1 << 32, (1 << 32) + 5]),
        serialize_block_ids(spark),
        serialize_block_ids(range(0, 9000, 2)[:4097]),  # one bitset container (8 KiB)
        _legacy([(0, runs.serialize())]),
        _legacy([(0, mixed.serialize()), (3, BitMap([1, 70_000]).serialize())], signed_longs=1),
        _legacy([(5, BitMap().serialize()), (5, BitMap([9]).serialize())]),  # empty and repeated highs
    ]


def _strided(data: bytes) -> memoryview:
    """``data`` as a non-contiguous byte view (every other byte of a buffer twice as long)."""
    doubled = bytearray(2 * len(data))
    doubled[::2] = data
    return memoryview(doubled)[::2]


def _reference_portable_size(buf: bytes, pos: int) -> int:
    """Size of the 32-bit portable bitmap at ``buf[pos:]``, read naively from spec §3.2."""
    (cookie,) = struct.unpack_from("<I", buf, pos)
    p = pos + 4
    if cookie & 0xFFFF == 12347:
        n = (cookie >> 16) + 1
        flags = buf[p : p + (n + 7) // 8]
        if len(flags) < (n + 7) // 8:
            raise ValueError("run flags truncated")
        p += len(flags)
        has_offsets = n >= 4
    elif cookie == 12346:
        (n,) = struct.unpack_from("<I", buf, p)
        p += 4
        if n > 1 << 16:
            raise ValueError("too many containers")
        flags = bytes((n + 7) // 8)
        has_offsets = True
    else:
        raise ValueError("unknown cookie")
    cards = [struct.unpack_from("<HH", buf, p + 4 * i)[1] + 1 for i in range(n)]
    p += 8 * n if has_offsets else 4 * n
    for i, card in enumerate(cards):
        if flags[i >> 3] >> (i & 7) & 1:
            (runs,) = struct.unpack_from("<H", buf, p)
            p += 2 + 4 * runs
        else:
            p += 2 * card if card <= 4096 else 8192
    return p - pos


def _reference_decode(data: bytes) -> dict[int, BitMap] | None:
    """Spec §3 read naively, one ``BitMap`` per high (a later bucket wins); ``None`` where invalid.

    Independent of ``riffle_actors.protocol.bitmap``, and every bucket is cut by its own size
    here, while ``BlockIdSet`` hands all buckets to CRoaring at once: a bucket size that
    differs from CRoaring's would make the two disagree.
    """
    if not data:
        return {}
    try:
        _signed_longs, count = struct.unpack_from(">Bi", data, 0)
        if count < 0:
            return None
        pos, buckets = 5, {}
        for _ in range(count):  # each bucket consumes >= 12 bytes or raises: bounded by len(data)
            (high,) = struct.unpack_from(">I", data, pos)
            size = _reference_portable_size(data, pos + 4)
            if high >= 1 << 31 or pos + 4 + size > len(data):
                return None
            buckets[high] = BitMap.deserialize(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
    except (struct.error, ValueError):
        return None
    return buckets if pos == len(data) else None


def _check_against_reference(data: bytes, ids: BlockIdSet | None) -> None:
    reference = _reference_decode(data)
    verdict = "rejects" if ids is not None else "accepts"
    _check((reference is None) == (ids is None), f"the reference decoder {verdict} what BlockIdSet does not")
    if ids is None or reference is None:
        return
    _check(len(ids) == sum(len(b) for b in reference.values()), "reference holds a different number of ids")
    if len(ids) <= _ITERATE_AT_MOST:
        expected = sorted(high << 32 | low for high, bitmap in reference.items() for low in bitmap)
        _check(list(ids) == expected, "reference holds different ids")


def _decode_set(data: bytes) -> BlockIdSet | None:
    try:
        return BlockIdSet.deserialize(data)
    except ProtocolError:
        return None


def _decode_filter(data: bytes) -> TaskIdFilter | None | ProtocolError:
    try:
        return TaskIdFilter.from_bytes(data)
    except ProtocolError as exc:
        return exc


@harness(max_len=20_000, seeds=_bitmap_seeds)
def fuzz_block_id_set(data: bytes) -> None:
    """``BlockIdSet.deserialize``: agrees with a naive reference, ids in range, stable re-encoding, no size
    blow-up, same result for any buffer type."""
    ids = _decode_set(data)
    _check_against_reference(data, ids)
    views = (bytearray(data), memoryview(data), _strided(data))
    if ids is None:
        for view in views:
            try:
                BlockIdSet.deserialize(view)
            except ProtocolError:
                continue
            raise FuzzPropertyError(f"{type(view).__name__} decodes where bytes do not")
        return
    for view in views:
        _check(deserialize_block_ids(view) == ids, f"{type(view).__name__} decodes differently")
    wire = ids.serialize()
    # Inner bitmaps are copied; re-framing a 12347 header without runs as 12346 at most doubles it.
    _check(len(wire) <= 2 * len(data) + 16, f"{len(data)} bytes re-encode as {len(wire)}")
    again = BlockIdSet.deserialize(wire)
    _check(again == ids, "decode(encode(decode(x))) != decode(x)")
    _check(again.serialize() == wire, "re-encoding is not stable")
    _check(bool(ids) == (len(ids) > 0), "bool and len disagree")
    if len(ids) <= _ITERATE_AT_MOST:
        listed = list(ids)
        _check(listed == sorted(set(listed)), "iteration is not strictly ascending")
        _check(all(0 <= i <= MAX_ID for i in listed), "id outside [0, 2**63)")
        _check(all(i in ids for i in listed[:64]), "iterated id is not a member")


@harness(max_len=20_000, seeds=_bitmap_seeds)
def fuzz_task_id_filter(data: bytes) -> None:
    """``TaskIdFilter.from_bytes`` accepts what ``BlockIdSet.deserialize`` accepts, with the same ids."""
    task_filter = _decode_filter(data)
    ids = _decode_set(data)
    strided = _decode_filter(_strided(data))
    _check(type(strided) is type(task_filter), "a strided view decodes differently")
    if not data:
        _check(task_filter is None, "zero-length bytes must mean 'no filter'")
        return
    if isinstance(task_filter, ProtocolError) or ids is None:
        _check(
            isinstance(task_filter, ProtocolError) and ids is None,
            f"decoders disagree on validity: filter {task_filter!r}, set {ids!r}",
        )
        return
    assert task_filter is not None
    _check(len(task_filter) == len(ids), f"filter holds {len(task_filter)} ids, set {len(ids)}")
    for probe in (0, 1, MAX_ID, -1, 1 << 32, 1 << 64, int.from_bytes(data[-8:], "big")):
        _check((probe in task_filter) == (probe in ids), f"membership of {probe} differs")
    if len(ids) <= _ITERATE_AT_MOST:
        _check(list(task_filter) == list(ids), "filter and set list different ids")


# --------------------------------------------------------------------------------------
# Index records (spec §5.2): decode_index, and encode_index / build_index of client ints
# --------------------------------------------------------------------------------------

_SPEC_RECORD = bytes.fromhex(
    "000000000000000000000064000000c800000000123456780000140000c000090000000000000009"
)


def _index_seeds() -> list[bytes]:
    extremes = IndexEntry(_INT64 - 1, _INT32 - 1, -_INT32, -_INT64, 0, -1)
    return [
        b"",
        _SPEC_RECORD,
        _SPEC_RECORD + _SPEC_RECORD[:17],  # torn tail
        encode_index([extremes, IndexEntry(40, 1, 1, 0xFFFFFFFF, MAX_ID, 3)]),
        bytes(INDEX_RECORD_SIZE * 3),
    ]


@harness(max_len=4096, seeds=_index_seeds)
def fuzz_decode_index(data: bytes) -> None:
    """``decode_index``: one entry per whole record, and encoding them gives the bytes back."""
    entries = decode_index(data)
    whole = len(data) - len(data) % INDEX_RECORD_SIZE
    _check(len(entries) == whole // INDEX_RECORD_SIZE, f"{len(entries)} records from {len(data)} bytes")
    _check(encode_index(entries) == data[:whole], "encode(decode(x)) != x without its torn tail")
    for view in (bytearray(data), memoryview(data), _strided(data)):
        _check(decode_index(view) == entries, f"{type(view).__name__} decodes differently")


def check_index_fields(entries: list[IndexEntry], start: int, blocks: list[Block]) -> None:
    """``encode_index(entries)`` and ``build_index(blocks, start)``: ``ProtocolError`` or exact records."""
    try:
        records = encode_index(entries)
    except ProtocolError:
        records = None
    if records is not None:
        _check(decode_index(records) == entries, "decode(encode(x)) != x")
    try:
        built, data_len = build_index(blocks, start)
    except ProtocolError:
        return
    _check(data_len == sum(len(b.data) for b in blocks), "data length is not the payload sum")
    decoded = decode_index(built)
    _check(len(decoded) == len(blocks), "one record per block")
    offset = start
    for entry, block in zip(decoded, blocks):
        expected = (
            offset,
            len(block.data),
            block.uncompress_length,
            block.crc,
            block.block_id,
            block.task_attempt_id,
        )
        _check(tuple(entry) == expected, f"record {entry} != {expected}")
        offset += len(block.data)


@harness(max_len=1024, seeds=_int_seeds)
def fuzz_encode_index(data: bytes) -> None:
    """Index records of client-supplied block fields (``check_index_fields``)."""
    fdp = atheris.FuzzedDataProvider(data)
    entries = [IndexEntry(*(_wire_int(fdp) for _ in range(6))) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    start = _wire_int(fdp)
    blocks = [
        Block(
            block_id=_wire_int(fdp),
            length=_wire_int(fdp, 32),
            uncompress_length=_wire_int(fdp, 32),
            crc=_wire_int(fdp),
            task_attempt_id=_wire_int(fdp),
            data=fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)),
        )
        for _ in range(fdp.ConsumeIntInRange(0, 4))
    ]
    check_index_fields(entries, start, blocks)


# --------------------------------------------------------------------------------------
# Block ids (spec §4): BlockIdLayout.from_proto_fields and the split of an id into parts
# --------------------------------------------------------------------------------------


def _widths_valid(widths: tuple[int, int, int]) -> bool:
    return all(1 <= w <= 31 for w in widths) and sum(widths) == 63


def check_block_id_layout(widths: tuple[int, int, int], block_id: int, wanted: tuple[int, int, int]) -> None:
    """Layout from the proto fields ``widths``; split ``block_id``; compose ``wanted`` (s, p, t)."""
    try:
        layout = BlockIdLayout.from_proto_fields(*widths)
    except ProtocolError:
        _check(not _widths_valid(widths), f"valid layout {widths} rejected")
        return
    _check(_widths_valid(widths) and layout.as_tuple() == widths, f"invalid layout {widths} accepted")

    parts = (layout.sequence_no(block_id), layout.partition_id(block_id), layout.task_attempt_id(block_id))
    limits = (layout.max_sequence_no, layout.max_partition_id, layout.max_task_attempt_id)
    _check(all(0 <= v <= m for v, m in zip(parts, limits)), f"parts {parts} of {block_id} exceed {limits}")
    if 0 <= block_id <= MAX_ID:
        _check(layout.get_block_id(*parts) == block_id, f"{block_id} does not compose back")

    try:
        composed = layout.get_block_id(*wanted)
    except ProtocolError:
        _check(not all(0 <= v <= m for v, m in zip(wanted, limits)), f"parts {wanted} rejected")
        return
    _check(0 <= composed <= MAX_ID, f"{wanted} composes to {composed}")
    split = (layout.sequence_no(composed), layout.partition_id(composed), layout.task_attempt_id(composed))
    _check(split == wanted, f"{wanted} -> {composed} -> {split}")


@harness(max_len=256, seeds=_int_seeds)
def fuzz_block_id_layout(data: bytes) -> None:
    """Proto int32 widths and int64 ids (``check_block_id_layout``), valid layouts drawn often."""
    fdp = atheris.FuzzedDataProvider(data)
    s, p = _wire_int(fdp, 32), _wire_int(fdp, 32)
    t = 63 - s - p if fdp.ConsumeBool() else _wire_int(fdp, 32)
    block_id = _wire_int(fdp)
    check_block_id_layout((s, p, t), block_id, (_wire_int(fdp, 32), _wire_int(fdp, 32), _wire_int(fdp)))


# --------------------------------------------------------------------------------------
# Block ids reported by clients: BlockIdSet(ids) / update / add / discard_many / in
# --------------------------------------------------------------------------------------

_BASE_IDS = (3, 1 << 40)


def check_reported_ids(ids: list[int], probe: int) -> None:
    """``id_array(ids)`` and ``update(ids)`` are all-or-nothing, whichever batch path ``update`` takes;
    ``add``, ``in``, ``discard_many`` take any int."""
    valid = all(0 <= i <= MAX_ID for i in ids)
    try:
        packed = id_array(ids)
    except ProtocolError:
        _check(not valid, f"id_array rejected {ids}")
        packed = None
    else:
        _check(valid and packed.tolist() == ids, f"id_array accepted {ids} as {packed}")
    outcomes: list[BlockIdSet | None] = []
    batches = (ids, iter(ids), BlockIdSet(ids) if valid else tuple(ids), packed if valid else ids)
    for batch in batches:  # iter(): not Sized, the large-batch path; an array('Q'): add_many
        target = BlockIdSet(_BASE_IDS)
        try:
            target.update(batch)
        except ProtocolError:
            _check(target == BlockIdSet(_BASE_IDS), "a rejected batch changed the set")
            outcomes.append(None)
            continue
        outcomes.append(target)
    _check(all(o == outcomes[0] for o in outcomes), f"batch paths disagree on {ids}")
    _check((outcomes[0] is not None) == valid, f"validity of {ids} misjudged")
    target = outcomes[0] if outcomes[0] is not None else BlockIdSet(_BASE_IDS)
    if outcomes[0] is not None:
        _check(all(i in target for i in ids), "an added id is missing")
        _check(BlockIdSet.deserialize(target.serialize()) == target, "round trip of reported ids")

    single = BlockIdSet()
    try:
        single.add(probe)
    except ProtocolError:
        _check(not 0 <= probe <= MAX_ID, f"add({probe}) rejected")
    else:
        _check(0 <= probe <= MAX_ID and probe in single, f"add({probe}) accepted or lost")

    before = len(target)
    removed = sum(1 for i in set(ids) if i in target)
    target.discard_many(ids)
    _check(len(target) == before - removed, "discard_many removed the wrong ids")
    _check(not any(i in target for i in ids), "a discarded id is still present")


@harness(max_len=2048, seeds=_int_seeds)
def fuzz_block_id_set_ids(data: bytes) -> None:
    """Ids of a ``reportShuffleResult`` (``check_reported_ids``)."""
    fdp = atheris.FuzzedDataProvider(data)
    ids = [_wire_int(fdp) for _ in range(fdp.ConsumeIntInRange(0, 40))]
    check_reported_ids(ids, _wire_int(fdp))


# --------------------------------------------------------------------------------------
# Netty (urpc) frames, spec §6
# --------------------------------------------------------------------------------------


def _urpc_seeds() -> list[bytes]:
    blocks = [Block(11, 3, 6, 0xABCDEF, 7, b"abc"), Block(12, 0, 0, 0, 7, b"")]
    frames = [
        urpc.encode_send_shuffle_data(1, "app_1", 0, 5, [(3, blocks), (4, blocks[:1])], 1_700_000_000_000),
        urpc.encode_send_shuffle_data(2, "", 1, -1, [], 0, servers=0),
        urpc.encode_get_local_index(3, "app_1", 0, 3, 1, 10),
        urpc.encode_get_local_data(4, "app_1", 0, 3, 0, 100),
        urpc.encode_get_local_data(5, "app_1", 0, 3, 40, 60, storage_id=1),
        urpc.encode_get_local_data(6, "app_1", 0, 3, 40, 60, storage_id=0, next_segments=[(100, 50)],
                                   task_attempt_id=9),
        urpc.encode_get_memory_data(7, "app_1", 0, 3, -1, 14 << 20),
        urpc.encode_get_memory_data(8, "app_1", 0, 3, 11, 1024, 0, serialize_block_ids([7, 8])),
    ]
    return frames + [b"".join(frames[:3]), frames[0][:20], b"\x00" * 9, b"\xff" * 16]


def _plain_request(req):  # type: ignore[no-untyped-def]
    if isinstance(req, urpc.SendShuffleData):
        return req._replace(partitions=tuple((p.partition_id, tuple(b._replace(data=bytes(b.data)) for b in p.blocks()))
                                             for p in req.partitions))
    return req


def _reencode(req) -> bytes:  # type: ignore[no-untyped-def]
    if isinstance(req, urpc.SendShuffleData):
        return urpc.encode_send_shuffle_data(req.request_id, req.app_id, req.shuffle_id, req.require_buffer_id,
                                             req.partitions, req.timestamp)
    if isinstance(req, urpc.GetLocalShuffleIndex):
        return urpc.encode_get_local_index(*req)
    if isinstance(req, urpc.GetMemoryShuffleData):
        return urpc.encode_get_memory_data(*req)
    assert isinstance(req, urpc.GetLocalShuffleData)
    kw = {}
    if req.storage_id != -1 or req.next_segments or req.task_attempt_id != -1:
        kw["storage_id"] = req.storage_id
    return urpc.encode_get_local_data(req.request_id, req.app_id, req.shuffle_id, req.partition_id, req.offset,
                                      req.length, partition_num_per_range=req.partition_num_per_range,
                                      partition_num=req.partition_num, timestamp=req.timestamp, **kw)


@harness(max_len=8192, seeds=_urpc_seeds)
def fuzz_urpc_frame(data: bytes) -> None:
    """A byte stream as the urpc listener receives it: header, then each request type's decoder.

    Properties: a frame that decodes re-encodes to a frame that decodes to the same request
    (V3 hints aside); a SendShuffleData's blocks are slices of the frame and the sum of their
    lengths never exceeds it.
    """
    view = memoryview(data)
    pos = 0
    while len(data) - pos >= urpc.HEADER_SIZE:
        try:
            header = urpc.decode_header(view, pos)
        except ProtocolError:
            return
        pos += urpc.HEADER_SIZE
        frame = view[pos:pos + header.frame_len]
        if len(frame) < header.frame_len:
            return
        pos += header.frame_len
        try:
            req = urpc.decode_request(header.type, frame, header.msg_len)
        except ProtocolError:
            continue
        _check(header.type in urpc.RESPONSE_TYPE, "an unknown type decoded")
        if isinstance(req, urpc.GetSortedShuffleData):
            continue
        if isinstance(req, urpc.SendShuffleData):
            total = sum(len(d) for p in req.partitions for d in p.datas)
            _check(total == sum(p.data_bytes for p in req.partitions), "data_bytes disagrees with the payloads")
            _check(total <= header.msg_len, "block payloads exceed the message")
            _check(all(isinstance(d, memoryview) for p in req.partitions for d in p.datas), "a block was copied")
            _check(all(len(p.datas) == len(p.block_ids) == len(p.lengths) == len(p.uncompress_lengths)
                       == len(p.crcs) == len(p.task_ids) for p in req.partitions), "columns of unequal length")
        if isinstance(req, urpc.GetLocalShuffleData) and (req.next_segments or header.type == 25):
            req = req._replace(next_segments=(), task_attempt_id=-1)
        again = _reencode(req)
        h2 = urpc.decode_header(again)
        back = urpc.decode_request(h2.type, again[urpc.HEADER_SIZE:], h2.msg_len)
        if isinstance(back, urpc.GetLocalShuffleData):
            back = back._replace(next_segments=(), task_attempt_id=-1)
        _check(_plain_request(back) == _plain_request(req), "urpc request round trip")


# --------------------------------------------------------------------------------------
# The coordinator's request decoders (issue 17): heartbeats, assignments, app requests and
# the HTTP applications filter. What a hostile peer controls: every byte of the protobuf (or
# JSON) body. Each must end in a clear refusal or a bounded, consistent answer.
# --------------------------------------------------------------------------------------

_MESSAGE_BOUND = 2048  # a refusal message is one bounded line, whatever the input


def _heartbeat_seeds() -> list[bytes]:
    server = pb.ShuffleServerId(id="127.0.0.1-19991", ip="127.0.0.1", port=19991, netty_port=17000, jetty_port=20010)
    good = pb.ShuffleServerHeartBeatRequest(
        serverId=server, usedMemory=10, availableMemory=1 << 30, tags=["ss_v5", "GRPC"], version="0.10.0",
        storageInfo={"/data1": pb.StorageInfo(mountPoint="/data1", capacity=1 << 40, usedBytes=5)},
        applicationInfo=[pb.ApplicationInfo(appId="application_1_2"), pb.ApplicationInfo(appId="app-3")])
    bad = pb.ShuffleServerHeartBeatRequest(
        serverId=pb.ShuffleServerId(id="10.0.0.9-1", ip="0.0.0.0", port=70000), usedMemory=-1,
        applicationInfo=[pb.ApplicationInfo(appId="../x")], tags=["\n"])
    return [b"", good.SerializeToString(), bad.SerializeToString(), good.SerializeToString()[:-3]]


@harness(max_len=4096, seeds=_heartbeat_seeds)
def fuzz_coordinator_heartbeat(data: bytes) -> None:
    """A server heartbeat's bytes: a bounded refusal, or a heartbeat whose every field is within the rules."""
    try:
        req = pb.ShuffleServerHeartBeatRequest.FromString(data)
    except DecodeError:
        return
    beat = decode_heartbeat_request(req)
    if isinstance(beat, MalformedHeartbeat):
        _check(bool(beat.problems) and len(beat.message) <= _MESSAGE_BOUND, "an unbounded or empty refusal")
        return
    assert isinstance(beat, ServerHeartbeat)
    _check(1 <= beat.grpc_port <= 65535 and 0 <= beat.netty_port <= 65535, f"port {beat.grpc_port} accepted")
    _check(len(beat.id) <= MAX_ID_CHARS + 80, f"an id of {len(beat.id)} characters accepted")
    _check(all(check_app_id(a) == a for a in beat.app_ids), "an invalid app id accepted")
    _check(beat.used_memory >= 0 and beat.available_memory >= 0, "negative memory accepted")


_CANDIDATES = [Candidate(id=f"10.0.{i % 3}.{i}-{19990 + i}", host=f"10.0.{i % 3}.{i % 4}",
                         available_memory=(i + 1) << 28, assigned_partitions=i) for i in range(7)]
_HEARTBEATS = {c.id: ServerHeartbeat(id=c.id, ip=c.host, grpc_port=19990 + i, netty_port=17000)
               for i, c in enumerate(_CANDIDATES)}
_ENCODE_AT_MOST = 3000  # ranges the harness encodes and compares with protobuf (larger plans: only counted)


@harness(max_len=256, seeds=_int_seeds)
def fuzz_coordinator_assignment(data: bytes) -> None:
    """``getShuffleAssignments`` fields (proto int32s): refused by ``assignment_problem``, or an assignment
    whose plan covers every partition ``replica`` times, costs nothing per partition, and encodes to
    the bytes protobuf writes."""
    fdp = atheris.FuzzedDataProvider(data)
    partition_num, per_range, replica = _wire_int(fdp, 32), _wire_int(fdp, 32), _wire_int(fdp, 32)
    server_number = _wire_int(fdp, 32)
    max_partitions = fdp.ConsumeIntInRange(1, (1 << 31) - 1)
    max_replica = fdp.ConsumeIntInRange(1, 16)
    candidates = _CANDIDATES[: fdp.ConsumeIntInRange(0, len(_CANDIDATES))]
    host_strategy = list(HostStrategy)[fdp.ConsumeIntInRange(0, len(HostStrategy) - 1)]
    strategy = list(AssignmentStrategy)[fdp.ConsumeIntInRange(0, len(AssignmentStrategy) - 1)]
    problem = assignment_problem("app_1", 0, partition_num=partition_num, per_range=per_range or 1,
                                 replica=replica or 1, max_partitions=max_partitions, max_replica=max_replica)
    if problem is not None:
        _check(len(problem) <= _MESSAGE_BOUND, "an unbounded refusal")
        return
    request = AssignmentRequest(partition_num=partition_num, partitions_per_range=per_range or 1,
                                replica=replica or 1, server_number=server_number)
    try:
        result = assign(request, candidates, strategy=strategy, host_strategy=host_strategy, max_servers=5)
    except AssignmentError as e:
        _check(len(str(e)) <= _MESSAGE_BOUND, "an unbounded assignment error")
        return
    plan = result.ranges
    _check(len(plan.replica_sets) <= len(candidates), "more replica lists than servers")
    _check(sum(result.partitions_per_server.values()) == partition_num * request.replica, "partitions lost")
    if len(plan):
        last = plan[-1]
        _check(last.end == partition_num - 1 and plan[0].start == 0, "the ranges do not cover the partitions")
        _check(all(len(set(r.server_ids)) == request.replica for r in (plan[0], last)), "replicas not distinct")
    if len(plan) <= _ENCODE_AT_MOST:
        ids = {sid: encode_server_id(hb) for sid, hb in _HEARTBEATS.items()}
        expected = pb.GetShuffleAssignmentsResponse(assignments=[
            pb.PartitionRangeAssignment(startPartition=r.start, endPartition=r.end,
                                        server=[ids[s] for s in r.server_ids]) for r in plan]).SerializeToString()
        _check(asyncio.run(encode_assignments(result, _HEARTBEATS)) == expected, "encoding differs from protobuf")


def _app_seeds() -> list[bytes]:
    return [b"", pb.ApplicationInfoRequest(appId="application_1_2", user="alice", version="0.10.0").SerializeToString(),
            pb.ApplicationInfoRequest(appId="../../etc", user="\x00").SerializeToString(),
            pb.AppHeartBeatRequest(appId="a" * 300).SerializeToString()]


@harness(max_len=1024, seeds=_app_seeds)
def fuzz_coordinator_app_request(data: bytes) -> None:
    """``registerApplicationInfo`` bytes: a bounded refusal, or an app the registry records (within its cap)."""
    try:
        req = pb.ApplicationInfoRequest.FromString(data)
    except DecodeError:
        return
    problem = app_request_problem(req.appId, user=req.user, version=req.version, git_commit_id=req.gitCommitId)
    if problem is not None:
        _check(len(problem) <= _MESSAGE_BOUND, "an unbounded refusal")
        return
    _check(check_app_id(req.appId) == req.appId and len(req.user) <= 256, "an invalid app request accepted")
    registry = AppRegistry(clock=ManualClock(start=0.0), heartbeat_timeout_s=1, max_apps=1)
    registry.register(req.appId, user=req.user, version=req.version, git_commit_id=req.gitCommitId)
    _check(req.appId in registry and len(registry) == 1, "an accepted app was not registered")
    try:
        registry.register(req.appId + "x" if len(req.appId) < 255 else req.appId[:-1] + "y")
    except AppRegistryFull:
        return
    raise FuzzPropertyError("max_apps did not hold")


_FILTER_IDS = ["a" * 29 + "b", "application_1700000000000_0001", "app-1", "x"]


def _filter_seeds() -> list[bytes]:
    bodies = [None, {}, {"appIdRegex": "(a+)+"}, {"appIdRegex": "app.*", "pageSize": 2, "currentPage": 1},
              {"applications": ["app-1", "x"], "heartBeatStartTime": 1, "heartBeatEndTime": "99"},
              {"appIdRegex": "(a)\\1"}, {"pageSize": "10"}, [1, 2]]
    return [orjson.dumps(b) for b in bodies] + [b"{", b"\xff"]


@harness(max_len=2048, seeds=_filter_seeds)
def fuzz_applications_filter(data: bytes) -> None:
    """``POST /api/server/applications`` bodies: a bounded refusal, or a filter within its bounds whose
    matching is fast (RE2) and consistent with the listed ids and the time window."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    try:
        wanted = AppFilter.parse(body)
    except InvalidFilter as e:
        _check(len(str(e)) <= _MESSAGE_BOUND, "an unbounded refusal")
        return
    _check(1 <= wanted.page_size <= MAX_PAGE_SIZE and wanted.page >= 1, "page bounds not enforced")
    for app_id in _FILTER_IDS:
        for when in (0, 5, 1 << 40):
            matched = wanted.matches(app_id, when)
            if matched:
                _check(not wanted.app_ids or app_id in wanted.app_ids, "an unlisted app matched")
                _check(wanted.start_ms <= when <= wanted.end_ms, "an app outside the window matched")


# --------------------------------------------------------------------------------------
# What restart recovery reads from a data path (docs/recovery.md): shuffle.meta and indexes
# --------------------------------------------------------------------------------------


def _meta_seeds() -> list[bytes]:
    reg = frame(REGISTER, encode_register([(0, 3), (7, 9)], local_order=True, user="u", remote_storage="hdfs://x",
                                          properties=[("k", "v")]))
    ids = frame(BLOCK_IDS, encode_block_ids([(1, [5, 6, MAX_ID]), (2, [])]))
    seg = frame(SEGMENT, encode_segment(3, "/data/d1"))
    too_big = frame(BLOCK_IDS, encode_block_ids([(0, array("Q", [(1 << 64) - 1]))]))
    return [
        FILE_HEADER,
        FILE_HEADER + reg + ids + seg,
        FILE_HEADER + reg + ids[:-3],  # torn tail
        FILE_HEADER + reg + too_big + seg,  # a checksummed record with an id above 2**63 - 1
        FILE_HEADER + frame(99, b"from a newer writer") + seg,
        b"RSHM\x02\x00\x00\x00" + reg,
    ]


@harness(max_len=8192, seeds=_meta_seeds)
def fuzz_shuffle_meta(data: bytes) -> None:
    """``decode_log`` (a shuffle.meta found on disk): ``MetaFormatError`` or records that re-read the same
    from ``valid_length`` bytes; ids in range; a corrupt log always says why; same for any buffer type."""
    try:
        out = decode_log(data)
    except MetaFormatError:
        for view in (bytearray(data), memoryview(data)):
            try:
                decode_log(view)
            except MetaFormatError:
                continue
            raise FuzzPropertyError(f"{type(view).__name__} decodes where bytes do not")
        return
    _check(HEADER_SIZE <= out.valid_length <= len(data), f"valid_length {out.valid_length} of {len(data)}")
    _check((out.valid_length < len(data)) == bool(out.problem), "a problem iff bytes are left over")
    _check(not out.corrupt or bool(out.problem), "corrupt without a reason")
    again = decode_log(data[: out.valid_length])
    _check(again.problem == "" and not again.corrupt, "the valid prefix is not clean")
    _check(again.records == out.records, "the valid prefix decodes to other records")
    for rec in out.records:
        if isinstance(rec, BlockIdsRecord):
            for pid, ids in rec.parts:
                _check(pid >= 0, f"negative partition id {pid}")
                _check(all(0 <= i <= MAX_ID for i in ids[:_ITERATE_AT_MOST]), "block id out of range")
    for view in (bytearray(data), memoryview(data), _strided(data)):
        other = decode_log(view)
        _check(other.records == out.records and other.valid_length == out.valid_length,
               f"{type(view).__name__} decodes differently")


def _scan_index_seeds() -> list[bytes]:
    good = encode_index([IndexEntry(0, 10, 10, 1, 5, 1), IndexEntry(10, 20, 20, 2, 6, 1)])
    return [
        (30).to_bytes(4, "big") + good,
        (25).to_bytes(4, "big") + good,  # the second record points past the data
        (30).to_bytes(4, "big") + good + b"\x01" * 17,  # torn tail
        (0).to_bytes(4, "big") + _SPEC_RECORD,
        (1 << 31).to_bytes(4, "big") + _SPEC_RECORD * 3,
        (100).to_bytes(4, "big") + b"\xff" * 80,
    ]


@harness(max_len=4096 + 4, seeds=_scan_index_seeds)
def fuzz_scan_index(data: bytes) -> None:
    """``scan_index`` (an index found on disk next to a data file of the first 4 bytes' length): keeps
    exactly the leading sane records, as a naive reading of ``decode_index`` says."""
    data_len, buf = int.from_bytes(data[:4], "big"), data[4:]
    found = scan_index(buf, data_len)
    entries = decode_index(buf)
    sane = 0
    while sane < len(entries):
        e = entries[sane]
        if e.offset < 0 or e.length < 0 or e.block_id < 0 or e.offset + e.length > data_len:
            break
        sane += 1
    _check(found.records == sane, f"kept {found.records} records, {sane} are sane")
    _check(list(found.block_ids) == [e.block_id for e in entries[:sane]], "block ids differ")
    _check(found.data_end == max((e.offset + e.length for e in entries[:sane]), default=0), "data end differs")
    _check(found.data_end <= data_len, "data end past the data file")
    _check(found.bad_record == (sane if sane < len(entries) else -1), "bad record misplaced")
    _check(found.torn_bytes == len(buf) % INDEX_RECORD_SIZE, "torn bytes")
    _check(bool(found.problem) == (found.bad_record >= 0 or found.torn_bytes > 0), "problem text")
    for view in (bytearray(buf), memoryview(buf), _strided(buf)):
        _check(scan_index(view, data_len) == found, f"{type(view).__name__} scans differently")
