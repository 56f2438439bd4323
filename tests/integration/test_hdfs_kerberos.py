"""The HDFS tier against a Kerberized HDFS: Hadoop's MiniKdc (a real KDC) and a MiniDFSCluster with
``hadoop.security.authentication=kerberos``, block access tokens and SASL data transfer protection
(``tests.helpers.minihdfs.KerberizedMiniHdfs``).

A server with ``[hdfs_store.kerberos_security_config]`` (its own principal and keytab, made by the
MiniKdc) writes its spills there, they are read back with the Uniffle client's layout, the files
belong to its principal's short name, and a purge deletes them; the same server without that table
(simple authentication, as before) is refused by the NameNode and its spills go to local disk. No
ticket cache is reachable (``KRB5CCNAME`` names a file that does not exist): only the keytab can log in.
A keytab that is a symlink or readable by others stops the start.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from riffle_actors.actors.hdfs_writer import GetHdfsStats
from riffle_actors.config import ConfigError
from riffle_actors.server import ShuffleServer, _load_checked
from tests.conftest import server_config, stop_server
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks
from tests.helpers.daemon import server_process
from tests.helpers.hdfs_read import list_partition_files, read_hdfs_partition

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PRINCIPAL = "riffle/localhost"
_ids = itertools.count()


@pytest.fixture(scope="module")
def krb_hdfs(tmp_path_factory: pytest.TempPathFactory):
    from tests.helpers.minihdfs import KerberizedMiniHdfs, kerberos_prerequisite

    reason = kerberos_prerequisite()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("krbhdfs")
    saved = {k: os.environ.get(k) for k in ("KRB5_CONFIG", "KRB5CCNAME")}
    hdfs = KerberizedMiniHdfs.start(base, [PRINCIPAL])
    # the server's process reaches the KDC through krb5.conf (as Riffle's README: KRB5_CONFIG), and
    # has no ticket cache: only a keytab login can authenticate
    os.environ["KRB5_CONFIG"] = hdfs.krb5_conf
    os.environ["KRB5CCNAME"] = f"FILE:{base}/no-such-ccache"
    try:
        yield hdfs
    finally:
        hdfs.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def principal_keytab(hdfs) -> tuple[str, str]:
    principal = f"{PRINCIPAL}@{hdfs.realm}"
    return principal, hdfs.keytabs[principal]


def reader_client(hdfs):
    """The test's own Kerberos client (to read back what the server wrote, as a Spark reader would)."""
    import hdfs_native

    principal, keytab = principal_keytab(hdfs)
    return hdfs_native.Client(hdfs.url, {"hadoop.security.authentication": "kerberos",
                                         "dfs.data.transfer.protection": "authentication"},
                              kerberos_principal=principal, kerberos_keytab=keytab)


def krb_cfg(tmp_path, remote, kerberos: dict | None, timeout=30):
    hdfs_store = {"write_timeout_sec": timeout, "unhealthy_retry_interval_sec": 0,
                  # the cluster's client conf (an operator's hdfs-site.xml): SASL on the DataNode connections
                  "remote_storage": [{"path": remote, "conf": {"dfs.data.transfer.protection": "authentication"}}]}
    if kerberos is not None:
        hdfs_store["kerberos_security_config"] = kerberos
    return server_config(tmp_path, store_type="MEMORY_LOCALFILE_HDFS", capacity="64M",
                         hybrid_store={"memory_single_buffer_max_spill_size": "64K",
                                       "memory_spill_to_cold_threshold_size": 0},
                         hdfs_store=hdfs_store)


async def write_and_spill(srv, client, app, remote, partitions=(0, 1), batches=2, size=40 << 10):
    await client.register_shuffle(app, 0, range(4), remote_storage=remote)
    written = []
    for b in range(batches):
        for p in partitions:
            blocks = make_blocks(p, b + 1, 2, size, seq_start=b * 10)
            await client.send_blocks(app, 0, blocks)
            written += blocks
    await poll_until(lambda: srv.budget.used == 0, 60, message="spills did not finish")
    return written


