"""Riffle's metric names on a live server's ``/metrics``, so Riffle's Grafana dashboard shows its panels.

``RIFFLE_DASHBOARD_METRICS`` is the set of metric names that Riffle's own dashboard
(``grafana/riffle.json`` of zuston/riffle, Riffle 0.27) queries, written down here as data. Each is
either served by a live server after some traffic (a write that spills, a read back from memory
and from disk) or listed in ``NOT_HERE`` with the reason, which docs/riffle-metrics.md repeats.
The values agree with our own metrics (same registry, read at scrape time), and Riffle's
conventions hold: ``service_is_healthy`` and ``local_disk_is_healthy`` are 0 when healthy.
"""

from __future__ import annotations

import aiohttp
import pytest

from riffle_actors.metrics import RIFFLE_METRIC_NAMES
from tests.helpers import parse_metrics, poll_until
from tests.helpers.client import UniffleClient, assert_read_matches, make_blocks

pytestmark = pytest.mark.integration

APP = "application_1764547200000_0018_1764547200001"

RIFFLE_DASHBOARD_METRICS = {
    "alignment_buffer_pool_acquired_buffer", "alignment_buffer_pool_acquired_miss",
    "alignment_buffer_pool_read_acquire_miss", "allocator_allocated_size", "app_flushed_bytes", "app_number",
    "append_permits", "append_wait", "eventbus_handle_operation_duration", "eventbus_queue_handling_size",
    "eventbus_queue_pending_size", "eventbus_total_handled_event_size", "eventbus_total_published_event_size",
    "grpc_duration_seconds", "grpc_get_localfile_data_latency", "grpc_get_localfile_data_process_time",
    "grpc_get_localfile_data_transport_time", "grpc_get_localfile_index_latency",
    "grpc_get_memory_data_freeze_process_time", "grpc_get_memory_data_process_time",
    "grpc_get_memory_data_transport_time", "grpc_request_number", "grpc_send_data_process_time",
    "grpc_send_data_transport_time", "huge_partition_number", "local_disk_is_healthy", "local_disk_used",
    "local_disk_used_ratio", "localfile_disk_append_operation_bytes_counter",
    "localfile_disk_append_operation_counter", "localfile_disk_append_operation_duration",
    "localfile_disk_delete_operation_duration", "localfile_disk_direct_read_operation_duration",
    "localfile_disk_read_operation_bytes_counter", "localfile_disk_read_operation_counter",
    "localfile_disk_read_operation_duration", "localfile_disk_stat_operation_duration", "memory_allocated",
    "memory_spill_batch_size_histogram", "memory_spill_in_flushing_bytes", "memory_spill_in_flushing_bytes_histogram",
    "memory_spill_in_flushing_operations", "memory_spill_in_queue_bytes", "memory_spill_to_hdfs",
    "memory_spill_to_localfile", "memory_used", "partition_number", "process_resident_memory_bytes",
    "process_virtual_memory_bytes", "purge_failed_count", "read_permits", "read_wait", "resident_bytes",
    "runtime_thread_alive_gauge", "runtime_thread_idle_gauge", "service_is_healthy", "shared_permits",
    "total_app_number", "total_evict_timeout_tickets_num", "total_grpc_request_number", "total_hdfs_used",
    "total_huge_partition_number", "total_huge_partition_require_buffer_failed", "total_localfile_used",
    "total_memory_spill_failed", "total_memory_spill_to_hdfs", "total_memory_spill_to_localfile",
    "total_memory_to_hdfs_spill_failed", "total_memory_to_localfile_spill_failed", "total_memory_used",
    "total_partition_number", "total_read_data", "total_read_data_from_localfile", "total_read_data_from_memory",
    "total_read_index_from_localfile", "total_received_data", "total_require_buffer_failed",
    "total_spill_events_dropped", "total_spill_events_dropped_with_app_not_found", "urpc_connection_number",
    "urpc_get_localfile_data_process_time", "urpc_get_memory_data_process_time", "urpc_send_data_process_time",
    "urpc_send_data_transport_time",
}

