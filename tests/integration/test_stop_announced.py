"""A server that stops gracefully tells its coordinators at once (issue 11, "stopping is announced").

Real daemons: one ``riffle-coordinator`` and two ``riffle-server`` processes on loopback, port 0. The
coordinator's heartbeat timeout is long (120 s), so nothing but the announcement can take a stopped
server out of the assignments in the time this test takes: right after the SIGTERMed server has
exited, the coordinator lists it as DECOMMISSIONED and assigns only the other one. Both of a
two-coordinator quorum hear the announcement.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from tests.helpers import wait_for
from tests.helpers.daemon import Daemons

pytestmark = pytest.mark.integration



@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    try:
        yield d
    finally:
        d.kill_all()


def coordinator_config(root: Path, name: str) -> str:
    return (
        'grpc_port = 0\nhttp_port = 0\ngrpc_bind_address = "127.0.0.1"\nhttp_bind_address = "127.0.0.1"\n'
        "[server]\nheartbeat_timeout_sec = 120\n"
        '[client_conf]\n"rss.storage.type" = "MEMORY_LOCALFILE"\n'
        f'[log]\npath = "{root / (name + ".log")}"\n'
    )


def server_config(root: Path, name: str, quorum: list[str]) -> str:
    return (
        'grpc_port = 0\nhttp_port = 0\ngrpc_bind_address = "127.0.0.1"\nhttp_bind_address = "127.0.0.1"\n'
        f"coordinator_quorum = {json.dumps(quorum)}\nheartbeat_interval_seconds = 1\ngrace_period_sec = 5\n"
        '[memory_store]\ncapacity = "32M"\n'
        f'[localfile_store]\ndata_paths = ["{root / (name + "-data")}"]\n'
        f'[log]\npath = "{root / (name + ".log")}"\n'
    )


def servers(http_port: int) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/servers", timeout=5) as r:
        return {s["id"]: s["status"] for s in json.loads(r.read())}


def assigned(grpc_port: int, shuffle: int) -> tuple[int, set[str]]:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        resp = pbg.CoordinatorServerStub(channel).getShuffleAssignments(pb.GetShuffleServerRequest(
            applicationId="app_announce_1", shuffleId=shuffle, partitionNum=4, partitionNumPerRange=1,
            dataReplica=1, requireTags=["ss_v5", "GRPC"]), timeout=10)
    return resp.status, {s.id for a in resp.assignments for s in a.server}


def test_a_stopping_server_is_out_of_the_assignments_of_every_coordinator_before_it_exits(
    daemons: Daemons, tmp_path: Path
) -> None:
    coords = [daemons.start("riffle_actors.coordinator", f"coord{i}", coordinator_config(tmp_path, f"coord{i}"))[1]
              for i in (1, 2)]
    quorum = [f"127.0.0.1:{c['grpc_port']}" for c in coords]
    started = {name: daemons.start("riffle_actors.server", name, server_config(tmp_path, name, quorum))
               for name in ("s1", "s2")}
    ids = {name: f"127.0.0.1-{ports['grpc_port']}" for name, (_, ports) in started.items()}
    for c in coords:
        wait_for(lambda c=c: servers(c["http_port"]) == {ids["s1"]: "ACTIVE", ids["s2"]: "ACTIVE"}, 60,
                 "both servers ACTIVE at both coordinators")
        assert assigned(c["grpc_port"], 0) == (pb.SUCCESS, set(ids.values()))

    s1, _ = started["s1"]
    s1.send_signal(signal.SIGTERM)
    assert s1.wait(60) == 0, daemons.tail("s1")
    # No waiting: the announcement happened before the server closed its ports.
    for shuffle, c in enumerate(coords, start=1):
        assert servers(c["http_port"]) == {ids["s1"]: "DECOMMISSIONED", ids["s2"]: "ACTIVE"}
        assert assigned(c["grpc_port"], shuffle) == (pb.SUCCESS, {ids["s2"]})
    log = (tmp_path / "s1.log").read_text()
    assert "announced the stop to every coordinator" in log
    for i in (1, 2):
        assert f"server {ids['s1']} announced that it is stopping" in (tmp_path / f"coord{i}.log").read_text()


def test_a_coordinator_that_is_down_does_not_hold_up_the_stop(daemons: Daemons, tmp_path: Path) -> None:
    coord_proc, coord = daemons.start("riffle_actors.coordinator", "coord", coordinator_config(tmp_path, "coord"))
    proc, ports = daemons.start("riffle_actors.server", "s1",
                                server_config(tmp_path, "s1", [f"127.0.0.1:{coord['grpc_port']}"]))
    sid = f"127.0.0.1-{ports['grpc_port']}"
    wait_for(lambda: servers(coord["http_port"]).get(sid) == "ACTIVE", 60, "server ACTIVE")
    coord_proc.kill()
    coord_proc.wait(10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, daemons.tail("s1")
    assert "announced the stop to 0 of 1 coordinators; not reached" in (tmp_path / "s1.log").read_text()
