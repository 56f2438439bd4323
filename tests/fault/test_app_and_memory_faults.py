"""App and memory faults: an AppActor crash, tickets never used, app heartbeat expiry, huge partitions,
memory stuck above the high watermark. Time is a ``ManualClock`` moved by the test, never a sleep.
"""

from __future__ import annotations

import asyncio
import errno

import pytest

from riffle_actors.actors.app_manager import GetHistory
from riffle_actors.runtime import FireDue
from riffle_actors.runtime import ManualClock
from tests.fault.conftest import open_files_under
from tests.fault.scenario import APP, Workload
from tests.helpers import app_dirs, budget_figures, poll_until, wait_server_clean
from tests.helpers.client import UniffleError, make_blocks

pytestmark = pytest.mark.fault

NO_BUFFER, NO_REGISTER, INTERNAL_ERROR, NO_BUFFER_FOR_HUGE_PARTITION = 2, 4, 6, 10


async def advance(srv, clock: ManualClock, seconds: float) -> None:
    """Move time and wait until every timer message it made due has been told."""
    clock.advance(seconds)
    await srv.timer.ask(FireDue())


async def test_an_app_actor_crash_purges_the_app_and_later_calls_get_no_register(fault_server, client_factory,
                                                                               invariants):
    srv = await fault_server()
    w = Workload(client_factory(srv), partitions=range(4))
    await w.register()
    await w.write(per_partition=20)  # some partitions spilled, the rest in memory
    assert srv.budget.used > 0 and app_dirs(srv, APP)

    srv.directory[APP].crash(RuntimeError("bug in the app actor"))
    await wait_server_clean(srv, APP)  # memory, tickets and files of the app released
    history = await srv.app_manager.ask(GetHistory())
    assert history[-1]["app_id"] == APP and "app actor crashed" in history[-1]["reason"]

    with pytest.raises(UniffleError) as e:
        await w.client.send_blocks(APP, 0, make_blocks(0, 99, 1, 100))
    assert e.value.status == NO_REGISTER  # Spark fails the stage and retries: nothing is silently lost
    with pytest.raises(UniffleError) as e:
        await w.client.heartbeat(APP)
    assert e.value.status == NO_REGISTER
    await invariants.after_purge(srv, w.client, APP)


async def test_tickets_never_used_exhaust_memory_until_they_expire(fault_server, client_factory, invariants):
    clock = ManualClock()
    # the app may reserve all of capacity (app_buffer_ticket_max_ratio): the bound per app is
    # tests/security/test_server_bounds.py's; here the expiry alone must give the memory back
    srv = await fault_server(clock=clock, memory_store={"buffer_ticket_timeout_sec": 5,
                                                        "app_buffer_ticket_max_ratio": 1.0})
    c = client_factory(srv, retry_deadline_s=0.2)
    w = Workload(c, partitions=range(2))
    await w.register()
    pb = c.pb
    tickets = []
    while True:  # a client that reserves memory and never sends
        resp = await c.stub.requireBuffer(pb.RequireBufferRequest(appId=APP, shuffleId=0, requireSize=512 << 10))
        if resp.status != 0:
            assert resp.status == NO_BUFFER
            break
        tickets.append(resp.requireBufferId)
    assert len(tickets) == 8 and srv.budget.allocated == 8 * (512 << 10)

    with pytest.raises(UniffleError) as e:  # everybody else backs off and retries ...
        await c.send_blocks(APP, 0, make_blocks(0, 1, 2, 1000))
    assert e.value.status == NO_BUFFER

    await advance(srv, clock, 6)  # ... until the reservations expire
    await poll_until(lambda: srv.budget.allocated == 0 and len(srv.tickets) == 0)
    late = await c.stub.sendShuffleData(c.send_request(APP, 0, tickets[0], make_blocks(0, 1, 1, 100)))
    assert late.status == INTERNAL_ERROR and "unknown, used or expired" in late.retMsg
    await w.write(per_partition=4)  # a fresh ticket works
    await w.read_back()
    await invariants.after_purge(srv, c, APP)


