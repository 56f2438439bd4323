"""Immutable per-block records shared by the transports, the actors and the disk IO.

This module owns the shape of one shuffle block as the server keeps it. A ``Block`` is
created once per received block (a NamedTuple: cheap to build, immutable) and is never
copied afterwards: ``data`` stays the ``bytes`` object the transport decoded (gRPC) or a
read-only ``memoryview`` slice of the frame it arrived in (urpc).

See also: ``riffle_actors.protocol.index`` (the 40-byte on-disk record of a block).
"""

from __future__ import annotations

from typing import NamedTuple


class Block(NamedTuple):
    """One shuffle block: Uniffle's ``ShuffleBlock`` minus the redundant wire length."""

    block_id: int
    length: int
    uncompress_length: int
    crc: int
    task_attempt_id: int
    data: bytes | memoryview
