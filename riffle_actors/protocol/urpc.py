"""The Uniffle Netty frame ("urpc" in Riffle, ``GRPC_NETTY`` in the client): bytes <-> records (spec §6).

This module owns the byte layout of the data transport that the Uniffle client uses when
``spark.rss.client.type=GRPC_NETTY``. A frame is a 9-byte header and two regions::

    msgLen  i32 BE   size of the encoded message fields
    type    i8       MessageType
    bodyLen i32 BE   size of the trailing body (index or data bytes of a response; 0 in requests)
    message msgLen bytes, then body bodyLen bytes

All integers are big-endian; a string is an i32 byte length (-1 = null) and UTF-8 bytes.

Requests (client -> server) are decoded from a buffer holding exactly the ``msgLen + bodyLen``
region (``decode_request``); a ``SendShuffleData`` keeps every block's payload as a slice of that
buffer (a ``memoryview``), never a per-block copy. Responses are encoded as a head (``bytes``)
and the caller's body buffers, so a transport can ``writelines`` them without joining.

Every decoder raises only ``ProtocolError`` on bad bytes (negative or out-of-range lengths,
counts larger than the bytes left could hold, invalid UTF-8, truncation). Request encoders exist
for tests, the benchmark and the fuzz harness; they produce what the Uniffle 0.9.2 client sends
(checked against its classes: ``SendShuffleDataRequest.encode``, ``Encoders.encodeShuffleBlockInfo``).

Upstream facts (0.9.2 client jar, agreeing with spec §6 unless noted):

- the 0.9.2 client knows types 0-20 only: it sends 3, 4, 5, 6 and decodes 0, 14, 15, 16; types 23-26
  are 0.10+ (a 0.9 client cannot decode a type-23 index response);
- a block is 56 bytes + data + its replica server list, which the server skips;
- the client's ticket for a send is Σ(length + 32) + the message size (``encodedLength``).

It does not cover sockets or the use cases (``riffle_actors.transport.urpc_server``).
"""

from __future__ import annotations

import enum
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn

from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.records import Block, BlockBatch

Buffer = bytes | bytearray | memoryview  # what a frame's bytes may be held in

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MessageType",
    "RESPONSE_TYPE",
    "FrameHeader",
    "SendShuffleData",
    "GetLocalShuffleIndex",
    "GetLocalShuffleData",
    "GetMemoryShuffleData",
    "GetSortedShuffleData",
    "decode_header",
    "decode_request",
    "peek_request_id",
    "encode_rpc_response",
    "encode_index_response",
    "encode_data_response",
    "encode_memory_response",
    "encode_sorted_response",
    "encode_send_shuffle_data",
    "encode_get_local_index",
    "encode_get_local_data",
    "encode_get_memory_data",
    "send_message_size",
    "Response",
    "decode_response",
]


class MessageType(enum.IntEnum):
    """``org.apache.uniffle.common.netty.protocol.Message.Type`` ids this server reads or writes."""

    RPC_RESPONSE = 0
    SEND_SHUFFLE_DATA_REQUEST = 3
    GET_LOCAL_SHUFFLE_INDEX_REQUEST = 4
    GET_LOCAL_SHUFFLE_DATA_REQUEST = 5
    GET_MEMORY_SHUFFLE_DATA_REQUEST = 6
    GET_LOCAL_SHUFFLE_INDEX_RESPONSE = 14
    GET_LOCAL_SHUFFLE_DATA_RESPONSE = 15
    GET_MEMORY_SHUFFLE_DATA_RESPONSE = 16
    GET_SORTED_SHUFFLE_DATA_REQUEST = 21
    GET_SORTED_SHUFFLE_DATA_RESPONSE = 22
    GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE = 23
    GET_LOCAL_SHUFFLE_DATA_V2_REQUEST = 24
    GET_LOCAL_SHUFFLE_DATA_V3_REQUEST = 25


