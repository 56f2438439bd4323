"""Issue 17's attacks on the HDFS tier, against a real HDFS (MiniDFSCluster): remote storage is the operator's.

- An app named like a directory under an allowed base (``rss`` on base ``/``) writes and is
  unregistered: the files this server wrote for *other* apps under ``/rss`` all survive, and
  its own are gone. Before: its purge listed ``/rss`` recursively and deleted this server's
  files of every app there.
- An app named ``user`` on base ``/``: the empty directories already under ``/user`` survive its
  purge (only the directories the server made for it go). Before: every empty one was removed.
- A client naming a NameNode or base nobody configured (``hdfs://127.0.0.1:<a socket we own>``,
  a sub-directory, ``..``, a bare path) is refused with INVALID_REQUEST naming
  ``hdfs_store.remote_storage``, and nothing connects to that socket, not even when an allowed
  base comes with client conf items naming it.
- A restart whose allow-list no longer has an app's base: the recovered app is reported
  (``/apps`` recovery report, metric), the server never opens a client for that base, and the
  app's purge leaves its HDFS files alone.
- A normal app's purge (app and shuffle, before and after a restart) removes exactly its files:
  the other app's, and a file another server wrote into the same partition directory, stay.
"""

from __future__ import annotations

import itertools
import socket

import pytest

from riffle_actors.actors.hdfs_writer import AllowedRemoteStorages, GetHdfsStats
from riffle_actors.errors import InvalidRequestError, StatusCode
from riffle_actors.io.hdfs import HdfsIO
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.hdfs_layout import (
    app_dir,
    file_pair,
    normalize_remote_path,
    partition_dir,
    shuffle_dir,
    split_remote_path,
)
from riffle_actors.server import ShuffleServer
from tests.conftest import server_config, stop_server
from tests.helpers import poll_until, wait_server_clean
from tests.helpers.client import UniffleClient, UniffleError, assert_read_matches, make_blocks
from tests.helpers.hdfs_read import hdfs_client, read_hdfs_partition

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_ids = itertools.count()
PARTITIONS = (0, 1)


