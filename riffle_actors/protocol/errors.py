"""The single exception raised by the byte codecs of ``riffle_actors.protocol``.

This module owns ``ProtocolError``: bytes (or values bound for the wire) that do not
follow a Uniffle format. It carries the dotted name of the offending field, in the style
of Riffle's ``consume_bytes(len, field)``, so a log line says *where* a frame or a bitmap
went wrong. It subclasses ``ValueError`` so callers that only know "bad input" still
catch it; the transport maps it to ``INVALID_REQUEST``.
"""

from __future__ import annotations


class ProtocolError(ValueError):
    """Malformed wire/storage bytes or an out-of-range value for a wire field.

    ``field`` is a dotted path such as ``"bitmap.bucket[2].cookie"``; ``detail`` says
    what is wrong with it.
    """

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, str]]:
        return type(self), (self.field, self.detail)

    @classmethod
    def truncated(cls, field: str, needed: int, available: int) -> ProtocolError:
        """The error for a field that runs past the end of the buffer."""
        return cls(field, f"requires {needed} bytes, but only {max(available, 0)} buffered")
