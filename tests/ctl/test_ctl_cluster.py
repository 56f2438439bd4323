"""riffle-ctl against a real coordinator and real servers (processes started by the fixture).

Covers ``query --sql`` (every format, bad table / column), the coordinator's overrides through
``instance set|add|remove --coordinator`` with ``--instance`` and with a pipeline on stdin (JSON
lines and CSV), a kill refused by a server without credentials, the refusal without an admin token,
and the app tables. (Riffle's own lines against servers: ``test_riffle_shapes.py``.)
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


def rows(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def inst(server: dict) -> str:
    return f"{server['ip']}:{server['http_port']}"


def wait_status(cluster: RealCluster, tag: str, status: str) -> dict:
    def reached() -> dict | None:
        server = servers_by_tag(cluster).get(tag)
        return server if server and server["status"] == status else None

    return wait_for(reached, timeout=30, what=f"server {tag} {status}")


def test_query_in_every_format(cluster: RealCluster) -> None:
    wait_status(cluster, "sick", "UNHEALTHY")
    sql = "select id, status, app_count, disk_count from instances order by id"
    as_json = cluster.ctl("query", "--sql", sql, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    listed = rows(as_json.stdout)
    assert [r["id"] for r in listed] == cluster.server_ids
    assert {r["status"] for r in listed} == {"ACTIVE", "UNHEALTHY"}
    assert all(r["disk_count"] == 1 for r in listed)
    assert cluster.ctl("query", "--sql", sql, "--json").stdout == as_json.stdout
    as_csv = cluster.ctl("query", "--sql", sql, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    assert [r["id"] for r in csv.DictReader(io.StringIO(as_csv.stdout))] == cluster.server_ids
    as_table = cluster.ctl("query", "--sql", "select count(*) as n, sum(available_memory) > 0 as mem from instances")
    assert as_table.returncode == 0, as_table.stderr
    assert "│ 2 " in as_table.stdout and "True" in as_table.stdout and "(1 row)" in as_table.stdout


def test_query_names_the_bad_table_or_column(cluster: RealCluster) -> None:
    bad_table = cluster.ctl("query", "--sql", "select * from instance")
    assert bad_table.returncode == 2
    assert "unknown table 'instance'" in bad_table.stderr and "instances, active_apps, historical_apps" in bad_table.stderr
    bad_column = cluster.ctl("query", "--sql", "select hostname from instances")
    assert bad_column.returncode == 2
    assert "unknown column 'hostname'" in bad_column.stderr and "heartbeat_age_s" in bad_column.stderr
    syntax = cluster.ctl("query", "--sql", "selec 1")
    assert syntax.returncode == 2 and "syntax error" in syntax.stderr


def test_pipeline_drains_the_unhealthy_servers_at_the_coordinator(cluster: RealCluster) -> None:
    sick = wait_status(cluster, "sick", "UNHEALTHY")
    healthy = servers_by_tag(cluster)["healthy"]
    try:
        done = cluster.shell("riffle-ctl query --sql \"select * from instances where status='UNHEALTHY'\" --json"
                             f" | riffle-ctl instance set --status decommissioning --coordinator {cluster.url}")
        assert done.returncode == 0, done.stderr
        # these servers have no [admin] credentials: the server itself refuses, the coordinator's change stands
        assert done.stdout.strip().startswith(f"{sick['id']}: UNHEALTHY -> DECOMMISSIONING (server not told: "
                                              "ACCESS_DENIED: admin actions are disabled")
        assert status_of(cluster, sick["id"]) == "DECOMMISSIONING"
        assert status_of(cluster, healthy["id"]) == "ACTIVE"
        # CSV pipeline back
        undo = cluster.shell("riffle-ctl query --sql \"select ip, http_port from instances where "
                             "status='DECOMMISSIONING'\" --format csv "
                             f"| riffle-ctl instance set --status active --coordinator {cluster.url}")
        assert undo.returncode == 0, undo.stderr
        assert undo.stdout.strip().startswith(f"{sick['id']}: DECOMMISSIONING -> UNHEALTHY (server not told")
        # an empty selection changes nothing and says so
        none = cluster.shell("riffle-ctl query --sql \"select * from instances where status='LOST'\" --json"
                             f" | riffle-ctl instance set --status decommissioning --coordinator {cluster.url}")
        assert none.returncode == 0 and "nothing changed" in none.stderr
        # the coordinator has no UNHEALTHY override
        no = cluster.ctl("instance", "set", "--instance", inst(sick), "--status", "unhealthy",
                         "--coordinator", cluster.url)
        assert no.returncode == 2 and "no UNHEALTHY override" in no.stderr
    finally:
        http_json(f"{cluster.url}/api/servers/{sick['id']}/status", "POST", {"status": "ACTIVE"}, ADMIN_TOKEN)


def test_instance_commands_at_the_coordinator(cluster: RealCluster) -> None:
    server = wait_status(cluster, "healthy", "ACTIVE")
    healthy, at = server["id"], ("--instance", inst(server), "--coordinator", cluster.url)
    listed = cluster.ctl("query", "--sql", "select id from instances order by id", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in rows(listed.stdout)] == cluster.server_ids
    try:
        dec = cluster.ctl("instance", "set", "--status", "decommissioning", *at)
        assert dec.returncode == 0, dec.stderr
        assert dec.stdout.strip().startswith(f"{healthy}: ACTIVE -> DECOMMISSIONING (server not told: ")
        # this server has no [admin] credentials: a real kill is refused (403) and nothing changes ...
        refused = cluster.ctl("instance", "kill", "--instance", inst(server), "--force")
        assert refused.returncode == 1 and "HTTP 403" in refused.stderr and "admin actions are disabled" in refused.stderr
        assert status_of(cluster, healthy) == "DECOMMISSIONING"
        # ... while the coordinator's DECOMMISSIONED just takes it out of the cluster (test_lifecycle.py: real kills)
        kill = cluster.ctl("instance", "set", "--status", "decommissioned", *at)
        assert kill.stdout.strip() == f"{healthy}: DECOMMISSIONING -> DECOMMISSIONED"
        # a killed server is out of the assignment pool: the Uniffle summary counts it
        assert http_json(cluster.url + "/api/server/nodes/summary")["data"].get("DECOMMISSIONED") == 1
        cancel = cluster.ctl("instance", "set", "--status", "cancel-decommission", *at)
        assert cancel.stdout.strip().startswith(f"{healthy}: DECOMMISSIONED -> ACTIVE")
        tag = cluster.ctl("instance", "add", "--tag", "ssd", *at)
        assert tag.returncode == 0, tag.stderr
        assert tag.stdout.strip() == f"{healthy}: tags GRPC,healthy,ss_v5 -> GRPC,healthy,ss_v5,ssd"
        both = cluster.ctl("instance", "set", "--tags", "rack1,ssd", *at)
        assert both.stdout.strip() == f"{healthy}: tags GRPC,healthy,ss_v5,ssd -> GRPC,healthy,rack1,ss_v5,ssd"
        q = cluster.ctl("query", "--sql", f"select tags, operator_tags from instances where id = '{healthy}'", "--json")
        [row] = rows(q.stdout)
        assert set(row["operator_tags"].split(",")) == {"rack1", "ssd"} and "ssd" in row["tags"].split(",")
        untag = cluster.ctl("instance", "remove", "--tag", "rack1", *at)
        assert untag.returncode == 0, untag.stderr
        assert untag.stdout.strip() == f"{healthy}: tags GRPC,healthy,rack1,ss_v5,ssd -> GRPC,healthy,ss_v5,ssd"
        assert cluster.ctl("instance", "remove", "--tag", "ssd", *at).returncode == 0
        # a tag the server reports itself cannot be removed; an unknown instance is reported, the rest done
        own = cluster.ctl("instance", "remove", "--tag", "healthy", "--coordinator", cluster.url,
                          stdin=f'{{"ip": "127.0.0.1", "http_port": 9}}\n{{"ip": "{server["ip"]}", '
                                f'"http_port": {server["http_port"]}}}\n')
        assert own.returncode == 1
        assert "reported by server" in own.stderr and "lists no server with HTTP port 127.0.0.1:9" in own.stderr
        assert "Total: 2. Success: 0. Failed: 2" in own.stderr
    finally:
        http_json(f"{cluster.url}/api/servers/{healthy}/status", "POST", {"status": "ACTIVE"}, ADMIN_TOKEN)
    assert status_of(cluster, healthy) == "ACTIVE"


def test_mutations_need_the_admin_token(cluster: RealCluster) -> None:
    server = wait_status(cluster, "healthy", "ACTIVE")
    healthy, at = server["id"], ("--instance", inst(server), "--coordinator", cluster.url)
    refused = cluster.ctl("instance", "set", "--status", "decommissioning", *at, token=False)
    assert refused.returncode != 0 and "RIFFLE_ADMIN_TOKEN" in refused.stderr
    wrong = cluster.ctl("instance", "set", "--status", "decommissioning", *at, token=False,
                        RIFFLE_ADMIN_TOKEN="x" * 20)
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    assert status_of(cluster, healthy) == "ACTIVE"


def test_unreachable_coordinator_is_one_clear_line(cluster: RealCluster) -> None:
    r = cluster.ctl("query", "--coordinator", "http://127.0.0.1:9", "--sql", "select * from instances")
    assert r.returncode == 1 and "cannot reach the coordinator at http://127.0.0.1:9" in r.stderr


def test_app_tables(cluster: RealCluster) -> None:
    grpc_port = cluster.coordinator.ports["grpc_port"]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.CoordinatorServerStub(channel)
        stub.registerApplicationInfo(pb.ApplicationInfoRequest(appId="app-ctl-gone", user="alice"))

        def live_row():
            stub.registerApplicationInfo(pb.ApplicationInfoRequest(appId="app-ctl-live", user="bob"))
            r = cluster.ctl("query", "--sql", "select app_id, user from active_apps where app_id = 'app-ctl-live'",
                            "--json")
            return r.returncode == 0 and rows(r.stdout)

        assert wait_for(live_row, timeout=30, what="live app listed") == [{"app_id": "app-ctl-live", "user": "bob"}]

    def gone_row():
        r = cluster.ctl("query", "--sql", "select app_id, user, expired_ms > registered_ms as later "
                        "from historical_apps where app_id = 'app-ctl-gone'", "--json")
        return r.returncode == 0 and rows(r.stdout)

    assert wait_for(gone_row, timeout=30, what="expired app in history") == [
        {"app_id": "app-ctl-gone", "user": "alice", "later": True}]
