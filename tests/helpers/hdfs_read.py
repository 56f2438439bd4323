"""Read a partition's HDFS files exactly as the Uniffle client does (HadoopClientReadHandler, spec §5.5).

List ``<base>/<appId>/<shuffleId>/<p>-<p>``, keep the ``.index`` files whose name starts with the
server id, read each whole index, take the sibling ``.data`` file's length as ``dataFileLen``,
segment the index (spec §5.4, ``split_index``) and read each segment's (offset, length) range;
every block is CRC-checked. Uses hdfs-native (the test's own client, not the server's).
"""

from __future__ import annotations

import zlib
from collections.abc import Container

from riffle_actors.protocol.hdfs_layout import partition_dir, split_remote_path
from tests.helpers.client import split_index


def hdfs_client(remote_path: str):
    import hdfs_native

    url, _ = split_remote_path(remote_path)
    return hdfs_native.Client(url)


def list_partition_files(remote_path: str, app_id: str, shuffle_id: int, partition_id: int,
                         client=None) -> dict[str, int]:
    """file name -> length in the partition's HDFS directory ({} when there is none); ``client``: an
    hdfs-native client of the test's own (a Kerberos one), else a plain one."""
    client = client or hdfs_client(remote_path)
    _, base = split_remote_path(remote_path)
    try:
        return {st.path.rsplit("/", 1)[-1]: st.length
                for st in client.list_status(partition_dir(base, app_id, shuffle_id, partition_id))}
    except FileNotFoundError:
        return {}


def read_hdfs_partition(remote_path: str, app_id: str, shuffle_id: int, partition_id: int, server_id: str,
                        expected: Container[int] | None = None, read_buffer_size: int = 14 << 20,
                        client=None) -> dict[int, bytes]:
    client = client or hdfs_client(remote_path)
    _, base = split_remote_path(remote_path)
    d = partition_dir(base, app_id, shuffle_id, partition_id)
    got: dict[int, bytes] = {}
    for name in sorted(list_partition_files(remote_path, app_id, shuffle_id, partition_id, client)):
        if not (name.endswith(".index") and name.startswith(server_id)):
            continue
        stem = name[:-len(".index")]
        with client.read(f"{d}/{name}") as r:
            index = r.readall()
        with client.read(f"{d}/{stem}.data") as r:
            data_len = r.size
            for seg in split_index(index, data_len, [], read_buffer_size):
                buf = r.read_range(seg.offset, seg.length)
                assert len(buf) == seg.length, f"{stem}.data: short read at {seg.offset}"
                for b in seg.blocks:
                    if b.block_id in got or (expected is not None and b.block_id not in expected):
                        continue
                    piece = buf[b.buffer_offset:b.buffer_offset + b.length]
                    assert zlib.crc32(piece) == b.crc, f"crc mismatch for block {b.block_id} in {stem}.data"
                    got[b.block_id] = piece
    return got
