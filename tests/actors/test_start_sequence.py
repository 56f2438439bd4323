"""StartSequence (riffle_actors.runtime.lifecycle): ordered start, rollback on a failed step, reverse stop.

Each step records what ran into one shared journal, so every test asserts the exact order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest
from loguru import logger

from riffle_actors.runtime import StartAborted, StartSequence, Step

pytestmark = pytest.mark.asyncio


class Boom(Exception):
    pass


def steps(journal: list[str], names: str, *, fail_start: str = "", fail_stop: str = "",
          no_stop: str = "") -> list[Step]:
    def start(name: str) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            await asyncio.sleep(0)
            if name in fail_start:
                journal.append(f"fail {name}")
                raise Boom(name)
            journal.append(f"start {name}")
        return go

    def stop(name: str) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            await asyncio.sleep(0)
            journal.append(f"stop {name}")
            if name in fail_stop:
                raise Boom(name)
        return go

    return [Step(n, start(n), None if n in no_stop else stop(n)) for n in names]


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG", format="{level} {message}")
    yield lines
    logger.remove(sink)


async def test_steps_start_in_order_and_stop_in_reverse():
    journal: list[str] = []
    seq = StartSequence(steps(journal, "abc"))
    await seq.start()
    assert journal == ["start a", "start b", "start c"]
    assert seq.running == ("a", "b", "c") and seq.phase == "running"
    await seq.stop()
    assert journal[3:] == ["stop c", "stop b", "stop a"]
    assert seq.running == () and seq.phase == "stopped"


async def test_a_failed_step_stops_the_started_ones_in_reverse_and_is_raised_again(log_lines):
    journal: list[str] = []
    seq = StartSequence(steps(journal, "abcd", fail_start="c"), what="riffle-server")
    with pytest.raises(Boom, match="c"):
        await seq.start()
    # c did not start, so it is not stopped; d never started
    assert journal == ["start a", "start b", "fail c", "stop b", "stop a"]
    assert seq.running == () and seq.phase == "stopped"
    [line] = [x for x in log_lines if x.startswith("ERROR")]
    assert "riffle-server: start failed at step 'c'" in line and "stopping b, a" in line
    await seq.stop()  # nothing more to do
    assert journal[-1] == "stop a"


async def test_a_failure_in_the_first_step_stops_nothing():
    journal: list[str] = []
    with pytest.raises(Boom):
        await StartSequence(steps(journal, "ab", fail_start="a")).start()
    assert journal == ["fail a"]


async def test_a_failing_stop_is_logged_and_the_rest_still_stop(log_lines):
    journal: list[str] = []
    seq = StartSequence(steps(journal, "abc", fail_stop="b"))
    await seq.start()
    await seq.stop()  # does not raise
    assert journal[3:] == ["stop c", "stop b", "stop a"]
    assert any("stopping step 'b' failed" in x for x in log_lines if x.startswith("ERROR"))


async def test_a_rollback_goes_on_past_a_failing_stop():
    journal: list[str] = []
    with pytest.raises(Boom, match="c"):
        await StartSequence(steps(journal, "abc", fail_start="c", fail_stop="b")).start()
    assert journal == ["start a", "start b", "fail c", "stop b", "stop a"]


async def test_stop_is_idempotent_and_a_concurrent_stop_waits_for_the_first():
    journal: list[str] = []
    seq = StartSequence(steps(journal, "ab"))
    await seq.start()
    first = asyncio.ensure_future(seq.stop())
    await asyncio.sleep(0)  # the first stop is under way (it awaits inside "stop b")
    second_done = False

    async def second() -> None:
        nonlocal second_done
        await seq.stop()
        second_done = True

    t = asyncio.ensure_future(second())
    await asyncio.sleep(0)
    assert not second_done and not first.done()
    await asyncio.gather(first, t)
    assert second_done
    await seq.stop()
    assert journal.count("stop a") == 1 and journal.count("stop b") == 1


async def test_steps_without_a_stop_are_skipped_when_stopping():
    journal: list[str] = []
    seq = StartSequence(steps(journal, "abc", no_stop="b"))
    await seq.start()
    assert seq.running == ("a", "b", "c")
    await seq.stop()
    assert journal[3:] == ["stop c", "stop a"]


async def test_a_stop_during_the_start_lets_the_step_finish_then_stops_everything():
    journal: list[str] = []
    gate = asyncio.Event()

    async def slow_start() -> None:
        journal.append("start slow")
        await gate.wait()

    async def slow_stop() -> None:
        journal.append("stop slow")

    seq = StartSequence([*steps(journal, "a"), Step("slow", slow_start, slow_stop), *steps(journal, "z")])
    starting = asyncio.ensure_future(seq.start())
    while "start slow" not in journal:
        await asyncio.sleep(0)
    stopping = asyncio.ensure_future(seq.stop())
    await asyncio.sleep(0)
    assert not stopping.done()  # it waits for the start to undo itself
    gate.set()
    with pytest.raises(StartAborted, match="slow"):
        await starting
    await stopping
    assert journal == ["start a", "start slow", "stop slow", "stop a"]  # z never started
    assert seq.phase == "stopped"


async def test_a_cancelled_start_stops_what_had_started():
    journal: list[str] = []
    hang = asyncio.Event()

    async def hanging() -> None:
        journal.append("start hang")
        await hang.wait()

    seq = StartSequence([*steps(journal, "ab"), Step("hang", hanging)])
    task = asyncio.ensure_future(seq.start())
    while "start hang" not in journal:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert journal == ["start a", "start b", "start hang", "stop b", "stop a"]


async def test_a_cancelled_stop_of_one_step_still_stops_the_others_then_propagates():
    journal: list[str] = []

    async def cancelled_stop() -> None:
        journal.append("stop x")
        raise asyncio.CancelledError

    async def started() -> None:
        journal.append("start x")

    seq = StartSequence([*steps(journal, "a"), Step("x", started, cancelled_stop), *steps(journal, "b")])
    await seq.start()
    with pytest.raises(asyncio.CancelledError):
        await seq.stop()
    assert journal[3:] == ["stop b", "stop x", "stop a"]
    assert seq.phase == "stopped"


async def test_a_sequence_starts_once():
    journal: list[str] = []
    seq = StartSequence(steps(journal, "a"))
    await seq.start()
    with pytest.raises(RuntimeError, match="starts once"):
        await seq.start()
    await seq.stop()
    with pytest.raises(RuntimeError, match="starts once"):
        await seq.start()


async def test_stop_before_start_does_nothing_and_start_is_refused_after_it():
    journal: list[str] = []
    seq = StartSequence(steps(journal, "a"))
    await seq.stop()
    assert journal == [] and seq.phase == "stopped"
    with pytest.raises(RuntimeError):
        await seq.start()


async def test_step_names_are_unique():
    with pytest.raises(ValueError, match="unique"):
        StartSequence(steps([], "aba"))


async def test_an_expected_start_failure_is_rolled_back_and_logged_without_a_traceback(log_lines):
    """``expected_errors`` (a port in use: the daemon reports it as one line) are logged at debug level."""
    journal: list[str] = []
    seq = StartSequence(steps(journal, "abc", fail_start="b"), what="coordinator", expected_errors=(Boom,))
    with pytest.raises(Boom, match="b"):
        await seq.start()
    assert journal == ["start a", "fail b", "stop a"]
    assert not [x for x in log_lines if x.startswith("ERROR") or "Traceback" in x]
    [line] = [x for x in log_lines if "start failed" in x]
    assert line.startswith("DEBUG coordinator: start failed at step 'b'") and "stopping a" in line
