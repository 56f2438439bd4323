"""Riffle's own ``riffle-ctl`` lines (its README and ``riffle-ctl/src/main.rs`` help examples) run
verbatim through bash (``./riffle-ctl`` is a wrapper of ``python -m riffle_actors.ctl`` in the
working directory) against a real coordinator and real servers; only the addresses (``xxxx:21001``,
``192.168.1.1:19998``), the directories and, for the benches, the sizes are the test's.

Also: the server's admin routes in Riffle's form (``/admin?get_state`` ... ``?kill[=force]``,
``/apps?format=Json``, ``/apps/number``, ``/apps/history``) and the UNHEALTHY round trip: set by
hand, it reaches the coordinator, which assigns only the other server; HEALTHY restores it.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from riffle_actors.protocol.index import IndexEntry, encode_index
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from tests.ctl.cluster import ADMIN_TOKEN, CTL, Daemon, RealCluster, http_json, send_blocks
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

# --- Riffle's lines, as its README / main.rs print them ------------------------------------------
README_QUERY_ACTIVE = './riffle-ctl query --coordinator http://xxxx:21001 --sql "select * from active_apps"'
README_QUERY_HISTORY = './riffle-ctl query --coordinator http://xxxx:21001 --sql "select * from historical_apps"'
README_SET_UNHEALTHY = "./riffle-ctl instance set --instance 192.168.1.1:19998 --status unhealthy"
README_PIPELINE = ("./riffle-ctl query --coordinator http://xx:21001 --sql \"select * from instances where tags like "
                   "'%sata%'\" --json \\\n  | ./riffle-ctl instance set --status unhealthy")
README_SET_TAGS = "./riffle-ctl instance set --instance 192.168.1.1:19998 --tags a1,a2"
README_BENCH = ("./riffle-ctl bench disk append --dir /data1/bench --batch-number 100 --concurrency 200 "
                "--write-size 10M --disk-throughput 100M --throttle")
HELP_ADD = "riffle-ctl instance add --instance 192.168.1.1:19998 --tag production"
HELP_REMOVE = "riffle-ctl instance remove --instance 192.168.1.1:19998 --tag deprecated"
HELP_KILL = "riffle-ctl instance kill --instance 192.168.1.1:19998 --force"
HELP_KILL_WAIT = "riffle-ctl instance kill --instance 192.168.1.1:19998 --interval-secs 5 --timeout-secs 120"
HELP_PIPE_ADD = ('riffle-ctl query --coordinator production --sql "select * from instances" --json '
                 "| riffle-ctl instance add --tag production")
HELP_QUERY_NAMED = 'riffle-ctl query --coordinator production --sql "select * from instances" --json'
HELP_CONFIG = "riffle-ctl config init --file ./clusters.toml"
HELP_INSPECT = "riffle-ctl inspect file --index-file /data/shuffle/index --data-file /data/shuffle/data"
HELP_READ = "riffle-ctl bench disk read --dir /data1/bench --read-size 1M --batch-number 100 --concurrency 32 --read-ahead"
HELP_PROFILE = ("riffle-ctl bench disk profile --dir /data1/bench --min-block-size 4KB --max-block-size 64MB "
                "--min-concurrency 1 --max-concurrency 16 --test-duration-secs 10")


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """Coordinator + servers ``sata`` and ``nvme`` (tags = their names), both with admin credentials."""
    c = RealCluster(tmp_path_factory.mktemp("riffle-shapes"))
    try:
        c.start_coordinator()
        c.start_server("sata", admin_token=ADMIN_TOKEN)
        c.start_server("nvme", admin_token=ADMIN_TOKEN)
        c.wait_registered(2)
        yield c
    finally:
        c.stop()


def _home(rc: RealCluster) -> Path:
    home = rc.tmp / "home"
    if not home.exists():
        home.mkdir()
        wrapper = home / "riffle-ctl"
        wrapper.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(c) for c in CTL) + ' "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return home


def bash(rc: RealCluster, line: str, *, token: bool = True, **subst: str) -> subprocess.CompletedProcess:
    """Run ``line`` through bash in a directory holding ``./riffle-ctl`` (also on PATH), after
    replacing each key of ``subst`` by its value (addresses, directories, sizes)."""
    for old, new in subst.items():
        assert old in line, (old, line)
        line = line.replace(old, new)
    home = _home(rc)
    env = rc.env(**({"RIFFLE_ADMIN_TOKEN": ADMIN_TOKEN} if token else {}))
    env.pop("RIFFLE_COORDINATOR")  # every line names its coordinator
    env.update(HOME=str(home), PATH=f"{home}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=home, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def server(rc: RealCluster, name: str) -> Daemon:
    return rc.servers[["sata", "nvme"].index(name)]


def addr(d: Daemon) -> str:
    return f"127.0.0.1:{d.ports['http_port']}"


def sid(d: Daemon) -> str:
    return f"127.0.0.1-{d.ports['grpc_port']}"


def coord_addr(rc: RealCluster) -> str:
    return rc.url.removeprefix("http://")


def listed(rc: RealCluster, d: Daemon) -> dict:
    return http_json(f"{rc.url}/api/servers/{sid(d)}")


def wait_listed(rc: RealCluster, d: Daemon, status: str) -> dict:
    return wait_for(lambda: (row := listed(rc, d))["status"] == status and row, timeout=30,
                    what=f"{sid(d)} listed {status}")


def admin(d: Daemon, query: str, method: str = "POST", token: str | None = ADMIN_TOKEN) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{addr(d)}/admin?{query}", data=b"" if method == "POST" else None,
                                 method=method, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def assigned(rc: RealCluster, app_id: str) -> set[str]:
    with grpc.insecure_channel(f"127.0.0.1:{rc.coordinator.ports['grpc_port']}") as channel:
        resp = pbg.CoordinatorServerStub(channel).getShuffleAssignments(pb.GetShuffleServerRequest(
            applicationId=app_id, shuffleId=0, partitionNum=8, partitionNumPerRange=1, dataReplica=1))
    assert resp.status == 0, resp
    return {f"{s.ip}-{s.port}" for a in resp.assignments for s in a.server}


def restore(rc: RealCluster) -> None:
    for d in rc.servers:
        if d.proc.poll() is None:
            assert admin(d, "update_state=HEALTHY")[0] == 200
    for d in rc.servers:
        if d.proc.poll() is None:
            wait_listed(rc, d, "ACTIVE")


# ------------------------------------------------------------------------------------------ tests

def test_unhealthy_round_trip_through_the_coordinator(rc: RealCluster) -> None:
    sata, nvme = server(rc, "sata"), server(rc, "nvme")
    wait_listed(rc, sata, "ACTIVE")
    wait_listed(rc, nvme, "ACTIVE")
    wait_for(lambda: assigned(rc, "application_1764547200000_0101") == {sid(sata), sid(nvme)}, 30, "both assigned")
    try:
        r = bash(rc, README_SET_UNHEALTHY, **{"192.168.1.1:19998": addr(sata)})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"{addr(sata)}: ACTIVE -> UNHEALTHY"
        assert admin(sata, "get_state", "GET", None) == (200, "UNHEALTHY")
        row = wait_listed(rc, sata, "UNHEALTHY")
        assert row["reported_status"] == "UNHEALTHY"
        assert assigned(rc, "application_1764547200000_0102") == {sid(nvme)}
        back = bash(rc, README_SET_UNHEALTHY.replace("unhealthy", "healthy"), **{"192.168.1.1:19998": addr(sata)})
        assert back.returncode == 0 and back.stdout.strip() == f"{addr(sata)}: UNHEALTHY -> ACTIVE", back
        wait_listed(rc, sata, "ACTIVE")
        assert sid(sata) in assigned(rc, "application_1764547200000_0103")
    finally:
        restore(rc)


def test_readme_pipeline_marks_the_selected_servers_unhealthy(rc: RealCluster) -> None:
    sata, nvme = server(rc, "sata"), server(rc, "nvme")
    try:
        r = bash(rc, README_PIPELINE, **{"xx:21001": coord_addr(rc)})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"{addr(sata)}: ACTIVE -> UNHEALTHY"
        wait_listed(rc, sata, "UNHEALTHY")
        assert listed(rc, nvme)["status"] == "ACTIVE"
        # JSON lines: exactly what the pipeline read
        q = bash(rc, README_PIPELINE.split(" \\\n")[0], **{"xx:21001": coord_addr(rc)})
        [line] = q.stdout.splitlines()
        row = json.loads(line)
        assert (row["ip"], row["http_port"], row["running_apps"]) == ("127.0.0.1", sata.ports["http_port"], 0)
        # an empty selection changes nothing and says so
        none = bash(rc, README_PIPELINE.replace("%sata%", "%none%"), **{"xx:21001": coord_addr(rc)})
        assert none.returncode == 0 and "stdin holds no instance; nothing changed" in none.stderr
    finally:
        restore(rc)


def test_tags_set_add_remove_reach_the_coordinator(rc: RealCluster) -> None:
    sata = server(rc, "sata")
    at = {"192.168.1.1:19998": addr(sata)}
    r = bash(rc, README_SET_TAGS, **at)
    assert r.returncode == 0 and r.stdout.strip() == f"{addr(sata)}: tags sata -> a1,a2", r
    add = bash(rc, HELP_ADD, **at)
    assert add.returncode == 0 and add.stdout.strip() == f"{addr(sata)}: tags a1,a2 -> a1,a2,production", add
    wait_for(lambda: set(listed(rc, sata)["tags"]) == {"GRPC", "ss_v5", "a1", "a2", "production"}, 30,
             "the new tags heartbeated")
    missing = bash(rc, HELP_REMOVE, **at)  # the server has no such tag
    assert missing.returncode == 1 and "has no tag 'deprecated'" in missing.stderr
    builtin = bash(rc, HELP_REMOVE.replace("deprecated", "GRPC"), **at)
    assert builtin.returncode == 1 and "built-in tag" in builtin.stderr
    removed = bash(rc, HELP_REMOVE.replace("deprecated", "a1"), **at)
    assert removed.returncode == 0 and removed.stdout.strip() == f"{addr(sata)}: tags a1,a2,production -> a2,production"
    # the help's pipeline: every instance of a named cluster gets the tag
    (_home(rc) / "clusters.toml").write_text(f'[[clusters]]\ncluster_id = "production"\ncoordinator_url = "{rc.url}"\n')
    assert bash(rc, HELP_CONFIG).returncode == 0
    piped = bash(rc, HELP_PIPE_ADD)
    assert piped.returncode == 0, piped.stderr
    assert "Total: 2. Success: 2. Failed: 0" in piped.stderr
    nvme = server(rc, "nvme")
    wait_for(lambda: "production" in listed(rc, nvme)["tags"], 30, "the piped tag heartbeated")
    reset = bash(rc, README_SET_TAGS.replace("a1,a2", "sata"), **at)
    assert reset.returncode == 0
    assert bash(rc, HELP_REMOVE.replace("deprecated", "production"), **{"192.168.1.1:19998": addr(nvme)}).returncode == 0


def test_named_clusters_of_config_init(rc: RealCluster) -> None:
    home = _home(rc)
    (home / "clusters.toml").write_text(f'[[clusters]]\ncluster_id = "production"\ncoordinator_url = "{rc.url}"\n')
    r = bash(rc, HELP_CONFIG)
    assert r.returncode == 0, r.stderr
    assert (home / ".riffle" / "meta.file").read_text() == str(home / "clusters.toml")
    q = bash(rc, HELP_QUERY_NAMED)
    assert q.returncode == 0, q.stderr
    rows = [json.loads(line) for line in q.stdout.splitlines()]
    assert sorted((r["ip"], r["http_port"]) for r in rows) == sorted(("127.0.0.1", d.ports["http_port"])
                                                                     for d in rc.servers)
    unknown = bash(rc, HELP_QUERY_NAMED.replace("production", "staging"))
    assert unknown.returncode == 2 and "unknown cluster 'staging'" in unknown.stderr and "production" in unknown.stderr
    (home / "bad.toml").write_text("[[clusters]]\ncluster_id = 1\n")
    bad = bash(rc, HELP_CONFIG.replace("clusters.toml", "bad.toml"))
    assert bad.returncode == 1 and "clusters[0] needs cluster_id and coordinator_url" in bad.stderr


def test_app_queries_and_the_servers_app_routes(rc: RealCluster) -> None:
    sata = server(rc, "sata")
    app = "application_1764547200000_0200"
    send_blocks(sata.ports["grpc_port"], app, [b"x" * 1000, b"y" * 500])
    with grpc.insecure_channel(f"127.0.0.1:{rc.coordinator.ports['grpc_port']}") as channel:
        pbg.CoordinatorServerStub(channel).registerApplicationInfo(pb.ApplicationInfoRequest(appId=app, user="u"))
    r = bash(rc, README_QUERY_ACTIVE + " --json", **{"xxxx:21001": coord_addr(rc)})
    assert r.returncode == 0, r.stderr
    assert app in {json.loads(line)["app_id"] for line in r.stdout.splitlines()}
    table = bash(rc, README_QUERY_HISTORY, **{"xxxx:21001": coord_addr(rc)})
    assert table.returncode == 0 and "row" in table.stdout, table
    # the server's own listing in Riffle's form
    base = f"http://{addr(sata)}"
    [info] = [a for a in http_json(base + "/apps?format=Json") if a["app_id"] == app]
    assert info["partition_number"] == 1 and info["received_bytes"] >= 1500 and info["resident_bytes"] >= 1500
    assert info["reported_block_id_number"] == 0 and info["partition_split_triggered"] is False
    assert info["registry_timestamp"] > 0 and info["duration_minutes"] == 0.0
    assert http_json(base + "/apps/number") == 1
    assert isinstance(http_json(base + "/apps/history"), list)
    with urllib.request.urlopen(base + "/apps?format=Html", timeout=10) as page:
        assert app in page.read().decode()
    # kill without --force refuses while the app is registered; the server keeps running
    refused = bash(rc, HELP_KILL.replace(" --force", ""), **{"192.168.1.1:19998": addr(sata)})
    assert refused.returncode == 1 and "still 1 app(s)" in refused.stderr and "--force" in refused.stderr
    assert sata.proc.poll() is None
    with grpc.insecure_channel(f"127.0.0.1:{sata.ports['grpc_port']}") as channel:
        assert pbg.ShuffleServerStub(channel).unregisterShuffleByAppId(
            pb.ShuffleUnregisterByAppIdRequest(appId=app)).status == 0
    wait_for(lambda: http_json(base + "/apps/number") == 0, 30, "the app purged")
    # the purge's history entry is written when the purge ends, just after the app left the directory
    wait_for(lambda: app in {h["app_id"] for h in http_json(base + "/apps/history")}, 30, "the app in the history")


def test_admin_routes_in_riffles_form(rc: RealCluster) -> None:
    nvme = server(rc, "nvme")
    assert admin(nvme, "get_state", "GET", None) == (200, "ACTIVE")
    # a change needs POST and the credentials
    assert admin(nvme, "update_state=UNHEALTHY", "GET", None)[0] == 405
    assert admin(nvme, "update_state=UNHEALTHY", token=None)[0] == 401
    assert admin(nvme, "update_state=UNHEALTHY", token="w" * 30)[0] == 401
    bad = admin(nvme, "update_state=unknown")
    assert bad[0] == 400 and "CANCEL_DECOMMISSION" in bad[1]
    assert admin(nvme, "nope")[0] == 400
    assert admin(nvme, "delete_tag=ss_v5")[0] == 400
    assert admin(nvme, "get_state", "GET", None)[1] == "ACTIVE"  # nothing changed
    try:
        assert admin(nvme, "update_state=decommissioned") == (200, "OK")
        assert admin(nvme, "get_state", "GET", None)[1] == "DECOMMISSIONED"
        wait_listed(rc, nvme, "DECOMMISSIONED")
        assert admin(nvme, "update_state=active") == (200, "OK")
        wait_listed(rc, nvme, "ACTIVE")
    finally:
        restore(rc)


def test_kill_verbatim_with_force_and_with_waiting(rc: RealCluster) -> None:
    victim = rc.start_server("victim", admin_token=ADMIN_TOKEN)
    rc.wait_registered(3)
    send_blocks(victim.ports["grpc_port"], "application_1764547200000_0300", [b"z" * 100])
    r = bash(rc, HELP_KILL, **{"192.168.1.1:19998": addr(victim)})
    assert r.returncode == 0, r.stderr
    assert wait_for(lambda: victim.proc.poll() is not None and [victim.proc.returncode], 60, "victim exits") == [0]
    wait_listed(rc, victim, "DECOMMISSIONED")
    waiter = rc.start_server("waiter", admin_token=ADMIN_TOKEN)
    rc.wait_registered(4)
    w = bash(rc, HELP_KILL_WAIT.replace("5", "0.1", 1), **{"192.168.1.1:19998": addr(waiter)})
    assert w.returncode == 0, w.stderr
    assert w.stdout.strip().startswith(f"{addr(waiter)}: ACTIVE -> stopping (0 app(s)); ")
    assert waiter.proc.wait(60) == 0
    gone = bash(rc, HELP_KILL, **{"192.168.1.1:19998": addr(waiter)})
    assert gone.returncode == 1 and "cannot reach the server" in gone.stderr and "Traceback" not in gone.stderr


def test_bench_lines(rc: RealCluster) -> None:
    bench_dir = rc.tmp / "bench"
    bench_dir.mkdir()
    sizes = {"/data1/bench": str(bench_dir), "--batch-number 100": "--batch-number 4",
             "--concurrency 200": "--concurrency 2", "--write-size 10M": "--write-size 1M",
             "--disk-throughput 100M": "--disk-throughput 4M"}
    r = bash(rc, README_BENCH + " --format json", **sizes)
    assert r.returncode == 0, r.stderr
    [row] = [json.loads(line) for line in r.stdout.splitlines()]
    assert row["mode"] == "append throttled" and row["bytes"] == 8 << 20 and row["blocks"] == 8
    # the server's io_limiter bucket: 4 MiB/s after a burst of one second's worth, so 8 MiB take at least 1 s
    assert row["seconds"] >= 0.98 and row["mb_per_s"] <= 8 * 1.048576 / 0.98, row
    assert f"{row['mb_per_s']:8.1f} MB/s" in r.stderr  # the progress bar's last figure is the row's
    assert list(bench_dir.iterdir()) == []
    rd = bash(rc, HELP_READ + " --format json", **{"/data1/bench": str(bench_dir), "--batch-number 100":
                                                   "--batch-number 4", "--concurrency 32": "--concurrency 2"})
    assert rd.returncode == 0, rd.stderr
    rows = [json.loads(line) for line in rd.stdout.splitlines()]
    assert [x["mode"] for x in rows] == ["append (setup)", "read"]
    assert rows[1]["bytes"] == 8 << 20 and rows[1]["blocks"] == 8 and rows[1]["mb_per_s"] > 0
    assert list(bench_dir.iterdir()) == []
    pf = bash(rc, HELP_PROFILE + " --format json", **{"/data1/bench": str(bench_dir), "--max-block-size 64MB":
                                                      "--max-block-size 8KB", "--max-concurrency 16":
                                                      "--max-concurrency 2", "--test-duration-secs 10":
                                                      "--test-duration-secs 0.2"})
    assert pf.returncode == 0, pf.stderr
    grid = [json.loads(line) for line in pf.stdout.splitlines()]
    assert [(g["block_size"], g["concurrency"]) for g in grid] == [(4096, 1), (4096, 2), (8192, 1), (8192, 2)]
    assert sum(g["best"] for g in grid) == 2 and all(g["mb_per_s"] > 0 for g in grid)
    assert list(bench_dir.iterdir()) == []
    no_limit = bash(rc, README_BENCH.replace(" --disk-throughput 100M", ""), **{"/data1/bench": str(bench_dir)})
    assert no_limit.returncode == 2 and "--throttle needs --disk-throughput" in no_limit.stderr


def test_inspect_file_line(rc: RealCluster) -> None:
    blocks = [b"a" * 100, b"b" * 50]
    index, data = rc.tmp / "shuffle.index", rc.tmp / "shuffle.data"
    data.write_bytes(b"".join(blocks))
    index.write_bytes(encode_index([IndexEntry(0, 100, 100, zlib.crc32(blocks[0]), 1, 7),
                                    IndexEntry(100, 50, 50, zlib.crc32(blocks[1]) ^ 1, 2, 7)]))
    r = bash(rc, HELP_INSPECT, **{"/data/shuffle/index": str(index), "/data/shuffle/data": str(data)})
    assert r.returncode == 1  # the second block's CRC is wrong
    assert "corrupt: record 1 (blockId 2, offset 100, length 50): CRC mismatch" in r.stdout
    assert "2 records, 1 blocks ok, 1 corrupt" in r.stdout


def test_old_shapes_are_gone(rc: RealCluster) -> None:
    for old in ("riffle-ctl query 'select 1'", "riffle-ctl instance decommission x", "riffle-ctl disk-bench /tmp",
                "riffle-ctl inspect /tmp/x.index"):
        r = bash(rc, old)
        assert r.returncode == 2 and any(w in r.stderr for w in ("invalid choice", "required", "unrecognized")), (old, r.stderr)


def test_initial_unhealthy_status_holds_until_an_operator_sets_healthy(tmp_path: Path) -> None:
    c = RealCluster(tmp_path / "initial-unhealthy")
    c.tmp.mkdir()
    try:
        c.start_coordinator()
        late = c.start_server("late", extra="initial_unhealthy_status_enable = true", admin_token=ADMIN_TOKEN)
        other = c.start_server("other", admin_token=ADMIN_TOKEN)
        c.wait_registered(2)
        assert admin(late, "get_state", "GET", None) == (200, "UNHEALTHY")
        assert wait_listed(c, late, "UNHEALTHY")["reported_status"] == "UNHEALTHY"
        wait_listed(c, other, "ACTIVE")
        assert assigned(c, "application_1764547200000_0201") == {sid(other)}  # nothing for the late one
        back = bash(c, README_SET_UNHEALTHY.replace("unhealthy", "healthy"), **{"192.168.1.1:19998": addr(late)})
        assert back.returncode == 0 and back.stdout.strip() == f"{addr(late)}: UNHEALTHY -> ACTIVE", back
        wait_listed(c, late, "ACTIVE")
        assert sid(late) in assigned(c, "application_1764547200000_0202")
    finally:
        c.stop()
