"""One server per data path: an exclusive ``flock`` on ``<data_path>/.riffle.lock``.

A second ``riffle-server`` started on a data path a running one uses would run restart
recovery on the live server's files (cutting what it takes for torn appends, removing what
it takes for unusable directories) before failing on its port. ``lock_data_paths`` is the
first thing ``ShuffleServer.start`` does, before recovery, before any actor or port:

- it creates the data path if needed and opens ``.riffle.lock`` in it (``O_NOFOLLOW``, a
  regular file only), then takes ``flock(LOCK_EX | LOCK_NB)``;
- held: the file is rewritten with the holder's pid and start time (one JSON line); the
  locked descriptor (read-only, so a read-only remount is not blocked) is kept open for the
  life of the server and released by ``DataPathLocks.release`` at stop; the
  kernel releases it when the process dies, however it dies (no stale lock after a crash or
  SIGKILL, unlike a pid file);
- taken by another process (or another server in this process): ``DataPathLockedError`` (an
  ``OSError``, ``EWOULDBLOCK``) naming the path and the holder's pid and start time as its
  file says, and every lock taken so far is released. The daemon logs it as one line and
  exits 1;
- the data path cannot be created or the file cannot be opened for another reason (a dead
  disk, a read-only mount): logged, and the path is left unlocked, so the server still starts
  with that disk quarantined by its probes, as before.

Blocking and quick; called once at start-up.

See also: ``riffle_actors.server``, ``docs/recovery.md``, ``docs/security.md``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from loguru import logger

LOCK_FILE = ".riffle.lock"


class DataPathLockedError(OSError):
    """Another process holds a data path's lock; ``holder`` is what its lock file says."""

    def __init__(self, path: str, holder: dict):
        self.path = path
        self.holder = holder
        pid = holder.get("pid", "unknown")
        started = holder.get("started", "unknown")
        super().__init__(errno.EWOULDBLOCK, f"data path {path} is in use by another riffle-server (pid {pid}, "
                                            f"started {started}; lock {os.path.join(path, LOCK_FILE)}); "
                                            f"not starting")

    def __str__(self) -> str:
        return self.strerror or super().__str__()


@dataclass(eq=False)
class DataPathLocks:
    """The held locks (one descriptor per data path); ``release`` closes them. Idempotent."""

    fds: dict[str, int] = field(default_factory=dict)

    def release(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)  # closing the last descriptor drops the flock
            except OSError:
                pass
        self.fds.clear()


def _holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        value = json.loads(raw.decode("utf-8", "replace") or "{}")
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _open_lock(path: str) -> int:
    os.makedirs(path, exist_ok=True)
    # read-only: flock needs no write access, and a descriptor open for writing would keep the file
    # system from being remounted read-only (the kernel does that to a failing disk)
    fd = os.open(os.path.join(path, LOCK_FILE),
                 os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ENXIO, f"{os.path.join(path, LOCK_FILE)} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_data_paths(paths: Iterable[str]) -> DataPathLocks:
    """Lock every data path; ``DataPathLockedError`` when one is held elsewhere (see the module docstring)."""
    locks = DataPathLocks()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        for path in paths:
            try:
                fd = _open_lock(path)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise OSError(errno.ELOOP, f"{os.path.join(path, LOCK_FILE)} is a symlink; not starting") from None
                logger.bind(disk=path).error("data path {}: cannot open its lock file ({}); it is not locked", path, e)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise DataPathLockedError(path, holder) from None
            except OSError as e:
                os.close(fd)
                logger.bind(disk=path).error("data path {}: cannot lock it ({}); it is not locked", path, e)
                continue
            locks.fds[path] = fd
            try:
                text = json.dumps({"pid": os.getpid(), "started": started}) + "\n"
                wfd = os.open(os.path.join(path, LOCK_FILE), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.write(wfd, text.encode())
                finally:
                    os.close(wfd)
            except OSError as e:  # the lock holds all the same; only the note for the next one is missing
                logger.bind(disk=path).warning("data path {}: could not write the lock holder: {}", path, e)
    except BaseException:
        locks.release()
        raise
    return locks