class RecordingHdfsIO(HdfsIO):
    """The real HDFS IO, recording every file system the server opens a client for."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    def client(self, fs_url, conf=()):
        self.opened.append(fs_url)
        return super().client(fs_url, conf)


def hdfs_cfg(tmp_path, *bases: str, grpc_port: int = 0):
    """HDFS tier with every spill going to HDFS (cold threshold 0); ``bases``: the allow-list."""
    return server_config(tmp_path, store_type="MEMORY_LOCALFILE_HDFS", capacity="64M", grpc_port=grpc_port,
                         hybrid_store={"memory_single_buffer_max_spill_size": "64K",
                                       "memory_spill_to_cold_threshold_size": 0},
                         hdfs_store={"write_timeout_sec": 30, "unhealthy_retry_interval_sec": 0,
                                     "remote_storage": [{"path": b} for b in bases]})


async def write_to_hdfs(srv, client, app, remote, shuffle_id=0, remote_conf=None):
    """Register ``app`` on ``remote``, send 2 x 2 blocks per partition, wait until HDFS has them."""
    await client.register_shuffle(app, shuffle_id, range(2), remote_storage=remote, remote_conf=remote_conf)
    before = (await srv.hdfs.ask(GetHdfsStats())).writes
    written = []
    for p in PARTITIONS:
        blocks = make_blocks(p, 1, 2, 40 << 10)
        await client.send_blocks(app, shuffle_id, blocks)
        await client.report(app, shuffle_id, 1, blocks)
        written += blocks

    async def landed():
        return srv.budget.used == 0 and (await srv.hdfs.ask(GetHdfsStats())).writes >= before + len(PARTITIONS)
    await poll_until(landed, 30, message="the spills did not reach HDFS")
    return written


def read_back(remote, app, server_id, written, shuffle_id=0):
    for p in PARTITIONS:
        want = [b for b in written if b.partition_id == p]
        assert_read_matches(read_hdfs_partition(remote, app, shuffle_id, p, server_id, {b.block_id for b in want}),
                            want)


def tree(url: str, path: str) -> set[str]:
    """Every path under ``path`` (the test's own, recursive listing; {} if there is none)."""
    c = hdfs_client(url)
    while True:
        try:
            return {st.path for st in c.list_status(path, True)}
        except FileNotFoundError:
            if not exists(url, path):
                return set()
            # something under it was deleted while it was listed: list it again


async def purged(srv, files: int) -> None:
    """Wait until the server's HDFS purges, all steps done (directories included), deleted ``files`` files."""
    async def done():
        return (await srv.hdfs.ask(GetHdfsStats())).files_purged >= files
    await poll_until(done, 30, message=f"the HDFS purge did not delete {files} files")
    assert (await srv.hdfs.ask(GetHdfsStats())).files_purged == files


def exists(url: str, path: str) -> bool:
    try:
        hdfs_client(url).get_file_info(path)
        return True
    except FileNotFoundError:
        return False


async def test_an_app_named_like_a_directory_of_the_base_purges_only_its_own_files(tmp_path, minihdfs):
    url = minihdfs.url
    name = f"rss-attack{next(_ids)}"
    victims_base = f"{url}/{name}"
    # the operator allows both the root and /<name>: the worst case for the app named <name>
    srv = ShuffleServer(hdfs_cfg(tmp_path, f"{url}/", victims_base))
    await srv.start()
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            victims = {}
            for v in ("application_victim_1", "application_victim_2"):
                victims[v] = await write_to_hdfs(srv, client, v, victims_base)
            before = tree(url, f"/{name}")
            assert any(p.endswith(".data") for p in before)
            # the app named like the base directory, on the root: its app directory is /<name>
            await write_to_hdfs(srv, client, name, f"{url}/")
            own = tree(url, f"/{name}") - before
            assert own and all(p.startswith(f"/{name}/0") for p in own), own
            await client.unregister_app(name)
            await purged(srv, len([p for p in own if p.endswith((".data", ".index"))]))
            assert tree(url, f"/{name}") == before, "files of other apps under the base were deleted"
            for v, written in victims.items():
                read_back(victims_base, v, srv.server_id, written)
            # and a victim's own purge still removes all of it
            await client.unregister_app("application_victim_1")
            await purged(srv, 8)
            assert not exists(url, f"/{name}/application_victim_1"), "the victim's purge left its directory"
            read_back(victims_base, "application_victim_2", srv.server_id, victims["application_victim_2"])
    finally:
        await stop_server(srv)


async def test_an_app_named_user_leaves_the_empty_directories_under_user_alone(tmp_path, minihdfs):
    url = minihdfs.url
    c = hdfs_client(url)
    homes = ["/user/alice", "/user/bob/.staging", "/user/carol"]
    for d in homes:
        c.mkdirs(d, 0o755, True)
    srv = ShuffleServer(hdfs_cfg(tmp_path, f"{url}/"))
    await srv.start()
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await write_to_hdfs(srv, client, "user", f"{url}/")
            assert exists(url, "/user/0/0-0")
            await client.unregister_app("user")
            await purged(srv, 4)
            assert not exists(url, "/user/0"), "the directories the server made for the app were not removed"
            for d in ["/user", "/user/bob", *homes]:
                assert exists(url, d), f"{d} (empty, not made by the server) was removed"
    finally:
        await stop_server(srv)
        c.delete("/user", True)


@pytest.mark.parametrize("app_id", ["..", ".", "", "a/b", "../rss", "rss\x00", "app\n", "ａpp"])
def test_app_ids_that_are_not_one_path_component_never_name_an_hdfs_path(app_id):
    with pytest.raises(ProtocolError):
        file_pair("/", app_id, 0, 0, "127.0.0.1-1", 0, 0)
    with pytest.raises(ProtocolError):
        app_dir("/rss", app_id)
    with pytest.raises(ProtocolError):
        shuffle_dir("/rss", "application_1", -1)


@pytest.mark.parametrize("path", ["hdfs://nn/rss/..", "hdfs://nn/rss/./x", "hdfs://nn/rss%2F..", "hdfs://u@nn/rss",
                                  "hdfs:///rss", "hdfs://nn/rss ", " hdfs://nn/rss", "hdfs://nn/rss?x", "file:///rss",
                                  "rss", "hdfs:/nn/rss", "hdfs://nn/r\\ss", "hdfs://nn/rss#x", "hdfs://nn/rß"])
def test_remote_paths_that_could_name_another_place_are_refused(path):
    with pytest.raises(ValueError):
        normalize_remote_path(path)
    with pytest.raises(InvalidRequestError, match="hdfs_store.remote_storage"):
        AllowedRemoteStorages([("hdfs://nn/rss", {})]).resolve(path)


def test_equivalent_spellings_of_an_allowed_base_resolve_to_the_operators_conf():
    allowed = AllowedRemoteStorages([("hdfs://nn:8020/rss", {"dfs.replication": "2"})])
    for spelling in ("hdfs://nn:8020/rss", "HDFS://nn:8020/rss/", "hdfs://nn:8020//rss//"):
        remote = allowed.resolve(spelling)
        assert (remote.fs_url, remote.base, remote.conf) == ("hdfs://nn:8020", "/rss", (("dfs.replication", "2"),))
    for other in ("hdfs://nn:8021/rss", "hdfs://NN:8020/rss", "hdfs://nn/rss", "hdfs://nn:8020/rss/sub", "/rss"):
        with pytest.raises(InvalidRequestError, match="not allowed"):
            allowed.resolve(other)


async def test_an_unconfigured_namenode_or_base_is_refused_and_never_connected_to(tmp_path, minihdfs):
    url = minihdfs.url
    base = f"{url}/rss-ok{next(_ids)}"
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(16)
    trap.setblocking(False)
    port = trap.getsockname()[1]
    io = RecordingHdfsIO()
    srv = ShuffleServer(hdfs_cfg(tmp_path, base), hdfs_io=io)
    await srv.start()
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            refused = [f"hdfs://127.0.0.1:{port}/rss", f"hdfs://127.0.0.1:{port}{split_remote_path(base)[1]}",
                       f"{base}/sub", f"{base}/../other", f"{base}/./", f"{url}/", split_remote_path(base)[1],
                       f"{base}?x=1", f"{base}%2F..", f"hdfs://evil@{url.split('://', 1)[1]}/rss", "s3a://bucket/rss"]
            for i, path in enumerate(refused):
                app = f"application_refused_{i}"
                with pytest.raises(UniffleError) as e:
                    await client.register_shuffle(app, 0, range(2), remote_storage=path)
                assert e.value.status == StatusCode.INVALID_REQUEST, path
                assert "hdfs_store.remote_storage" in str(e.value), str(e.value)
                assert app not in srv.directory, "a refused registration registered nothing"
            assert (await srv.hdfs.ask(GetHdfsStats())).remote_storage_refused == len(refused)
            # the allowed base, spelled differently, with client conf naming the trap: the server's own
            # (empty) conf for the base is used, the conf items are ignored
            trap_url = f"hdfs://127.0.0.1:{port}"
            spelled = base.replace("hdfs://", "HDFS://", 1).replace("/rss-ok", "//rss-ok", 1) + "/"
            written = await write_to_hdfs(srv, client, "application_allowed", spelled, remote_conf={
                "fs.defaultFS": trap_url, "dfs.namenode.rpc-address": f"127.0.0.1:{port}",
                "dfs.client.failover.proxy.provider.x": "org.example.Evil"})
            read_back(base, "application_allowed", srv.server_id, written)
            await client.unregister_app("application_allowed")
            await purged(srv, 4)
            assert not exists(url, partition_dir(split_remote_path(base)[1], "application_allowed", 0, 0))
        assert set(io.opened) == {url}, f"the server opened clients for {set(io.opened)}"
        with pytest.raises(BlockingIOError):
            trap.accept()  # nothing ever connected to the unconfigured "NameNode"
    finally:
        await stop_server(srv)
        trap.close()


async def test_a_server_with_hdfs_and_no_allowed_base_refuses_every_remote_storage(tmp_path, minihdfs):
    srv = ShuffleServer(hdfs_cfg(tmp_path))
    await srv.start()
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            with pytest.raises(UniffleError) as e:
                await client.register_shuffle("application_none", 0, range(1), remote_storage=f"{minihdfs.url}/rss")
            assert e.value.status == StatusCode.INVALID_REQUEST and "hdfs_store.remote_storage" in str(e.value)
            await client.register_shuffle("application_local", 0, range(1))  # no remote storage: served, local
    finally:
        await stop_server(srv)


async def test_a_normal_purge_removes_exactly_the_apps_files(tmp_path, minihdfs):
    url = minihdfs.url
    remote = f"{url}/rss-purge{next(_ids)}"
    _, base = split_remote_path(remote)
    srv = ShuffleServer(hdfs_cfg(tmp_path, remote))
    await srv.start()
    c = hdfs_client(url)
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            a, b = "application_purge_a", "application_purge_b"
            await write_to_hdfs(srv, client, a, remote, shuffle_id=0)
            kept_shuffle = await write_to_hdfs(srv, client, a, remote, shuffle_id=1)
            other = await write_to_hdfs(srv, client, b, remote)
            # another server's file in a's partition directory
            foreign = f"{partition_dir(base, a, 1, 0)}/10.0.0.9-19999_0_0.data"
            with c.create(foreign) as w:
                w.write(b"another server's")
            files_b = tree(url, f"{base}/{b}")
            # a shuffle's purge: only that shuffle's files and directories
            await client.unregister_shuffle(a, 0)
            await purged(srv, 4)
            assert not exists(url, shuffle_dir(base, a, 0)), "shuffle 0's directory was not removed"
            read_back(remote, a, srv.server_id, kept_shuffle, shuffle_id=1)
            # a server whose id extends this one's (the reader would take it for this server's: so written
            # only now, after the read)
            lookalike = f"{partition_dir(base, a, 1, 1)}/{srv.server_id}9_0_0.index"
            with c.create(lookalike) as w:
                w.write(b"x" * 40)
            # the app's purge: its files go; the foreign files and their directories stay
            await client.unregister_app(a)
            await purged(srv, 8)
            assert tree(url, f"{base}/{a}") == {
                f"{base}/{a}/1", partition_dir(base, a, 1, 0), partition_dir(base, a, 1, 1), foreign, lookalike}
            assert tree(url, f"{base}/{b}") == files_b
            read_back(remote, b, srv.server_id, other)
    finally:
        await stop_server(srv)


async def _restart(tmp_path, bases, port, io=None) -> ShuffleServer:
    srv = ShuffleServer(hdfs_cfg(tmp_path, *bases, grpc_port=port), hdfs_io=io)
    await srv.start()
    return srv


async def test_a_restart_purges_exactly_the_recovered_apps_files(tmp_path, minihdfs):
    url = minihdfs.url
    remote = f"{url}/rss-restart{next(_ids)}"
    _, base = split_remote_path(remote)
    a, b = "application_restart_a", "application_restart_b"
    srv = await _restart(tmp_path, [remote], 0)
    port, server_id = srv.grpc_port, srv.server_id
    try:
        async with UniffleClient(f"127.0.0.1:{port}") as client:
            await write_to_hdfs(srv, client, a, remote)
            kept = await write_to_hdfs(srv, client, b, remote)
    finally:
        await stop_server(srv)
    foreign = f"{partition_dir(base, a, 0, 0)}/10.0.0.9-19999_0_0.data"
    with hdfs_client(url).create(foreign) as w:
        w.write(b"another server's")
    files_b = tree(url, f"{base}/{b}")
    srv = await _restart(tmp_path, [remote], port)
    try:
        assert srv.server_id == server_id and srv.recovery.apps == 2
        async with UniffleClient(f"127.0.0.1:{port}") as client:
            await client.unregister_app(a)
            await purged(srv, 4)
            # its pairs are gone; the other server's file stays, and so do the directories (made before
            # the restart: the server no longer knows it made them)
            assert tree(url, f"{base}/{a}") == {f"{base}/{a}/0", partition_dir(base, a, 0, 0),
                                                partition_dir(base, a, 0, 1), foreign}
            assert tree(url, f"{base}/{b}") == files_b
            read_back(remote, b, server_id, kept)
    finally:
        await stop_server(srv)


async def test_a_restart_without_the_base_in_the_allow_list_never_touches_it(tmp_path, minihdfs):
    url = minihdfs.url
    remote = f"{url}/rss-dropped{next(_ids)}"
    _, base = split_remote_path(remote)
    app = "application_dropped"
    srv = await _restart(tmp_path, [remote], 0)
    port = srv.grpc_port
    try:
        async with UniffleClient(f"127.0.0.1:{port}") as client:
            written = await write_to_hdfs(srv, client, app, remote)
    finally:
        await stop_server(srv)
    files = tree(url, base)
    io = RecordingHdfsIO()
    srv = await _restart(tmp_path, [f"{url}/elsewhere"], port, io)
    try:
        rec = srv.recovery
        assert rec.apps == 1 and rec.remote_storage_refused == [(app, remote)]
        assert rec.to_json()["remote_storage_refused"] == [{"app_id": app, "path": remote}]
        assert "riffle_recovery_remote_storage_refused_total 1.0" in srv.metrics.render().decode()
        stats = await srv.hdfs.ask(GetHdfsStats())
        assert stats.apps_with_remote == 0 and stats.remote_storage_refused == 1
        async with UniffleClient(f"127.0.0.1:{port}") as client:
            # its re-registration on the dropped base is refused too
            with pytest.raises(UniffleError) as e:
                await client.register_shuffle(app, 1, range(2), remote_storage=remote)
            assert e.value.status == StatusCode.INVALID_REQUEST
            await client.unregister_app(app)
            await wait_server_clean(srv, app)
            await srv.hdfs.ask(GetHdfsStats())  # the writer has taken the purge
        assert io.opened == [], f"the server opened clients for {io.opened}"
        assert tree(url, base) == files, "the files on the dropped base were touched"
        read_back(remote, app, srv.server_id, written)
    finally:
        await stop_server(srv)
