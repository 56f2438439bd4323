"""Domain errors of the shuffle server and the coordinator, each carrying the Uniffle status it maps to.

This module owns the one mapping from a failure to a wire status (``to_status``), so the
NO_REGISTER / NO_BUFFER / INTERNAL_ERROR decisions exist once, whatever the transport.
Status numbers are the ``rss.common.StatusCode`` values (spec §1.5); codes above 14 never
reach a client.
"""

from __future__ import annotations

import enum

from riffle_actors.protocol.errors import ProtocolError


class StatusCode(enum.IntEnum):
    """Mirror of ``rss.common.StatusCode`` (0.10): the numbers are the wire values."""

    SUCCESS = 0
    DOUBLE_REGISTER = 1
    NO_BUFFER = 2
    INVALID_STORAGE = 3
    NO_REGISTER = 4
    NO_PARTITION = 5
    INTERNAL_ERROR = 6
    TIMEOUT = 7
    ACCESS_DENIED = 8
    INVALID_REQUEST = 9
    NO_BUFFER_FOR_HUGE_PARTITION = 10
    STAGE_RETRY_IGNORE = 11
    EXCEED_HUGE_PARTITION_HARD_LIMIT = 12
    APP_NOT_FOUND = 13
    INTERNAL_NOT_RETRY_ERROR = 14


class RiffleError(Exception):
    """Base of every expected failure; ``status`` is what the client receives."""

    status: StatusCode = StatusCode.INTERNAL_ERROR


class NoRegisterError(RiffleError):
    """The app (or its shuffle/partition) is unknown or expired."""

    status = StatusCode.NO_REGISTER


class NoBufferError(RiffleError):
    """Not enough write memory for a ticket; the client backs off and retries."""

    status = StatusCode.NO_BUFFER


class HugePartitionBackpressureError(RiffleError):
    """A huge partition holds too much memory; the client backs off and retries."""

    status = StatusCode.NO_BUFFER_FOR_HUGE_PARTITION


class TicketNotFoundError(RiffleError):
    """The requireBuffer ticket is unknown, used or expired; the client retries with a new one."""

    status = StatusCode.INTERNAL_ERROR


class TicketExceededError(RiffleError):
    """A send carries more bytes than its requireBuffer ticket reserved.

    INVALID_REQUEST, not a retriable code: the same send would be refused every time. (The 0.9
    client knows no fail-now code but NO_REGISTER, which would misname the cause; it retries a
    send answered INVALID_REQUEST up to ``rpc.maxAttempts`` times, each refused, then fails the task.)
    """

    status = StatusCode.INVALID_REQUEST


class AccessDeniedError(RiffleError):
    """The request is well-formed but refused (a coordinator heartbeat from outside the allowed
    networks, or one the registry's admission rules turn down)."""

    status = StatusCode.ACCESS_DENIED


class InvalidRequestError(RiffleError):
    """The request is malformed (bad bitmap, bad layout, negative sizes, ...)."""

    status = StatusCode.INVALID_REQUEST


class InternalError(RiffleError):
    """A server-side failure the client may retry."""

    status = StatusCode.INTERNAL_ERROR


class StorageError(RiffleError):
    """Data on a disk cannot be served (the disk failed or is quarantined); names the disk."""

    status = StatusCode.INTERNAL_ERROR


class BlockCorruptError(RiffleError):
    """A block's bytes do not match its CRC: a send carrying one (nothing of the send is stored; the
    client resends it, as it does every send answered other than SUCCESS or NO_REGISTER), or a read
    of a range holding a block the scrubber found corrupt (the client reads another replica).
    INTERNAL_ERROR: the code the Uniffle client retries; the message names the block."""

    status = StatusCode.INTERNAL_ERROR


def to_status(exc: BaseException) -> tuple[StatusCode, str]:
    """The single place where an exception becomes a ``(status, retMsg)`` pair."""
    if isinstance(exc, RiffleError):
        return exc.status, str(exc) or type(exc).__name__
    if isinstance(exc, ProtocolError):  # a wire value the codecs or protocol.ids refused
        return StatusCode.INVALID_REQUEST, str(exc)
    return StatusCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"