#: Riffle dashboard names with no counterpart here yet, and why (docs/riffle-metrics.md).
NOT_HERE = {
    # Riffle internals with no counterpart in this design
    "alignment_buffer_pool_acquired_buffer": "no O_DIRECT buffer pool (one staging buffer per spill)",
    "alignment_buffer_pool_acquired_miss": "no O_DIRECT buffer pool",
    "alignment_buffer_pool_read_acquire_miss": "no O_DIRECT buffer pool",
    "allocator_allocated_size": "no jemalloc; process_resident_memory_bytes instead",
    "append_permits": "no io scheduler permits", "append_wait": "no io scheduler permits",
    "read_permits": "no io scheduler permits", "read_wait": "no io scheduler permits",
    "shared_permits": "no io scheduler permits",
    "eventbus_handle_operation_duration": "no event bus: spills are actor messages (riffle_actor_* metrics)",
    "eventbus_queue_handling_size": "no event bus", "eventbus_queue_pending_size": "no event bus",
    "eventbus_total_handled_event_size": "no event bus", "eventbus_total_published_event_size": "no event bus",
    "runtime_thread_alive_gauge": "no tokio runtimes", "runtime_thread_idle_gauge": "no tokio runtimes",
    "grpc_get_memory_data_freeze_process_time": "no buffer freeze step",
    # transport times: one handler time is measured here (the *_process_time names)
    "grpc_get_localfile_data_transport_time": "only the handler time is measured",
    "grpc_get_memory_data_transport_time": "only the handler time is measured",
    "grpc_send_data_transport_time": "only the handler time is measured",
    "urpc_send_data_transport_time": "only the handler time is measured",
    "grpc_get_localfile_data_latency": "a summary of Riffle's; grpc_get_localfile_data_process_time instead",
    "grpc_get_localfile_index_latency": "a summary of Riffle's; grpc_duration_seconds{path=.../getLocalShuffleIndex}",
    # not measured yet
    "app_flushed_bytes": "per-app series: app ids never become labels here (/apps has them)",
    "resident_bytes": "per-app series (topN_app_resident_bytes): app ids never become labels (/apps)",
    "grpc_request_number": "not measured yet (in-flight gRPC requests)",
    "urpc_connection_number": "not measured yet",
    "huge_partition_number": "not measured yet", "total_huge_partition_number": "not measured yet",
    "total_huge_partition_require_buffer_failed": "not measured yet",
    "partition_number": "not measured yet", "total_partition_number": "not measured yet",
    "total_app_number": "not measured yet (app_number is served)",
    "purge_failed_count": "not measured yet",
    "total_evict_timeout_tickets_num": "not measured yet",
    "total_spill_events_dropped": "spills are never dropped here (a failed one is retried)",
    "total_spill_events_dropped_with_app_not_found": "spills are never dropped here",
    "memory_spill_in_queue_bytes": "not measured yet (riffle_spill_pending_jobs counts jobs)",
    "memory_spill_in_flushing_bytes": "not measured yet (riffle_memory_in_flight_bytes is served as "
                                      "memory_spill_in_flight_bytes)",
    "memory_spill_in_flushing_bytes_histogram": "not measured yet (memory_spill_batch_size_histogram is served)",
    "memory_spill_to_hdfs": "not measured yet", "memory_spill_to_localfile": "not measured yet",
    "localfile_disk_delete_operation_duration": "not measured yet",
    "localfile_disk_direct_read_operation_duration": "not measured yet",
    "localfile_disk_read_operation_bytes_counter": "not measured yet (total_read_data_from_localfile)",
    "localfile_disk_read_operation_counter": "not measured yet",
    "localfile_disk_read_operation_duration": "not measured yet",
    "localfile_disk_stat_operation_duration": "not measured yet",
}


def _one(samples: dict, name: str, **labels: str) -> float:
    values = [v for lab, v in samples[name] if all(lab.get(k) == w for k, w in labels.items())]
    assert len(values) == 1, (name, labels, samples.get(name))
    return values[0]


def _served(samples: dict, name: str) -> bool:
    return any(s == name or s in (f"{name}_bucket", f"{name}_count") for s in samples)


def test_the_list_is_complete() -> None:
    assert set(NOT_HERE) <= RIFFLE_DASHBOARD_METRICS
    assert set(RIFFLE_METRIC_NAMES) & set(NOT_HERE) == set()
    assert RIFFLE_DASHBOARD_METRICS - set(NOT_HERE) <= set(RIFFLE_METRIC_NAMES)


