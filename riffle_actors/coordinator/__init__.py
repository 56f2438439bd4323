"""``riffle-coordinator``: an Apache-Uniffle-compatible coordinator (cluster membership + shuffle assignment).

Modules, each owning one thing:

- ``config``: the TOML schema (``CoordinatorConfig``) and ``load_coordinator_config``;
- ``cluster``: the pure server registry (heartbeat expiry, status, exclusion, candidates, admission caps);
- ``validation``: the pure checks a shuffle server's heartbeat must pass before it is believed;
- ``assignment``: the pure assignment strategies (partition_balance, basic; host strategies);
- ``apps``: the pure application registry with a bounded history;
- ``events``: ``RegistryEvent``, what the pure registries return for the log instead of logging;
- ``actors``: ``ClusterActor`` and ``AppRegistryActor``, which own that state at run time (told to
  expire members and to re-read the exclude file by the runtime's ``TimerActor``);
- ``service``: ``CoordinatorService``, the use cases (heartbeats, assignments, apps, operator status and
  tags, Uniffle's REST queries);
- ``admin``: ``CoordinatorAdmin``, what the coordinator says about itself (health, the metrics snapshot,
  ``/api/coordinator/info``, the config listing), the counterpart of the server's ``riffle_actors.admin``;
- ``metrics``: the Prometheus metrics and the ``CoordinatorCounters`` behind them;
- ``static/``: the status page (HTML/JS/CSS served at ``/`` by the HTTP adapter; no build step);
- ``__main__`` / ``main``: entry points that forward to ``riffle_actors.coordinator_server.main``.

The composition root, ``riffle_actors.coordinator_server.Coordinator``, sits above the package and the
transports (``riffle_actors.transport.coordinator_grpc``: the gRPC ``CoordinatorServer`` servicer;
``riffle_actors.transport.coordinator_http``: the JSON API, ``/api/servers``, ``/api/apps``, ...,
Uniffle's ``/api/server/...``, ``/metrics`` and the status page), as ``riffle_actors.server`` does for
the shuffle server: nothing in this package imports ``riffle_actors.transport``.

See ``docs/coordinator.md`` for configuration, the HTTP API and the daemon commands.
"""
