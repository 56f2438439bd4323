"""``[tracing]``: spans of the RPCs and spills reach an OTLP/HTTP receiver, and tracing never holds a request.

The receiver is a real HTTP server on a port of its own (``OtlpReceiver``) that decodes what the
server's exporter POSTs to ``/v1/traces`` with the OpenTelemetry protocol's own messages
(``ExportTraceServiceRequest``, from opentelemetry-proto), as Jaeger's OTLP receiver (4318) does:
the test checks the service name (Riffle's ``<jaeger_service_name>-<server id>``), the span names
(the gRPC method paths, as Riffle's) and their attributes. With the receiver gone, the RPCs go on at
full speed and the spans beyond the bounded queue are dropped.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from riffle_actors.server import ShuffleServer
from riffle_actors.tracing import GRPC_SERVICE_PATH, exporter_url
from tests.conftest import server_config, stop_server
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, make_blocks

pytestmark = pytest.mark.integration


class OtlpReceiver:
    """An OTLP/HTTP traces receiver (protobuf body) collecting (service name, span) pairs."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans: list[tuple[str, object]] = []
        lock = threading.Lock()
        self.spans, self.lock, self.posts = spans, lock, []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest.FromString(body)
                with lock:
                    outer.posts.append((self.path, self.headers.get("Content-Type")))
                    for rs in req.resource_spans:
                        service = next(a.value.string_value for a in rs.resource.attributes
                                       if a.key == "service.name")
                        for ss in rs.scope_spans:
                            spans.extend((service, s) for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        outer = self
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def names(self) -> set[str]:
        with self.lock:
            return {s.name for _, s in self.spans}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


def tracing_cfg(tmp_path, endpoint, **tracing):
    return server_config(tmp_path, capacity="8M", hybrid_store={"memory_single_buffer_max_spill_size": "64K"},
                         tracing={"jaeger_reporter_endpoint": endpoint, "jaeger_service_name": "riffle-it",
                                  **tracing})


async def test_rpc_and_spill_spans_reach_the_receiver(tmp_path, receiver):
    # a bare http://host:port gets the OTLP path, as Jaeger's receiver expects
    srv = ShuffleServer(tracing_cfg(tmp_path, f"http://127.0.0.1:{receiver.port}"))
    await srv.start()
    app = "application_trace_1"
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(app, 0, range(2))
            blocks = make_blocks(0, 1, 4, 40 << 10)  # 160K: above the 64K spill size, some go to disk
            await client.send_blocks(app, 0, blocks)
            await client.report(app, 0, 1, blocks)
            await client.get_shuffle_result(app, 0, [0])
            await poll_until(lambda: "spill" in receiver.names(), 30, message="no spill span (no spill?)")
            await client.read_partition(app, 0, 0, {b.block_id for b in blocks}, partition_num=2,
                                        check_complete=False)
        want = {GRPC_SERVICE_PATH + m for m in ("registerShuffle", "requireBuffer", "sendShuffleData",
                                                "reportShuffleResult", "getShuffleResultForMultiPart",
                                                "getMemoryShuffleData", "getLocalShuffleIndex",
                                                "getLocalShuffleData")} | {"spill"}
        try:
            await poll_until(lambda: want <= receiver.names(), 30)
        except AssertionError:
            raise AssertionError(f"spans missing: {sorted(want - receiver.names())}") from None
        with receiver.lock:
            services = {svc for svc, _ in receiver.spans}
            send = next(s for _, s in receiver.spans if s.name == GRPC_SERVICE_PATH + "sendShuffleData")
            spill = next(s for _, s in receiver.spans if s.name == "spill")
            paths = {p for p, _ in receiver.posts}
        assert services == {f"riffle-it-{srv.server_id}"}
        assert paths == {"/v1/traces"}
        attrs = {a.key: a.value for a in send.attributes}
        assert attrs["app_id"].string_value == app and attrs["status"].string_value == "SUCCESS"
        assert 0 < send.end_time_unix_nano - send.start_time_unix_nano < 30e9
        assert abs(send.end_time_unix_nano - time.time_ns()) < 120e9  # wall-clock times
        spill_attrs = {a.key: a.value for a in spill.attributes}
        assert spill_attrs["data_bytes"].int_value > 0 and spill_attrs["disk"].string_value
    finally:
        await stop_server(srv)


async def test_a_dead_receiver_never_holds_a_request_and_the_queue_is_bounded(tmp_path, receiver):
    port = receiver.port
    receiver.close()  # nothing listens there any more: every export fails (on the export thread)
    srv = ShuffleServer(tracing_cfg(tmp_path, f"http://127.0.0.1:{port}/v1/traces", max_queue_size=16,
                                    export_timeout_ms=2000))
    await srv.start()
    app = "application_trace_2"
    try:
        async with UniffleClient(f"127.0.0.1:{srv.grpc_port}") as client:
            await client.register_shuffle(app, 0, range(2))
            started = time.perf_counter()
            for i in range(200):
                await client.get_shuffle_result(app, 0, [i % 2])
            took = time.perf_counter() - started
        tracer = srv.metrics.tracer
        assert tracer.recorded <= 16 + 512 and tracer.dropped > 0, (tracer.recorded, tracer.dropped)
        assert took < 30, f"200 RPCs took {took:.1f}s with the receiver down"
    finally:
        await stop_server(srv)


def test_riffle_agent_address_maps_to_the_hosts_otlp_receiver():
    assert exporter_url("10.1.2.3:6831") == "http://10.1.2.3:4318/v1/traces"
    assert exporter_url("jaeger:6831") == "http://jaeger:4318/v1/traces"
    assert exporter_url("http://jaeger:4318") == "http://jaeger:4318/v1/traces"
    assert exporter_url("http://jaeger:14268") == "http://jaeger:4318/v1/traces"  # Riffle's README value
    assert exporter_url("https://otel.example:443/custom") == "https://otel.example:443/custom"
    for bad in ("jaeger", "udp://jaeger:6831", "http://u:p@j:4318", "j:99999", ""):
        with pytest.raises(ValueError):
            exporter_url(bad)
    with pytest.raises(Exception, match="jaeger_reporter_endpoint"):
        server_config(__import__("pathlib").Path("/tmp"), tracing={"jaeger_reporter_endpoint": "jaeger",
                                                                   "jaeger_service_name": "x"})