#: The reply type of each request type, on success and on every error (spec §6.5). Index requests
#: are answered 14 unless the server is configured for V2 (23).
RESPONSE_TYPE = {
    MessageType.SEND_SHUFFLE_DATA_REQUEST: MessageType.RPC_RESPONSE,
    MessageType.GET_LOCAL_SHUFFLE_INDEX_REQUEST: MessageType.GET_LOCAL_SHUFFLE_INDEX_RESPONSE,
    MessageType.GET_LOCAL_SHUFFLE_DATA_REQUEST: MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE,
    MessageType.GET_LOCAL_SHUFFLE_DATA_V2_REQUEST: MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE,
    MessageType.GET_LOCAL_SHUFFLE_DATA_V3_REQUEST: MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE,
    MessageType.GET_MEMORY_SHUFFLE_DATA_REQUEST: MessageType.GET_MEMORY_SHUFFLE_DATA_RESPONSE,
    MessageType.GET_SORTED_SHUFFLE_DATA_REQUEST: MessageType.GET_SORTED_SHUFFLE_DATA_RESPONSE,
}

HEADER = struct.Struct(">ibi")
HEADER_SIZE = HEADER.size  # 9
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_RESP_PREFIX = struct.Struct(">qii")  # requestId, status, retMsg length
# partitionId, blockId, length, shuffleId, crc, taskAttemptId, data length
_BLOCK_HEAD = struct.Struct(">iqiiqqi")
_BLOCK_TAIL = struct.Struct(">iq")  # uncompressLength, freeMemory
_PARTITION_HEAD = struct.Struct(">ii")  # partitionId, blockCount
_SEGMENT = struct.Struct(">qiiiqq")  # blockId, offset, length, uncompressLength, crc, taskAttemptId (36 bytes)
_MIN_BLOCK_BYTES = _BLOCK_HEAD.size + 4 + _BLOCK_TAIL.size  # 56
_MIN_SERVER_BYTES = 4 + 4 + 4 + 4  # two empty strings and two ports
_MIN_PARTITION_BYTES = 8  # partitionId + blockCount


class FrameHeader(NamedTuple):
    msg_len: int
    type: int
    body_len: int

    @property
    def frame_len(self) -> int:
        """Bytes after the header."""
        return self.msg_len + self.body_len


class SendShuffleData(NamedTuple):
    request_id: int
    app_id: str
    shuffle_id: int
    require_buffer_id: int
    partitions: tuple[BlockBatch, ...]  # columnar, payloads as slices of the frame (see detach_partitions)
    timestamp: int


class GetLocalShuffleIndex(NamedTuple):
    request_id: int
    app_id: str
    shuffle_id: int
    partition_id: int
    partition_num_per_range: int
    partition_num: int


class GetLocalShuffleData(NamedTuple):
    """Types 5, 24 (+ storageId) and 25 (+ read-ahead hints and the reader's task attempt id)."""

    request_id: int
    app_id: str
    shuffle_id: int
    partition_id: int
    partition_num_per_range: int
    partition_num: int
    offset: int
    length: int
    timestamp: int
    storage_id: int = -1
    next_segments: tuple[tuple[int, int], ...] = ()
    task_attempt_id: int = -1


class GetMemoryShuffleData(NamedTuple):
    request_id: int
    app_id: str
    shuffle_id: int
    partition_id: int
    last_block_id: int
    read_buffer_size: int
    timestamp: int
    expected_task_ids: bytes | None  # None: no filter (length -1 on the wire)


class GetSortedShuffleData(NamedTuple):
    """Remote merge only (0.10+); answered INTERNAL_ERROR like the Java server without the feature."""

    request_id: int
    app_id: str


Request = SendShuffleData | GetLocalShuffleIndex | GetLocalShuffleData | GetMemoryShuffleData | GetSortedShuffleData


# ----------------------------------------------------------------------------- decoding


def decode_header(buf: Buffer, pos: int = 0) -> FrameHeader:
    """The 9-byte header at ``buf[pos:]``; ``ProtocolError`` for negative lengths or an empty frame."""
    msg_len, type_, body_len = HEADER.unpack_from(buf, pos)
    if msg_len < 0:
        raise ProtocolError("frame.msgLen", f"{msg_len} is negative")
    if body_len < 0:
        raise ProtocolError("frame.bodyLen", f"{body_len} is negative")
    if msg_len + body_len <= 0:
        raise ProtocolError("frame", "msgLen + bodyLen must be > 0")
    return FrameHeader(msg_len, type_, body_len)


