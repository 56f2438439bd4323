"""Blocking HDFS operations of the HDFS tier, with the ``hdfs-native`` client (Rust, no JVM).

This module owns the calls into ``hdfs_native``: one ``Client`` per (file system URL, conf
items), appending a batch to a data/index file pair (data first, then index, spec §5.2), and
deleting the files and (empty) directories this server made, one path at a time: nothing here
lists a tree or deletes recursively. Every function blocks; the HDFS writer
actors run them on their thread pool, never on the event loop.

Kerberos (``[hdfs_store.kerberos_security_config]``, Riffle's keys): ``KerberosLogin`` is the
server's own principal and keytab, from the server config only. With it, every client is made
with ``hadoop.security.authentication=kerberos`` (whatever a base's conf says) and hdfs-native's
keytab login: it gets the tickets from the KDC through the system's GSSAPI library (MIT krb5,
``KRB5_CONFIG`` names the realm's KDC) and gets new ones from the keytab when they expire, so
nothing has to re-run ``kinit`` (Riffle runs ``kinit -kt`` at start and every hour instead). The
keytab is checked before use (``KerberosLogin.check``: ``safe_fs.check_secret_file``).

``HdfsIO`` is the seam for fault tests, as ``LocalIO`` is for disks: a test passes a subclass
whose ``append_pair`` fails on demand. It does not cover: file names
(``riffle_actors.protocol.hdfs_layout``) or which batch goes to HDFS
(``riffle_actors.state.tier_policy``).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from riffle_actors.io.safe_fs import check_secret_file
from riffle_actors.protocol.hdfs_layout import FilePair

try:  # the server runs without it unless store_type names HDFS
    import hdfs_native
except ImportError:  # pragma: no cover - hdfs-native is a dependency; kept for a clear message
    hdfs_native = None  # type: ignore[assignment]


class HdfsUnavailableError(RuntimeError):
    """hdfs-native is not installed."""


#: the Hadoop conf items a Kerberos login sets on every client (over a base's own conf)
KERBEROS_CONF = (("hadoop.security.authentication", "kerberos"),)
KEYTAB_KEY = "hdfs_store.kerberos_security_config.keytab_path"


@dataclass(frozen=True)
class KerberosLogin:
    """The server's Kerberos identity for HDFS (from the server config, never from a client)."""

    principal: str
    keytab_path: str

    def check(self) -> None:
        """``ValueError`` naming the key when the keytab is unusable (symlink, not a regular file,
        another user's, readable by others, empty): checked at start, so the server refuses to start."""
        try:
            check_secret_file(self.keytab_path)
        except OSError as e:
            raise ValueError(f"{KEYTAB_KEY}: {e.strerror or e}") from None


