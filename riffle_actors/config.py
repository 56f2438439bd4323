"""Typed configuration of ``riffle-server`` and the shared config primitives.

This module owns: parsing a TOML file into frozen pydantic models, the ``ByteSize``
type ("64M", "1G", plain integers), the ``[log]`` section shared by every daemon, and
``ConfigError``, which lists the dotted key name and the reason of every problem.
Unknown keys are rejected (``extra="forbid"``) so a typo never silently falls back to
a default. Key names follow Riffle's TOML so Riffle configs carry over.

It does not cover: the coordinator's own sections (``riffle_actors.coordinator.config``
builds on the primitives here) or turning the config into running actors
(``riffle_actors.server``).
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_byte_size(value: Any) -> int:
    """Parse ``"64M"``, ``"1.5G"``, ``"512KiB"`` or an integer into bytes (binary units)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 64M or 1G, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size must not be negative")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    raise ValueError(f"invalid size {value!r}: use bytes or a number with K/M/G/T, e.g. 64M")


ByteSize = Annotated[int, BeforeValidator(parse_byte_size)]


class FieldProblem(ValueError):
    """Raised by cross-field checks so the error names the offending key, not its section."""

    def __init__(self, key: str, reason: str):
        self.key = key
        super().__init__(reason)


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds ``(dotted_key, reason)`` pairs."""

    def __init__(self, path: str | os.PathLike[str] | None, problems: list[tuple[str, str]]):
        self.path = str(path) if path is not None else "<config>"
        self.problems = problems
        lines = "\n".join(f"  {key}: {reason}" for key, reason in problems)
        super().__init__(f"invalid config {self.path}:\n{lines}")


class StrictModel(BaseModel):
    """Base of every config section: immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class LogConfig(StrictModel):
    """``[log]``: where and how much the daemon logs (loguru)."""

    path: str | None = Field(None, description="log file; unset = stderr")
    level: str = Field("INFO", description="TRACE, DEBUG, INFO, WARNING, ERROR")
    rotation: str = Field("100 MB", description="loguru rotation of the log file")
    retention: int = Field(5, ge=1, description="rotated log files kept")

    @model_validator(mode="after")
    def _check_level(self) -> LogConfig:
        if self.level.upper() not in {"TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"}:
            raise FieldProblem("level", f"unknown log level {self.level!r}")
        return self


