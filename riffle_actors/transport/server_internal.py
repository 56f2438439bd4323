"""Uniffle's ``ShuffleServerInternal`` gRPC service (``decommission``, ``cancelDecommission``): both ends.

- ``ShuffleServerInternalServicer``: served on the shuffle server's gRPC port beside
  ``ShuffleServer``; each call goes to ``riffle_actors.decommission.Lifecycle``. Unlike upstream,
  it needs the server's ``[admin]`` credentials, sent as the ``authorization`` metadata entry
  (``Bearer <token>`` or ``Basic ...``, as the HTTP header): none configured answers
  ``ACCESS_DENIED`` with the reason (admin actions are off), wrong or missing ones
  ``ACCESS_DENIED`` too. A server already stopping answers ``INVALID_REQUEST`` with the reason; a
  repeated decommission or a cancel of an ACTIVE server succeeds doing nothing (as upstream).
- ``tell_server(...)``: the client side the coordinator uses when an operator decommissions a
  server at the coordinator (as upstream's ``ClusterManager`` calls the server's RPC), bounded by a
  short timeout; it returns ``(ok, message)`` and never raises.
"""

from __future__ import annotations

import grpc
from loguru import logger

from riffle_actors.credentials import AdminCredentials
from riffle_actors.decommission import Lifecycle, Outcome
from riffle_actors.errors import StatusCode
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from riffle_actors.transport.decode import wire_status


def _peer(context: grpc.aio.ServicerContext) -> str:
    try:
        return context.peer()
    except Exception:  # noqa: BLE001 - only for the log line
        return "?"


class ShuffleServerInternalServicer(pb_grpc.ShuffleServerInternalServicer):
    """See the module docstring."""

    def __init__(self, lifecycle: Lifecycle, credentials: AdminCredentials):
        self.lifecycle = lifecycle
        self.credentials = credentials

    def _refusal(self, context: grpc.aio.ServicerContext, what: str) -> str | None:
        if not self.credentials.configured:
            logger.warning("refused ShuffleServerInternal.{} from {}: no admin credentials are configured",
                           what, _peer(context))
            return "admin actions are disabled: no admin credentials are configured on this server"
        header = dict(context.invocation_metadata() or ()).get("authorization")
        if not self.credentials.check(header if isinstance(header, str) else None):
            logger.warning("refused ShuffleServerInternal.{} from {}: missing or wrong credentials",
                           what, _peer(context))
            return "admin credentials required (authorization metadata: Bearer <token> or Basic ...)"
        logger.info("admin request ShuffleServerInternal.{} from {}", what, _peer(context))
        return None

    @staticmethod
    def _answer(outcome: Outcome) -> tuple[int, str]:
        code = StatusCode.SUCCESS if outcome.ok else StatusCode.INVALID_REQUEST
        return int(code), outcome.message

    async def decommission(self, request: pb.DecommissionRequest, context) -> pb.DecommissionResponse:
        refused = self._refusal(context, "decommission")
        if refused is not None:
            return pb.DecommissionResponse(status=wire_status(StatusCode.ACCESS_DENIED), retMsg=refused)
        status, message = self._answer(await self.lifecycle.decommission())
        return pb.DecommissionResponse(status=wire_status(status), retMsg=message)

    async def cancelDecommission(self, request: pb.CancelDecommissionRequest,
                                 context) -> pb.CancelDecommissionResponse:
        refused = self._refusal(context, "cancelDecommission")
        if refused is not None:
            return pb.CancelDecommissionResponse(status=wire_status(StatusCode.ACCESS_DENIED), retMsg=refused)
        status, message = self._answer(await self.lifecycle.cancel_decommission())
        return pb.CancelDecommissionResponse(status=wire_status(status), retMsg=message)


async def tell_server(ip: str, grpc_port: int, action: str, authorization: str | None,
                      timeout_s: float = 3.0) -> tuple[bool, str]:
    """Call ``ShuffleServerInternal.<action>`` (``decommission`` or ``cancelDecommission``) on one server."""
    target = f"[{ip}]:{grpc_port}" if ":" in ip else f"{ip}:{grpc_port}"
    metadata = (("authorization", authorization),) if authorization else None
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.ShuffleServerInternalStub(channel)
            if action == "decommission":
                response = await stub.decommission(pb.DecommissionRequest(), timeout=timeout_s, metadata=metadata)
            elif action == "cancelDecommission":
                response = await stub.cancelDecommission(pb.CancelDecommissionRequest(), timeout=timeout_s,
                                                         metadata=metadata)
            else:
                raise ValueError(f"unknown ShuffleServerInternal action {action!r}")
    except grpc.aio.AioRpcError as e:
        return False, f"{target}: {e.code().name}: {e.details()}"
    except (OSError, ValueError) as e:
        return False, f"{target}: {e}"
    ok = response.status == StatusCode.SUCCESS
    name = StatusCode(response.status).name if response.status in StatusCode._value2member_map_ else response.status
    return ok, response.retMsg if ok else f"{name}: {response.retMsg}"
