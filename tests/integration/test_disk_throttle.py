"""The disk throttle (``[localfile_store.io_limiter]``) on a real server: spills and local reads of a
disk wait for its token bucket, the server's own metrics account for every byte and every second
waited, and data reads back byte-exact.

Nothing here times the test itself: the assertions are on the limiter's accounting
(``riffle_disk_throttle_bytes_total`` / ``riffle_disk_throttled_seconds_total``), which is exact
for one spill batch on a full bucket: it waits ``(bytes - capacity) / capacity`` seconds.
"""

from __future__ import annotations

import aiohttp
import pytest
from loguru import logger

from tests.helpers import parse_metrics, poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks

pytestmark = pytest.mark.integration

APP = "application_1764547200000_0019_1764547200001"
RATE = 1 << 20  # io_limiter capacity "1M": bytes per second, and the burst


def _sum(m: dict, name: str, **labels: str) -> float:
    return sum(v for lab, v in m.get(name, []) if all(lab.get(k) == w for k, w in labels.items()))


async def _write_spill_read(srv, blocks) -> dict:
    """Send ``blocks`` (one request: one spill batch), wait for the spill, read them back byte-exact;
    the ``/metrics`` samples after the read."""
    client = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        async with aiohttp.ClientSession() as http:
            async def scrape() -> dict:
                async with http.get(f"http://127.0.0.1:{srv.http_port}/metrics") as r:
                    return parse_metrics(await r.text())

            await client.register_shuffle(APP, 0, range(1))
            await client.send_blocks(APP, 0, blocks)
            await client.report(APP, 0, 1, blocks)

            async def spilled() -> bool:
                m = await scrape()
                return (_sum(m, "riffle_spill_total") > 0 and _sum(m, "riffle_memory_in_flight_bytes") == 0
                        and _sum(m, "riffle_memory_used_bytes") == 0)

            await poll_until(spilled, timeout=60)
            ids = await client.get_shuffle_result(APP, 0, [0])
            assert_read_matches(await client.read_partition(APP, 0, 0, ids), blocks)
            m = await scrape()
            await client.unregister_app(APP)
            return m
    finally:
        await client.close()


async def test_spills_and_reads_wait_for_the_disk_bucket(server_factory) -> None:
    srv = await server_factory(capacity="16M", disks=1, localfile_store={"io_limiter": {"capacity": "1M"}})
    [disk] = srv.disk_names
    blocks = make_blocks(0, 1, 30, 100_000)  # 3,000,000 bytes: almost 3 s of the disk's rate
    data = sum(len(b.data) for b in blocks)
    m = await _write_spill_read(srv, blocks)

    # writes: every spilled byte charged; one batch on a full bucket waits exactly for the excess
    assert _sum(m, "riffle_spill_total") == 1, m.get("riffle_spill_total")
    assert _sum(m, "riffle_spill_bytes_total") == data
    assert _sum(m, "riffle_disk_throttle_bytes_total", disk=disk, op="write") == data
    waited_w = _sum(m, "riffle_disk_throttled_seconds_total", disk=disk, op="write")
    assert waited_w == pytest.approx((data - RATE) / RATE, rel=1e-6)
    # the server's own spill time includes the wait (the limiter slept on the disk's writer thread)
    assert _sum(m, "riffle_spill_duration_seconds_sum", disk=disk) >= waited_w

    # reads: the index and every data byte read from the disk charged; the bucket holds at most one
    # second's worth when the read starts, so the data read waits at least for the rest
    read = _sum(m, "riffle_server_read_bytes_total", source="localfile")
    index = _sum(m, "riffle_server_read_bytes_total", source="index")
    assert read == data and index == 30 * 40
    assert _sum(m, "riffle_disk_throttle_bytes_total", disk=disk, op="read") == read + index
    waited_r = _sum(m, "riffle_disk_throttled_seconds_total", disk=disk, op="read")
    assert (data - RATE) / RATE - 1e-6 <= waited_r <= (read + index) / RATE + 1e-6


async def test_read_enable_false_throttles_writes_only(server_factory) -> None:
    srv = await server_factory(capacity="16M", disks=1, localfile_store={"io_limiter": {
        "capacity": "1M", "read_enable": False}})
    [disk] = srv.disk_names
    blocks = make_blocks(0, 1, 20, 100_000)  # 2,000,000 bytes
    data = sum(len(b.data) for b in blocks)
    m = await _write_spill_read(srv, blocks)

    assert _sum(m, "riffle_disk_throttle_bytes_total", disk=disk, op="write") == data
    assert _sum(m, "riffle_disk_throttled_seconds_total", disk=disk, op="write") == pytest.approx(
        (data - RATE) / RATE, rel=1e-6)
    assert _sum(m, "riffle_server_read_bytes_total", source="localfile") == data  # read from the disk...
    # ... and never charged nor waited for
    assert not [lab for lab, _ in m.get("riffle_disk_throttle_bytes_total", []) if lab["op"] == "read"]
    assert not [lab for lab, _ in m.get("riffle_disk_throttled_seconds_total", []) if lab["op"] == "read"]


async def test_without_io_limiter_nothing_is_throttled(server_factory) -> None:
    srv = await server_factory(capacity="16M", disks=1)
    m = await _write_spill_read(srv, make_blocks(0, 1, 12, 100_000))  # above the 1M single-buffer limit
    assert _sum(m, "riffle_spill_bytes_total") == 1_200_000
    assert "riffle_disk_throttle_bytes_total" not in m and "riffle_disk_throttled_seconds_total" not in m


async def test_a_limit_too_low_for_one_spill_batch_is_warned_at_start(server_factory) -> None:
    notes: list[str] = []
    sink = logger.add(lambda m: notes.append(m.record["message"]), level="INFO", format="{message}")
    try:
        await server_factory(disks=1, localfile_store={"io_limiter": {"capacity": "1M"}, "disk_io_timeout_sec": 0.5})
        await server_factory(disks=1, localfile_store={"io_limiter": {"capacity": "1M", "write_enable": False},
                                                       "disk_io_timeout_sec": 0.5})
    finally:
        logger.remove(sink)
    assert len([n for n in notes if "throughput limited to 1048576 bytes/s" in n]) == 2, notes
    # the 1M single-buffer batch needs 1 s at 1M/s, above the 0.5 s IO timeout (writes limited only)
    assert len([n for n in notes if "waits longer than disk_io_timeout_sec (0.5s)" in n]) == 1, notes