async def test_server_logs_in_with_its_keytab_writes_reads_and_purges(tmp_path, krb_hdfs):
    principal, keytab = principal_keytab(krb_hdfs)
    remote = f"{krb_hdfs.url}/riffle/rss{next(_ids)}"  # /riffle belongs to the riffle principal only
    srv = ShuffleServer(krb_cfg(tmp_path, remote, {"principal": principal, "keytab_path": keytab}))
    await srv.start()
    app = "application_krb_1"
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            written = await write_and_spill(srv, client, app, remote)
            stats = await srv.hdfs.ask(GetHdfsStats())
            assert stats.write_failures == 0 and stats.writes == 4, stats
            reader = reader_client(krb_hdfs)
            for p in (0, 1):
                want = [b for b in written if b.partition_id == p]
                ids = {b.block_id for b in want}
                local = await client.read_partition(app, 0, p, ids, partition_num=4, check_complete=False)
                got = read_hdfs_partition(remote, app, 0, p, srv.server_id, ids, client=reader)
                assert not local and len(got) == 4, "every batch is above the cold threshold: all in HDFS"
                assert_read_matches(got, want)
                assert list_partition_files(remote, app, 0, p, reader)
            # written as the principal's short name (auth_to_local), not as the server's OS user
            base = "/" + remote.split("/", 3)[3]
            owners = {st.owner for st in reader.list_status(f"{base}/{app}", True)}
            assert owners == {"riffle"}, owners
            await client.unregister_app(app)

            def app_dir_gone() -> bool:
                return all(not st.path.endswith(app) for st in reader.list_status(base))
            await poll_until(app_dir_gone, 30, message="the app's HDFS directory was not deleted")
    finally:
        await stop_server(srv)


async def test_server_without_kerberos_is_refused_by_the_namenode(tmp_path, krb_hdfs):
    """The same server without the table, as a daemon (hdfs-native keeps retrying a refused simple-auth
    connection for minutes, which would hold an in-process test's interpreter at exit)."""
    remote = f"{krb_hdfs.url}/riffle/rss{next(_ids)}"
    app = "application_krb_2"
    tables = (f'[hybrid_store]\nmemory_single_buffer_max_spill_size = "64K"\nmemory_spill_to_cold_threshold_size = 0\n'
              f'[hdfs_store]\nwrite_timeout_sec = 3\nunhealthy_retry_interval_sec = 0\n'
              f'[[hdfs_store.remote_storage]]\npath = "{remote}"\n'
              f'conf = {{ "dfs.data.transfer.protection" = "authentication" }}\n')
    with server_process(tmp_path, top='store_type = "MEMORY_LOCALFILE_HDFS"', tables=tables) as srv:
        async with UniffleClient(srv.target) as client:
            await client.register_shuffle(app, 0, range(4), remote_storage=remote)
            written = make_blocks(0, 1, 2, 40 << 10)
            await client.send_blocks(app, 0, written)
            await poll_until(lambda: srv.metric("riffle_spill_tier_choices_total", reason="hdfs_failed",
                                                tier="localfile") >= 1, 60,
                             message="the HDFS write was not refused (no fallback to local disk)")
            # the batch fell back to local disk and reads back whole
            ids = {b.block_id for b in written}
            local = await client.read_partition(app, 0, 0, ids, partition_num=4, check_complete=False)
            assert_read_matches(local, written)
    assert not list_partition_files(remote, app, 0, 0, reader_client(krb_hdfs))
    log = Path(krb_hdfs.log_path).read_text(errors="replace")
    assert "SIMPLE authentication is not enabled" in log, krb_hdfs.log_tail()


def test_unsafe_keytab_stops_the_start(tmp_path, krb_hdfs):
    principal, keytab = principal_keytab(krb_hdfs)
    link = tmp_path / "link.keytab"
    link.symlink_to(keytab)
    loose = tmp_path / "loose.keytab"
    loose.write_bytes(Path(keytab).read_bytes())
    loose.chmod(0o644)
    remote = f"{krb_hdfs.url}/riffle/rss{next(_ids)}"
    for path, why in ((link, "symlink"), (loose, "mode 0644"), (tmp_path / "missing.keytab", "No such file")):
        with pytest.raises(ValueError, match="keytab_path") as e:
            ShuffleServer(krb_cfg(tmp_path, remote, {"principal": principal, "keytab_path": str(path)}))
        assert why in str(e.value)
    # the daemon's start (riffle-server -c FILE) refuses it by name too, before anything starts
    conf = tmp_path / "server.toml"
    conf.write_text(f'store_type = "MEMORY_LOCALFILE_HDFS"\n[localfile_store]\ndata_paths = ["{tmp_path}/d"]\n'
                    f'[hdfs_store.kerberos_security_config]\nkeytab_path = "{link}"\nprincipal = "{principal}"\n')
    with pytest.raises(ConfigError, match="kerberos_security_config.*symlink"):
        _load_checked(str(conf))