class _Reader:
    """Cursor over one frame's message region; every read checks the bytes left."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: memoryview, end: int):
        self.buf = buf
        self.pos = 0
        self.end = end

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise ProtocolError(what, f"needs {n} bytes, {self.end - self.pos} left in the frame")

    def i32(self, what: str) -> int:
        self.need(4, what)
        v: int = _I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def i64(self, what: str) -> int:
        self.need(8, what)
        v: int = _I64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def unpack(self, st: struct.Struct, what: str) -> tuple[Any, ...]:
        self.need(st.size, what)
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def raw(self, n: int, what: str) -> memoryview:
        if n < 0:
            raise ProtocolError(what, f"length {n} is negative")
        self.need(n, what)
        v = self.buf[self.pos:self.pos + n]
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.i32(what)
        if n == -1:
            return ""
        try:
            return str(self.raw(n, what), "utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(what, f"not UTF-8: {e.reason}") from None

    def skip_string(self, what: str) -> None:
        n = self.i32(what)
        if n != -1:
            self.raw(n, what)

    def count(self, min_item_bytes: int, what: str) -> int:
        n = self.i32(what)
        if n < 0:
            raise ProtocolError(what, f"count {n} is negative")
        if n * min_item_bytes > self.end - self.pos:
            raise ProtocolError(what, f"count {n} cannot fit in the {self.end - self.pos} bytes left")
        return n


def peek_request_id(buf: Buffer, msg_len: int) -> int | None:
    """The requestId that starts every request's message, if the message is long enough."""
    return _I64.unpack_from(buf, 0)[0] if msg_len >= 8 and len(buf) >= 8 else None


def _decode_send(r: _Reader) -> SendShuffleData:
    """Type 3. The block loop checks every length against the bytes left inline; only when a check
    fails is that field read again through ``r`` (``_refuse``), which raises naming it: building a
    field name for every read would cost more than the read."""
    request_id = r.i64("send.requestId")
    app_id = r.string("send.appId")
    shuffle_id = r.i32("send.shuffleId")
    ticket = r.i64("send.requireBufferId")
    partitions = []
    buf = r.buf
    end = r.end
    unpack_head = _BLOCK_HEAD.unpack_from
    unpack_tail = _BLOCK_TAIL.unpack_from
    unpack_i32 = _I32.unpack_from
    unpack_partition = _PARTITION_HEAD.unpack_from
    head_size, tail_size = _BLOCK_HEAD.size, _BLOCK_TAIL.size
    for i in range(r.count(_MIN_PARTITION_BYTES, "send.partitionCount")):
        pos = r.pos
        if end - pos < 8:
            r.i32(f"send.partition[{i}].partitionId")
            _refuse(r, pos + 4, r.count, _MIN_BLOCK_BYTES, f"send.partition[{i}].blockCount")
        partition_id, blocks = unpack_partition(buf, pos)
        pos += 8
        if blocks < 0 or blocks * _MIN_BLOCK_BYTES > end - pos:
            _refuse(r, pos - 4, r.count, _MIN_BLOCK_BYTES, f"send.partition[{i}].blockCount")
        ids, lengths, uncompress, crcs, tasks = array("q"), array("q"), array("q"), array("q"), array("q")
        datas = []
        data_bytes = 0
        for j in range(blocks):
            if end - pos < head_size:
                _refuse(r, pos, r.need, head_size, _send_field(i, j, ""))
            _, block_id, length, _, crc, task_attempt_id, data_len = unpack_head(buf, pos)
            start = pos + head_size
            if not 0 <= data_len <= end - start:
                _refuse(r, start, r.raw, data_len, _send_field(i, j, ".data"))
            pos = start + data_len
            servers = unpack_i32(buf, pos)[0] if end - pos >= 4 else -1
            if servers < 0 or servers * _MIN_SERVER_BYTES > end - pos - 4:
                _refuse(r, pos, r.count, _MIN_SERVER_BYTES, _send_field(i, j, ".serverCount"))
            pos += 4
            for k in range(servers):  # the replica list: skipped (id and host strings, two ports)
                pos = _skip_string(r, pos, i, j, k, ".id")
                pos = _skip_string(r, pos, i, j, k, ".host")
                if end - pos < 8:
                    _refuse(r, pos, r.need, 8, _send_field(i, j, f".server[{k}].ports"))
                pos += 8
            if end - pos < tail_size:
                _refuse(r, pos, r.need, tail_size, _send_field(i, j, ".uncompressLength"))
            uncompress_length = unpack_tail(buf, pos)[0]
            pos += tail_size
            ids.append(block_id)
            lengths.append(length)
            uncompress.append(uncompress_length)
            crcs.append(crc)
            tasks.append(task_attempt_id)
            datas.append(buf[start:start + data_len])
            data_bytes += data_len
        r.pos = pos
        partitions.append(BlockBatch(partition_id, ids, lengths, uncompress, crcs, tasks, datas, data_bytes))
    timestamp = r.i64("send.timestamp")
    return SendShuffleData(request_id, app_id, shuffle_id, ticket, tuple(partitions), timestamp)