async def test_a_live_server_serves_riffles_names(server_factory) -> None:
    srv = await server_factory(capacity="4M", hybrid_store={"memory_single_buffer_max_spill_size": "256K"})
    client = UniffleClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        await client.register_shuffle(APP, 0, range(2))
        spilled = make_blocks(0, 1, 20, 20_000)  # over the single-buffer limit: spilled to disk
        await client.send_blocks(APP, 0, spilled)
        in_memory = make_blocks(1, 1, 2, 1000)
        await client.send_blocks(APP, 0, in_memory)
        await client.report(APP, 0, 1, spilled + in_memory)

        async with aiohttp.ClientSession() as http:
            async def scrape() -> dict:
                async with http.get(f"http://127.0.0.1:{srv.http_port}/metrics") as r:
                    return parse_metrics(await r.text())

            async def spill_done() -> bool:  # so that partition 0 is read back from disk
                m = await scrape()
                return (sum(v for _lab, v in m.get("riffle_spill_total", [])) > 0
                        and _one(m, "riffle_memory_in_flight_bytes") == 0
                        and _one(m, "riffle_spill_pending_jobs") == _one(m, "riffle_spill_running_jobs") == 0)

            await poll_until(spill_done, timeout=30)
            ids = await client.get_shuffle_result(APP, 0, [0, 1])
            assert_read_matches(await client.read_partition(APP, 0, 0, ids), spilled)
            assert_read_matches(await client.read_partition(APP, 0, 1, ids), in_memory)
            m = await scrape()
            for name in sorted(RIFFLE_DASHBOARD_METRICS - set(NOT_HERE)) + list(RIFFLE_METRIC_NAMES):
                assert _served(m, name), f"{name} is not on /metrics"

            # the same figures as our own metrics
            assert _one(m, "memory_capacity") == _one(m, "riffle_memory_capacity_bytes") == 4 << 20
            assert _one(m, "total_received_data") == _one(m, "riffle_server_received_bytes_total") > 0
            assert _one(m, "total_received_data") == sum(len(b.data) for b in spilled + in_memory)
            assert _one(m, "total_read_data_from_localfile") == _one(
                m, "riffle_server_read_bytes_total", source="localfile") > 0
            assert _one(m, "total_read_data_from_memory") > 0
            local_spills = sum(v for _lab, v in m["riffle_spill_total"])
            assert _one(m, "total_memory_spill_to_localfile") == local_spills > 0
            assert sum(v for _lab, v in m["localfile_disk_append_operation_counter"]) == local_spills
            assert sum(v for _lab, v in m["localfile_disk_append_operation_bytes_counter"]) == \
                _one(m, "total_localfile_used") > 0
            grpc_rpcs = sum(v for lab, v in m["riffle_server_rpc_total"] if not lab["rpc"].startswith("urpc:"))
            # the scrape counts itself nowhere: /metrics is HTTP, not gRPC
            assert _one(m, "total_grpc_request_number", path="ALL") == grpc_rpcs
            assert _one(m, "total_grpc_request_number", path="/rss.common.ShuffleServer/sendShuffleData") == 2
            assert _one(m, "grpc_duration_seconds_count", path="/rss.common.ShuffleServer/sendShuffleData") == 2
            assert _one(m, "grpc_send_data_process_time_count") == 2
            # Riffle's health conventions: 0 = healthy
            assert _one(m, "service_is_healthy") == 0 and _one(m, "riffle_server_healthy") == 1
            for disk in srv.disk_names:
                assert _one(m, "local_disk_is_healthy", root=disk) == 0
                assert 0 < _one(m, "local_disk_used_ratio", root=disk) < 1
            assert _one(m, "process_resident_memory_bytes") > 0
        await client.unregister_app(APP)
    finally:
        await client.close()


def test_the_doc_lists_every_name() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "riffle-metrics.md").read_text()
    for name in [*RIFFLE_METRIC_NAMES, *NOT_HERE]:
        assert f"| `{name}` |" in doc, f"docs/riffle-metrics.md does not list {name}"
