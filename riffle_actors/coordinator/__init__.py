"""``riffle-coordinator``: an Apache-Uniffle-compatible coordinator (cluster membership + shuffle assignment).

Modules, each owning one thing:

- ``config``: the TOML schema (``CoordinatorConfig``) and ``load_coordinator_config``;
- ``cluster``: the pure server registry (heartbeat expiry, status, exclusion, candidates, admission caps);
- ``validation``: the pure checks a shuffle server's heartbeat must pass before it is believed;
- ``assignment``: the pure assignment strategies (partition_balance, basic; host strategies);
- ``apps``: the pure application registry with a bounded history;
- ``actors``: ``ClusterActor`` and ``AppRegistryActor``, which own that state at run time;
- ``service``: ``CoordinatorService``, the use cases (heartbeats, assignments, apps, operator status and tags);
- ``metrics``: the Prometheus metrics (``/metrics``, pulled from the service at each scrape or push);
- ``static/``: the status page (HTML/JS/CSS served at ``/`` by the HTTP adapter; no build step);
- ``runtime``: ``Coordinator``, the composition root that starts and stops all of the above and its
  adapters (``riffle_actors.transport.coordinator_grpc``: the gRPC ``CoordinatorServer`` servicer;
  ``riffle_actors.transport.coordinator_http``: the JSON API, ``/api/servers``, ``/api/apps``, ...,
  Uniffle's ``/api/server/...``, ``/metrics`` and the status page);
- ``main``: the ``riffle-coordinator`` console entry point (via ``riffle_actors.daemon``).

See ``docs/coordinator.md`` for configuration, the HTTP API and the daemon commands.
"""
