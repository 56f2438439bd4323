"""``riffle-ctl bench disk append|read|profile`` and ``bench hdfs append``: how fast a data path
writes and reads, in Riffle's command shapes (``riffle-ctl/src/actions/disk_*``).

- ``append``: ``--concurrency`` writers, each appending ``--batch-number`` batches of
  ``--write-size`` to its own file ``disk-bench-<i>`` in ``--dir`` (one ``fsync`` per file at
  the end, counted). ``--throttle`` limits the writers together to ``--disk-throughput`` bytes per
  second with the server's own disk throttle (``actors.disk.DiskThrottle``, the
  ``[localfile_store.io_limiter]`` bucket), as Riffle's bench uses its IO limiter. ``--direct`` writes with ``O_DIRECT`` (sizes must be multiples of 4096).
- ``read``: writes the files first (its own ``append (setup)`` row), drops them from the page
  cache (``posix_fadvise DONTNEED``), then ``--concurrency`` readers read ``--batch-number``
  batches of ``--read-size`` each; ``--read-ahead`` asks the kernel for sequential read-ahead
  (``FADV_SEQUENTIAL``; otherwise ``FADV_RANDOM``), ``--sleep-millis-per-batch`` pauses a reader
  between batches.
- ``profile``: every block size from ``--min-block-size`` to ``--max-block-size`` (doubling) ×
  every concurrency from ``--min-concurrency`` to ``--max-concurrency`` (doubling), each appended
  for ``--test-duration-secs``; the best concurrency of each block size is marked.

Files are removed afterwards, also on failure or Ctrl-C. Each result row gives bytes, seconds,
MB/s (10^6 bytes per second of wall time, fsync included) and the latency of one call (p50 / p95 /
p99 / max). A progress bar on stderr shows bytes done and MB/s on the same counters and clock, and
its last figure is the row's.

``run_hdfs_bench``: an ``hdfs://`` / ``viewfs://`` file instead, through the HDFS tier's IO layer
(``riffle_actors.io.hdfs``): an append pass (open, write one batch, close, as the tier appends a
batch) and a read pass.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
from rich.text import Text

from riffle_actors.actors.disk import DiskThrottle

ALIGN = 4096
FILE_PREFIX = "disk-bench-"  # Riffle's name of the bench files
PROFILE_PREFIX = "profile_test_"
#: Bounds of the bench arguments (a bench must not fill a disk by a typo)
MAX_CONCURRENCY = 1024
MAX_TOTAL_BYTES = 1 << 40


@dataclass
class PassResult:
    mode: str
    bytes: int = 0
    seconds: float = 0.0
    latencies_s: list[float] | None = None
    skipped: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        lat = sorted(self.latencies_s or [0.0])
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000

    def as_row(self) -> dict[str, object]:
        if self.skipped:
            return {"mode": self.mode, **self.extra, "skipped": self.skipped}
        return {"mode": self.mode, **self.extra, "bytes": self.bytes, "seconds": round(self.seconds, 4),
                "mb_per_s": round(self.mb_per_s, 1), "p50_ms": round(self.percentile_ms(0.50), 3),
                "p95_ms": round(self.percentile_ms(0.95), 3), "p99_ms": round(self.percentile_ms(0.99), 3),
                "max_ms": round(max(self.latencies_s or [0.0]) * 1000, 3), "blocks": len(self.latencies_s or [])}


def _pattern(block_size: int) -> bytes:
    # not all zeros, so a compressing or deduplicating file system cannot cheat
    seed = os.urandom(min(block_size, 1 << 16))
    return (seed * (block_size // len(seed) + 1))[:block_size]


class _Rate(ProgressColumn):
    """MB/s of a task: its ``mbps`` field, set from the same counters as the result row."""

    def render(self, task) -> Text:
        return Text(f"{task.fields.get('mbps', 0.0):8.1f} MB/s")


def _progress(progress_file) -> Progress:
    return Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                    _Rate(), console=None if progress_file is None else _console(progress_file), transient=False)


class _Counter:
    def __init__(self) -> None:
        self.bytes = 0
        self.lat: list[float] = []
        self.lock = threading.Lock()

    def add(self, n: int, lat: float) -> None:
        with self.lock:
            self.bytes += n
            self.lat.append(lat)


def _check_dir(path: str) -> None:
    if not os.path.isdir(path):
        raise OSError(f"{path} is not a directory")


def _check_sizes(concurrency: int, batches: int, size: int, direct: bool, what: str) -> None:
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"--concurrency must be 1..{MAX_CONCURRENCY}")
    if batches < 1:
        raise ValueError("--batch-number must be at least 1")
    if size <= 0:
        raise ValueError(f"--{what} must be positive")
    if direct and size % ALIGN:
        raise ValueError(f"--{what} must be a multiple of {ALIGN} with --direct (O_DIRECT alignment)")
    if concurrency * batches * size > MAX_TOTAL_BYTES:
        raise ValueError(f"the bench would write {concurrency * batches * size} bytes, more than {MAX_TOTAL_BYTES}")


def _run_threads(n: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"bench-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # a join with a timeout keeps Ctrl-C responsive
            t.join(0.1)
    if errors:
        raise errors[0]


def _watch(progress: Progress, task, counter: _Counter, start: float, done: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not done.wait(0.2):
            elapsed = time.perf_counter() - start
            progress.update(task, completed=counter.bytes,
                            mbps=counter.bytes / elapsed / 1e6 if elapsed > 0 else 0.0)

    t = threading.Thread(target=loop, daemon=True, name="bench-progress")
    t.start()
    return t


def _append_files(dir_: str, names: list[str], batches: int, size: int, *, bucket: DiskThrottle | None,
                  direct: bool, progress: Progress, mode: str, stop_at: float | None = None) -> PassResult:
    """One writer thread per file; ``stop_at`` (perf_counter) ends a timed pass instead of ``batches``."""
    data = _pattern(size)
    total = len(names) * batches * size if stop_at is None else None
    task = progress.add_task(mode, total=total, mbps=0.0)
    counter = _Counter()
    done = threading.Event()
    start = time.perf_counter()
    watcher = _watch(progress, task, counter, start, done)

    def write(i: int) -> None:
        path = os.path.join(dir_, names[i])
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        fd = os.open(path, flags, 0o600)
        buf = None
        try:
            if direct:
                buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
                buf[:] = data
            offset, n = 0, 0
            while (n < batches) if stop_at is None else (time.perf_counter() < stop_at):
                if bucket is not None:
                    bucket.wait("write", size)
                t = time.perf_counter()
                w = os.pwritev(fd, [buf], offset) if buf is not None else os.pwrite(fd, data, offset)
                if w <= 0:
                    raise OSError(f"{mode}: short write at offset {offset} of {path}")
                counter.add(w, time.perf_counter() - t)
                offset += w
                n += 1
            os.fsync(fd)
        finally:
            os.close(fd)
            if buf is not None:
                buf.close()

    try:
        _run_threads(len(names), write)
    finally:
        done.set()
        watcher.join()
    result = PassResult(mode, bytes=counter.bytes, seconds=time.perf_counter() - start, latencies_s=counter.lat)
    progress.update(task, completed=counter.bytes, total=counter.bytes or 1, mbps=result.mb_per_s)
    return result


def _remove(dir_: str, names: list[str]) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(dir_, name))
        except FileNotFoundError:
            pass


def _direct_ok(dir_: str) -> None:
    if not hasattr(os, "O_DIRECT"):
        raise OSError("O_DIRECT is not available on this platform")
    probe = os.path.join(dir_, f".{FILE_PREFIX}probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError as e:
        raise OSError(f"the file system of {dir_} refuses O_DIRECT ({e.strerror})") from None
    finally:
        try:
            os.unlink(probe)
        except FileNotFoundError:
            pass


def run_append(dir_: str, *, concurrency: int, batch_number: int, write_size: int, disk_throughput: int | None,
               throttle: bool, direct: bool = False, progress_file=None) -> list[PassResult]:
    """``bench disk append``; raises ``OSError`` (a missing dir, O_DIRECT refused) and ``ValueError``."""
    _check_sizes(concurrency, batch_number, write_size, direct, "write-size")
    if throttle and not disk_throughput:
        raise ValueError("--throttle needs --disk-throughput (bytes per second, e.g. 100M)")
    _check_dir(dir_)
    if direct:
        _direct_ok(dir_)
    if throttle and disk_throughput is not None and disk_throughput <= 0:
        raise ValueError("--disk-throughput must be positive")
    # the server's own disk throttle ([localfile_store.io_limiter] with capacity = --disk-throughput)
    bucket = DiskThrottle(int(disk_throughput)) if throttle and disk_throughput else None
    names = [f"{FILE_PREFIX}{i}" for i in range(concurrency)]
    progress = _progress(progress_file)
    try:
        with progress:
            r = _append_files(dir_, names, batch_number, write_size, bucket=bucket, direct=direct, progress=progress,
                              mode="append" + (" O_DIRECT" if direct else "") + (" throttled" if bucket else ""))
    finally:
        _remove(dir_, names)
    r.extra = {"concurrency": concurrency,
               **({"limit_mb_per_s": round(bucket.bucket.rate / 1e6, 1)} if bucket is not None else {})}
    return [r]


def run_read(dir_: str, *, concurrency: int, batch_number: int, read_size: int, read_ahead: bool,
             sleep_millis_per_batch: int = 0, direct: bool = False, progress_file=None) -> list[PassResult]:
    """``bench disk read``: write the files, drop them from the page cache, read them back."""
    _check_sizes(concurrency, batch_number, read_size, direct, "read-size")
    if sleep_millis_per_batch < 0:
        raise ValueError("--sleep-millis-per-batch must not be negative")
    _check_dir(dir_)
    if direct:
        _direct_ok(dir_)
    names = [f"{FILE_PREFIX}{i}" for i in range(concurrency)]
    progress = _progress(progress_file)
    try:
        with progress:
            setup = _append_files(dir_, names, batch_number, read_size, bucket=None, direct=direct,
                                  progress=progress, mode="append (setup)")
            setup.extra = {"concurrency": concurrency}
            task = progress.add_task("read" + (" O_DIRECT" if direct else ""),
                                     total=concurrency * batch_number * read_size, mbps=0.0)
            counter = _Counter()
            done = threading.Event()
            start = time.perf_counter()
            watcher = _watch(progress, task, counter, start, done)

            def read(i: int) -> None:
                fd = os.open(os.path.join(dir_, names[i]), os.O_RDONLY | (os.O_DIRECT if direct else 0))
                buf = mmap.mmap(-1, read_size) if direct else None
                try:
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL if read_ahead else os.POSIX_FADV_RANDOM)
                    offset = 0
                    for _ in range(batch_number):
                        t = time.perf_counter()
                        n = os.preadv(fd, [buf], offset) if buf is not None else len(os.pread(fd, read_size, offset))
                        if n <= 0:
                            raise OSError(f"read: short read at offset {offset} of {names[i]}")
                        counter.add(n, time.perf_counter() - t)
                        offset += n
                        if sleep_millis_per_batch:
                            time.sleep(sleep_millis_per_batch / 1000)
                finally:
                    os.close(fd)
                    if buf is not None:
                        buf.close()

            try:
                _run_threads(concurrency, read)
            finally:
                done.set()
                watcher.join()
            r = PassResult("read" + (" O_DIRECT" if direct else ""), bytes=counter.bytes,
                           seconds=time.perf_counter() - start, latencies_s=counter.lat,
                           extra={"concurrency": concurrency})
            progress.update(task, completed=counter.bytes, mbps=r.mb_per_s)
    finally:
        _remove(dir_, names)
    return [setup, r]


def _doubling(low: int, high: int) -> list[int]:
    out, v = [], low
    while v <= high:
        out.append(v)
        v *= 2
    return out


def run_profile(dir_: str, *, min_block_size: int, max_block_size: int, min_concurrency: int, max_concurrency: int,
                test_duration_s: float, progress_file=None) -> list[PassResult]:
    """``bench disk profile``: one timed append pass per (block size, concurrency); ``best`` marks the
    fastest concurrency of each block size."""
    if not 0 < min_block_size <= max_block_size:
        raise ValueError("need 0 < --min-block-size <= --max-block-size")
    if not 1 <= min_concurrency <= max_concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"need 1 <= --min-concurrency <= --max-concurrency <= {MAX_CONCURRENCY}")
    if not 0 < test_duration_s <= 3600:
        raise ValueError("--test-duration-secs must be in (0, 3600]")
    _check_dir(dir_)
    results: list[PassResult] = []
    progress = _progress(progress_file)
    names: list[str] = []
    try:
        with progress:
            for block in _doubling(min_block_size, max_block_size):
                row: list[PassResult] = []
                for conc in _doubling(min_concurrency, max_concurrency):
                    names = [f"{PROFILE_PREFIX}{i}" for i in range(conc)]
                    r = _append_files(dir_, names, 0, block, bucket=None, direct=False, progress=progress,
                                      mode=f"profile {block}B x{conc}",
                                      stop_at=time.perf_counter() + test_duration_s)
                    _remove(dir_, names)
                    r.mode = "profile"
                    r.extra = {"block_size": block, "concurrency": conc}
                    row.append(r)
                best = max(row, key=lambda r: r.mb_per_s)
                for r in row:
                    r.extra["best"] = r is best
                results += row
    finally:
        _remove(dir_, names)
    return results


def _console(file):
    from rich.console import Console

    return Console(file=file)


def default_progress_file():
    return sys.stderr


# --- HDFS ---------------------------------------------------------------------------------------

HDFS_SCHEMES = ("hdfs", "viewfs")


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


def _hdfs_pass(mode: str, total: int, op: Callable[[int], int], progress: Progress) -> PassResult:
    task = progress.add_task(mode, total=total, mbps=0.0)
    latencies: list[float] = []
    result = PassResult(mode, latencies_s=latencies)
    start = time.perf_counter()
    offset = 0
    while offset < total:
        t = time.perf_counter()
        n = op(offset)
        latencies.append(time.perf_counter() - t)
        if n <= 0:
            raise OSError(f"{mode}: short transfer at offset {offset}")
        offset += n
        elapsed = time.perf_counter() - start
        progress.update(task, completed=offset, mbps=offset / elapsed / 1e6 if elapsed > 0 else 0.0)
    result.seconds = time.perf_counter() - start
    result.bytes = offset
    progress.update(task, mbps=result.mb_per_s)
    return result


def run_hdfs_bench(file_url: str, *, size: int, block_size: int, progress_file=None,
                   hdfs_io=None) -> list[PassResult]:
    """``bench hdfs append``: write the file ``file_url`` (it must not exist; its directory must) with
    ``size`` bytes in ``block_size`` appends, the way the HDFS tier writes
    (``riffle_actors.io.hdfs.HdfsIO``: each append opens, writes, closes the file), then read it back
    in ``block_size`` reads. The file is deleted afterwards, also on failure or Ctrl-C.
    Raises ``OSError`` (unreachable NameNode, missing directory, existing file) and ``ValueError``."""
    from riffle_actors.io.hdfs import HdfsIO, HdfsUnavailableError

    if block_size <= 0:
        raise ValueError("--batch-size must be positive")
    if size < block_size:
        raise ValueError("--total-size must be at least one batch")
    if size > MAX_TOTAL_BYTES:
        raise ValueError(f"--total-size must be at most {MAX_TOTAL_BYTES}")
    total = size - size % block_size
    fs_url, path = split_hdfs_url(file_url)
    path = path.rstrip("/")
    directory = path.rsplit("/", 1)[0] or "/"
    if not path or path == directory:
        raise ValueError(f"{file_url}: --file-path names a file, e.g. hdfs://nn:8020/tmp/bench.data")
    _probe_namenode(fs_url)
    io_ = hdfs_io or HdfsIO()
    try:
        client = io_.client(fs_url)
    except HdfsUnavailableError as e:
        raise OSError(str(e)) from None
    where = f"{fs_url}{directory}"
    try:
        if not client.get_file_info(directory).isdir:
            raise OSError(f"{where} is not a directory")
    except FileNotFoundError:
        raise OSError(f"{where} is not a directory") from None
    except (RuntimeError, OSError) as e:
        if isinstance(e, OSError) and "is not a directory" in str(e):
            raise
        raise OSError(f"{where}: {e}") from None
    try:
        client.get_file_info(path)
        raise OSError(f"{file_url} exists; name a new file (the bench deletes it afterwards)")
    except FileNotFoundError:
        pass
    data = _pattern(block_size)
    results: list[PassResult] = []
    progress = _progress(progress_file)
    created = False
    try:
        with progress:
            def append(offset: int) -> int:
                nonlocal created
                io_.write_file(client, path, (data,), create=offset == 0)
                created = True
                return len(data)

            results.append(_hdfs_pass("hdfs append", total, append, progress))
            with client.read(path) as reader:
                results.append(_hdfs_pass("hdfs read", total, lambda _o: len(reader.read(block_size)), progress))
    except RuntimeError as e:  # hdfs-native reports some server errors as RuntimeError
        raise OSError(f"{file_url}: {e}") from None
    finally:  # the file did not exist before the bench: removing it is always safe
        _remove_hdfs_scratch(client, path, created)
    return results


def _remove_hdfs_scratch(client, scratch: str, created: bool) -> None:
    try:
        client.delete(scratch, False)
    except FileNotFoundError:
        pass
    except (OSError, RuntimeError) as e:
        if created:
            print(f"riffle-ctl: bench hdfs append: could not remove {scratch}: {e}", file=sys.stderr)
