"""The one RPC wrapper of both daemons (riffle_actors.transport.rpc_answer): status, log, count, timing."""

from __future__ import annotations

import time
from typing import Any

import pytest
from loguru import logger

from riffle_actors.errors import InvalidRequestError, NoBufferError, StatusCode
from riffle_actors.protocol.ids import check_app_id
from riffle_actors.transport.rpc_answer import answer, failure_status


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, float]] = []

    def on_rpc(self, rpc: str, status_name: str, started: float, app_id: str = "") -> None:
        self.calls.append((rpc, status_name, app_id, time.perf_counter() - started))


def make(**fields: Any) -> dict[str, Any]:
    return fields


@pytest.fixture
def log() -> Any:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip("\n")), level="DEBUG", format="{level} {message}")
    yield lines
    logger.remove(sink)


async def test_a_successful_call_answers_success_with_its_fields_and_is_counted_and_timed() -> None:
    rec = Recorder()

    async def body() -> dict[str, Any]:
        return {"uuid": "u1"}

    reply = await answer("accessCluster", make, body, "app-1", recorder=rec)
    assert reply == {"status": int(StatusCode.SUCCESS), "retMsg": "", "uuid": "u1"}
    [(rpc, status, app_id, seconds)] = rec.calls
    assert (rpc, status, app_id) == ("accessCluster", "SUCCESS", "app-1") and seconds >= 0


async def test_an_expected_error_answers_its_own_status_and_logs_at_debug_only(log: list[str]) -> None:
    rec = Recorder()

    async def body() -> dict[str, Any]:
        raise NoBufferError("memory is full")

    reply = await answer("requireBuffer", make, body, recorder=rec)
    assert reply == {"status": int(StatusCode.NO_BUFFER), "retMsg": "memory is full"}
    assert rec.calls[0][:2] == ("requireBuffer", "NO_BUFFER")
    assert [line for line in log if "requireBuffer" in line] == ["DEBUG requireBuffer -> NO_BUFFER: memory is full"]


async def test_an_unexpected_error_answers_internal_error_and_logs_its_traceback(log: list[str]) -> None:
    rec = Recorder()

    async def body() -> dict[str, Any]:
        raise KeyError("boom")

    reply = await answer("heartbeat", make, body, recorder=rec)
    assert reply == {"status": int(StatusCode.INTERNAL_ERROR), "retMsg": "KeyError: 'boom'"}
    assert rec.calls[0][:2] == ("heartbeat", "INTERNAL_ERROR")
    [line] = [line for line in log if "heartbeat failed" in line]
    assert line.startswith("ERROR heartbeat failed for app") and "KeyError" in line and "Traceback" in line


def test_a_protocol_error_is_an_invalid_request_and_a_closed_connection_logs_nothing(log: list[str]) -> None:
    with pytest.raises(Exception) as bad_id:
        check_app_id("../../etc")
    assert failure_status("getLocalShuffleData", bad_id.value, log=False)[0] is StatusCode.INVALID_REQUEST
    assert failure_status("x", InvalidRequestError("bad"), log=False) == (StatusCode.INVALID_REQUEST, "bad")
    assert log == []
