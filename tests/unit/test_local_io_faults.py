"""FaultyLocalIO: failing, failing after the fact, pausing and healing chosen LocalIO operations."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from riffle_actors.io.faults import FaultyLocalIO
from riffle_actors.io.local import LOCAL_IO
from riffle_actors.records import Block


def blocks(n: int = 2) -> list[Block]:
    return [Block(i + 1, 4, 4, 0, 7, b"abcd") for i in range(n)]


def test_passes_through_when_no_rule_is_armed(tmp_path: Path):
    io = FaultyLocalIO()
    assert io.append_batch(str(tmp_path), "app", 0, 1, blocks()) == (0, 8)
    assert io.read_data(str(tmp_path), "app", 0, 1, 4, 4) == b"abcd"
    assert io.calls["append_batch"] == 1 and io.calls["read_data"] == 1


def test_fail_raises_the_errno_a_limited_number_of_times(tmp_path: Path):
    io = FaultyLocalIO(LOCAL_IO)
    rule = io.fail("append_batch", errno.ENOSPC, times=2)
    for _ in range(2):
        with pytest.raises(OSError) as e:
            io.append_batch(str(tmp_path), "app", 0, 1, blocks())
        assert e.value.errno == errno.ENOSPC
    assert io.append_batch(str(tmp_path), "app", 0, 1, blocks()) == (0, 8)  # nothing was written before
    assert rule.hits == 2


def test_fail_after_runs_the_operation_first(tmp_path: Path):
    io = FaultyLocalIO()
    io.fail("append_batch", errno.EIO, times=1, after=True)
    with pytest.raises(OSError):
        io.append_batch(str(tmp_path), "app", 0, 1, blocks())
    assert io.read_index(str(tmp_path), "app", 0, 1)[1] == 8  # the bytes reached the file


def test_match_selects_the_calls_a_rule_applies_to(tmp_path: Path):
    io = FaultyLocalIO()
    io.fail("append_batch", RuntimeError("boom"), match=lambda root, app, shuffle, partition, bl: partition == 2)
    io.append_batch(str(tmp_path), "app", 0, 1, blocks())
    with pytest.raises(RuntimeError):
        io.append_batch(str(tmp_path), "app", 0, 2, blocks())


def test_hang_pauses_until_released_then_raises_or_carries_on(tmp_path: Path):
    io = FaultyLocalIO()
    paused = io.hang("read_index", then=errno.EIO)
    out: list[BaseException | tuple] = []

    def call() -> None:
        try:
            out.append(io.read_index(str(tmp_path), "app", 0, 1))
        except OSError as e:
            out.append(e)

    t = threading.Thread(target=call)
    t.start()
    assert paused.entered.wait(5)
    assert not out
    paused.release.set()
    t.join(5)
    assert isinstance(out[0], OSError) and out[0].errno == errno.EIO
    assert io.read_index(str(tmp_path), "app", 0, 1) == (b"", 0)  # times=1: used up


def test_heal_removes_rules_and_releases_paused_calls(tmp_path: Path):
    io = FaultyLocalIO()
    paused = io.hang("usage", times=None)
    io.fail("remove_app")
    t = threading.Thread(target=io.usage, args=(str(tmp_path),))
    t.start()
    assert paused.entered.wait(5)
    io.heal()
    t.join(5)
    assert not t.is_alive() and io.rules == []
    io.remove_app(str(tmp_path), "app")


def test_unknown_operations_are_refused():
    with pytest.raises(ValueError):
        FaultyLocalIO().fail("append")