def _skip_string(r: _Reader, pos: int, i: int, j: int, k: int, name: str) -> int:
    """The position after the string at ``pos`` (block ``j``'s replica server ``k``): ``_Reader.skip_string``
    without the field name, which only a bad length needs."""
    n: int = _I32.unpack_from(r.buf, pos)[0] if r.end - pos >= 4 else -2
    if n == -1:
        return pos + 4
    if not 0 <= n <= r.end - pos - 4:
        _refuse(r, pos, r.skip_string, _send_field(i, j, f".server[{k}]{name}"))
    return pos + 4 + n


def _send_field(i: int, j: int, rest: str) -> str:
    return f"send.partition[{i}].block[{j}]{rest}"


def _refuse(r: _Reader, pos: int, read: Callable[..., object], *args: object) -> NoReturn:
    """A check of the fast path failed at ``pos``: the same read through ``r`` raises the ``ProtocolError``
    that names the field and says what is wrong with it."""
    r.pos = pos
    read(*args)
    raise AssertionError(f"{read.__name__}{args} at {pos} did not refuse what the fast path refused")


def detach_partitions(partitions: tuple[BlockBatch, ...]) -> tuple[BlockBatch, ...]:
    """Give each partition's block payloads a buffer of its own: one copy of the frame's data, after
    which the frame's buffer holds nothing anybody refers to and can be reused at once.

    Decoded blocks are slices of their frame, and a slice keeps the whole frame alive; partitions
    leave memory separately (one spill batch each), so a small partition staying in memory would
    keep a whole frame resident while the budget counts a few KiB of it, and a receive buffer could
    never be reused. Each partition's payloads are joined into one ``bytes`` of exactly their size,
    so resident memory is what the budget counts. The returned batches share the columns of
    ``partitions``; only ``datas`` are new.
    """
    out = []
    for batch in partitions:
        datas = batch.datas
        if not datas:
            out.append(batch)
            continue
        whole = memoryview(b"".join(datas))
        own = []
        pos = 0
        for n in map(len, datas):
            own.append(whole[pos:pos + n])
            pos += n
        out.append(BlockBatch(batch.partition_id, batch.block_ids, batch.lengths, batch.uncompress_lengths,
                              batch.crcs, batch.task_ids, own, batch.data_bytes))
    return tuple(out)


def _decode_index(r: _Reader) -> GetLocalShuffleIndex:
    return GetLocalShuffleIndex(r.i64("index.requestId"), r.string("index.appId"), r.i32("index.shuffleId"),
                                r.i32("index.partitionId"), r.i32("index.partitionNumPerRange"),
                                r.i32("index.partitionNum"))


