"""RecvPool: the urpc listener's reused receive buffers (riffle_actors.transport.urpc_server)."""

from __future__ import annotations

from riffle_actors.transport.urpc_server import RecvPool


def test_a_given_back_buffer_is_reused_for_a_frame_of_about_its_size_only() -> None:
    pool = RecvPool(limit=10 << 20)
    a = pool.take(1 << 20)
    assert len(a) == 1 << 20 and (pool.allocated, pool.reused) == (1, 0)
    pool.give(a)
    assert pool.idle_bytes == 1 << 20
    assert pool.take((1 << 20) - 1000) is a  # a little smaller: reused, not zero-filled again
    assert pool.idle_bytes == 0 and pool.reused == 1
    pool.give(a)
    small = pool.take(100_000)  # far smaller: a buffer of its own (the budget counts what is taken)
    assert small is not a and len(small) == 100_000
    big = pool.take((1 << 20) + 1)  # larger: never a buffer too short
    assert big is not a and len(big) == (1 << 20) + 1
    assert pool.take(1 << 20) is a


def test_the_pool_keeps_at_most_its_limit_idle_and_shrinks_on_demand() -> None:
    pool = RecvPool(limit=3 << 20)
    bufs = [pool.take(1 << 20) for _ in range(5)]
    for b in bufs:
        pool.give(b)
    assert pool.idle_bytes == 3 << 20  # the oldest were dropped
    pool.give(bytearray(4 << 20))  # above the limit on its own: not kept
    assert pool.idle_bytes == 3 << 20
    pool.shrink(1)
    assert pool.idle_bytes == 2 << 20
    pool.shrink(10 << 20)
    fresh = pool.take(1 << 20)
    assert pool.idle_bytes == 0 and all(fresh is not b for b in bufs)
