"""How every RPC of both daemons is answered: status mapping, logging, metrics and timing, in one place.

Every transport (the shuffle server's gRPC servicer and urpc server, the coordinator's gRPC servicer)
answers a request with a status and a message, never with a raised exception:

- ``failure_status(rpc, e, app_id)``: the one mapping of a failure (``errors.to_status``) plus its
  log line: an expected ``RiffleError`` at debug level (the client gets the reason), anything else
  with its traceback at error level (INTERNAL_ERROR, so one bad request never takes a daemon down);
- ``answer(rpc, make, body, app_id, recorder=...)``: run ``body()`` (the use case, answering the
  response's fields), build ``make(status=..., retMsg=..., **fields)`` and report the outcome and
  its duration to ``recorder.on_rpc(rpc, status_name, started, app_id)`` (the shuffle server's
  ``metrics.Metrics``: counts, latency histogram, spans; the coordinator's
  ``coordinator.metrics.CoordinatorCounters``: calls by method).

The shuffle server's two hottest RPCs (``requireBuffer``, ``sendShuffleData``) do not go through
``answer`` (no closure, no extra coroutine on their success path: ``transport.grpc_server``); their
error path calls ``failure_status`` and the same recorder, so the behaviour is the same.

It does not cover: decoding requests and encoding replies (each adapter), which statuses exist
(``protocol.status``) or which error means which status (``riffle_actors.errors``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from loguru import logger

from riffle_actors.errors import RiffleError, StatusCode, to_status

R = TypeVar("R")  # what a response maker builds


class RpcRecorder(Protocol):
    """Where an answered RPC is counted (``started``: its ``time.perf_counter()``)."""

    def on_rpc(self, rpc: str, status_name: str, started: float, app_id: str = "") -> None: ...


def failure_status(rpc: str, e: BaseException, app_id: str = "", *, log: bool = True) -> tuple[StatusCode, str]:
    """``(status, retMsg)`` for a failed RPC, logged (``log=False``: nobody gets the answer anyway)."""
    status, msg = to_status(e)
    if log:
        if isinstance(e, RiffleError):
            logger.bind(app_id=app_id).debug("{} -> {}: {}", rpc, status.name, msg)
        else:
            logger.bind(app_id=app_id).opt(exception=e).error("{} failed for app {}", rpc, app_id)
    return status, msg


async def answer(rpc: str, make: Callable[..., R], body: Callable[[], Awaitable[dict[str, Any]]],
                 app_id: str = "", *, recorder: RpcRecorder) -> R:
    """Run ``body`` and build the response ``make(status=..., retMsg=..., **fields)``; see the module."""
    started = time.perf_counter()
    try:
        fields = await body()
        status, msg = StatusCode.SUCCESS, ""
    except Exception as e:  # noqa: BLE001 - a bad request must never kill the daemon
        status, msg = failure_status(rpc, e, app_id)
        fields = {}
    recorder.on_rpc(rpc, status.name, started, app_id)
    return make(status=int(status), retMsg=msg, **fields)
