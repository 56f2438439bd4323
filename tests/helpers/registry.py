"""Heartbeats for tests of the coordinator's server registry (``riffle_actors.coordinator.cluster``).

``hb(i, **fields)`` is the heartbeat of server ``10.0.0.<i>-19999`` with the base tags and 1 GiB
available unless the fields say otherwise.
"""

from __future__ import annotations

from typing import Any

from riffle_actors.coordinator.cluster import ServerHeartbeat

TAGS = frozenset({"ss_v5", "GRPC"})


def hb(i: int, **kw: Any) -> ServerHeartbeat:
    kw.setdefault("tags", TAGS)
    kw.setdefault("available_memory", 1 << 30)
    return ServerHeartbeat(id=f"10.0.0.{i}-19999", ip=f"10.0.0.{i}", grpc_port=19999, **kw)
