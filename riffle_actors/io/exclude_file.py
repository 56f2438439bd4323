"""ExcludeFile: the coordinator's operator exclude-nodes file (``exclude_nodes_file``), read from disk.

One server id a line; blank lines and ``#`` comments are ignored (``parse_exclude_list``, pure).
``poll()`` stats the file and reads it again only when its ``(mtime_ns, size, inode)`` changed since
the last call: it answers the new set of ids, or None for "unchanged". A missing file means
"nobody excluded" (logged once until it appears); an unreadable one keeps the previous list
(logged each time). ``poll()`` blocks on the file system, so its caller runs it off the event loop
(``coordinator.actors.ClusterActor`` in a thread; the composition root once before it serves).

It does not cover: applying the list (``coordinator.cluster.ClusterRegistry.set_excluded``) or when
to poll (``exclude_nodes_check_interval_sec``, the composition root's timer).
"""

from __future__ import annotations

import os

from loguru import logger


class ExcludeFile:
    """See the module docstring."""

    _MISSING = (-1, -1, -1)

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) last read; None = never polled

    def poll(self) -> frozenset[str] | None:
        """The new set of excluded ids when the file changed since the last call, else None.

        A missing file means "nobody excluded"; an unreadable one keeps the previous list.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._stamp == self._MISSING:
                return None
            self._stamp = self._MISSING
            logger.warning("exclude_nodes_file {} does not exist: no server excluded", self.path)
            return frozenset()
        except OSError as e:
            logger.warning("cannot read exclude_nodes_file {}: {}", self.path, e)
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                ids = parse_exclude_list(f.read())
        except (OSError, UnicodeDecodeError) as e:
            logger.warning("cannot read exclude_nodes_file {}: {}", self.path, e)
            return None
        self._stamp = stamp
        return ids


def parse_exclude_list(text: str) -> frozenset[str]:
    """One server id a line; blank lines and ``#`` comments ignored."""
    ids = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return frozenset(i for i in ids if i)