class HdfsIO:
    """The blocking HDFS operations; thread-safe (one client per file system and conf)."""

    def __init__(self, replication: int | None = None, kerberos: KerberosLogin | None = None):
        self.replication = replication
        self.kerberos = kerberos
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], object] = {}
        self._lock = threading.Lock()

    def client(self, fs_url: str, conf: Iterable[tuple[str, str]] = ()):
        """The client of one file system (created on first use; connections are lazy)."""
        if hdfs_native is None:
            raise HdfsUnavailableError("the hdfs-native package is not installed (pip install hdfs-native)")
        key = (fs_url, tuple(sorted(conf)))
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                items = dict(key[1])
                login = {}
                if self.kerberos is not None:
                    items.update(KERBEROS_CONF)
                    login = {"kerberos_principal": self.kerberos.principal,
                             "kerberos_keytab": self.kerberos.keytab_path}
                c = self._clients[key] = hdfs_native.Client(fs_url or None, items or None, **login)
            return c

    def forget(self, fs_url: str, conf: Iterable[tuple[str, str]] = ()) -> None:
        with self._lock:
            self._clients.pop((fs_url, tuple(sorted(conf))), None)

    def append_pair(self, client, pair: FilePair, data: Iterable[bytes | memoryview], index: bytes,
                    create: bool) -> None:
        """Append ``data`` to ``pair.data``, then ``index`` to ``pair.index``; ``create``: new files.

        Creating refuses to overwrite (``FileExistsError``-like errors come from hdfs-native as
        ``FileExistsError`` or ``OSError``); the caller then moves to the next retry suffix.
        """
        self._write_file(client, pair.data, data, create)
        self._write_file(client, pair.index, (index,), create)

    def write_file(self, client, path: str, chunks: Iterable[bytes | memoryview], create: bool) -> None:
        """Create (``create``) or append to one file: open, write ``chunks``, close; as
        ``append_pair`` does for each file of a pair (``riffle-ctl disk-bench`` times it)."""
        self._write_file(client, path, chunks, create)

    def _write_file(self, client, path: str, chunks: Iterable[bytes | memoryview], create: bool) -> None:
        if create:
            opts = hdfs_native.WriteOptions(overwrite=False, create_parent=True, replication=self.replication)
            w = client.create(path, opts)
        else:
            w = client.append(path)
        try:
            for chunk in chunks:
                w.write(chunk)
        finally:
            try:
                w.close()  # completes the file on the NameNode; blocks (here, on a writer thread)
            finally:
                # hdfs-native's FileWriter.close does not mark the object closed, so io.IOBase.__del__
                # would call it again when the object is collected, in whatever thread does that, the
                # event loop's included, and block it on a dead NameNode. Mark it closed ourselves.
                io.RawIOBase.close(w)

    def recover_lease(self, client, path: str) -> bool:
        """One request to close ``path`` for good after a failed write (HDFS lease recovery), so readers
        see its acknowledged bytes again; True once closed (or gone), False while the NameNode still
        recovers it. The caller asks again later (``HdfsWriterActor``: on its timer, a pool thread is
        never held waiting between two tries)."""
        try:
            return bool(client.recover_lease(path))
        except FileNotFoundError:
            return True

    def file_length(self, client, path: str) -> int:
        """The length the NameNode gives ``path`` (its complete blocks), -1 when it does not exist."""
        try:
            return int(client.get_file_info(path).length)
        except FileNotFoundError:
            return -1

    def exists(self, client, path: str) -> bool:
        try:
            client.get_file_info(path)
            return True
        except FileNotFoundError:
            return False

    def make_dir(self, client, path: str) -> bool:
        """Create the directory ``path`` (and missing parents); True if it did not exist before."""
        try:
            st = client.get_file_info(path)
        except FileNotFoundError:
            client.mkdirs(path, 0o755, True)
            return True
        if not st.isdir:
            raise NotADirectoryError(f"HDFS path {path} exists and is not a directory")
        return False

    def delete_file(self, client, path: str) -> bool:
        """Delete the file ``path`` (never a directory); True if it was deleted, False if not there."""
        try:
            if client.get_file_info(path).isdir:
                return False
            return bool(client.delete(path, False))
        except FileNotFoundError:
            return False

    def remove_empty_dir(self, client, path: str) -> bool:
        """Remove the directory ``path`` if it is empty (a non-recursive delete); True if removed."""
        try:
            if not client.get_file_info(path).isdir:
                return False
            return bool(client.delete(path, False))
        except FileNotFoundError:
            return False
        except (OSError, RuntimeError):  # not empty: another server's (or anyone's) files remain
            return False

    def list_files(self, client, directory: str) -> dict[str, int]:
        """name -> length of the files directly under ``directory`` (tests and tools)."""
        try:
            return {st.path.rsplit("/", 1)[-1]: st.length for st in client.list_status(directory, False)
                    if not st.isdir}
        except FileNotFoundError:
            return {}

    def reach(self, client, path: str) -> bool:
        """One NameNode RPC on ``path`` (``hdfs_store.precheck_enable``): True if it exists, False if
        not (the NameNode answered either way); raises when the file system cannot be reached."""
        return self.exists(client, path)

    def read_file(self, client, path: str) -> bytes:
        with client.read(path) as r:
            return r.readall()


def conf_items(conf: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = conf.items() if isinstance(conf, Mapping) else conf
    return tuple(sorted((str(k), str(v)) for k, v in items))


class HdfsPrecheckError(ConnectionError):
    """``hdfs_store.precheck_enable``: a remote storage base could not be reached at start."""


def precheck(io: HdfsIO, bases: Iterable[tuple[str, str, str, tuple[tuple[str, str], ...]]],
             timeout_s: float) -> list[str]:
    """Reach every ``(remote path, fs_url, base dir, conf)`` base with one RPC each, at most ``timeout_s`` per base
    (a dead NameNode can make the client retry for minutes; the attempt is left to its daemon
    thread then). Returns a line per base reached; raises ``HdfsPrecheckError`` naming the first
    base that failed, and why."""
    reached = []
    for path, fs_url, base, conf in bases:
        outcome: dict[str, object] = {}
        done = threading.Event()

        def attempt(fs_url=fs_url, conf=conf, base=base, outcome=outcome, done=done) -> None:
            try:
                outcome["exists"] = io.reach(io.client(fs_url, conf), base)
            except BaseException as e:  # noqa: BLE001 - reported to the starting server
                outcome["error"] = e
            finally:
                done.set()

        threading.Thread(target=attempt, name="hdfs-precheck", daemon=True).start()
        if not done.wait(timeout_s):
            raise HdfsPrecheckError(f"hdfs_store.precheck_enable: remote storage {path} did not answer within "
                                    f"{timeout_s:g}s (hdfs_store.write_timeout_sec); not starting")
        if "error" in outcome:
            err = outcome["error"]
            raise HdfsPrecheckError(f"hdfs_store.precheck_enable: remote storage {path} cannot be reached: "
                                    f"{type(err).__name__}: {err}; not starting")
        reached.append(f"{path} ({'exists' if outcome['exists'] else 'not created yet'})")
    return reached

