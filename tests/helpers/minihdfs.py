"""A real HDFS for tests: Hadoop's MiniDFSCluster in a JVM, through our launcher (scripts/hdfs/MiniHdfs.java).

``MiniHdfs.start(base_dir)`` runs ``java MiniHdfs <base_dir> <datanodes>`` with the jars that
``scripts/e2e_setup.sh`` put in ``.cache/hdfs-jars`` (NameNode and DataNodes on ephemeral
127.0.0.1 ports) and waits for its ``NAMENODE hdfs://...`` / ``READY`` lines. ``command(line)``
sends one of the launcher's commands (``stop-datanode 0``, ``restart-datanode 0``,
``stop-namenode``, ``restart-namenode``) and waits for its answer. ``stop()`` shuts it down and
kills the JVM if it does not exit; closing its stdin (our process dying) also ends it.

``KerberizedMiniHdfs.start(base_dir, ["riffle/localhost"])`` runs scripts/hdfs/KerberizedMiniHdfs.java
instead: Hadoop's MiniKdc (a real KDC) and a Kerberized MiniDFSCluster (kerberos authentication,
block access tokens, SASL data transfer protection) at ``hdfs://localhost:<port>``, with one keytab
per client principal (``keytabs``) and the ``krb5_conf`` that reaches the KDC (for ``KRB5_CONFIG``);
its jars (hadoop-minikdc, scripts/hdfs/minikdc-pom.xml) are in ``.cache/kdc-jars``
(``RIFFLE_KDC_CACHE``); ``kerberos_prerequisite()`` says why it cannot start.

``hdfs_prerequisite()`` says why a test cannot run (no java, jars not fetched): the tests
``pytest.skip`` with it, which CI (RIFFLE_TESTS_REQUIRE_ALL=1) turns into a failure.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HDFS_CACHE = Path(os.environ.get("RIFFLE_HDFS_CACHE", REPO / ".cache" / "hdfs-jars"))
KDC_CACHE = Path(os.environ.get("RIFFLE_KDC_CACHE", REPO / ".cache" / "kdc-jars"))


def hdfs_prerequisite() -> str | None:
    """None when a MiniDFSCluster can start here, else the reason it cannot."""
    if shutil.which("java") is None:
        return "java is not installed (the MiniDFSCluster needs Java 17)"
    if not list(HDFS_CACHE.glob("hadoop-client-minicluster-*.jar")):
        return f"no hadoop-client-minicluster jar in {HDFS_CACHE}: run scripts/e2e_setup.sh"
    if not (HDFS_CACHE / "classes" / "MiniHdfs.class").is_file():
        return f"the MiniHdfs launcher is not compiled in {HDFS_CACHE}/classes: run scripts/e2e_setup.sh"
    try:
        import hdfs_native  # noqa: F401
    except ImportError:
        return "the hdfs-native package is not installed"
    return None


def kerberos_prerequisite() -> str | None:
    """None when the Kerberized MiniDFSCluster can start here, else the reason it cannot."""
    reason = hdfs_prerequisite()
    if reason:
        return reason
    if not list(KDC_CACHE.glob("hadoop-minikdc-*.jar")):
        return f"no hadoop-minikdc jar in {KDC_CACHE}: run scripts/e2e_setup.sh"
    if not (KDC_CACHE / "classes" / "KerberizedMiniHdfs.class").is_file():
        return f"the KerberizedMiniHdfs launcher is not compiled in {KDC_CACHE}/classes: run scripts/e2e_setup.sh"
    return None


class MiniHdfs:
    def __init__(self, proc: subprocess.Popen[str], log_path: Path):
        self.proc = proc
        self.log_path = log_path
        self.url = ""
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, base_dir: Path, datanodes: int = 1, timeout: float = 120.0) -> MiniHdfs:
        base_dir.mkdir(parents=True, exist_ok=True)
        log_path = base_dir / "minihdfs.log"
        cp = os.pathsep.join([str(HDFS_CACHE / "*"), str(HDFS_CACHE / "classes")])
        with open(log_path, "w") as log:  # the JVM keeps its own descriptor of the log
            proc = subprocess.Popen(
                ["java", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", cp, "MiniHdfs",
                 str(base_dir / "dfs"), str(datanodes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        hdfs = cls(proc, log_path)
        try:
            line = hdfs._expect(lambda s: s.startswith("NAMENODE "), timeout, "the NameNode URI")
            hdfs.url = line.split()[1]
            hdfs._expect(lambda s: s == "READY", timeout, "READY")
        except BaseException:
            hdfs.stop()
            raise
        return hdfs

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _expect(self, pred, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"MiniDFSCluster: no {what} within {timeout}s; log: {self.log_tail()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"MiniDFSCluster exited (code {self.proc.poll()}) before {what}; "
                                     f"log: {self.log_tail()}")
            if pred(line):
                return line

    def command(self, cmd: str, timeout: float = 120.0) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self._expect(lambda s: s.startswith(("OK ", "ERR ")) and s.split(":")[0].endswith(cmd)
                            or s == f"OK {cmd}", timeout, f"an answer to {cmd!r}")
        if line.startswith("ERR"):
            raise AssertionError(f"MiniDFSCluster refused {cmd!r}: {line}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "<no log>"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("shutdown\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class KerberizedMiniHdfs(MiniHdfs):
    """MiniKdc + a Kerberized MiniDFSCluster (scripts/hdfs/KerberizedMiniHdfs.java)."""

    krb5_conf: str = ""
    realm: str = ""
    keytabs: dict[str, str]  # principal@REALM -> keytab path

    @classmethod
    def start(cls, base_dir: Path, principals: list[str] | int = 1, timeout: float = 180.0) -> KerberizedMiniHdfs:
        if isinstance(principals, int):
            principals = ["riffle/localhost"]
        base_dir.mkdir(parents=True, exist_ok=True)
        log_path = base_dir / "kerberized-minihdfs.log"
        cp = os.pathsep.join([str(HDFS_CACHE / "*"), str(KDC_CACHE / "*"), str(KDC_CACHE / "classes")])
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                ["java", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", cp,
                 "KerberizedMiniHdfs", str(base_dir), *principals],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        hdfs = cls(proc, log_path)
        hdfs.keytabs = {}
        try:
            while True:
                line = hdfs._expect(lambda s: s.split(" ", 1)[0] in ("KRB5_CONF", "REALM", "KEYTAB", "NAMENODE"),
                                    timeout, "the cluster's KDC and NameNode lines")
                word, _, rest = line.partition(" ")
                if word == "KRB5_CONF":
                    hdfs.krb5_conf = rest
                elif word == "REALM":
                    hdfs.realm = rest
                elif word == "KEYTAB":
                    principal, path = rest.split(" ", 1)
                    os.chmod(path, 0o600)  # as an operator keeps it (MiniKdc writes 0644; the server refuses that)
                    hdfs.keytabs[principal] = path
                else:
                    hdfs.url = rest
                    break
            hdfs._expect(lambda s: s == "READY", timeout, "READY")
        except BaseException:
            hdfs.stop()
            raise
        return hdfs
