"""``riffle-ctl disk-bench PATH``: how fast a data path writes and reads, the way the server uses it.

Four passes over one scratch file in ``PATH`` (removed afterwards, also on failure or Ctrl-C),
each in blocks of ``--block-size``:

1. buffered write (``write`` then one ``fsync``, which is counted: the data must reach the disk),
2. buffered read (after ``posix_fadvise(DONTNEED)``, so it reads the disk, not the page cache),
3. ``O_DIRECT`` write (page-aligned buffer; ``fdatasync`` at the end),
4. ``O_DIRECT`` read.

Each pass reports MB/s (10^6 bytes per second of wall time) and the latency of one block call
(p50 / p95 / p99 / max). A file system without ``O_DIRECT`` (tmpfs) gets a line saying so
instead of figures. A progress bar (rich) runs on stderr; results go to stdout.

``run_hdfs_bench``: an ``hdfs://`` / ``viewfs://`` directory instead, through the HDFS tier's IO
layer (``riffle_actors.io.hdfs``): an append pass (open, write one block, close, as the tier
appends a batch) and a read pass; the ``O_DIRECT`` passes say they do not apply.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from dataclasses import dataclass

from rich.progress import BarColumn, Progress, TextColumn, TransferSpeedColumn

ALIGN = 4096


@dataclass
class PassResult:
    mode: str
    bytes: int = 0
    seconds: float = 0.0
    latencies_s: list[float] | None = None
    skipped: str | None = None

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        lat = sorted(self.latencies_s or [0.0])
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000

    def as_row(self) -> dict[str, object]:
        if self.skipped:
            return {"mode": self.mode, "skipped": self.skipped}
        return {"mode": self.mode, "bytes": self.bytes, "seconds": round(self.seconds, 4),
                "mb_per_s": round(self.mb_per_s, 1), "p50_ms": round(self.percentile_ms(0.50), 3),
                "p95_ms": round(self.percentile_ms(0.95), 3), "p99_ms": round(self.percentile_ms(0.99), 3),
                "max_ms": round(max(self.latencies_s or [0.0]) * 1000, 3), "blocks": len(self.latencies_s or [])}


def _pattern(block_size: int) -> bytes:
    # not all zeros, so a compressing or deduplicating file system cannot cheat
    seed = os.urandom(min(block_size, 1 << 16))
    return (seed * (block_size // len(seed) + 1))[:block_size]


def _run(mode: str, fd: int, total: int, block: int, op, progress: Progress) -> PassResult:
    task = progress.add_task(mode, total=total)
    result = PassResult(mode, latencies_s=[])
    start = time.perf_counter()
    offset = 0
    while offset < total:
        t = time.perf_counter()
        n = op(fd, offset)
        result.latencies_s.append(time.perf_counter() - t)
        if n <= 0:
            raise OSError(f"{mode}: short transfer at offset {offset}")
        offset += n
        progress.update(task, advance=n)
    result.seconds = time.perf_counter() - start
    result.bytes = offset
    return result


def run_bench(path: str, *, size: int, block_size: int, direct: bool = True,
              progress_file=None) -> list[PassResult]:
    """Run the passes; raises ``OSError`` (e.g. PATH missing) and ``ValueError`` (bad sizes)."""
    if block_size <= 0 or block_size % ALIGN:
        raise ValueError(f"--block-size must be a positive multiple of {ALIGN} (O_DIRECT alignment)")
    if size < block_size:
        raise ValueError("--size must be at least one block")
    total = size - size % block_size
    if not os.path.isdir(path):
        raise OSError(f"{path} is not a directory")
    scratch = os.path.join(path, f".riffle-disk-bench-{os.getpid()}.dat")
    data = _pattern(block_size)
    results: list[PassResult] = []
    progress = Progress(TextColumn("{task.description:<16}"), BarColumn(), TransferSpeedColumn(),
                        console=None if progress_file is None else _console(progress_file), transient=False)
    try:
        with progress:
            fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                r = _run("buffered write", fd, total, block_size, lambda f, o: os.write(f, data), progress)
                t = time.perf_counter()
                os.fsync(fd)
                r.seconds += time.perf_counter() - t
                results.append(r)
            finally:
                os.close(fd)
            fd = os.open(scratch, os.O_RDONLY)
            try:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                results.append(_run("buffered read", fd, total, block_size,
                                    lambda f, o: len(os.pread(f, block_size, o)), progress))
            finally:
                os.close(fd)
            if direct:
                results.extend(_direct_passes(scratch, total, block_size, data, progress))
    finally:
        try:
            os.unlink(scratch)
        except FileNotFoundError:
            pass
    return results


def _direct_passes(scratch: str, total: int, block: int, data: bytes, progress: Progress) -> list[PassResult]:
    if not hasattr(os, "O_DIRECT"):
        return [PassResult("O_DIRECT write", skipped="O_DIRECT is not available on this platform"),
                PassResult("O_DIRECT read", skipped="O_DIRECT is not available on this platform")]
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    buf[:] = data
    try:
        try:
            fd = os.open(scratch, os.O_WRONLY | os.O_DIRECT)
        except OSError as e:
            why = f"the file system refuses O_DIRECT ({e.strerror})"
            return [PassResult("O_DIRECT write", skipped=why), PassResult("O_DIRECT read", skipped=why)]
        try:
            try:
                w = _run("O_DIRECT write", fd, total, block, lambda f, o: os.pwritev(f, [buf], o), progress)
            except OSError as e:
                why = f"the file system refuses O_DIRECT writes ({e.strerror or e})"
                return [PassResult("O_DIRECT write", skipped=why), PassResult("O_DIRECT read", skipped=why)]
            t = time.perf_counter()
            os.fdatasync(fd)
            w.seconds += time.perf_counter() - t
        finally:
            os.close(fd)
        fd = os.open(scratch, os.O_RDONLY | os.O_DIRECT)
        try:
            r = _run("O_DIRECT read", fd, total, block, lambda f, o: os.preadv(f, [buf], o), progress)
        finally:
            os.close(fd)
        return [w, r]
    finally:
        buf.close()


def _console(file):
    from rich.console import Console

    return Console(file=file)


def default_progress_file():
    return sys.stderr


# --- HDFS ---------------------------------------------------------------------------------------

HDFS_SCHEMES = ("hdfs", "viewfs")
HDFS_NO_DIRECT = "O_DIRECT does not apply to HDFS (the DataNodes own the disks)"


def is_hdfs_url(path: str) -> bool:
    return path.split("://", 1)[0].lower() in HDFS_SCHEMES if "://" in path else False


def split_hdfs_url(url: str) -> tuple[str, str]:
    """``hdfs://nn:8020/some/dir`` -> (``hdfs://nn:8020``, ``/some/dir``); a bare path (``--hdfs``)
    -> ("", path): the client's default file system (``fs.defaultFS`` of the Hadoop config)."""
    from urllib.parse import urlsplit

    if "://" not in url:
        return "", url if url.startswith("/") else "/" + url
    u = urlsplit(url)
    if u.scheme.lower() not in HDFS_SCHEMES:
        raise ValueError(f"{url}: not an hdfs:// or viewfs:// URL")
    return f"{u.scheme}://{u.netloc}", u.path or "/"


