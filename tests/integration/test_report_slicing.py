"""Big reports and shuffle results over gRPC: exact bytes, and other apps are served meanwhile.

The AppActor handles reportShuffleResult and getShuffleResult* in time slices
(``riffle_actors.runtime.slicing``). Here, through a real in-process server: results of a
600k-id shuffle (many partitions, several high-32-bit buckets) are byte-identical to the
canonical encoding of the expected ids, for every partition subset and whatever blockIdLayout the
request carries (the server keeps ids per reported partition, so the layout selects nothing);
and another app's heartbeat is answered while one app's big report is still being processed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from riffle_actors.actors import app as app_module
from riffle_actors.runtime import SliceLane
from riffle_actors.errors import StatusCode
from riffle_actors.protocol.bitmap import BlockIdSet
from riffle_actors.protocol.blockid import RIFFLE_FALLBACK, SPARK_DEFAULT, UNIFFLE_DEFAULT
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.server import ShuffleServer
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient

pytestmark = pytest.mark.integration

S = StatusCode
APP = "application_1700000000000_0042_1700000000001"
OTHER = "application_1700000000000_0043_1700000000001"
EMPTY_MAP = b"\x00\x00\x00\x00\x00"


def canonical(ids: Iterable[int]) -> bytes:
    return BlockIdSet(sorted(set(ids))).serialize()


def spark_ids(partition: int, seqs: range, tasks: range) -> list[int]:
    return [SPARK_DEFAULT.get_block_id(seq, partition, task) for seq in seqs for task in tasks]


def report_request(app_id: str, shuffle_id: int, task: int, by_partition: dict[int, list[int]]) -> Any:
    entries = [pb.PartitionToBlockIds(partitionId=p, blockIds=ids) for p, ids in by_partition.items()]
    return pb.ReportShuffleResultRequest(appId=app_id, shuffleId=shuffle_id, taskAttemptId=task, bitmapNum=1,
                                         partitionToBlockIds=entries)


def layout_msg(layout: Any) -> Any:
    s, p, t = layout.as_tuple()
    return pb.BlockIdLayout(sequenceNoBits=s, partitionIdBits=p, taskAttemptIdBits=t)


async def multi(stub: Any, partitions: Iterable[int], layout: Any = SPARK_DEFAULT, app_id: str = APP,
                shuffle_id: int = 0) -> bytes:
    resp = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId=app_id, shuffleId=shuffle_id, partitions=list(partitions),
        blockIdLayout=layout_msg(layout) if layout is not None else None))
    assert resp.status == S.SUCCESS, resp.retMsg
    return resp.serializedBitmap


async def test_big_results_are_byte_exact_for_any_subset_and_layout(
        server: ShuffleServer, client: UniffleClient, stub: Any) -> None:
    partitions = 1500
    await client.register_shuffle(APP, 0, range(partitions + 10))
    # 400 ids per partition over 8 sequence numbers: 16 buckets (high = seq << 10 | partition >> 10)
    expected = {p: spark_ids(p, range(8), range(50)) for p in range(partitions)}
    one_request = report_request(APP, 0, 1, expected)
    assert (await stub.reportShuffleResult(one_request)).status == S.SUCCESS
    # the same ids again as per-task reports (a retried stage): nothing new, nothing lost
    for task in range(0, 50, 10):
        again = {p: [i for i in ids if SPARK_DEFAULT.task_attempt_id(i) in range(task, task + 10)]
                 for p, ids in expected.items() if p % 3 == task % 3}
        assert (await stub.reportShuffleResult(report_request(APP, 0, task, again))).status == S.SUCCESS

    everything = canonical(i for ids in expected.values() for i in ids)
    for layout in (SPARK_DEFAULT, UNIFFLE_DEFAULT, RIFFLE_FALLBACK):
        assert await multi(stub, range(partitions), layout) == everything
    assert await multi(stub, range(partitions + 10)) == everything  # unreported partitions add nothing
    subset = range(3, partitions, 7)
    assert await multi(stub, reversed(subset)) == canonical(i for p in subset for i in expected[p])
    assert await multi(stub, [partitions + 1, partitions + 2]) == EMPTY_MAP
    assert await multi(stub, []) == EMPTY_MAP
    single = await stub.getShuffleResult(pb.GetShuffleResultRequest(appId=APP, shuffleId=0, partitionId=77,
                                                                    blockIdLayout=layout_msg(SPARK_DEFAULT)))
    assert (single.status, single.serializedBitmap) == (S.SUCCESS, canonical(expected[77]))


async def test_another_app_is_served_while_a_big_report_is_processed(
        server: ShuffleServer, client: UniffleClient, stub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lanes: list[SliceLane] = []

    class OneStepLane(SliceLane):  # one step per loop turn: the report takes many turns
        def __init__(self) -> None:
            super().__init__(slice_s=0.0)
            lanes.append(self)

    monkeypatch.setattr(app_module, "SliceLane", OneStepLane)
    await client.register_shuffle(APP, 0, range(2000))
    await client.register_shuffle(OTHER, 0, range(1))
    ids = {p: [(seq << 42) | (p << 22) | task for seq in range(2) for task in range(250)]
           for p in range(2000)}
    report = asyncio.ensure_future(stub.reportShuffleResult(report_request(APP, 0, 1, ids)))  # 1M ids

    # only APP has a report in flight: a busy lane means it is being processed
    await poll_until(lambda: report.done() or not all(lane.idle for lane in lanes),
                     message="the report never reached the lane")
    assert not report.done()
    for _ in range(3):
        assert (await stub.appHeartbeat(pb.AppHeartBeatRequest(appId=OTHER))).status == S.SUCCESS
    assert not report.done(), "the heartbeats waited for the report"
    assert (await report).status == S.SUCCESS
    assert await multi(stub, range(2000)) == canonical(i for v in ids.values() for i in v)
