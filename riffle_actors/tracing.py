"""Spans of the server's RPCs and spills, exported where Jaeger accepts them (``[tracing]``, Riffle's keys).

Riffle (fastrace + fastrace-jaeger) makes one root span per gRPC call, named by its path
(``/rss.common.ShuffleServer/sendShuffleData``), and reports them to a Jaeger *agent* over UDP
(Thrift compact) at ``jaeger_reporter_endpoint`` = ``IP:PORT`` (6831), service name
``<jaeger_service_name>-<server id>``, every call traced. Here the spans are made with the
OpenTelemetry SDK and exported with OTLP over HTTP, which Jaeger takes natively (its collector and
all-in-one listen on 4318) and the Jaeger agent's UDP protocol no longer has a maintained Python
exporter. ``exporter_url`` maps Riffle's value:

- ``http://host:4318/v1/traces`` (or ``https://``; a bare ``http://host:4318`` gets ``/v1/traces``): used as is;
- ``host:port`` (Riffle's agent address): ``http://host:4318/v1/traces``, the OTLP receiver on the same
  host (an all-in-one Jaeger, or a collector where the agent ran); the port is not used, and the start
  logs the mapping.
- ``http://host:14268`` (or ``.../api/traces``; Riffle's README shows this one, the Jaeger collector's
  Thrift-over-HTTP port, which Riffle itself cannot parse as an agent address): the same collector's
  OTLP receiver, ``http://host:4318/v1/traces``.

Cost bounds (the request path never waits for an export):

- one span per RPC, made after the call ended from the times already taken for ``/metrics``
  (``record``): a few microseconds on the loop, no context propagation, no per-block spans;
- ``sample_ratio`` (ours; Riffle traces every call, as the default 1.0 does) keeps that share of
  traces, decided from the trace id before anything is built;
- the SDK's batch processor holds at most ``max_queue_size`` finished spans; beyond, new spans are
  dropped (counted in ``dropped``), never queued without bound; its own thread exports batches
  (``export_timeout_ms`` each), off the event loop.

``Tracer.off()`` is the no-op used without ``[tracing]``. Nothing here knows the shuffle domain:
callers pass names and attributes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

OTLP_PORT = 4318
JAEGER_THRIFT_HTTP_PORT = 14268
OTLP_PATH = "/v1/traces"
#: the gRPC service whose method paths name the RPC spans (as Riffle's tracing middleware does)
GRPC_SERVICE_PATH = "/rss.common.ShuffleServer/"


def exporter_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for ``jaeger_reporter_endpoint`` (see the module docstring);
    ``ValueError`` for a value that is neither a URL nor ``host:port``."""
    value = endpoint.strip()
    if "://" in value:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{endpoint!r}: an OTLP/HTTP URL is http(s)://host[:port][/path]")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError(f"{endpoint!r}: no user info, query or fragment")
        if parts.port == JAEGER_THRIFT_HTTP_PORT and parts.path in ("", "/", "/api/traces"):
            # Riffle's README value: the Jaeger collector's Thrift-over-HTTP endpoint; the same
            # collector takes OTLP on 4318
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            return f"http://{host}:{OTLP_PORT}{OTLP_PATH}"
        path = parts.path if parts.path not in ("", "/") else OTLP_PATH
        return f"{parts.scheme}://{parts.netloc}{path}"
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/@ "):
        raise ValueError(f"{endpoint!r}: give Riffle's agent address host:port or an http(s):// OTLP URL")
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{OTLP_PORT}{OTLP_PATH}"


class Tracer:
    """Records finished spans; ``Tracer.off()`` when tracing is not configured."""

    def __init__(self, provider=None, tracer=None, processor=None, sample_ratio: float = 1.0):
        self._provider = provider
        self._tracer = tracer
        self._processor = processor
        self.enabled = tracer is not None
        self._ratio = sample_ratio
        self.recorded = 0
        self.dropped = 0
        # the SDK's bounded queue (a deque), to drop a span while it is full instead of having the
        # SDK evict the oldest one and log a warning per span; None if the SDK's insides differ
        self._queue = getattr(getattr(processor, "_batch_processor", None), "_queue", None)
        self._max_queue = getattr(self._queue, "maxlen", None)

    @classmethod
    def off(cls) -> Tracer:
        return cls()

    @classmethod
    def start(cls, endpoint: str, service_name: str, *, sample_ratio: float = 1.0, max_queue_size: int = 2048,
              export_batch_size: int = 512, schedule_delay_ms: int = 1000, export_timeout_ms: int = 10_000,
              resource_attributes: Mapping[str, str] | None = None) -> Tracer:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        resource = Resource.create({"service.name": service_name, **(resource_attributes or {})})
        # sampling is decided here (record), before a span is built; the SDK's sampler then keeps all
        provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        exporter = OTLPSpanExporter(endpoint=exporter_url(endpoint), timeout=export_timeout_ms / 1000)
        processor = BatchSpanProcessor(exporter, max_queue_size=max_queue_size,
                                       max_export_batch_size=min(export_batch_size, max_queue_size),
                                       schedule_delay_millis=schedule_delay_ms,
                                       export_timeout_millis=export_timeout_ms)
        provider.add_span_processor(processor)
        return cls(provider, provider.get_tracer("riffle_actors"), processor, sample_ratio)

    def record(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, object] | None = None,
               error: str | None = None) -> None:
        """One finished span ``name`` from ``start_ns`` to ``end_ns`` (``time.time_ns()`` clock);
        ``error``: the call's failure status (the span's status is then ERROR). Never blocks."""
        if self._tracer is None or (self._ratio < 1.0 and random.random() >= self._ratio):
            return
        queue = self._queue
        if self._max_queue is not None and queue is not None and len(queue) >= self._max_queue:
            self.dropped += 1  # the exporter is behind (or the receiver is down): drop, never wait
            return
        span = self._tracer.start_span(name, start_time=start_ns, attributes=attributes)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)
        self.recorded += 1

    def record_since(self, name: str, started_perf: float, attributes: Mapping[str, object] | None = None,
                     error: str | None = None) -> None:
        """``record`` for a call that started at ``time.perf_counter()`` value ``started_perf`` and ends now."""
        if self._tracer is None:
            return
        end_ns = time.time_ns()
        self.record(name, end_ns - int((time.perf_counter() - started_perf) * 1e9), end_ns, attributes, error)

    def flush(self, timeout_ms: int = 5000) -> bool:
        """Export what is queued now (blocks up to ``timeout_ms``: call it off the loop)."""
        return True if self._provider is None else bool(self._provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        """Export what is left and stop the export thread (blocks: off the loop, at stop)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = self._tracer = self._processor = None
            self.enabled = False
