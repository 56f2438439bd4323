"""Transport adapters of both daemons: decode a request, call one service method, encode the answer.

- shuffle server: ``grpc_server`` (``rss.common.ShuffleServer``, calls ``ShuffleService``),
  ``http_server`` (``/health``, ``/metrics``, ``/apps``, ``/debug/actors``; calls ``AdminService``),
  ``decode`` (wire fields into domain values, shared by every adapter), ``coordinator_client`` (the
  heartbeat's gRPC client of the coordinators);
- coordinator: ``coordinator_grpc`` (``rss.common.CoordinatorServer``) and ``coordinator_http`` (the
  JSON API), both calling ``CoordinatorService``;
- both: ``listen`` (opening ports with actionable errors), ``admin_auth`` (the guard of admin routes).

Adapters hold no state and make no decisions; the services below them do (see the layers in
``pyproject.toml``'s ``[tool.importlinter]``).
"""
