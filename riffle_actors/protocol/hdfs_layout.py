"""The HDFS file layout of shuffle data (spec §5.5): a contract, since clients read it directly.

This module owns the names only::

    <remotePath>/<appId>/<shuffleId>/<p>-<p>/<serverId>_<writerIndex>_<retry>.data
    <remotePath>/<appId>/<shuffleId>/<p>-<p>/<serverId>_<writerIndex>_<retry>.index

(Java 0.10 with writer concurrency > 1, and Riffle). The Uniffle reader
(``HadoopClientReadHandler``) lists the partition directory, keeps the ``.index`` files whose
name starts with the assigned server's id, and reads each with its sibling ``.data``; the
index records are the 40-byte ones of ``riffle_actors.protocol.index``. ``retry`` grows when a
write to a pair failed: an HDFS file whose append failed may stay leased, so a new pair starts.

``split_remote_path`` turns a ``RemoteStorage.path`` (``hdfs://host:port/base``) into the
file system URL and the base directory.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

__all__ = ["FilePair", "app_dir", "file_pair", "partition_dir", "server_prefix", "shuffle_dir",
           "split_remote_path"]


class FilePair(NamedTuple):
    data: str
    index: str


def split_remote_path(remote_path: str) -> tuple[str, str]:
    """``hdfs://nn:8020/rss/data`` -> (``hdfs://nn:8020``, ``/rss/data``); a bare path keeps the default FS."""
    parts = urlsplit(remote_path.strip())
    if not parts.scheme:
        return "", "/" + parts.path.strip("/") if parts.path.strip("/") else "/"
    if parts.scheme not in ("hdfs", "viewfs"):
        raise ValueError(f"remote storage {remote_path!r}: only hdfs:// (or viewfs://) paths are supported")
    base = "/" + parts.path.strip("/") if parts.path.strip("/") else "/"
    return f"{parts.scheme}://{parts.netloc}", base


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts]) if base != "/" else "/" + "/".join(parts)


def app_dir(base: str, app_id: str) -> str:
    return _join(base, app_id)


def shuffle_dir(base: str, app_id: str, shuffle_id: int) -> str:
    return _join(base, app_id, str(shuffle_id))


def partition_dir(base: str, app_id: str, shuffle_id: int, partition_id: int) -> str:
    """Spark registers one partition per range, so the range directory is ``<p>-<p>``."""
    return _join(base, app_id, str(shuffle_id), f"{partition_id}-{partition_id}")


def server_prefix(server_id: str) -> str:
    """What every file of this server starts with (the reader filters on the server id)."""
    return f"{server_id}_"


def file_pair(base: str, app_id: str, shuffle_id: int, partition_id: int, server_id: str, writer_index: int,
              retry: int) -> FilePair:
    if not server_id:
        raise ValueError("the server id is not known yet")
    stem = _join(partition_dir(base, app_id, shuffle_id, partition_id), f"{server_id}_{writer_index}_{retry}")
    return FilePair(stem + ".data", stem + ".index")