def _decode_data(r: _Reader, type_: int) -> GetLocalShuffleData:
    head = GetLocalShuffleData(
        r.i64("data.requestId"), r.string("data.appId"), r.i32("data.shuffleId"), r.i32("data.partitionId"),
        r.i32("data.partitionNumPerRange"), r.i32("data.partitionNum"), r.i64("data.offset"),
        r.i32("data.length"), r.i64("data.timestamp"))
    if type_ == MessageType.GET_LOCAL_SHUFFLE_DATA_REQUEST:
        return head
    storage_id = r.i32("data.storageId")
    if type_ == MessageType.GET_LOCAL_SHUFFLE_DATA_V2_REQUEST:
        return head._replace(storage_id=storage_id)
    segments = tuple((r.i64(f"data.nextSegment[{i}].offset"), r.i64(f"data.nextSegment[{i}].length"))
                     for i in range(r.count(16, "data.nextSegmentCount")))
    return head._replace(storage_id=storage_id, next_segments=segments, task_attempt_id=r.i64("data.taskAttemptId"))


def _decode_memory(r: _Reader) -> GetMemoryShuffleData:
    fields = (r.i64("memory.requestId"), r.string("memory.appId"), r.i32("memory.shuffleId"),
              r.i32("memory.partitionId"), r.i64("memory.lastBlockId"), r.i32("memory.readBufferSize"),
              r.i64("memory.timestamp"))
    n = r.i32("memory.expectedTaskIds")
    bitmap = None if n == -1 else bytes(r.raw(n, "memory.expectedTaskIds"))
    return GetMemoryShuffleData(*fields, bitmap)


def _decode_sorted(r: _Reader) -> GetSortedShuffleData:
    return GetSortedShuffleData(r.i64("sorted.requestId"), r.string("sorted.appId"))


def decode_request(type_: int, frame: Buffer, msg_len: int) -> Request:
    """Decode the request of ``type_`` from ``frame`` (the ``msgLen + bodyLen`` bytes after the header).

    ``SendShuffleData`` blocks reference ``frame`` (zero copy): pass an immutable buffer, or one that
    is never reused. Unknown types raise ``ProtocolError`` (field ``frame.type``).
    """
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    if msg_len > len(view):
        raise ProtocolError("frame.msgLen", f"{msg_len} is more than the {len(view)} bytes of the frame")
    r = _Reader(view, msg_len)
    if type_ == MessageType.SEND_SHUFFLE_DATA_REQUEST:
        return _decode_send(r)
    if type_ == MessageType.GET_LOCAL_SHUFFLE_INDEX_REQUEST:
        return _decode_index(r)
    if type_ in (MessageType.GET_LOCAL_SHUFFLE_DATA_REQUEST, MessageType.GET_LOCAL_SHUFFLE_DATA_V2_REQUEST,
                 MessageType.GET_LOCAL_SHUFFLE_DATA_V3_REQUEST):
        return _decode_data(r, type_)
    if type_ == MessageType.GET_MEMORY_SHUFFLE_DATA_REQUEST:
        return _decode_memory(r)
    if type_ == MessageType.GET_SORTED_SHUFFLE_DATA_REQUEST:
        return _decode_sorted(r)
    raise ProtocolError("frame.type", f"{type_} is not a request type this server serves")


# ----------------------------------------------------------------------------- encoding responses


def _str(s: str | None) -> bytes:
    if s is None:
        return _I32.pack(-1)
    b = s.encode("utf-8")
    return _I32.pack(len(b)) + b


def _response(type_: int, request_id: int, status: int, ret_msg: str, extra: bytes, body_len: int) -> bytes:
    msg = ret_msg.encode("utf-8")
    head = _RESP_PREFIX.pack(request_id, status, len(msg)) + msg + extra
    return HEADER.pack(len(head), type_, body_len) + head


def encode_rpc_response(request_id: int, status: int, ret_msg: str = "") -> bytes:
    """Type 0 (the reply to SendShuffleData): a whole frame."""
    return _response(MessageType.RPC_RESPONSE, request_id, status, ret_msg, b"", 0)


def encode_index_response(request_id: int, status: int, ret_msg: str, data_file_len: int, index_len: int,
                          storage_ids: Sequence[int] | None = None) -> bytes:
    """Type 14 (``storage_ids`` None) or 23: the head; the ``index_len`` index bytes follow as the body."""
    if storage_ids is None:
        return _response(MessageType.GET_LOCAL_SHUFFLE_INDEX_RESPONSE, request_id, status, ret_msg,
                         _I64.pack(data_file_len), index_len)
    extra = struct.pack(f">qi{len(storage_ids)}i", data_file_len, len(storage_ids), *storage_ids)
    return _response(MessageType.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE, request_id, status, ret_msg, extra, index_len)