async def test_app_heartbeat_expiry_purges_memory_tickets_files_and_handles(fault_server, client_factory,
                                                                          invariants):
    clock = ManualClock()
    srv = await fault_server(clock=clock, app_config={"app_heartbeat_timeout_min": 1,
                                                      "app_expiry_check_interval_sec": 10})
    w = Workload(client_factory(srv), partitions=range(4))
    await w.register()
    await w.write(per_partition=20)
    await w.client.require_buffer(APP, 0, 1000)  # a ticket that will never be used
    assert srv.budget.used and srv.budget.allocated and app_dirs(srv, APP)

    await advance(srv, clock, 50)
    assert APP in srv.directory  # not yet
    await advance(srv, clock, 20)
    await wait_server_clean(srv, APP)
    assert budget_figures(srv) == (0, 0, 0) and len(srv.tickets) == 0
    paths = list(srv.cfg.localfile_store.data_paths)
    # the purge closes its directory descriptors just after its last rmdir (as the invariants wait for)
    await poll_until(lambda: not open_files_under(paths), 5.0,
                     message=f"file descriptors left open: {open_files_under(paths)}")
    assert (await srv.app_manager.ask(GetHistory()))[-1]["reason"] == "heartbeat timeout"
    with pytest.raises(UniffleError) as e:
        await w.client.heartbeat(APP)
    assert e.value.status == NO_REGISTER
    await invariants.after_purge(srv, w.client, APP)


async def test_a_huge_partition_gets_backpressure_while_others_keep_flowing(fault_server, client_factory,
                                                                          invariants):
    srv = await fault_server(app_config={
        "partition_limit_enable": True, "partition_limit_threshold": "200K",
        "partition_limit_memory_backpressure_ratio": 0.1,  # 10 % of 4 MiB
        "huge_partition_memory_single_buffer_max_spill_size": "128K"},
        localfile_store={"disk_io_timeout_sec": 60})  # held spills must not time out here
    held = {name: io.hang("append_batch", times=None) for name, io in srv.faulty.items()}  # spills stay in flight
    c = client_factory(srv)
    w = Workload(c, partitions=range(2))
    await w.register()
    await w.write(per_partition=28, partitions=[0])  # 448 KiB: huge, and just above 10 % of memory
    await poll_until(lambda: any(h.entered.is_set() for h in held.values()))
    pb = c.pb

    def require(pids, size=1000):
        return c.stub.requireBuffer(pb.RequireBufferRequest(appId=APP, shuffleId=0, requireSize=size,
                                                            partitionIds=pids, partitionRequireSizes=[size] * len(pids)))

    resp = await require([0])
    assert resp.status == NO_BUFFER_FOR_HUGE_PARTITION and "huge" in resp.retMsg and resp.requireBufferId == -1
    assert (await require([1])).status == 0  # other partitions keep flowing
    assert (await require([])).status == 0   # a pre-0.10 client names no partition: not held back
    info = (await srv.admin.apps())[0]
    assert info["shuffles"][0]["huge_partitions"] == 1

    sender = client_factory(srv)  # backs off on status 10 and retries ...
    blocked_send = make_blocks(0, 77, 2, 1000)
    task = asyncio.ensure_future(sender.send_blocks(APP, 0, blocked_send))
    await poll_until(lambda: sender.no_buffer_retries > 0)
    for io in srv.faulty.values():  # ... until the huge partition's spills land
        io.heal()
    await task
    await sender.report(APP, 0, 77, blocked_send)
    w.acked.extend(blocked_send)
    await w.finish()
    assert (await require([0])).status == 0
    await w.read_back()
    await invariants.after_purge(srv, c, APP)


async def test_memory_stuck_above_the_high_watermark_reports_unhealthy(fault_server, client_factory, invariants):
    clock = ManualClock()
    srv = await fault_server(clock=clock, health={"memory_stuck_above_high_watermark_sec": 30},
                             localfile_store={"disk_probation_probes": 1})
    for io in srv.faulty.values():
        io.fail("append_batch", errno.EIO)  # every spill fails: memory cannot drain
    c = client_factory(srv, retry_deadline_s=0.5)
    w = Workload(c, partitions=range(4))
    await w.register()
    with pytest.raises(UniffleError) as e:
        await w.write(per_partition=100)  # 6.4 MiB into 4 MiB: the client ends up with NO_BUFFER
    assert e.value.status == NO_BUFFER
    assert srv.budget.used > 0.8 * srv.budget.capacity
    assert (await srv.admin.health()).to_json()["status"] == "UNHEALTHY"  # no healthy disk left, too
    await advance(srv, clock, 31)
    health = (await srv.admin.health()).to_json()
    assert any("memory above the spill high watermark for more than 30s" in r for r in health["reasons"])

    for io in srv.faulty.values():
        io.heal()
    await srv.admin.probe_disks()  # probation (1 probe here) re-admits both disks; the spills go through
    await poll_until(lambda: srv.budget.in_flight == 0 and srv.budget.used < 0.8 * srv.budget.capacity,
                     timeout=20)
    assert (await srv.admin.health()).to_json()["status"] == "HEALTHY"
    await w.read_back()
    await invariants.after_purge(srv, c, APP)
