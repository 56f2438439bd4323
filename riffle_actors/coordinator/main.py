"""The ``riffle-coordinator`` console entry point.

``main(argv)`` hands the command line to ``riffle_actors.daemon.run_daemon`` (``--config``,
``--daemon``, ``--pid-file``, ``--port-file``, ``stop``, ``status``; see that module for the
contract) with ``serve``, which runs a ``Coordinator`` until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio

from riffle_actors.coordinator.config import CoordinatorConfig, load_coordinator_config
from riffle_actors.coordinator.runtime import Coordinator
from riffle_actors.daemon import PortFileWriter, run_daemon


async def serve(cfg: CoordinatorConfig, stop: asyncio.Event, ports: PortFileWriter) -> int:
    """Run the coordinator until ``stop`` is set; returns the exit code."""
    coordinator = Coordinator(cfg)
    await coordinator.start()
    try:
        ports(grpc_port=coordinator.grpc_port, http_port=coordinator.http_port)
        await stop.wait()
    finally:
        await coordinator.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_daemon(
        argv,
        prog="riffle-coordinator",
        description="Uniffle-compatible shuffle coordinator (gRPC + HTTP JSON API)",
        load_config=load_coordinator_config,
        log_config=lambda cfg: cfg.log,
        serve=serve,
    )


if __name__ == "__main__":
    raise SystemExit(main())