def parse_bind_address(value: Any) -> str:
    """A listen address: an IPv4/IPv6 literal (``0.0.0.0`` / ``::`` = all interfaces) or ``localhost``.

    Host names other than ``localhost`` are refused: a name that resolves differently later
    would silently move a listener to another interface.
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected an IP address such as 0.0.0.0, 127.0.0.1 or ::")
    value = value.strip()
    if value == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address (use 0.0.0.0 for all interfaces, "
                         f"127.0.0.1 for loopback only)") from None


BindAddress = Annotated[str, BeforeValidator(parse_bind_address)]


def is_wildcard(address: str) -> bool:
    """True for the all-interfaces addresses ``0.0.0.0`` and ``::``."""
    return ipaddress.ip_address(address).is_unspecified


class MetricsConfig(StrictModel):
    """``[metrics]`` (Riffle's keys): optional push of the daemon's metrics to a Prometheus Pushgateway.

    ``/metrics`` stays scrapeable either way; the push only adds a copy every ``push_interval_sec``.
    """

    push_gateway_endpoint: str | None = Field(
        None, description="Pushgateway base URL (e.g. http://pushgateway:9091); unset = no push")
    push_interval_sec: int = Field(10, ge=1, description="seconds between two pushes")
    labels: dict[str, str] = Field(default_factory=dict, description="extra grouping labels of the push")

    @field_validator("push_gateway_endpoint", mode="after")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"{value!r} is not an http(s):// URL such as http://pushgateway:9091")
        return value

    @field_validator("labels", mode="after")
    @classmethod
    def _check_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", key):
                raise ValueError(f"label name {key!r} is not a Prometheus label name")
        return value


class AdminConfig(StrictModel):
    """``[admin]``: credentials for HTTP endpoints that change state (decommission, status overrides).

    With none configured (here or in the environment), such requests are refused with 403 and
    the reason. The environment variables win over the file, so a secret need not sit in the
    config: ``RIFFLE_ADMIN_TOKEN``, ``RIFFLE_ADMIN_USER``, ``RIFFLE_ADMIN_PASSWORD``.
    """

    token: str | None = Field(None, description="bearer token (Authorization: Bearer ...); env RIFFLE_ADMIN_TOKEN")
    token_file: str | None = Field(None, description="file whose first line is the token (e.g. a mounted secret)")
    basic_user: str | None = Field(None, description="HTTP Basic user name; env RIFFLE_ADMIN_USER")
    basic_password: str | None = Field(None, description="HTTP Basic password; env RIFFLE_ADMIN_PASSWORD")

    @model_validator(mode="after")
    def _check(self) -> AdminConfig:
        if self.token is not None and len(self.token) < 16:
            raise FieldProblem("token", "must be at least 16 characters")
        if (self.basic_user is None) != (self.basic_password is None):
            raise FieldProblem("basic_password" if self.basic_password is None else "basic_user",
                               "basic_user and basic_password go together")
        if self.basic_password is not None and len(self.basic_password) < 12:
            raise FieldProblem("basic_password", "must be at least 12 characters")
        return self


class StorageType(enum.StrEnum):
    MEMORY_LOCALFILE = "MEMORY_LOCALFILE"
    MEMORY_LOCALFILE_HDFS = "MEMORY_LOCALFILE_HDFS"
    MEMORY_HDFS = "MEMORY_HDFS"

    @property
    def has_localfile(self) -> bool:
        return "LOCALFILE" in self.value

    @property
    def has_hdfs(self) -> bool:
        return "HDFS" in self.value


class MemoryStoreConfig(StrictModel):
    """``[memory_store]``: the write buffer budget and its tickets."""

    capacity: ByteSize = Field("1G", gt=0, description="bytes of shuffle data held in memory")
    buffer_ticket_timeout_sec: int = Field(
        60, ge=1, description="a requireBuffer ticket not used by a send within this time is released"
    )
    buffer_ticket_check_interval_sec: int = Field(1, ge=1, description="how often expired tickets are swept")


class LocalfileStoreConfig(StrictModel):
    """``[localfile_store]``: the local disks, one Disk actor each."""

    data_paths: list[str] = Field(default_factory=list, description="one directory per disk",
                                  json_schema_extra={"example": ["/data1/riffle", "/data2/riffle"]})
    min_number_of_available_disks: int = Field(1, ge=0, description="fewer healthy disks = server UNHEALTHY")
    disk_high_watermark: float = Field(0.8, gt=0, le=1, description="used ratio at which a disk stops taking data")
    disk_low_watermark: float = Field(0.7, gt=0, le=1, description="used ratio at which a full disk is re-admitted")
    disk_healthy_check_interval_sec: int = Field(
        60, ge=1, description="health probe period (write + fsync + read back a small file, capacity check)")
    disk_probe_timeout_sec: float = Field(
        10.0, gt=0, description="a probe (run in its own process) not answered in time quarantines its disk; "
                                "the stuck probe process is killed and replaced")
    disk_probation_probes: int = Field(3, ge=1, description="healthy probes in a row that re-admit a quarantined disk")
    disk_failures_to_quarantine: int = Field(
        3, ge=1, description="EIO (or other) IO failures in a row that quarantine a disk; ENOSPC, EROFS and "
                             "timeouts quarantine at once")
    disk_io_timeout_sec: float = Field(
        60.0, gt=0, description="a disk read or write not done in time fails with TIMEOUT (a spill then "
                                "moves to another disk); the blocked thread is left to finish")
    disk_write_threads: int = Field(1, ge=1, le=16, description="writer threads per disk (appends to one partition are serialized)")
    disk_read_threads: int = Field(2, ge=1, le=32, description="reader threads per disk")
    direct_io_append_enable: bool = Field(
        True, description="spill appends bypass the page cache (O_DIRECT from aligned buffers; the unaligned "
                          "tail is rewritten by the next append); a file system that refuses O_DIRECT gets "
                          "buffered appends, with the reason logged")

    @model_validator(mode="after")
    def _check(self) -> LocalfileStoreConfig:
        if len(set(self.data_paths)) != len(self.data_paths):
            raise FieldProblem("data_paths", "lists the same directory twice")
        if self.disk_low_watermark > self.disk_high_watermark:
            raise FieldProblem("disk_low_watermark", "disk_low_watermark must not exceed disk_high_watermark")
        return self


class HybridStoreConfig(StrictModel):
    """``[hybrid_store]``: when memory is spilled to disk."""

    memory_spill_high_watermark: float = Field(0.8, gt=0, le=1, description="used/capacity that starts a spill")
    memory_spill_low_watermark: float = Field(0.2, ge=0, lt=1, description="spill until used/capacity is below")
    memory_single_buffer_max_spill_size: ByteSize | None = Field(
        "128M", description="a partition buffer above this size is spilled on its own; unset = never"
    )
    memory_spill_max_concurrency: int = Field(8, ge=1, description="spills in flight across all disks")
    memory_spill_to_cold_threshold_size: ByteSize | None = Field(
        None, description="a spill batch larger than this goes to HDFS (store_type with HDFS); unset = by size never")
    huge_partition_memory_spill_to_hdfs_threshold_size: ByteSize | None = Field(
        None, description="a huge partition's spill batch larger than this goes to HDFS (store_type with HDFS; "
                          "needs app_config.partition_limit_enable); unset = huge partitions stay local")

    @model_validator(mode="after")
    def _check(self) -> HybridStoreConfig:
        if self.memory_spill_low_watermark >= self.memory_spill_high_watermark:
            raise FieldProblem("memory_spill_low_watermark",
                               "memory_spill_low_watermark must be below memory_spill_high_watermark")
        return self


class HdfsStoreConfig(StrictModel):
    """``[hdfs_store]``: the HDFS tier's writers (store_type MEMORY_LOCALFILE_HDFS or MEMORY_HDFS).

    Where the files go is not configured here: each app's client sends its remote storage path
    (and Hadoop conf items) in registerShuffle, from the coordinator's ``[remote_storage]``.
    """

    max_concurrency: int = Field(50, ge=1, le=1024, description="HDFS writes in flight over the server "
                                                                "(also the writer thread count)")
    partition_write_max_concurrency: int = Field(
        20, ge=1, le=1024, description="HDFS writes in flight for one partition, each to its own file pair "
                                       "<serverId>_<i>_<retry>")
    write_timeout_sec: float = Field(120.0, gt=0, description="an HDFS write not done in time fails (the batch "
                                                              "goes to local disk, its file pair is abandoned)")
    unhealthy_retry_interval_sec: float = Field(
        30.0, ge=0, description="after a failed HDFS write, spills skip HDFS this long (they go to local disk)")
    replication: int | None = Field(None, ge=1, le=32, description="replication of new HDFS files; "
                                                                   "unset = the NameNode's default")


class AppConfig(StrictModel):
    """``[app_config]``: per-application limits and expiry."""

    app_heartbeat_timeout_min: float = Field(5, gt=0, description="apps silent this long are purged")
    app_expiry_check_interval_sec: int = Field(10, ge=1, description="how often silent apps are looked for")
    partition_limit_enable: bool = Field(False, description="mark partitions above the threshold huge")
    partition_limit_threshold: ByteSize = Field("20G", gt=0, description="bytes after which a partition is huge")
    partition_limit_memory_backpressure_ratio: float = Field(
        0.2, gt=0, le=1, description="huge partitions holding more than this share of capacity get NO_BUFFER_FOR_HUGE_PARTITION"
    )
    huge_partition_memory_single_buffer_max_spill_size: ByteSize = Field(
        "64M", gt=0, description="spill size of a huge partition's buffer"
    )


class HealthConfig(StrictModel):
    """``[health]``: when the server calls itself unhealthy."""

    memory_stuck_above_high_watermark_sec: int = Field(
        300, ge=1, description="memory above the spill high watermark this long = UNHEALTHY"
    )


class UrpcIndexVersion(enum.StrEnum):
    V1 = "V1"
    V2 = "V2"


class UrpcConfig(StrictModel):
    """``[urpc_config]``: the Netty data transport (``urpc_port``), served when the client uses GRPC_NETTY."""

    get_index_rpc_version: UrpcIndexVersion = Field(
        UrpcIndexVersion.V1, description="index response type: V1 (type 14, every client) or V2 (type 23 with "
                                         "storage ids; 0.10+ clients only, a 0.9 client cannot decode it)")
    max_connections: int = Field(
        4096, ge=1, description="open urpc connections; more are closed at once with a logged reason "
                                "(each executor opens up to rss.client.netty.client.connections.per.peer, 2)")
    max_inflight_bytes: ByteSize = Field(
        "256M", ge=1 << 20, description="bytes of large request frames (those above 64K) received and not yet "
                                        "processed, over all connections; above it connections stop reading "
                                        "until some are done")
    max_requests_per_connection: int = Field(
        64, ge=1, le=4096, description="requests of one connection in progress at once; above it the "
                                       "connection stops reading until replies are sent")
    sendfile_enable: bool = Field(
        True, description="GetLocalShuffleData replies go from the data file to the socket with sendfile (no "
                          "copy through the server process) when the connection has nothing else queued; "
                          "false: read into memory, then write")
    sendfile_stall_timeout_sec: float = Field(
        60.0, gt=0, description="a reply the client does not read for this long (sent with sendfile, or waiting "
                                "in the socket's write buffer) closes the connection")
    frame_read_timeout_sec: float = Field(
        60.0, gt=0, description="a request frame whose bytes do not all arrive within this time of its first "
                                "one (or a new connection with no frame within it) is closed, releasing what "
                                "it reserved of max_inflight_bytes")
    frame_read_min_bytes_per_sec: ByteSize = Field(
        "64K", ge=0, description="a frame arriving slower than this on average (judged after 5 s) closes the "
                                 "connection; 0 = only frame_read_timeout_sec")
    idle_timeout_sec: float = Field(
        900.0, gt=0, description="a connection with no request for this long (and nothing in progress) is "
                                 "closed; above the client's own 600 s idle close "
                                 "(rss.client.netty.client.connection.timeout.ms), and it reconnects anyway")
    max_reply_bytes_per_connection: ByteSize = Field(
        "64M", ge=1 << 20, description="reply bytes one connection may hold (being read for it, or written and "
                                       "not yet read by the client); above it the connection stops reading "
                                       "requests until its client reads (one reply always goes through)")


class ServerConfig(StrictModel):
    """The whole ``riffle-server`` TOML file."""

    store_type: StorageType = Field(StorageType.MEMORY_LOCALFILE, description="storage tiers")
    grpc_port: int = Field(19999, ge=0, le=65535, description="gRPC port; 0 = any free port")
    grpc_bind_address: BindAddress = Field(
        "0.0.0.0", description="address the gRPC port listens on (executors must reach it); 0.0.0.0 = all "
                               "interfaces, :: = all IPv6 (and IPv4) interfaces, 127.0.0.1 = this host only")
    grpc_max_concurrent_streams: int = Field(
        100, ge=1, le=65536, description="HTTP/2 streams (RPCs) one gRPC connection may have open at once; the "
                                         "client queues more")
    grpc_max_reply_bytes_per_connection: ByteSize = Field(
        "256M", ge=1 << 20, description="read reply bytes one gRPC connection may hold (being read, or waiting "
                                        "for the client's HTTP/2 flow-control window); above it reads wait, "
                                        "then get NO_BUFFER after reply_wait_timeout_sec")
    max_reply_bytes: ByteSize = Field(
        "1G", ge=1 << 20, description="read reply bytes the server holds over gRPC and urpc together (being "
                                      "read, or sent and not yet taken by the client), outside "
                                      "memory_store.capacity; a read above it waits, then gets NO_BUFFER")
    reply_wait_timeout_sec: float = Field(
        10.0, gt=0, description="how long a read waits for max_reply_bytes (or "
                                "grpc_max_reply_bytes_per_connection) before it is answered NO_BUFFER (the "
                                "client backs off and retries)")
    grpc_max_message_size: ByteSize = Field(
        "64M", ge=1 << 20, le=1 << 30,
        description="largest gRPC request and urpc frame accepted (refused before it is buffered) and largest "
                    "getLocalShuffleData read served; the client sends at most 16M per request by default")
    urpc_port: int | None = Field(
        None, ge=0, le=65535, description="Netty data port (client type GRPC_NETTY); 0 = any free port, "
                                          "unset = off")
    urpc_bind_address: BindAddress = Field(
        "0.0.0.0", description="address the urpc port listens on (executors must reach it)")
    http_port: int = Field(20010, ge=0, le=65535, description="HTTP port (/metrics, /health, /apps); 0 = any")
    http_bind_address: BindAddress = Field(
        "0.0.0.0", description="address the HTTP port listens on; 127.0.0.1 keeps metrics and listings local")
    coordinator_quorum: list[str] = Field(default_factory=list, description="host:port of each coordinator")
    tags: list[str] = Field(default_factory=list, description="extra tags sent in heartbeats")
    heartbeat_interval_seconds: int = Field(10, ge=1, description="period of the coordinator heartbeat")
    grace_period_sec: int = Field(30, ge=0, description="on SIGTERM, time allowed to flush memory to disk")
    decommission_check_interval_sec: float = Field(
        10.0, gt=0, description="while DECOMMISSIONING, how often the server checks whether its last app is gone "
                                "(then it stops itself as on SIGTERM)")
    admin: AdminConfig = Field(default_factory=AdminConfig,
                               description="credentials of the HTTP admin routes (/admin: kill, decommission)")
    memory_store: MemoryStoreConfig = Field(default_factory=MemoryStoreConfig)
    localfile_store: LocalfileStoreConfig = Field(default_factory=LocalfileStoreConfig)
    hybrid_store: HybridStoreConfig = Field(default_factory=HybridStoreConfig)
    hdfs_store: HdfsStoreConfig = Field(default_factory=HdfsStoreConfig)
    urpc_config: UrpcConfig = Field(default_factory=UrpcConfig)
    app_config: AppConfig = Field(default_factory=AppConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if not self.store_type.has_localfile and self.localfile_store.data_paths:
            raise FieldProblem("localfile_store.data_paths", f"store_type {self.store_type.value} has no local "
                                                             f"tier; remove the data paths or use MEMORY_LOCALFILE_HDFS")
        if self.store_type.has_localfile and not self.localfile_store.data_paths:
            raise FieldProblem("localfile_store.data_paths", f"store_type {self.store_type.value} needs at least one")
        for entry in self.coordinator_quorum:
            host, sep, port = entry.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise FieldProblem("coordinator_quorum", f"entry {entry!r} is not host:port")
        return self


M = TypeVar("M", bound=BaseModel)


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def validate_config(model: type[M], data: dict[str, Any], path: str | os.PathLike[str] | None = None) -> M:
    """Validate a parsed TOML table, turning pydantic errors into one ``ConfigError``."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            reason = err["msg"]
            loc = tuple(err["loc"])
            if err["type"] == "extra_forbidden":
                reason = "unknown key"
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldProblem):
                loc += tuple(cause.key.split("."))
                reason = str(cause)
            problems.append((_dotted(loc), reason.removeprefix("Value error, ")))
        raise ConfigError(path, problems) from None


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(path, [("<file>", "no such file")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [("<file>", f"not valid TOML: {e}")]) from None


def load_config(path: str | os.PathLike[str]) -> ServerConfig:
    """Read and validate a server TOML file; relative data paths resolve against the working directory."""
    data = load_toml(path)
    ls = data.get("localfile_store")
    if isinstance(ls, dict) and isinstance(ls.get("data_paths"), list):
        ls["data_paths"] = [str(Path(p).resolve()) if isinstance(p, str) else p for p in ls["data_paths"]]
    return validate_config(ServerConfig, data, path)
