"""ConnectionTicker: the one timer task of a listener of ours (urpc, gRPC on the loop).

It owns the task that calls ``tick(now)`` on each open connection of a listener every ``tick_s``
(their timeouts and reply accounting), and the event it sleeps on while the listener has no
connection, so an idle server is not woken by it. The listener owns its connections; it calls
``connected()`` when it admits one. Timeouts themselves are the connections' business.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Protocol


class Ticked(Protocol):
    def tick(self, now: float) -> None: ...


class ConnectionTicker:
    """Calls ``tick`` on every connection of ``connections`` every ``tick_s``, while there is one."""

    def __init__(self, connections: Collection[Ticked], tick_s: float, name: str):
        self.connections = connections
        self.tick_s = tick_s
        self.name = name
        self._connected = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def connected(self) -> None:
        """A connection was admitted: tick again (a no-op while ticking)."""
        self._connected.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            if not self.connections:
                self._connected.clear()
                await self._connected.wait()
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.tick(now)
