"""The HDFS file layout of shuffle data (spec §5.5): a contract, since clients read it directly.

This module owns the names only::

    <remotePath>/<appId>/<shuffleId>/<p>-<p>/<serverId>_<writerIndex>_<retry>.data
    <remotePath>/<appId>/<shuffleId>/<p>-<p>/<serverId>_<writerIndex>_<retry>.index

(Java 0.10 with writer concurrency > 1, and Riffle). The Uniffle reader
(``HadoopClientReadHandler``) lists the partition directory, keeps the ``.index`` files whose
name starts with the assigned server's id, and reads each with its sibling ``.data``; the
index records are the 40-byte ones of ``riffle_actors.protocol.index``. ``retry`` grows when a
write to a pair failed: an HDFS file whose append failed may stay leased, so a new pair starts.

``normalize_remote_path`` is the one spelling of a remote storage base that the server compares
(the operator's allow-list, ``hdfs_store.remote_storage``, against a client's
``RemoteStorage.path``): scheme ``hdfs`` or ``viewfs`` (lower case) or none (a bare absolute path
on the default file system), the authority as written, the path with empty components dropped.
Anything that could name another place than it seems is refused, not repaired: ``.`` or ``..``
components, ``%`` escapes, backslashes, whitespace or control characters, user info, a query, a
fragment, ``hdfs:///`` without a host. ``split_remote_path`` turns a base into the file system URL
and the base directory.

Every app id, shuffle id and partition id that becomes a path component here goes through
``riffle_actors.protocol.ids`` first, so no id can name a directory outside its app's.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import urlsplit

from riffle_actors.protocol.ids import check_app_id, check_partition_id, check_shuffle_id

__all__ = ["FilePair", "app_dir", "file_pair", "is_server_file", "normalize_remote_path", "partition_dir",
           "server_prefix", "shuffle_dir", "split_remote_path"]

_SCHEMES = ("hdfs", "viewfs")
_AUTHORITY_RE = re.compile(r"[A-Za-z0-9._-]+(:[0-9]{1,5})?", re.ASCII)
_FORBIDDEN_RE = re.compile(r"[\x00-\x20\x7f%\\?#;]", re.ASCII)


class FilePair(NamedTuple):
    data: str
    index: str  # type: ignore[assignment]  # a field named like tuple.index, as Uniffle names the file


def normalize_remote_path(remote_path: str) -> str:
    """The one spelling of a remote storage base (see the module docstring); ``ValueError`` if unsafe.

    ``hdfs://nn:8020//rss/data/`` -> ``hdfs://nn:8020/rss/data``; ``HDFS://nn`` -> ``hdfs://nn/``;
    ``/rss`` -> ``/rss`` (the default file system).
    """
    if not isinstance(remote_path, str) or not remote_path:
        raise ValueError("remote storage path is empty")
    if len(remote_path) > 4096:
        raise ValueError(f"remote storage path is {len(remote_path)} characters long, at most 4096 are allowed")
    bad = _FORBIDDEN_RE.search(remote_path)
    if bad is not None or not remote_path.isascii():
        raise ValueError(f"remote storage {remote_path!r}: whitespace, control characters, non-ASCII "
                         f"characters and any of % \\ ? # ; are not allowed")
    if remote_path.startswith("/"):
        scheme, authority, path = "", "", remote_path
    else:
        parts = urlsplit(remote_path)
        scheme = parts.scheme.lower()
        if scheme not in _SCHEMES or not remote_path[len(scheme):].startswith("://"):
            raise ValueError(f"remote storage {remote_path!r}: only hdfs://, viewfs:// or absolute paths "
                             f"are supported")
        authority, path = parts.netloc, parts.path or "/"
        if _AUTHORITY_RE.fullmatch(authority) is None:
            raise ValueError(f"remote storage {remote_path!r}: the authority must be a NameNode host[:port] "
                             f"or nameservice (no user info, not empty)")
    components = [c for c in path.split("/") if c]
    if any(c in (".", "..") for c in components):
        raise ValueError(f"remote storage {remote_path!r}: '.' and '..' path components are not allowed")
    base = "/" + "/".join(components)
    return f"{scheme}://{authority}{base}" if scheme else base


def split_remote_path(remote_path: str) -> tuple[str, str]:
    """``hdfs://nn:8020/rss/data`` -> (``hdfs://nn:8020``, ``/rss/data``); a bare path keeps the default FS.

    The path is normalized first (``normalize_remote_path``; ``ValueError`` if unsafe).
    """
    normal = normalize_remote_path(remote_path)
    if normal.startswith("/"):
        return "", normal
    scheme, rest = normal.split("://", 1)
    authority, _, path = rest.partition("/")
    return f"{scheme}://{authority}", "/" + path


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts]) if base != "/" else "/" + "/".join(parts)


def app_dir(base: str, app_id: str) -> str:
    return _join(base, check_app_id(app_id))


def shuffle_dir(base: str, app_id: str, shuffle_id: int) -> str:
    return _join(base, check_app_id(app_id), str(check_shuffle_id(shuffle_id)))


def partition_dir(base: str, app_id: str, shuffle_id: int, partition_id: int) -> str:
    """Spark registers one partition per range, so the range directory is ``<p>-<p>``."""
    check_partition_id(partition_id)
    return _join(base, check_app_id(app_id), str(check_shuffle_id(shuffle_id)), f"{partition_id}-{partition_id}")


def server_prefix(server_id: str) -> str:
    """What every file of this server starts with (the reader filters on the server id)."""
    return f"{server_id}_"


def is_server_file(name: str, server_id: str) -> bool:
    """True if the file name ``name`` is one of ``server_id``'s pair files (``<serverId>_<i>_<retry>.data``
    or ``.index``); a name that only starts with the prefix (another server id that extends it) is not."""
    if not server_id or not name.startswith(server_prefix(server_id)):
        return False
    return _PAIR_TAIL_RE.fullmatch(name, len(server_id) + 1) is not None


_PAIR_TAIL_RE = re.compile(r"(0|[1-9][0-9]{0,9})_(0|[1-9][0-9]{0,9})\.(data|index)", re.ASCII)


def file_pair(base: str, app_id: str, shuffle_id: int, partition_id: int, server_id: str, writer_index: int,
              retry: int) -> FilePair:
    if not server_id:
        raise ValueError("the server id is not known yet")
    stem = _join(partition_dir(base, app_id, shuffle_id, partition_id), f"{server_id}_{writer_index}_{retry}")
    return FilePair(stem + ".data", stem + ".index")
