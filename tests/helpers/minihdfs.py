"""A real HDFS for tests: Hadoop's MiniDFSCluster in a JVM, through our launcher (scripts/hdfs/MiniHdfs.java).

``MiniHdfs.start(base_dir)`` runs ``java MiniHdfs <base_dir> <datanodes>`` with the jars that
``scripts/e2e_setup.sh`` put in ``.cache/hdfs-jars`` (NameNode and DataNodes on ephemeral
127.0.0.1 ports) and waits for its ``NAMENODE hdfs://...`` / ``READY`` lines. ``command(line)``
sends one of the launcher's commands (``stop-datanode 0``, ``restart-datanode 0``,
``stop-namenode``, ``restart-namenode``) and waits for its answer. ``stop()`` shuts it down and
kills the JVM if it does not exit; closing its stdin (our process dying) also ends it.

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
