"""Wire fields → domain values, shared by every adapter of the shuffle server.

This module owns turning the request fields that carry an encoded structure into the values
``ShuffleService`` takes, so a second transport (urpc) calls the same code and no service method
sees wire formats:

- ``decode_layout((sequenceNoBits, partitionIdBits, taskAttemptIdBits))`` → ``BlockIdLayout``, or
  None when all three are 0 (an old client: the default layout applies);
- ``wire_status(code)``: a status number as the protobuf stubs type a ``status`` field (the
  generated enum type; the number is what goes on the wire either way);
- ``decode_task_filter(serializedExpectedTaskIdsBitmap)`` → ``TaskIdFilter``, or None when absent.
  Bitmaps above ``MAX_TASK_BITMAP_BYTES`` are refused before decoding; those above
  ``INLINE_TASK_BITMAP_BYTES`` are decoded on a thread (decoding is Python code, ~0.1 us a byte:
  there the GIL's switch interval lets the event loop run every few ms instead of waiting for the
  whole decode).

A bad value raises ``InvalidRequestError`` (INVALID_REQUEST) naming the field; the codecs
themselves live in ``riffle_actors.protocol`` and raise only ``ProtocolError``.
"""

from __future__ import annotations

import asyncio
from typing import cast

from riffle_actors.errors import InvalidRequestError
from riffle_actors.protocol.bitmap import TaskIdFilter
from riffle_actors.protocol.blockid import BlockIdLayout
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.proto import uniffle_pb2 as pb

# A Spark reader's expected task ids fit in far less: 1M sparse ids take about 2 MiB.
MAX_TASK_BITMAP_BYTES = 8 << 20
INLINE_TASK_BITMAP_BYTES = 64 << 10


def wire_status(code: int) -> pb.StatusCode:
    """``code`` (a ``riffle_actors.errors.StatusCode``) for a protobuf ``status`` field."""
    return cast(pb.StatusCode, int(code))


def decode_layout(bits: tuple[int, int, int]) -> BlockIdLayout | None:
    """The request's ``blockIdLayout`` (sequence, partition, task-attempt bits); None when unset."""
    if not any(bits):
        return None
    try:
        return BlockIdLayout.from_proto_fields(*bits)
    except ProtocolError as e:
        raise InvalidRequestError(f"invalid blockIdLayout {bits}: {e}") from None


async def decode_task_filter(bitmap: bytes | None) -> TaskIdFilter | None:
    """The reader's expected task ids; None when the request carries none (or an empty one)."""
    if not bitmap:
        return None
    if len(bitmap) > MAX_TASK_BITMAP_BYTES:
        raise InvalidRequestError(f"serializedExpectedTaskIdsBitmap of {len(bitmap)} bytes is above "
                                  f"the {MAX_TASK_BITMAP_BYTES} this server decodes")
    try:
        if len(bitmap) > INLINE_TASK_BITMAP_BYTES:
            return await asyncio.to_thread(TaskIdFilter.from_bytes, bitmap)
        return TaskIdFilter.from_bytes(bitmap)
    except ProtocolError as e:
        raise InvalidRequestError(f"bad serializedExpectedTaskIdsBitmap: {e}") from None
