"""Fixtures of the riffle-ctl tests: a real coordinator with two real servers (module scope)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ctl.cluster import RealCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """Coordinator + server ``healthy`` (ACTIVE) + server ``sick`` (UNHEALTHY: it asks for two healthy
    disks and has one), all real processes."""
    c = RealCluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start_coordinator()
        c.start_server("healthy")
        c.start_server("sick", min_disks=2)
        c.wait_registered(2)
        yield c
    finally:
        c.stop()