def encode_data_response(request_id: int, status: int, ret_msg: str, data_len: int) -> bytes:
    """Type 15: the head; the ``data_len`` data bytes follow as the body."""
    return _response(MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE, request_id, status, ret_msg, b"", data_len)


def encode_memory_response(request_id: int, status: int, ret_msg: str, blocks: Sequence[Block]) -> bytes:
    """Type 16: the head with one 36-byte segment per block; the blocks' data follow, in order, as the body."""
    parts = [_I32.pack(len(blocks))]
    offset = 0
    for b in blocks:
        n = len(b.data)
        parts.append(_SEGMENT.pack(b.block_id, offset, n, b.uncompress_length, b.crc, b.task_attempt_id))
        offset += n
    return _response(MessageType.GET_MEMORY_SHUFFLE_DATA_RESPONSE, request_id, status, ret_msg,
                     b"".join(parts), offset)


def encode_sorted_response(request_id: int, status: int, ret_msg: str) -> bytes:
    """Type 22 without data: nextBlockId -1, mergeState 0."""
    return _response(MessageType.GET_SORTED_SHUFFLE_DATA_RESPONSE, request_id, status, ret_msg,
                     struct.pack(">qi", -1, 0), 0)


# ----------------------------------------------------------------------------- encoding requests (clients)


def _frame(type_: int, msg: bytes) -> bytes:
    return HEADER.pack(len(msg), type_, 0) + msg


def send_message_size(app_id: str, partitions: Sequence[tuple[int, Sequence[Block]] | BlockBatch],
                      servers: int = 1) -> int:
    """``msgLen`` of ``encode_send_shuffle_data`` (the client adds it to the ticket it asks for)."""
    return len(encode_send_shuffle_data(0, app_id, 0, 0, partitions, 0, servers=servers)) - HEADER_SIZE


def encode_send_shuffle_data(request_id: int, app_id: str, shuffle_id: int, require_buffer_id: int,
                             partitions: Sequence[tuple[int, Sequence[Block]] | BlockBatch], timestamp: int,
                             servers: int = 1) -> bytes:
    """Type 3 as the Uniffle client writes it (each block lists ``servers`` replica servers)."""
    server = _str("127.0.0.1-19999") + _str("127.0.0.1") + struct.pack(">ii", 19999, 17000)
    parts = [_I64.pack(request_id), _str(app_id), struct.pack(">iqi", shuffle_id, require_buffer_id, len(partitions))]
    for partition in partitions:
        partition_id, blocks = ((partition.partition_id, tuple(partition.blocks()))
                                if isinstance(partition, BlockBatch) else partition)
        parts.append(struct.pack(">ii", partition_id, len(blocks)))
        for b in blocks:
            parts.append(_BLOCK_HEAD.pack(partition_id, b.block_id, b.length, shuffle_id, b.crc, b.task_attempt_id,
                                          len(b.data)))
            parts.append(bytes(b.data))
            parts.append(_I32.pack(servers) + server * servers)
            parts.append(_BLOCK_TAIL.pack(b.uncompress_length, 0))
    parts.append(_I64.pack(timestamp))
    return _frame(MessageType.SEND_SHUFFLE_DATA_REQUEST, b"".join(parts))


def encode_get_local_index(request_id: int, app_id: str, shuffle_id: int, partition_id: int,
                           partition_num_per_range: int = 1, partition_num: int = 1) -> bytes:
    msg = _I64.pack(request_id) + _str(app_id) + struct.pack(">iiii", shuffle_id, partition_id,
                                                             partition_num_per_range, partition_num)
    return _frame(MessageType.GET_LOCAL_SHUFFLE_INDEX_REQUEST, msg)


