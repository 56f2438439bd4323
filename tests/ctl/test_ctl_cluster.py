"""riffle-ctl against a real coordinator and real servers (processes started by the fixture).

Covers ``query`` (every format, bad table / column), ``instance list | decommission |
cancel-decommission | tag | kill`` with ids and with ``--pipeline`` (JSON and CSV, the README's
example verbatim), the refusal without an admin token, and the app tables.
"""

from __future__ import annotations

import csv
import io
import json

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from tests.ctl.cluster import ADMIN_TOKEN, RealCluster, http_json
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def servers_by_tag(cluster: RealCluster) -> dict[str, dict]:
    return {t: s for s in http_json(cluster.url + "/api/servers") for t in s["tags"] if t in ("healthy", "sick")}


def status_of(cluster: RealCluster, sid: str) -> str:
    return http_json(f"{cluster.url}/api/servers/{sid}")["status"]


def wait_status(cluster: RealCluster, tag: str, status: str) -> dict:
    def reached() -> dict | None:
        server = servers_by_tag(cluster).get(tag)
        return server if server and server["status"] == status else None

    return wait_for(reached, timeout=30, what=f"server {tag} {status}")


def test_query_in_every_format(cluster: RealCluster) -> None:
    wait_status(cluster, "sick", "UNHEALTHY")
    sql = "select id, status, app_count, disk_count from instances order by id"
    as_json = cluster.ctl("query", sql, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [r["id"] for r in rows] == cluster.server_ids
    assert {r["status"] for r in rows} == {"ACTIVE", "UNHEALTHY"}
    assert all(r["disk_count"] == 1 for r in rows)
    as_csv = cluster.ctl("query", sql, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    assert [r["id"] for r in csv.DictReader(io.StringIO(as_csv.stdout))] == cluster.server_ids
    as_table = cluster.ctl("query", "select count(*) as n, sum(available_memory) > 0 as mem from instances")
    assert as_table.returncode == 0, as_table.stderr
    assert "│ 2 " in as_table.stdout and "True" in as_table.stdout and "(1 row)" in as_table.stdout


def test_query_names_the_bad_table_or_column(cluster: RealCluster) -> None:
    bad_table = cluster.ctl("query", "select * from instance")
    assert bad_table.returncode == 2
    assert "unknown table 'instance'" in bad_table.stderr and "instances, active_apps, historical_apps" in bad_table.stderr
    bad_column = cluster.ctl("query", "select hostname from instances")
    assert bad_column.returncode == 2
    assert "unknown column 'hostname'" in bad_column.stderr and "heartbeat_age_s" in bad_column.stderr
    syntax = cluster.ctl("query", "selec 1")
    assert syntax.returncode == 2 and "syntax error" in syntax.stderr


def test_readme_pipeline_decommissions_the_unhealthy_servers(cluster: RealCluster) -> None:
    sick = wait_status(cluster, "sick", "UNHEALTHY")
    healthy = servers_by_tag(cluster)["healthy"]
    try:
        # the README's example, verbatim
        done = cluster.shell("riffle-ctl query \"select id from instances where status='UNHEALTHY'\" --format json"
                             " | riffle-ctl instance decommission --pipeline")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{sick['id']}: UNHEALTHY -> DECOMMISSIONING"
        assert status_of(cluster, sick["id"]) == "DECOMMISSIONING"
        assert status_of(cluster, healthy["id"]) == "ACTIVE"
        # CSV pipeline back
        undo = cluster.shell("riffle-ctl query \"select id from instances where status='DECOMMISSIONING'\" "
                             "--format csv | riffle-ctl instance cancel-decommission --pipeline")
        assert undo.returncode == 0, undo.stderr
        assert undo.stdout.strip() == f"{sick['id']}: DECOMMISSIONING -> UNHEALTHY"
        # an empty selection changes nothing and says so
        none = cluster.shell("riffle-ctl query \"select id from instances where status='LOST'\" --format json"
                             " | riffle-ctl instance decommission --pipeline")
        assert none.returncode == 0 and "nothing changed" in none.stderr
    finally:
        http_json(f"{cluster.url}/api/servers/{sick['id']}/status", "POST", {"status": "ACTIVE"}, ADMIN_TOKEN)


def test_instance_commands_with_ids(cluster: RealCluster) -> None:
    healthy = wait_status(cluster, "healthy", "ACTIVE")["id"]
    listed = cluster.ctl("instance", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == cluster.server_ids
    try:
        dec = cluster.ctl("instance", "decommission", healthy)
        assert dec.returncode == 0, dec.stderr
        assert dec.stdout.strip() == f"{healthy}: ACTIVE -> DECOMMISSIONING"
        kill = cluster.ctl("instance", "kill", healthy)
        assert kill.stdout.strip() == f"{healthy}: DECOMMISSIONING -> DECOMMISSIONED"
        # a killed server is out of the assignment pool: the Uniffle summary counts it
        assert http_json(cluster.url + "/api/server/nodes/summary")["data"].get("DECOMMISSIONED") == 1
        cancel = cluster.ctl("instance", "cancel-decommission", healthy)
        assert cancel.stdout.strip() == f"{healthy}: DECOMMISSIONED -> ACTIVE"
        tag = cluster.ctl("instance", "tag", healthy, "--add", "ssd", "--add", "rack1")
        assert tag.returncode == 0, tag.stderr
        assert tag.stdout.strip() == f"{healthy}: tags GRPC,healthy,ss_v5 -> GRPC,healthy,rack1,ss_v5,ssd"
        q = cluster.ctl("query", f"select tags, operator_tags from instances where id = '{healthy}'", "--format", "json")
        row = json.loads(q.stdout)[0]
        assert set(row["operator_tags"].split(",")) == {"rack1", "ssd"} and "ssd" in row["tags"].split(",")
        untag = cluster.ctl("instance", "tag", healthy, "--remove", "rack1", "--remove", "ssd")
        assert untag.returncode == 0, untag.stderr
        assert untag.stdout.strip() == f"{healthy}: tags GRPC,healthy,rack1,ss_v5,ssd -> GRPC,healthy,ss_v5"
        # a tag the server reports itself cannot be removed; an unknown id is reported, the rest done
        own = cluster.ctl("instance", "tag", healthy, "nope-1", "--remove", "healthy")
        assert own.returncode == 1
        assert "reported by server" in own.stderr and "unknown server 'nope-1'" in own.stderr
    finally:
        http_json(f"{cluster.url}/api/servers/{healthy}/status", "POST", {"status": "ACTIVE"}, ADMIN_TOKEN)
    assert status_of(cluster, healthy) == "ACTIVE"


def test_mutations_need_the_admin_token(cluster: RealCluster) -> None:
    healthy = wait_status(cluster, "healthy", "ACTIVE")["id"]
    refused = cluster.ctl("instance", "decommission", healthy, token=False)
    assert refused.returncode != 0 and "RIFFLE_ADMIN_TOKEN" in refused.stderr
    wrong = cluster.ctl("instance", "decommission", healthy, token=False, RIFFLE_ADMIN_TOKEN="x" * 20)
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    assert status_of(cluster, healthy) == "ACTIVE"


def test_unreachable_coordinator_is_one_clear_line(cluster: RealCluster) -> None:
    r = cluster.ctl("--coordinator", "http://127.0.0.1:9", "instance", "list")
    assert r.returncode == 1 and "cannot reach the coordinator at http://127.0.0.1:9" in r.stderr


def test_app_tables(cluster: RealCluster) -> None:
    grpc_port = cluster.coordinator.ports["grpc_port"]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.CoordinatorServerStub(channel)
        stub.registerApplicationInfo(pb.ApplicationInfoRequest(appId="app-ctl-gone", user="alice"))

        def live_row():
            stub.registerApplicationInfo(pb.ApplicationInfoRequest(appId="app-ctl-live", user="bob"))
            r = cluster.ctl("query", "select app_id, user from active_apps where app_id = 'app-ctl-live'",
                            "--format", "json")
            return r.returncode == 0 and json.loads(r.stdout)

        assert wait_for(live_row, timeout=30, what="live app listed") == [{"app_id": "app-ctl-live", "user": "bob"}]

    def gone_row():
        r = cluster.ctl("query", "select app_id, user, expired_ms > registered_ms as later from historical_apps "
                        "where app_id = 'app-ctl-gone'", "--format", "json")
        return r.returncode == 0 and json.loads(r.stdout)

    assert wait_for(gone_row, timeout=30, what="expired app in history") == [
        {"app_id": "app-ctl-gone", "user": "alice", "later": True}]
