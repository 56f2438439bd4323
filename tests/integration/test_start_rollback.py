"""A server whose start fails half-way leaves nothing behind (issue 20, "one lifecycle").

Real in-process ``ShuffleServer``s on loopback, real sockets, real data-path locks. Two ways to fail
half-way through ``ShuffleServer.start``:

- the urpc port is taken (a socket of this test listens on it), after HTTP and gRPC are bound;
- the DiskMonitor cannot start (its probe fleet, a real seam, fails), in the middle of the actor tree.

Either way the start raises the cause, and then: nothing listens on the ports that had been bound, no
actor runs, no asyncio task is left (the autouse leak check too), every data-path lock is free (this
process takes them again), and a new server on the same config starts, serves and stops.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from riffle_actors.io.data_lock import lock_data_paths
from riffle_actors.io.probe_fleet import ProbeFleet
from riffle_actors.server import ShuffleServer
from riffle_actors.transport.listen import ListenError
from tests.conftest import server_config
from tests.helpers import leftover_tasks
from tests.helpers.client import UniffleClient

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

HOST = "127.0.0.1"


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port this test listens on for its whole run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        s.listen(1)
        yield s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=2.0):
            return True
    except ConnectionRefusedError:
        return False


async def _assert_nothing_left(srv: ShuffleServer, bound_ports: list[int]) -> None:
    assert srv.running_steps == ()
    assert [p for p in bound_ports if _listening(p)] == []
    assert srv.system.statistics() == [], "actors still running"
    assert not [t for t in leftover_tasks() if t is not asyncio.current_task()], "tasks left running"
    locks = lock_data_paths(srv.cfg.localfile_store.data_paths)  # free again (raises when still held)
    locks.release()


async def _serves(srv: ShuffleServer) -> None:
    client = UniffleClient(f"{HOST}:{srv.grpc_port}")
    try:
        await client.register_shuffle("app-rollback", 0, [0])
    finally:
        await client.close()


async def test_a_taken_urpc_port_after_grpc_bound_leaves_nothing_and_the_server_starts_again(
        tmp_path: Path, taken_port: int) -> None:
    cfg = server_config(tmp_path, urpc_port=taken_port, urpc_bind_address=HOST)
    srv = ShuffleServer(cfg)
    with pytest.raises(ListenError, match="urpc_port"):
        await srv.start()
    assert srv.grpc_port and srv.http_port  # the failure came after both were bound
    await _assert_nothing_left(srv, [srv.grpc_port, srv.http_port])
    await srv.stop()  # a stop after the failed start does nothing more

    again = ShuffleServer(server_config(tmp_path, urpc_port=0, urpc_bind_address=HOST))
    try:
        await again.start()
        assert again.urpc_port and _listening(again.urpc_port)
        await _serves(again)
    finally:
        await again.stop()
    await _assert_nothing_left(again, [again.grpc_port, again.http_port, again.urpc_port])


class _NoProbeWorkers(ProbeFleet):
    def __init__(self) -> None:
        raise OSError("cannot start the probe worker processes")


async def test_a_step_failing_inside_the_actor_tree_stops_the_actors_already_started(tmp_path: Path) -> None:
    cfg = server_config(tmp_path)
    srv = ShuffleServer(cfg, probe_fleet_factory=_NoProbeWorkers)
    with pytest.raises(Exception, match="probe worker processes"):
        await srv.start()
    assert (srv.grpc_port, srv.http_port) == (0, 0)  # no port had been opened
    await _assert_nothing_left(srv, [])

    again = ShuffleServer(cfg)
    try:
        await again.start()
        await _serves(again)
    finally:
        await again.stop()
    await _assert_nothing_left(again, [again.grpc_port, again.http_port])
