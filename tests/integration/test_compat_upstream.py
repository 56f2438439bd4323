"""Acceptance: a client built from the UPSTREAM Uniffle 0.9.2 ``Rss.proto`` writes and reads a whole shuffle.

The client's message classes come from ``tests.helpers.upstream_proto.load_upstream_proto()``
(``Rss.proto`` extracted from ``org.apache.uniffle:rss-client-spark3-shaded:0.9.2``, the newest
client Maven Central serves here; 0.10.0 is not served), never from our own proto, so field
numbers, the ``rss.common`` package and method paths are checked against the real contract.

Scenario, as a Spark 3 job would drive it (spec §2.14): register 8 partitions, several
concurrent map tasks write about 3x the server's memory (so most data is spilled while
writing), each reports its block ids; then every reduce partition asks
getShuffleResultForMultiPart, reads memory with the lastBlockId cursor, then the index,
segments it like the Java client (§5.4) and reads each segment with getLocalShuffleData,
checking the crc of every block. Block ids use the Spark default layout 21/20/22, and the
task attempt ids are ``mapIndex << attemptBits | attemptNo`` as the client builds them.
"""

from __future__ import annotations

import random

import pytest

from riffle_actors.protocol.blockid import SPARK_DEFAULT
from tests.helpers import gather_all, wait_server_clean
from tests.helpers.client import (
    BlockSpec,
    ReadStats,
    UniffleClient,
    assert_read_matches,
    make_blocks,
    require_size,
)
from tests.helpers.upstream_proto import UNIFFLE_VERSION, load_upstream_proto

pytestmark = pytest.mark.integration

APP = "application_1718000000000_0042_1718000000123"
PARTITIONS = 8
MAPS = 8
ATTEMPT_BITS = 2  # spark.task.maxFailures = 4, no speculation: bitlen(3) = 2 (spec §4)


def task_attempt_id(map_index: int, attempt: int = 0) -> int:
    return (map_index << ATTEMPT_BITS) | attempt


@pytest.fixture(scope="module")
def upstream():
    return load_upstream_proto()


def test_the_upstream_proto_is_the_real_contract(upstream) -> None:
    pb, pb_grpc = upstream
    assert UNIFFLE_VERSION == "0.9.2"
    assert pb.DESCRIPTOR.package == "rss.common"
    assert hasattr(pb_grpc, "ShuffleServerStub")
    # 0.9.2 has no storage ids: the reader must work without them
    assert "storageIds" not in pb.GetLocalShuffleIndexResponse.DESCRIPTOR.fields_by_name
    assert "storageId" not in pb.GetLocalShuffleDataRequest.DESCRIPTOR.fields_by_name


async def test_upstream_0_9_2_client_writes_and_reads_a_shuffle(server_factory, upstream) -> None:
    pb, pb_grpc = upstream
    srv = await server_factory(capacity="4M")
    capacity = srv.cfg.memory_store.capacity
    target = f"127.0.0.1:{srv.grpc_port}"
    known_statuses = set(pb.StatusCode.values())
    clients = [UniffleClient(target, pb, pb_grpc, layout=SPARK_DEFAULT, read_buffer_size=256 << 10)
               for _ in range(3)]
    driver = clients[0]
    written: list[BlockSpec] = []
    try:
        await driver.register_shuffle(APP, 3, range(PARTITIONS))

        async def map_task(map_index: int) -> None:
            client = clients[map_index % len(clients)]
            tid = task_attempt_id(map_index)
            rng = random.Random(map_index)
            seq = [0] * PARTITIONS
            mine: list[BlockSpec] = []
            for _ in range(8):  # eight buffer flushes, each a block for every partition
                batch = []
                for p in range(PARTITIONS):
                    batch += make_blocks(p, tid, 1, rng.randrange(16 << 10, 40 << 10), seq_start=seq[p], rng=rng)
                    seq[p] += 1
                await client.send_blocks(APP, 3, batch)
                mine += batch
            await client.report(APP, 3, tid, mine)
            written.extend(mine)

        await gather_all(*(map_task(m) for m in range(MAPS)))
        assert sum(require_size([b]) for b in written) >= 3 * capacity
        assert {SPARK_DEFAULT.partition_id(b.block_id) for b in written} == set(range(PARTITIONS))

        # the reduce side
        all_ids = await driver.get_shuffle_result(APP, 3, range(PARTITIONS))
        assert set(all_ids) == {b.block_id for b in written}
        stats = ReadStats()
        for p in range(PARTITIONS):
            reader = clients[p % len(clients)]
            ids = await reader.get_shuffle_result(APP, 3, [p])
            want = [b for b in written if b.partition_id == p]
            assert set(ids) == {b.block_id for b in want}
            got = await reader.read_partition(APP, 3, p, ids, partition_num=PARTITIONS, stats=stats)
            assert_read_matches(got, want)
        assert stats.file_blocks > 0, "3x the capacity must have been spilled"
        assert stats.data_calls < stats.file_blocks, "segments group several blocks"

        # a skew-split reader (LOCAL_ORDER under AQE) only wants some map tasks
        some = {task_attempt_id(m) for m in (1, 4, 6)}
        ids = await driver.get_shuffle_result(APP, 3, [5])
        wanted = {i for i in ids if SPARK_DEFAULT.task_attempt_id(i) in some}
        got = await driver.read_partition(APP, 3, 5, wanted, task_ids=some)
        assert_read_matches(got, [b for b in written if b.partition_id == 5 and b.task_attempt_id in some])

        await driver.heartbeat(APP)
        await driver.unregister_shuffle(APP, 3)
        await driver.unregister_app(APP)
        await wait_server_clean(srv, APP)
        for c in clients:
            assert set(c.statuses) <= known_statuses, f"status codes unknown to a {UNIFFLE_VERSION} client"
    finally:
        for c in clients:
            await c.close()