def _probe_namenode(fs_url: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a NameNode that does not accept connections: hdfs-native retries a refused
    connection for minutes. Only for ``hdfs://host:port`` (a viewfs or HA name is left to the client)."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(fs_url)
    if u.scheme.lower() != "hdfs" or not u.hostname or u.port is None:
        return
    try:
        socket.create_connection((u.hostname, u.port), timeout=timeout_s).close()
    except OSError as e:
        raise OSError(f"{fs_url}: NameNode unreachable ({e.strerror or e})") from None


def run_hdfs_bench(url: str, *, size: int, block_size: int, progress_file=None, hdfs_io=None) -> list[PassResult]:
    """Write a scratch file of ``size`` in ``block_size`` appends, the way the HDFS tier writes
    (``riffle_actors.io.hdfs.HdfsIO``: each append opens, writes, closes the file), then read it
    back in ``block_size`` reads. The scratch file is deleted afterwards, also on failure or Ctrl-C.
    Raises ``OSError`` (unreachable NameNode, missing directory) and ``ValueError`` (bad sizes)."""
    from riffle_actors.io.hdfs import HdfsIO, HdfsUnavailableError

    if block_size <= 0:
        raise ValueError("--block-size must be positive")
    if size < block_size:
        raise ValueError("--size must be at least one block")
    total = size - size % block_size
    fs_url, directory = split_hdfs_url(url)
    _probe_namenode(fs_url)
    io_ = hdfs_io or HdfsIO()
    try:
        client = io_.client(fs_url)
    except HdfsUnavailableError as e:
        raise OSError(str(e)) from None
    try:
        if not client.get_file_info(directory).isdir:
            raise OSError(f"{url} is not a directory")
    except FileNotFoundError:
        raise OSError(f"{url} is not a directory") from None
    except (RuntimeError, OSError) as e:
        if isinstance(e, OSError) and "is not a directory" in str(e):
            raise
        raise OSError(f"{url}: {e}") from None
    scratch = directory.rstrip("/") + f"/.riffle-disk-bench-{os.getpid()}-{os.urandom(4).hex()}.dat"
    data = _pattern(block_size)
    results: list[PassResult] = []
    progress = Progress(TextColumn("{task.description:<16}"), BarColumn(), TransferSpeedColumn(),
                        console=None if progress_file is None else _console(progress_file), transient=False)
    created = False
    try:
        with progress:
            def append(_f, offset: int) -> int:
                nonlocal created
                io_.write_file(client, scratch, (data,), create=offset == 0)
                created = True
                return len(data)

            results.append(_run("hdfs write", None, total, block_size, append, progress))
            with client.read(scratch) as reader:
                results.append(_run("hdfs read", None, total, block_size,
                                    lambda _f, _o: len(reader.read(block_size)), progress))
            results += [PassResult("O_DIRECT write", skipped=HDFS_NO_DIRECT),
                        PassResult("O_DIRECT read", skipped=HDFS_NO_DIRECT)]
    except RuntimeError as e:  # hdfs-native reports some server errors as RuntimeError
        raise OSError(f"{url}: {e}") from None
    finally:
        _remove_hdfs_scratch(client, scratch, created)
    return results


def _remove_hdfs_scratch(client, scratch: str, created: bool) -> None:
    try:
        client.delete(scratch, False)
    except FileNotFoundError:
        pass
    except (OSError, RuntimeError) as e:
        if created:
            print(f"riffle-ctl: disk-bench: could not remove {scratch}: {e}", file=sys.stderr)
