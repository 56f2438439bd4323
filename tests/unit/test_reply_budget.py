"""ReplyBudget: the byte count that bounds held read replies (riffle_actors.transport.reply_budget)."""

from __future__ import annotations

import asyncio

import pytest

from riffle_actors.errors import NoBufferError, StatusCode
from riffle_actors.transport.reply_budget import ReplyBudget


async def test_one_reply_larger_than_the_limit_goes_through_alone() -> None:
    b = ReplyBudget(100, 1.0)
    await b.acquire(500)
    assert b.held == 500
    b.release(500)
    assert b.held == 0


async def test_waiters_are_granted_in_order_as_bytes_come_back() -> None:
    seen: list[int] = []
    b = ReplyBudget(100, None, on_change=seen.append)
    await b.acquire(80)
    order: list[str] = []

    async def want(name: str, n: int) -> None:
        await b.acquire(n)
        order.append(name)

    first = asyncio.create_task(want("first", 60))
    second = asyncio.create_task(want("second", 10))  # would fit now, but waits behind the first
    await asyncio.sleep(0)
    assert order == [] and b.held == 80
    b.release(80)
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and b.held == 70
    assert seen[-1] == 70 and b.peak == 80


async def test_a_wait_beyond_the_timeout_is_no_buffer_naming_the_key_and_leaves_nothing_held() -> None:
    b = ReplyBudget(100, 0.05, key="max_reply_bytes")
    await b.acquire(100)
    with pytest.raises(NoBufferError) as refused:
        await b.acquire_or_refuse(10)
    assert refused.value.status == StatusCode.NO_BUFFER
    assert "max_reply_bytes" in str(refused.value) and "reply_wait_timeout_sec" in str(refused.value)
    assert b.held == 100 and b.refused == 1
    b.release(100)
    assert b.held == 0
    await b.acquire(10)  # the timed-out waiter left the queue
    assert b.held == 10


async def test_a_cancelled_waiter_does_not_keep_bytes_or_block_others() -> None:
    b = ReplyBudget(100, None)
    await b.acquire(100)
    stuck = asyncio.create_task(b.acquire(50))
    await asyncio.sleep(0)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    later = asyncio.create_task(b.acquire(30))
    b.release(100)
    await later
    assert b.held == 30