def encode_get_local_data(request_id: int, app_id: str, shuffle_id: int, partition_id: int, offset: int,
                          length: int, *, partition_num_per_range: int = 1, partition_num: int = 1,
                          timestamp: int = 0, storage_id: int | None = None,
                          next_segments: Sequence[tuple[int, int]] | None = None, task_attempt_id: int = 0) -> bytes:
    """Type 5; 24 with ``storage_id``; 25 with ``storage_id`` and ``next_segments``."""
    msg = _I64.pack(request_id) + _str(app_id) + struct.pack(
        ">iiiiqiq", shuffle_id, partition_id, partition_num_per_range, partition_num, offset, length, timestamp)
    type_ = MessageType.GET_LOCAL_SHUFFLE_DATA_REQUEST
    if storage_id is not None:
        msg += _I32.pack(storage_id)
        type_ = MessageType.GET_LOCAL_SHUFFLE_DATA_V2_REQUEST
        if next_segments is not None:
            msg += _I32.pack(len(next_segments)) + b"".join(struct.pack(">qq", o, n) for o, n in next_segments)
            msg += _I64.pack(task_attempt_id)
            type_ = MessageType.GET_LOCAL_SHUFFLE_DATA_V3_REQUEST
    return _frame(type_, msg)


def encode_get_memory_data(request_id: int, app_id: str, shuffle_id: int, partition_id: int, last_block_id: int,
                           read_buffer_size: int, timestamp: int = 0, expected_task_ids: bytes | None = None) -> bytes:
    msg = _I64.pack(request_id) + _str(app_id) + struct.pack(
        ">iiqiq", shuffle_id, partition_id, last_block_id, read_buffer_size, timestamp)
    msg += _I32.pack(-1) if expected_task_ids is None else _I32.pack(len(expected_task_ids)) + expected_task_ids
    return _frame(MessageType.GET_MEMORY_SHUFFLE_DATA_REQUEST, msg)


# ----------------------------------------------------------------------------- decoding responses (clients)


class Response(NamedTuple):
    """A decoded reply: the common prefix, the type-specific fields and the body (a slice of the frame)."""

    type: int
    request_id: int
    status: int
    ret_msg: str
    body: memoryview
    data_file_len: int = 0  # 14 / 23
    storage_ids: tuple[int, ...] = ()  # 23
    segments: tuple[tuple[int, int, int, int, int, int], ...] = ()  # 16: blockId, offset, length, uncompress, crc, task


def decode_response(type_: int, frame: Buffer, msg_len: int) -> Response:
    """Decode a server reply (what the client's ``Message.decode`` reads); the body is the rest of the frame."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    if msg_len > len(view):
        raise ProtocolError("frame.msgLen", f"{msg_len} is more than the {len(view)} bytes of the frame")
    r = _Reader(view, msg_len)
    request_id, status, ret_msg = r.i64("response.requestId"), r.i32("response.status"), r.string("response.retMsg")
    extra: dict[str, Any] = {}
    if type_ in (MessageType.GET_LOCAL_SHUFFLE_INDEX_RESPONSE, MessageType.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE):
        extra["data_file_len"] = r.i64("response.dataFileLen")
        if type_ == MessageType.GET_LOCAL_SHUFFLE_INDEX_V2_RESPONSE:
            extra["storage_ids"] = tuple(r.i32("response.storageId") for _ in range(r.count(4, "response.storageIds")))
    elif type_ == MessageType.GET_MEMORY_SHUFFLE_DATA_RESPONSE:
        extra["segments"] = tuple(r.unpack(_SEGMENT, "response.segment")
                                  for _ in range(r.count(_SEGMENT.size, "response.segmentCount")))
    elif type_ == MessageType.GET_SORTED_SHUFFLE_DATA_RESPONSE:
        r.need(12, "response.nextBlockId")
        r.pos += 12
    elif type_ not in (MessageType.RPC_RESPONSE, MessageType.GET_LOCAL_SHUFFLE_DATA_RESPONSE):
        raise ProtocolError("frame.type", f"{type_} is not a response type")
    if r.pos != msg_len:
        raise ProtocolError("frame.msgLen", f"{msg_len} but the fields end at {r.pos}")
    return Response(type_, request_id, status, ret_msg, view[msg_len:], **extra)
