"""Work that used to hold the event loop in one piece, whatever its size, now done in steps.

- ``union_serialize_steps`` of several sets builds a union; freeing that union whole is one C call
  over every container (2M one-id containers, the tiny-partitions layout of
  ``scripts/bench_loop_lag.py``: ~0.8 s). It must be empty by the time it is dropped: emptied
  chunk by chunk as it is encoded.
- The partition-id checks of getShuffleResultForMultiPart / requireBuffer (up to
  ``partition_number_max_limit`` ids: 1M, ~0.3 s) must give the loop turns.

Nothing is timed: containers left at the union's release and the coroutine's suspensions are counted.
"""

from __future__ import annotations

import gc

import pytest

import riffle_actors.protocol.bitmap as bitmap_module
from riffle_actors.actors.app_manager import AppDirectory
from riffle_actors.errors import InvalidRequestError
from riffle_actors.metrics import Metrics
from riffle_actors.protocol.bitmap import STEP_IDS, BlockIdSet, release_steps, union_serialize_steps
from riffle_actors.service import ShuffleService
from riffle_actors.state.app_state import drain


def test_the_union_of_several_sets_is_emptied_before_it_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    left_at_release: list[int] = []

    class Recorded(bitmap_module.BitMap64):
        def __del__(self) -> None:
            left_at_release.append(self.get_statistics()["n_containers"])

    monkeypatch.setattr(bitmap_module, "BitMap64", Recorded)
    # three partitions whose ids interleave, every id a container of its own (as tiny-partitions)
    sets = [BlockIdSet([(i << 16) | p for i in range(5000)]) for p in range(3)]
    expected = BlockIdSet([(i << 16) | p for i in range(5000) for p in range(3)]).serialize()
    left_at_release.clear()  # the sets' own bitmaps are Recorded too, and live on
    assert drain(union_serialize_steps(sets)) == expected
    gc.collect()
    assert left_at_release, "the union was not released"
    assert max(left_at_release) == 0, f"a union was released holding {max(left_at_release)} containers"
    assert all(len(s) == 5000 for s in sets)  # the inputs are untouched


def test_one_set_is_encoded_without_being_emptied() -> None:
    only = BlockIdSet([(i << 16) for i in range(5000)])
    before = only.serialize()
    assert drain(union_serialize_steps([only])) == before
    assert len(only) == 5000 and only.serialize() == before


def suspensions_until_done(coro) -> tuple[int, BaseException | None]:
    """Drive ``coro`` by hand (no loop); how often it suspended, and what it raised."""
    n = 0
    try:
        while True:
            coro.send(None)
            n += 1
    except StopIteration:
        return n, None
    except BaseException as e:  # noqa: BLE001 - handed back to the test
        return n, e


def service() -> ShuffleService:
    return ShuffleService(directory=AppDirectory(), app_manager=None, memory=None, disks=(), metrics=Metrics())


@pytest.mark.parametrize("call", ["get_shuffle_result", "require_buffer"])
def test_a_long_partition_list_is_checked_in_steps(call: str) -> None:
    pids = list(range(200_000)) + [-1]  # the bad id comes last: every id is checked
    svc = service()
    coro = (svc.get_shuffle_result("app", 0, pids, None) if call == "get_shuffle_result"
            else svc.require_buffer("app", 0, 100, tuple(pids)))
    n, error = suspensions_until_done(coro)
    assert isinstance(error, InvalidRequestError) and "-1" in str(error)
    assert n >= 10, f"{len(pids)} partition ids were checked in {n + 1} loop turns"


def test_released_sets_are_emptied_in_bounded_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    left_at_release: list[int] = []

    class Recorded(bitmap_module.BitMap64):
        def __del__(self) -> None:
            left_at_release.append(self.get_statistics()["n_containers"])

    monkeypatch.setattr(bitmap_module, "BitMap64", Recorded)
    big = BlockIdSet([i << 16 for i in range(20 * STEP_IDS)])  # one container per id
    reported = {p: BlockIdSet([p << 16 | i for i in range(10)]) for p in range(1, 5000)}
    reported[0] = big
    del big
    gc.collect()
    left_at_release.clear()  # temporaries of the construction
    steps = release_steps(reported)
    n = 0
    for _ in steps:
        n += 1
        assert max(left_at_release, default=0) <= STEP_IDS, "a step freed a set of too many containers"
    gc.collect()
    assert reported == {} and len(left_at_release) == 5000
    assert max(left_at_release) <= 1 and n >= 20


def test_metrics_are_rendered_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics renders every series in Python (50-130 ms seen under load): not on the loop thread."""
    import asyncio
    import threading

    metrics = Metrics()
    rendered_in: list[int] = []
    real = Metrics.render

    def recording(self: Metrics) -> bytes:
        rendered_in.append(threading.get_ident())
        return real(self)

    monkeypatch.setattr(Metrics, "render", recording)

    async def scrape() -> tuple[int, bytes]:
        return threading.get_ident(), await metrics.render_off_loop()

    loop_thread, text = asyncio.run(scrape())
    assert b"riffle_server_event_loop_lag_seconds" in text
    assert rendered_in and loop_thread not in rendered_in
