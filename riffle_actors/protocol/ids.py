"""The one validator of the ids a client or a data directory hands the server.

This module owns what a valid application id, shuffle id and partition id is, for every
place one enters: the gRPC and urpc handlers, restart recovery (directory names on disk),
the HDFS layout and the coordinator. An app id becomes a directory name locally and on
HDFS, so it must never be able to name anything outside the app's own directory: letters,
digits and ``._@:+=,-`` only, at most ``MAX_APP_ID_CHARS`` characters, never ``.`` or
``..`` (no ``/``, no NUL, no newline, no non-ASCII lookalike). Shuffle and partition ids
are Java ints on the wire (``int32``), so anything outside ``[0, 2^31 - 1]`` is refused
here, before it sizes a structure or names a file.

``parse_id_dirname`` turns a directory name found on disk back into an id: ASCII digits
only (``str.isdigit`` accepts ``"²"``, which ``int`` then refuses), no leading zeros
other than ``"0"`` itself, and within the same range; anything else is foreign.

Every refusal raises ``ProtocolError`` naming the field, which the transports map to
``INVALID_REQUEST``.
"""

from __future__ import annotations

import re

from riffle_actors.protocol.errors import ProtocolError

__all__ = [
    "MAX_APP_ID_CHARS",
    "MAX_JAVA_INT",
    "check_app_id",
    "check_partition_id",
    "check_shuffle_id",
    "parse_id_dirname",
]

MAX_APP_ID_CHARS = 255
MAX_JAVA_INT = (1 << 31) - 1

# re.ASCII keeps \d and friends out; the class is spelled out, so no Unicode letter matches
_APP_ID_RE = re.compile(r"[A-Za-z0-9._@:+=,-]+", re.ASCII)
_DIRNAME_RE = re.compile(r"0|[1-9][0-9]*", re.ASCII)


def check_app_id(app_id: object, field: str = "appId") -> str:
    """Return ``app_id`` if it is a safe application id, else raise ``ProtocolError``."""
    if not isinstance(app_id, str):
        raise ProtocolError(field, f"expected a string, got {type(app_id).__name__}")
    if not app_id:
        raise ProtocolError(field, "is empty")
    if len(app_id) > MAX_APP_ID_CHARS:
        raise ProtocolError(field, f"is {len(app_id)} characters long, at most {MAX_APP_ID_CHARS} are allowed")
    if _APP_ID_RE.fullmatch(app_id) is None or app_id in (".", ".."):
        raise ProtocolError(field, f"{app_id!r} is not a valid application id: use letters, digits and ._@:+=,- only")
    return app_id


def _check_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(field, f"expected an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_JAVA_INT:
        raise ProtocolError(field, f"{value} is outside [0, {MAX_JAVA_INT}]")
    return value


def check_shuffle_id(shuffle_id: object, field: str = "shuffleId") -> int:
    """Return ``shuffle_id`` if it is a Java int in ``[0, 2^31 - 1]``, else raise ``ProtocolError``."""
    return _check_int(shuffle_id, field)


def check_partition_id(partition_id: object, field: str = "partitionId") -> int:
    """Return ``partition_id`` if it is a Java int in ``[0, 2^31 - 1]``, else raise ``ProtocolError``."""
    return _check_int(partition_id, field)


def parse_id_dirname(name: str, field: str = "directory") -> int:
    """The shuffle or partition id a directory name on disk stands for; ``ProtocolError`` if foreign."""
    if len(name) > 10 or _DIRNAME_RE.fullmatch(name) is None:
        raise ProtocolError(field, f"{name!r} is not a shuffle or partition id")
    return _check_int(int(name), field)
