"""Opening, listing and deleting below a data path without trusting what is there.

A data path holds what this server wrote, but anything else may have been put there: a
symlink to a file or directory outside (``/etc``, another disk), a FIFO, a device node, a
file far larger than anything the server writes. This module owns the rules every file
operation below a data path follows, so that none of those is ever followed, read or
deleted through:

- the data path itself (``root``) is the operator's: it is opened as configured (the config
  resolves it); every component **below** it is opened relative to its parent's descriptor
  with ``O_NOFOLLOW`` (``open_dir``: ``O_DIRECTORY | O_NOFOLLOW``), so a symlinked app or
  shuffle directory fails with ``ELOOP`` instead of leading elsewhere;
- a file is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once instead of waiting
  for a writer; ``O_NONBLOCK`` does nothing to a regular file) and then checked with
  ``fstat``: anything but a regular file is closed unread and refused with ``ENXIO``
  (``open_file``);
- listings use ``os.scandir`` on a directory descriptor and never follow a symlink
  (``list_dir``);
- deletion (``remove_below``) walks directory descriptors, unlinks every entry that is not a
  real directory (a symlink is removed, never its target) and deletes at most ``max_ops``
  entries per call, reporting each one to a ``RemovalProgress``, so a purge of a huge tree is
  done in bounded steps whose progress a caller can watch.

Names handed to these functions are single path components (``check_name``); a ``/``,
``.``, ``..`` or NUL is refused before any system call.

Every function blocks; the callers run them on a Disk actor's threads or a worker thread.

See also: ``riffle_actors.io.localfile``, ``riffle_actors.io.meta_store``, ``docs/security.md``
("Data directories are checked, not trusted").
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# what an entry is, from its lstat mode (never following it)
REGULAR, DIRECTORY, SYMLINK, FIFO, DEVICE, SOCKET, OTHER = ("file", "directory", "symlink", "FIFO", "device",
                                                            "socket", "unknown entry")


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return REGULAR
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISLNK(mode):
        return SYMLINK
    if stat.S_ISFIFO(mode):
        return FIFO
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return DEVICE
    if stat.S_ISSOCK(mode):
        return SOCKET
    return OTHER


def check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise OSError(errno.EINVAL, f"{name!r} is not a single path component")
    return name


def open_root(root: str) -> int:
    """The data path's descriptor (the operator's directory: opened as configured)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_subdir(dir_fd: int, name: str, *, create: bool = False) -> int:
    """``name`` below ``dir_fd`` as a directory, never through a symlink (``ELOOP``); ``create``: mkdir it."""
    check_name(name)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def open_dir(root: str, parts: Iterable[str], *, create: bool = False) -> int:
    """``root/part/...`` as a directory descriptor, each component below ``root`` opened with
    ``O_NOFOLLOW`` (``create``: missing ones are made, the data path too). The caller closes it."""
    try:
        fd = open_root(root)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(root, exist_ok=True)
        fd = open_root(root)
    try:
        for name in parts:
            sub = open_subdir(fd, name, create=create)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """``name`` below ``dir_fd`` opened with ``flags``, only if it is a regular file (else ``ENXIO``, or
    ``ELOOP`` for a symlink); never blocks on a FIFO. The caller closes it."""
    check_name(name)
    fd = os.open(name, flags | FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.ENXIO, f"{name} is a {kind_of(st.st_mode)}, not a regular file; not used")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(dir_fd: int, name: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The whole of regular file ``name`` (``open_file``) and its ``fstat``; ``EFBIG`` when it is larger
    than ``max_bytes`` (nothing is read then). Reads at most the size ``fstat`` gave."""
    fd = open_file(dir_fd, name, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{name} is {st.st_size} bytes, more than the {max_bytes} allowed")
        parts = []
        left = st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 16 << 20))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts), st
    finally:
        os.close(fd)


def list_dir(dir_fd: int) -> list[tuple[str, str]]:
    """``(name, kind)`` of every entry of the directory, sorted by name; symlinks are not followed."""
    out = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            out.append((entry.name, kind_of(mode)))
    out.sort()
    return out


@dataclass(slots=True)
class RemovalProgress:
    """Entries deleted so far by ``remove_below`` (read from another thread to tell a long deletion
    from a hung one)."""

    ops: int = 0


def _remove_entries(dir_fd: int, budget: int, progress: RemovalProgress) -> tuple[int, bool]:
    """Delete up to ``budget`` entries inside ``dir_fd`` (depth first); ``(used, now empty)``."""
    used = 0
    with os.scandir(dir_fd) as it:
        for entry in it:
            if used >= budget:
                return used, False
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if is_dir:
                try:
                    sub = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                try:
                    n, empty = _remove_entries(sub, budget - used, progress)
                finally:
                    os.close(sub)
                used += n
                if not empty:
                    return used, False
                _ignore_missing(os.rmdir, entry.name, dir_fd)
            else:  # a file, or a symlink / FIFO / device: the entry itself, never what it points to
                _ignore_missing(os.unlink, entry.name, dir_fd)
            used += 1
            progress.ops += 1
    return used, True


def _ignore_missing(op, name: str, dir_fd: int) -> None:
    try:
        op(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def remove_below(root: str, parts: Iterable[str], *, max_ops: int | None = None,
                 progress: RemovalProgress | None = None) -> bool:
    """Delete ``root/part/...`` (a directory tree, or a single entry of any kind), never following a
    symlink and never outside ``root``. At most ``max_ops`` entries per call (None: no limit);
    returns True when it is gone (or was never there), False when more calls are needed."""
    parts = [check_name(p) for p in parts]
    if not parts:
        raise OSError(errno.EINVAL, "refusing to remove a data path itself")
    progress = progress or RemovalProgress()
    budget = max_ops if max_ops is not None else 1 << 62
    try:
        parent = open_dir(root, parts[:-1])
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symlink on the way: nothing of ours below it
            return True
        raise
    name = parts[-1]
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode):
            _ignore_missing(os.unlink, name, parent)
            progress.ops += 1
            return True
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return True
        try:
            _used, empty = _remove_entries(fd, budget, progress)
        finally:
            os.close(fd)
        if not empty:
            return False
        _ignore_missing(os.rmdir, name, parent)
        progress.ops += 1
        return True
    finally:
        os.close(parent)


def check_secret_file(path: str, max_bytes: int = 1 << 20) -> os.stat_result:
    """Check a credentials file the operator configured (a Kerberos keytab) before it is handed to a
    library: an absolute path whose last component is not a symlink (``O_NOFOLLOW``), a regular file
    (not a FIFO or device: ``open_file``'s rule), owned by this process's user or root, writable by
    nobody else and readable by no other user (mode ``& 0o026`` is 0: ``0600``, ``0400``, ``0640``
    pass), not empty and at most ``max_bytes``. ``OSError`` with the reason otherwise."""
    if not os.path.isabs(path):
        raise OSError(errno.EINVAL, f"{path!r} is not an absolute path")
    parent, name = os.path.split(path)
    dir_fd = open_root(parent or "/")
    try:
        fd = open_file(dir_fd, name, os.O_RDONLY)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symlink; name the file itself") from None
        raise OSError(e.errno, f"{path}: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid not in (os.geteuid(), 0):
        raise OSError(errno.EPERM, f"{path} is owned by uid {st.st_uid}, neither this server's user "
                                   f"(uid {os.geteuid()}) nor root")
    if st.st_mode & 0o026:
        raise OSError(errno.EPERM, f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: other users may read it "
                                   f"or others may write it (chmod 600)")
    if st.st_size == 0 or st.st_size > max_bytes:
        raise OSError(errno.EFBIG, f"{path} is {st.st_size} bytes: not a credentials file (0 < size <= "
                                   f"{max_bytes})")
    return st
