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

from riffle_actors.protocol.hdfs_layout import normalize_remote_path
from riffle_actors.tracing import exporter_url

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


def SizeField(default: str, **kw: Any) -> Any:
    """A ``ByteSize`` field whose default is written as a size (``"1G"``): validated like a configured
    value (``validate_default``) and shown as written in the generated config docs."""
    return Field(default, **kw)


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


# --- Riffle's keys (docs/riffle-compat.md) ---------------------------------------------------------
class RiffleKind(enum.StrEnum):
    """How a key that exists for Riffle's configs is treated here (``riffle_key``)."""

    MAPPED = "mapped"  # Riffle's name (or a Riffle thread pool) for a setting of ours: it sets or caps that one
    NOT_YET = "not yet"  # accepted; the feature is not built here: a WARNING at start when it is set
    NO_EFFECT = "no effect"  # accepted; it means nothing in this design: an INFO line at start when set


def riffle_key(kind: RiffleKind, note: str, *, target: str | None = None, inert: Any = None) -> dict[str, Any]:
    """``json_schema_extra`` of a field kept for Riffle's configs. ``note``: what it does here (or why
    not); ``target``: the dotted key of ours it sets or caps (MAPPED); ``inert``: a value that needs
    no log line because it asks for what this server does anyway (e.g. ``false`` for a feature
    not built here)."""
    extra: dict[str, Any] = {"riffle": kind.value, "riffle_note": note}
    if target is not None:
        extra["riffle_target"] = target
    if inert is not None:
        extra["riffle_inert"] = inert
    return extra


def riffle_extra(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The ``riffle_key`` metadata of field ``name`` of ``model`` ({} for a key of our own)."""
    extra = model.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) and "riffle" in extra else {}


def _conflict(riffle_name: str, ours: str) -> FieldProblem:
    return FieldProblem(riffle_name, f"is Riffle's name of {ours} here and both are set to different values; "
                                     f"keep one of them")


class LogConfig(StrictModel):
    """``[log]``: where and how much the daemon logs (loguru)."""

    path: str | None = Field(None, description="log file; unset = stderr")
    level: str = Field("INFO", description="TRACE, DEBUG, INFO, WARNING, ERROR")
    rotation: str = Field("100 MB", description="loguru rotation of the log file")
    retention: int = Field(5, ge=1, description="rotated log files kept")

    # Riffle's [log] keys (path and rotation above are Riffle's names too; see riffle_actors.log)
    log_level: str | None = Field(
        None, description="Riffle's name of level: DEBUG, INFO or WARN",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets level (WARN = WARNING)", target="log.level"))
    max_file_size: ByteSize | None = Field(
        None, gt=0, description="Riffle's size limit of one log file",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "rotates the log file at this size when rotation is Never "
                                                         "or not set (loguru rotates on one condition)",
                                     target="log.rotation"))
    max_log_files: int | None = Field(
        None, ge=1, description="Riffle's name of retention",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets retention", target="log.retention"))

    @model_validator(mode="after")
    def _check_level(self) -> LogConfig:
        if self.level.upper() not in {"TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"}:
            raise FieldProblem("level", f"unknown log level {self.level!r}")
        if self.log_level is not None:
            if self.log_level.upper() not in _RIFFLE_LOG_LEVELS:
                raise FieldProblem("log_level", f"unknown log level {self.log_level!r}: DEBUG, INFO or WARN")
            if ("level" in self.model_fields_set
                    and self.level.upper() != _RIFFLE_LOG_LEVELS[self.log_level.upper()]):
                raise _conflict("log_level", "level")
        if (self.max_log_files is not None and "retention" in self.model_fields_set
                and self.max_log_files != self.retention):
            raise _conflict("max_log_files", "retention")
        return self

    @property
    def effective_level(self) -> str:
        """``level``, or Riffle's ``log_level`` when only that is set (upper case, loguru's names)."""
        if self.log_level is not None and "level" not in self.model_fields_set:
            return _RIFFLE_LOG_LEVELS[self.log_level.upper()]
        return self.level.upper()

    @property
    def effective_rotation(self) -> str | int | None:
        """loguru's rotation: Riffle's ``Hourly`` / ``Daily`` / ``Never`` (None) or loguru's own forms;
        Riffle's ``max_file_size`` (bytes) when rotation is Never or not set."""
        rotation: str | int | None = self.rotation
        if self.rotation.strip().lower() in ("hourly", "daily"):
            rotation = self.rotation.strip().lower()
        elif self.rotation.strip().lower() == "never":
            rotation = None
        if self.max_file_size is not None and (rotation is None or "rotation" not in self.model_fields_set):
            rotation = self.max_file_size
        return rotation

    @property
    def effective_retention(self) -> int:
        return self.max_log_files if self.max_log_files is not None else self.retention

    @property
    def file_path(self) -> str | None:
        """The log file: ``path``, or ``<path>/riffle-server.log`` when ``path`` names a directory
        (an existing one, or ending with ``/``) as Riffle's ``[log] path`` does."""
        if not self.path:
            return None
        if self.path.endswith(("/", os.sep)) or os.path.isdir(self.path):
            return os.path.join(self.path, "riffle-server.log")
        return self.path


_RIFFLE_LOG_LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARNING"}


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


class RiffleBufferType(enum.StrEnum):
    DEFAULT = "DEFAULT"
    INDEXED = "INDEXED"
    EXPERIMENTAL = "EXPERIMENTAL"  # Riffle's old name of INDEXED


class MemoryStoreConfig(StrictModel):
    """``[memory_store]``: the write buffer budget and its tickets."""

    capacity: ByteSize = SizeField("1G", gt=0, description="bytes of shuffle data held in memory")
    buffer_ticket_timeout_sec: int = Field(
        60, ge=1, description="a requireBuffer ticket not used by a send within this time is released"
    )
    buffer_ticket_check_interval_sec: int = Field(1, ge=1, description="how often expired tickets are swept")
    app_buffer_ticket_max_ratio: float = Field(
        0.5, gt=0, le=1, description="share of capacity one app's unused requireBuffer tickets may reserve at "
                                     "once; above it requireBuffer answers NO_BUFFER (the client backs off)")
    app_buffer_ticket_max_number: int = Field(
        4096, ge=1, description="unused requireBuffer tickets one app may hold at once; above it NO_BUFFER")

    # Riffle's keys without a counterpart here (docs/riffle-compat.md)
    buffer_type: RiffleBufferType = Field(
        RiffleBufferType.DEFAULT, description="Riffle's memory buffer structure (DEFAULT, INDEXED, EXPERIMENTAL)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "one buffer design here: a partition's staging and "
                                                            "in-flight block lists", inert="DEFAULT"))
    dashmap_shard_amount: int | None = Field(
        None, ge=1, description="Riffle's shard count of its concurrent maps (README; Riffle 0.27 ignores it too)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "no shared concurrent maps here: each partition's "
                                                            "buffer is owned by one actor"))


class IoLimiterConfig(StrictModel):
    """``[localfile_store.io_limiter]`` (Riffle's keys and defaults): a byte throughput limit per disk.

    One token bucket per data path, shared by its reads and writes: ``capacity`` bytes per second,
    bursts of up to one second's worth. Spill appends are charged their data bytes, data reads their
    length, index reads their size; the wait is slept on the disk's IO threads (never the event loop)
    and counts towards ``disk_io_timeout_sec``. A request larger than ``capacity`` waits for it in full
    (Riffle passes it unthrottled). See docs/storage.md "Disk throttle"."""

    capacity: ByteSize = Field(gt=0, description="bytes per second of one disk (also the burst)")
    read_enable: bool = Field(True, description="throttle reads (index and data reads served to clients)")
    write_enable: bool = Field(True, description="throttle writes (spill appends)")


class ReadAheadConfig(StrictModel):
    """``[localfile_store.read_ahead_options]`` (Riffle's keys and defaults): read-ahead of data files.

    As in Riffle, for apps whose client sets ``spark.rss.riffle.readAheadEnabled = true`` (its
    ``readAheadBatchSize`` / ``readAheadBatchNumber`` may lower, not raise, the two sizes below): the
    kernel is asked to load data-file ranges into the page cache before they are read
    (``posix_fadvise(WILLNEED)`` on the disk's read-ahead threads, ``disk_read_ahead_threads``); no
    bytes are held by the server. See ``riffle_actors.state.read_ahead`` and docs/storage.md."""

    batch_size: ByteSize = SizeField("14M", gt=0, le=1 << 30, description="bytes per read-ahead batch (apps "
                                 "with spark.rss.riffle.readAheadEnabled = true): a sequential reader's first read (at offset 0) loads batch_number batches, "
                                 "each read within two batches of the loaded end loads two more")
    batch_number: int = Field(4, ge=1, le=64, description="batches loaded by a sequential reader's first read")
    read_plan_enable: bool = Field(False, description="load the next segments a urpc client announces "
                                                      "(getLocalShuffleDataV3) for reads that are not sequential")
    read_plan_concurrency: int = Field(100, ge=1, le=10_000, description="read-plan loads queued or running "
                                                                          "per disk; more are skipped")


class IoUringConfig(StrictModel):
    """``[localfile_store.io_uring_options]`` (Riffle): the io_uring disk IO engine."""

    threads: int = Field(2, ge=1, description="io_uring threads")
    io_depth: int = Field(64, ge=1, description="submission queue depth")


#: upper bounds of the per-disk thread pools (``disk_write_threads``, ``disk_read_threads``)
MAX_DISK_WRITE_THREADS = 16
MAX_DISK_READ_THREADS = 32


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
    recovery_file_max_size: ByteSize = SizeField(
        "1G", ge=1 << 20, description="restart recovery reads no shuffle.meta or partition index larger than "
                                         "this (the shuffle or partition counts as lost, logged); a metadata "
                                         "append that would grow a shuffle.meta past it fails")
    meta_write_retry_timeout_sec: float = Field(
        30.0, ge=0, le=3600, description="a shuffle metadata record (registerShuffle, reportShuffleResult, a "
                                         "spill's segment) that every disk failed (read-only, full, EIO) is "
                                         "tried again, 0.05 s doubling up to 1 s apart, for this long before "
                                         "the request fails; keep it below the client's rss.client.rpc.timeout.ms "
                                         "(60 s); 0 = fail at once")

    # Riffle's keys (docs/riffle-compat.md)
    write_concurrency_per_disk: int | None = Field(
        None, ge=1, description="Riffle's writes in flight per disk (its default 4); unset = disk_write_threads",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, f"sets disk_write_threads (writer threads per disk; at "
                                                         f"most {MAX_DISK_WRITE_THREADS})",
                                     target="localfile_store.disk_write_threads"))
    io_duration_threshold_sec: float | None = Field(
        None, gt=0, description="Riffle's timeout of one disk IO (its default 300); unset = disk_io_timeout_sec",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets disk_io_timeout_sec (Riffle's TimeoutLayer fails an "
                                                         "IO after this long, as disk_io_timeout_sec does)",
                                     target="localfile_store.disk_io_timeout_sec"))
    direct_io_enable: bool | None = Field(
        None, description="Riffle README's name of direct_io_append_enable (O_DIRECT flushes)",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets direct_io_append_enable (Riffle 0.27 itself no "
                                                         "longer reads this key)",
                                     target="localfile_store.direct_io_append_enable"))
    launch_purge_enable: bool = Field(
        False, description="at start, delete everything under each data path (instead of recovering it)")
    direct_io_read_enable: bool = Field(
        False, description="data reads bypass the page cache (O_DIRECT into aligned buffers, the file's "
                           "unpadded tail read short); only where appends are direct too "
                           "(direct_io_append_enable), as in Riffle; replaces sendfile on urpc (sendfile "
                           "cannot bypass the page cache; Riffle prefers direct reads too); a file system "
                           "that refuses O_DIRECT gets buffered reads, with the reason logged. Riffle README's "
                           "key (Riffle 0.27 chooses the mode per client instead)")
    disk_write_buf_capacity: ByteSize = SizeField(
        "1M", description="Riffle's write buffer of a data file",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "a spill batch is written by one call from its own "
                                                            "buffer; there is no intermediate write buffer"))
    disk_read_buf_capacity: ByteSize = SizeField(
        "1M", description="Riffle's read buffer of a data file",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "a read is one pread (or sendfile) of the requested "
                                                            "range; there is no intermediate read buffer"))
    index_consistency_detection_enable: bool = Field(
        False, description="check each index served against its data file (as Riffle: the last record "
                           "must end where the data file ends; a mismatch still there with the partition's "
                           "appends held off is logged as an ERROR and counted in "
                           "riffle_localfile_index_inconsistencies_total; the index is served as read; "
                           "Riffle also copies both files to /tmp, not done here)")
    io_limiter: IoLimiterConfig | None = Field(
        None, description="Riffle's disk throughput limit per disk (disk throttle; unset = not limited)")
    scrub_rate: ByteSize = SizeField(
        "8M", ge=0, description="bytes per second each disk's scrubber re-reads of its spilled data files to "
                                "check every block's CRC (charged to io_limiter too, when set); 0 = no scrubbing")
    scrub_interval_sec: float = Field(
        300.0, gt=0, description="pause between two scrub passes over a disk's data files")
    read_crc_check_enable: bool = Field(
        True, description="check every whole block of a local data range being served against its index "
                          "record's CRC before it is sent (read once on the disk's reader pool, the same bytes "
                          "sent: urpc then serves from memory, not by sendfile); a mismatch refuses the read "
                          "like a block the scrubber found corrupt, and records the block (not a Riffle key)")
    read_ahead_options: ReadAheadConfig | None = Field(
        None, description="read-ahead of data files for apps that ask for it (unset = off)")
    disk_read_ahead_threads: int = Field(
        1, ge=1, le=16, description="read-ahead threads per disk (read_ahead_options; they only queue the "
                                    "kernel's reads)")
    io_uring_options: IoUringConfig | None = Field(
        None, description="Riffle's io_uring IO engine (its io-uring build only)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "disk IO runs on per-disk thread pools here (Python "
                                                            "has no io_uring engine); Riffle without its io-uring "
                                                            "build ignores it too"))

    @model_validator(mode="after")
    def _check(self) -> LocalfileStoreConfig:
        if len(set(self.data_paths)) != len(self.data_paths):
            raise FieldProblem("data_paths", "lists the same directory twice")
        if self.disk_low_watermark > self.disk_high_watermark:
            raise FieldProblem("disk_low_watermark", "disk_low_watermark must not exceed disk_high_watermark")
        fields = self.model_fields_set
        if (self.write_concurrency_per_disk is not None and "disk_write_threads" in fields
                and min(self.write_concurrency_per_disk, MAX_DISK_WRITE_THREADS) != self.disk_write_threads):
            raise _conflict("write_concurrency_per_disk", "disk_write_threads")
        if (self.io_duration_threshold_sec is not None and "disk_io_timeout_sec" in fields
                and self.io_duration_threshold_sec != self.disk_io_timeout_sec):
            raise _conflict("io_duration_threshold_sec", "disk_io_timeout_sec")
        if (self.direct_io_enable is not None and "direct_io_append_enable" in fields
                and self.direct_io_enable != self.direct_io_append_enable):
            raise _conflict("direct_io_enable", "direct_io_append_enable")
        return self


class HybridStoreConfig(StrictModel):
    """``[hybrid_store]``: when memory is spilled to disk."""

    memory_spill_high_watermark: float = Field(0.8, gt=0, le=1, description="used/capacity that starts a spill")
    memory_spill_low_watermark: float = Field(0.2, ge=0, lt=1, description="spill until used/capacity is below")
    memory_single_buffer_max_spill_size: ByteSize | None = SizeField(
        "128M", description="a partition buffer above this size is spilled on its own; unset = never"
    )
    memory_spill_max_concurrency: int = Field(8, ge=1, description="spills in flight across all disks")
    memory_spill_to_cold_threshold_size: ByteSize | None = Field(
        None, description="a spill batch larger than this goes to HDFS (store_type with HDFS); unset = by size never")
    huge_partition_memory_spill_to_hdfs_threshold_size: ByteSize | None = Field(
        None, description="a huge partition's spill batch larger than this goes to HDFS (store_type with HDFS; "
                          "needs app_config.partition_limit_enable); unset = huge partitions stay local")

    # Riffle's keys (docs/riffle-compat.md)
    huge_partition_memory_single_buffer_max_spill_size: ByteSize | None = Field(
        None, gt=0, description="Riffle's place of app_config.huge_partition_memory_single_buffer_max_spill_size",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets app_config.huge_partition_memory_single_buffer_"
                                                         "max_spill_size",
                                     target="app_config.huge_partition_memory_single_buffer_max_spill_size"))
    memory_spill_to_hdfs_concurrency: int | None = Field(
        None, description="Riffle's HDFS spills in flight (unset there = its HDFS thread count)",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "caps hdfs_store.max_concurrency (HDFS writes in flight); "
                                                         "0 or less = no cap", target="hdfs_store.max_concurrency"))
    memory_spill_to_localfile_concurrency: int | None = Field(
        None, description="Riffle's old local spill limit (Riffle 0.27 ignores it)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "Riffle 0.27 replaced it by write_concurrency_per_disk; "
                                                            "set that one (or disk_write_threads)"))
    huge_partition_fallback_enable: bool = Field(
        False, description="Riffle: a huge partition's spill that failed on HDFS may go to local disk",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "a failed HDFS spill always goes to local disk here "
                                                            "(huge partitions too), as if true", inert=True))
    sensitive_watermark_spill_enable: bool = Field(
        False, description="count the bytes being spilled (in flight) as used in the high-watermark test, as "
                           "Riffle: used/capacity above memory_spill_high_watermark starts a spill of the bytes "
                           "not in flight down to memory_spill_low_watermark (none when they are below it); "
                           "false = only the bytes not in flight count")
    async_watermark_spill_trigger_enable: bool = Field(
        False, description="Riffle: check the spill watermark periodically instead of on every write",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "the MemoryManager actor checks the watermark as each "
                                                            "write is accounted, off the write path already",
                                     inert=False))
    async_watermark_spill_trigger_interval_ms: int = Field(
        500, ge=1, description="Riffle: period of the asynchronous watermark check",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "see async_watermark_spill_trigger_enable", inert=500))

    @model_validator(mode="after")
    def _check(self) -> HybridStoreConfig:
        if self.memory_spill_low_watermark >= self.memory_spill_high_watermark:
            raise FieldProblem("memory_spill_low_watermark",
                               "memory_spill_low_watermark must be below memory_spill_high_watermark")
        return self


class KerberosSecurityConfig(StrictModel):
    """``[hdfs_store.kerberos_security_config]`` (Riffle's keys): the server's Kerberos login to HDFS.

    Every HDFS client of the server then authenticates as ``principal`` with the keys of
    ``keytab_path`` (``riffle_actors.io.hdfs.KerberosLogin``); tickets are renewed from the keytab
    as they expire. The keytab is checked at start (absolute, not a symlink, a regular file owned
    by the server's user or root, mode without other-read or group/other-write); a bad one stops
    the start. The KDC comes from the system's krb5.conf (``KRB5_CONFIG``, as with Riffle).
    """

    keytab_path: str = Field(description="the server's keytab file (absolute; chmod 600)")
    principal: str = Field(description="the server's principal, e.g. riffle/host@REALM")

    @field_validator("keytab_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\0" in value:
            raise ValueError("must be an absolute path")
        return value

    @field_validator("principal")
    @classmethod
    def _principal(cls, value: str) -> str:
        if not value or len(value) > 512 or any(c.isspace() or c == "\0" for c in value) or value.count("@") > 1:
            raise ValueError("must be one Kerberos principal (name[/instance][@REALM], no spaces)")
        return value


class RemoteStorageBase(StrictModel):
    """``[[hdfs_store.remote_storage]]``: one remote storage base clients may name, and its Hadoop conf."""

    path: str = Field(description="hdfs://<namenode or nameservice>[:port]/<dir> (or a bare /<dir> on the "
                                  "default file system); compared normalized (scheme case, repeated and "
                                  "trailing slashes); '..', '%', user info and the like are refused")
    conf: dict[str, str] = Field(default_factory=dict,
                                 description="Hadoop conf items the server uses for this base (the client's "
                                             "remoteStorageConf items are ignored)")

    @field_validator("path")
    @classmethod
    def _normalize(cls, value: str) -> str:
        return normalize_remote_path(value)


class HdfsStoreConfig(StrictModel):
    """``[hdfs_store]``: the HDFS tier's writers (store_type MEMORY_LOCALFILE_HDFS or MEMORY_HDFS).

    Each app's client sends its remote storage path in registerShuffle (from the coordinator's
    ``[remote_storage]``); the server writes there only if the path is one of ``remote_storage``
    (the operator's allow-list), with the operator's Hadoop conf for it, and refuses the
    registration otherwise (INVALID_REQUEST).
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
    remote_storage: list[RemoteStorageBase] = Field(
        default_factory=list,
        description="the remote storage bases (path + Hadoop conf) clients may name in registerShuffle; any "
                    "other path is refused with INVALID_REQUEST and never connected to; empty = none (every "
                    "registration with a remote storage is refused); set the same path as the coordinator's "
                    "remote_storage.path",
        json_schema_extra={"example": [{"path": "hdfs://namenode:8020/rss", "conf": {}}]})

    @model_validator(mode="after")
    def _check_bases(self) -> HdfsStoreConfig:
        paths = [b.path for b in self.remote_storage]
        if len(set(paths)) != len(paths):
            raise FieldProblem("remote_storage", "lists the same path twice (compared normalized)")
        return self

    # Riffle's keys (docs/riffle-compat.md)
    kerberos_security_config: KerberosSecurityConfig | None = Field(
        None, description="the server's Kerberos login to HDFS (keytab_path, principal); unset = simple "
                          "authentication as the server's user")
    precheck_enable: bool = Field(
        False, description="at start, reach every remote_storage base (a NameNode RPC on its path, within "
                           "write_timeout_sec) and refuse to start, naming the base and the error, when one "
                           "cannot be reached (Riffle checks its default HDFS client; here the allow-list is "
                           "what apps may use)")


class RiffleBlockIdManagerType(enum.StrEnum):
    DEFAULT = "DEFAULT"
    PARTITIONED = "PARTITIONED"


class AppConfig(StrictModel):
    """``[app_config]``: per-application limits and expiry."""

    app_heartbeat_timeout_min: float = Field(5, gt=0, description="apps silent this long are purged")
    app_expiry_check_interval_sec: int = Field(10, ge=1, description="how often silent apps are looked for")
    partition_limit_enable: bool = Field(False, description="mark partitions above the threshold huge")
    partition_limit_threshold: ByteSize = SizeField("20G", gt=0, description="bytes after which a partition is huge")
    partition_limit_memory_backpressure_ratio: float = Field(
        0.2, gt=0, le=1, description="huge partitions holding more than this share of capacity get NO_BUFFER_FOR_HUGE_PARTITION"
    )
    huge_partition_memory_single_buffer_max_spill_size: ByteSize = SizeField(
        "64M", gt=0, description="spill size of a huge partition's buffer"
    )
    app_number_hard_limit: int = Field(
        2000, ge=1, description="apps registered on this server at once; registerShuffle of one more app is "
                                "refused with ACCESS_DENIED (a safety bound of ours; Riffle's "
                                "[health_service_config] alive_app_number_max_limit reports UNHEALTHY earlier, so "
                                "the coordinator stops assigning before this refuses)")
    shuffle_number_max_limit: int = Field(
        10_000, ge=1, description="shuffles one app may have registered at once; one more is refused with "
                                  "INVALID_REQUEST")
    partition_number_max_limit: int = Field(
        1 << 20, ge=1, le=1 << 31, description="partition ids of a shuffle lie below this (and below what the app's "
                                               "block-id layout encodes); a range past it is refused with "
                                               "INVALID_REQUEST; also the most partition ids one read or "
                                               "requireBuffer may name")
    report_block_id_number_max_limit: int = Field(
        1_000_000, ge=1, description="block ids one reportShuffleResult may carry (a partition counts one at "
                                     "least); more is refused with INVALID_REQUEST, nothing added")
    report_partition_block_id_number_max_limit: int = Field(
        200_000, ge=1, description="block ids one reportShuffleResult may carry for one partition; more is "
                                   "refused with INVALID_REQUEST, nothing added")
    block_crc_check_enable: bool = Field(
        True, description="check every block's CRC-32 against its bytes when it arrives (both transports, "
                          "~0.1 s of CPU per GB); a send holding a mismatch is refused whole with INTERNAL_ERROR "
                          "naming the block (the client resends it)")

    # Riffle's keys (docs/riffle-compat.md)
    block_id_manager_type: RiffleBlockIdManagerType = Field(
        RiffleBlockIdManagerType.DEFAULT, description="Riffle's block id set structure (DEFAULT, PARTITIONED)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "block ids are kept per partition here (one Roaring "
                                                            "bitmap each), which is what PARTITIONED means",
                                     inert="DEFAULT"))
    partition_split_enable: bool = Field(
        False, description="ask clients to move a partition elsewhere once it received more than "
                           "partition_split_threshold, as Riffle: a successful requireBuffer naming it lists it "
                           "in needSplitPartitionIds (read by Uniffle 0.10+ clients with partition reassignment; "
                           "the 0.9.2 client has no such field and ignores it); the partition keeps being served")
    partition_split_threshold: ByteSize = SizeField(
        "40G", gt=0, description="bytes received by a partition after which it is split (must be below "
                                 "partition_limit_threshold when partition_limit_enable is set too); reloadable")

    @model_validator(mode="after")
    def _check_split(self) -> AppConfig:
        if (self.partition_split_enable and self.partition_limit_enable
                and self.partition_split_threshold >= self.partition_limit_threshold):
            raise FieldProblem("partition_split_threshold", "must be below partition_limit_threshold when "
                                                            "partition_split_enable and partition_limit_enable "
                                                            "are both set (Riffle refuses it too)")
        return self


class HealthConfig(StrictModel):
    """``[health]``: when the server calls itself unhealthy."""

    memory_stuck_above_high_watermark_sec: int = Field(
        300, ge=1, description="memory above the spill high watermark this long = UNHEALTHY"
    )


class UrpcIndexVersion(enum.StrEnum):
    V1 = "V1"
    V2 = "V2"


class RiffleUrpcWriteMode(enum.StrEnum):
    VECTORED = "VECTORED"
    FREEZE = "FREEZE"
    CHUNKED = "CHUNKED"


class RiffleUrpcNetEngine(enum.StrEnum):
    TOKIO = "TOKIO"
    URING = "URING"


class UrpcConfig(StrictModel):
    """``[urpc_config]``: the Netty data transport (``urpc_port``), served when the client uses GRPC_NETTY."""

    get_index_rpc_version: UrpcIndexVersion = Field(
        UrpcIndexVersion.V1, description="index response type: V1 (type 14, every client) or V2 (type 23 with "
                                         "storage ids; 0.10+ clients only, a 0.9 client cannot decode it)")
    max_connections: int = Field(
        4096, ge=1, description="open urpc connections; more are closed at once with a logged reason "
                                "(each executor opens up to rss.client.netty.client.connections.per.peer, 2)")
    max_connections_per_address: int = Field(
        1024, ge=1, description="open urpc connections from one source address (IP); more are closed at once "
                                "with a logged reason, so one host cannot take every max_connections slot")
    max_inflight_bytes: ByteSize = SizeField(
        "256M", ge=1 << 20, description="bytes of large request frames (those above 64K) received and not yet "
                                        "processed, over all connections; above it connections stop reading "
                                        "until some are done. Idle pooled receive buffers (reused for the next "
                                        "frames; at most half of it, 64 MiB) count in it too")
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
    frame_read_min_bytes_per_sec: ByteSize = SizeField(
        "64K", ge=0, description="a frame arriving slower than this on average (judged after 5 s) closes the "
                                 "connection; 0 = only frame_read_timeout_sec")
    idle_timeout_sec: float = Field(
        900.0, gt=0, description="a connection with no request for this long (and nothing in progress) is "
                                 "closed; above the client's own 600 s idle close "
                                 "(rss.client.netty.client.connection.timeout.ms), and it reconnects anyway")
    max_reply_bytes_per_connection: ByteSize = SizeField(
        "64M", ge=1 << 20, description="reply bytes one connection may hold (being read for it, or written and "
                                       "not yet read by the client); above it the connection stops reading "
                                       "requests until its client reads (one reply always goes through)")

    # Riffle's keys (docs/riffle-compat.md)
    streaming_parse_enabled: bool = Field(
        True, description="Riffle: parse frames as their bytes arrive",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "frames are always parsed as their bytes arrive here "
                                                            "(asyncio BufferedProtocol)", inert=True))
    write_mode: RiffleUrpcWriteMode = Field(
        RiffleUrpcWriteMode.VECTORED, description="Riffle: how replies are written (VECTORED, FREEZE, CHUNKED)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "replies are written header + body in one vectored "
                                                            "write (or sendfile) here", inert="VECTORED"))
    net_engine: RiffleUrpcNetEngine = Field(
        RiffleUrpcNetEngine.TOKIO, description="Riffle: the urpc network engine (TOKIO, URING)",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "urpc runs on the asyncio (uvloop) event loop here; "
                                                            "URING falls back as in a Riffle build without io-uring",
                                     inert="TOKIO"))


class GrpcEngine(enum.StrEnum):
    GRPCIO = "GRPCIO"  # grpc.aio: grpc's C core, its threads, the loop
    LOOP = "LOOP"  # riffle_actors' own HTTP/2 on the event loop (transport/grpc_loop.py)


class GrpcLoopConfig(StrictModel):
    """``[grpc_loop_config]``: the limits of the gRPC port when ``grpc_engine = "LOOP"`` (docs/grpc-loop.md).

    ``grpc_max_concurrent_streams``, ``grpc_max_message_size`` and the reply budgets apply to both engines."""

    max_connections: int = Field(
        4096, ge=1, description="open gRPC connections; more are closed at once with a logged reason")
    max_connections_per_address: int = Field(
        1024, ge=1, description="open gRPC connections from one source address (IP); more are closed at once "
                                "with a logged reason")
    max_inflight_bytes: ByteSize = SizeField(
        "256M", ge=1 << 20, description="request bytes received and not yet handled, over all gRPC "
                                        "connections; above it connections stop reading until handlers finish "
                                        "(a connection holding all of it reads on, so one request always gets "
                                        "through)")
    max_header_list_bytes: ByteSize = SizeField(
        "16K", ge=4096, le=1 << 20, description="largest decoded header list of one call (HTTP/2 "
                                                "SETTINGS_MAX_HEADER_LIST_SIZE); a larger block closes the "
                                                "connection (GOAWAY ENHANCE_YOUR_CALM)")
    frame_read_timeout_sec: float = Field(
        60.0, gt=0, description="a frame cut short, a request body not complete, or a new connection without "
                                "its HTTP/2 preface for this long is closed (the stream is reset)")
    idle_timeout_sec: float = Field(
        900.0, gt=0, description="a connection with no call for this long gets GOAWAY and is closed (the "
                                 "client reconnects at its next call)")
    reply_stall_timeout_sec: float = Field(
        60.0, gt=0, description="a reply the client takes nothing of for this long is given up and its bytes "
                                "released: no HTTP/2 window granted resets the stream (CANCEL), a socket not "
                                "read closes the connection")

    def limits(self) -> dict[str, Any]:
        """``LoopGrpcServer``'s keyword arguments."""
        return {"max_connections": self.max_connections,
                "max_connections_per_address": self.max_connections_per_address,
                "max_inflight_bytes": self.max_inflight_bytes, "max_header_list_bytes": self.max_header_list_bytes,
                "frame_timeout_s": self.frame_read_timeout_sec, "idle_timeout_s": self.idle_timeout_sec,
                "reply_stall_s": self.reply_stall_timeout_sec}


#: ``runtime_config.worker_number`` at most (worker processes of one riffle-server host)
MAX_WORKER_NUMBER = 256


class RuntimeConfig(StrictModel):
    """``[runtime_config]`` (Riffle's thread pools): each one sets or caps the pool of ours that does that work.

    Unset keys leave our own settings alone (Riffle's defaults are in docs/riffle-compat.md).
    ``worker_number`` is ours (Riffle's one process has a thread pool per job instead): the
    processes of this host, see ``riffle_actors.workers`` and docs/workers.md.
    """

    read_thread_num: int | None = Field(
        None, ge=1, description="Riffle's disk read threads (all disks)",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, f"sets localfile_store.disk_read_threads to this / number "
                                                         f"of disks (rounded up, at most {MAX_DISK_READ_THREADS}) "
                                                         f"unless disk_read_threads is set",
                                     target="localfile_store.disk_read_threads"))
    localfile_write_thread_num: int | None = Field(
        None, ge=1, description="Riffle's disk write threads (all disks)",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "caps localfile_store.disk_write_threads at this / number "
                                                         "of disks (at least 1)",
                                     target="localfile_store.disk_write_threads"))
    hdfs_write_thread_num: int | None = Field(
        None, ge=1, description="Riffle's HDFS write threads",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "caps hdfs_store.max_concurrency (one writer thread per "
                                                         "HDFS write in flight here)",
                                     target="hdfs_store.max_concurrency"))
    http_thread_num: int | None = Field(
        None, ge=1, description="Riffle's HTTP threads",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "the HTTP server runs on the event loop; it has no "
                                                            "threads of its own"))
    default_thread_num: int | None = Field(
        None, ge=1, description="Riffle's threads of background work",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets the threads of the event loop's default executor "
                                                         "(recovery scans, bitmap decoding, metrics pushes)"))
    dispatch_thread_num: int | None = Field(
        None, ge=1, description="Riffle's threads of spill dispatching",
        json_schema_extra=riffle_key(RiffleKind.NO_EFFECT, "spills are dispatched by one actor on the event loop; "
                                                            "their concurrency is hybrid_store."
                                                            "memory_spill_max_concurrency"))
    worker_number: int = Field(
        1, ge=1, le=MAX_WORKER_NUMBER,
        description="ours, not Riffle's: shuffle server processes on this host (one core each); above 1 a "
                    "parent process runs them, each with memory_store.capacity / N, its own subdirectory "
                    "<data path>/.worker-<k> and ports grpc_port + k, urpc_port + k (docs/workers.md)")
    read_ahead_thread_number: int | None = Field(
        None, ge=1, description="Riffle's read-ahead threads (all disks)",
        json_schema_extra=riffle_key(RiffleKind.MAPPED, "sets localfile_store.disk_read_ahead_threads to this / "
                                                         "number of disks (rounded up, at most 16) unless "
                                                         "disk_read_ahead_threads is set",
                                     target="localfile_store.disk_read_ahead_threads"))


class HealthServiceConfig(StrictModel):
    """``[health_service_config]`` (Riffle's names): more reasons for /health and the heartbeat to say UNHEALTHY."""

    alive_app_number_max_limit: int | None = Field(
        None, ge=0, description="more apps than this = UNHEALTHY (new apps go elsewhere); unset = no limit")
    disk_used_ratio_health_threshold: float | None = Field(
        None, gt=0, le=1, description="a data path used above this ratio = UNHEALTHY; unset = no check")
    memory_allocated_threshold: ByteSize | None = Field(
        None, gt=0, description="the process's resident memory (RSS) above this = UNHEALTHY until restart "
                                "(Riffle counts its allocator's bytes); unset = no check")
    service_hang_of_mem_continuous_unchange_sec: float = Field(
        300, gt=0, description="memory in use (not 0) unchanged this long while service_hang_of_app_valid_number "
                               "apps or more are registered = a hung server, UNHEALTHY until restart")
    service_hang_of_app_valid_number: int = Field(
        50, ge=0, description="apps needed for the hang check above")


class TracingConfig(StrictModel):
    """``[tracing]`` (Riffle's keys): spans of every RPC and spill, exported to Jaeger with OTLP/HTTP
    (``riffle_actors.tracing``: cost bounds, and how Riffle's agent address is mapped)."""

    jaeger_reporter_endpoint: str = Field(
        description="where spans go: Riffle's Jaeger agent address host:port (6831) is sent to the OTLP/HTTP "
                    "receiver of that host, http://host:4318/v1/traces; or an http(s):// OTLP URL used as is "
                    "(a bare http://host:4318 gets /v1/traces)",
        json_schema_extra={"example": "127.0.0.1:6831"})
    jaeger_service_name: str = Field(
        min_length=1, max_length=200,
        description="service name of the spans; as Riffle, <jaeger_service_name>-<server id> is exported")
    sample_ratio: float = Field(1.0, gt=0, le=1, description="share of RPCs and spills traced (ours; Riffle "
                                                             "traces all, as 1.0 does)")
    max_queue_size: int = Field(2048, ge=1, le=1_000_000, description="finished spans waiting for export "
                                                                      "(ours); beyond, new spans are dropped")
    export_timeout_ms: int = Field(10_000, ge=100, le=600_000, description="one export attempt's timeout (ours; "
                                                                           "on the export thread)")

    @field_validator("jaeger_reporter_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        exporter_url(value)  # ValueError: neither host:port nor an http(s) URL
        return value


class HistoricalAppsConfig(StrictModel):
    """``[historical_apps_config]`` (Riffle): the record of finished apps behind ``/apps/history``
    (``riffle_actors.io.app_history``). Unset: the last 1000 purged apps, in memory, no retention."""

    retention_days: int = Field(ge=1, le=36500, description="days a finished app is kept (from its purge)")
    backend: str = Field(description="MEM (in memory, lost at restart) or SLED (on disk under db_path, kept "
                                     "across restarts; an SQLite file here, Riffle's is a sled database)")
    db_path: str | None = Field(None, description="directory of the SLED backend's database "
                                                  "(<db_path>/apps.sqlite3); needed with SLED")
    max_apps: int = Field(10_000, ge=1, le=1_000_000,
                          description="finished apps kept at most (the oldest go first); bounds memory and "
                                      "the database (a key of ours)")

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, value: str) -> str:
        if value not in ("MEM", "SLED"):
            raise ValueError(f"unknown backend {value!r}: MEM or SLED")
        return value

    @model_validator(mode="after")
    def _check_db_path(self) -> HistoricalAppsConfig:
        if self.backend == "SLED" and not self.db_path:
            raise FieldProblem("db_path", "backend SLED needs db_path (the database directory)")
        return self


class ServerConfig(StrictModel):
    """The whole ``riffle-server`` TOML file."""

    store_type: StorageType = Field(StorageType.MEMORY_LOCALFILE, description="storage tiers")
    grpc_port: int = Field(19999, ge=0, le=65535, description="gRPC port; 0 = any free port")
    grpc_bind_address: BindAddress = Field(
        "0.0.0.0", description="address the gRPC port listens on (executors must reach it); 0.0.0.0 = all "
                               "interfaces, :: = all IPv6 (and IPv4) interfaces, 127.0.0.1 = this host only")
    grpc_engine: GrpcEngine = Field(
        GrpcEngine.LOOP, description="what serves the gRPC port: GRPCIO (grpc.aio, grpc's C core) or LOOP "
                                       "(riffle_actors' own HTTP/2 on the event loop: about a third of the CPU "
                                       "per call; limits in [grpc_loop_config], docs/grpc-loop.md)")
    grpc_loop_config: GrpcLoopConfig = Field(default_factory=GrpcLoopConfig)
    grpc_max_concurrent_streams: int = Field(
        100, ge=1, le=65536, description="HTTP/2 streams (RPCs) one gRPC connection may have open at once; the "
                                         "client queues more")
    grpc_max_reply_bytes_per_connection: ByteSize = SizeField(
        "64M", ge=1 << 20, description="read reply bytes one gRPC connection may hold (being read, or waiting "
                                       "for the client's HTTP/2 flow-control window; each reply counted twice: "
                                       "this process's bytes and gRPC core's copy); above it reads wait, then "
                                       "get NO_BUFFER after reply_wait_timeout_sec")
    max_reply_bytes: ByteSize = SizeField(
        "1G", ge=1 << 20, description="read reply bytes the server holds over gRPC and urpc together (being "
                                      "read, or sent and not yet taken by the client), outside "
                                      "memory_store.capacity; a read above it waits, then gets NO_BUFFER")
    reply_wait_timeout_sec: float = Field(
        10.0, gt=0, description="how long a read waits for max_reply_bytes (or "
                                "grpc_max_reply_bytes_per_connection) before it is answered NO_BUFFER (the "
                                "client backs off and retries)")
    grpc_max_message_size: ByteSize = SizeField(
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

    # Riffle's keys (docs/riffle-compat.md)
    fallback_random_ports_enable: bool = Field(
        False, description="a configured grpc/urpc/http port already in use is replaced by a free one (logged); "
                           "Riffle's default is true")
    initial_unhealthy_status_enable: bool = Field(
        False, description="start UNHEALTHY (the coordinators assign the server nothing) until an operator "
                           "sets it healthy (riffle-ctl instance set --status healthy, POST /admin?update_state=HEALTHY)")
    conf_reload_enable: bool = Field(
        False, description="re-read the config file every conf_reload_interval_sec and apply the keys that may "
                           "change live: app_config.partition_limit_threshold, partition_limit_memory_"
                           "backpressure_ratio, partition_split_threshold (Riffle's), hybrid_store.memory_spill_"
                           "high/low_watermark, sensitive_watermark_spill_enable, localfile_store.io_limiter."
                           "capacity, log.level/log_level, conf_reload_interval_sec; a file that does not load or "
                           "changes any other key is logged (ERROR) and ignored whole (Riffle's default is true; "
                           "README.md, Live config reload)")
    conf_reload_interval_sec: float = Field(
        60.0, gt=0, le=86400, description="period of the conf_reload_enable check (Riffle's is a fixed 60 s; a "
                                          "key of ours, e.g. for tests)")
    runtime_config: RuntimeConfig = Field(default_factory=RuntimeConfig)
    health_service_config: HealthServiceConfig = Field(default_factory=HealthServiceConfig)
    tracing: TracingConfig | None = Field(
        None, description="spans of every RPC and spill sent to Jaeger (OTLP/HTTP); unset = no tracing")
    historical_apps_config: HistoricalAppsConfig | None = Field(
        None, description="the record of finished apps (/apps/history) with Riffle's per-app totals; unset = "
                          "the last 1000 purged apps in memory")

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        hs, ac = self.hybrid_store, self.app_config
        if (hs.huge_partition_memory_single_buffer_max_spill_size is not None
                and "huge_partition_memory_single_buffer_max_spill_size" in ac.model_fields_set
                and hs.huge_partition_memory_single_buffer_max_spill_size
                != ac.huge_partition_memory_single_buffer_max_spill_size):
            raise _conflict("hybrid_store.huge_partition_memory_single_buffer_max_spill_size",
                            "app_config.huge_partition_memory_single_buffer_max_spill_size")
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


# --- Riffle's keys: applying them and telling what they did -----------------------------------------


def apply_riffle_keys(cfg: ServerConfig) -> ServerConfig:
    """``cfg`` with every MAPPED Riffle key applied to the setting of ours it names (idempotent).

    A Riffle name of one of our keys sets it unless ours is set too (both set and different is a
    config error, see the validators); a Riffle thread pool caps the pool of ours doing that work.
    ``[log]``'s Riffle keys are read by ``LogConfig``'s ``effective_*`` properties instead.
    """
    ls, hs, hd, ac, rt = cfg.localfile_store, cfg.hybrid_store, cfg.hdfs_store, cfg.app_config, cfg.runtime_config
    disks = max(1, len(ls.data_paths))
    ls_up: dict[str, Any] = {}
    ours = ls.model_fields_set
    if ls.write_concurrency_per_disk is not None and "disk_write_threads" not in ours:
        ls_up["disk_write_threads"] = min(ls.write_concurrency_per_disk, MAX_DISK_WRITE_THREADS)
    if rt.localfile_write_thread_num is not None:
        ls_up["disk_write_threads"] = max(1, min(ls_up.get("disk_write_threads", ls.disk_write_threads),
                                                 rt.localfile_write_thread_num // disks))
    if rt.read_thread_num is not None and "disk_read_threads" not in ours:
        ls_up["disk_read_threads"] = max(1, min(MAX_DISK_READ_THREADS, -(-rt.read_thread_num // disks)))
    if rt.read_ahead_thread_number is not None and "disk_read_ahead_threads" not in ours:
        ls_up["disk_read_ahead_threads"] = max(1, min(16, -(-rt.read_ahead_thread_number // disks)))
    if ls.io_duration_threshold_sec is not None and "disk_io_timeout_sec" not in ours:
        ls_up["disk_io_timeout_sec"] = float(ls.io_duration_threshold_sec)
    if ls.direct_io_enable is not None and "direct_io_append_enable" not in ours:
        ls_up["direct_io_append_enable"] = ls.direct_io_enable
    hdfs_caps = [n for n in (rt.hdfs_write_thread_num, hs.memory_spill_to_hdfs_concurrency) if n is not None and n > 0]
    hd_up = {"max_concurrency": min(hd.max_concurrency, *hdfs_caps)} if hdfs_caps else {}
    ac_up: dict[str, Any] = {}
    if (hs.huge_partition_memory_single_buffer_max_spill_size is not None
            and "huge_partition_memory_single_buffer_max_spill_size" not in ac.model_fields_set):
        ac_up["huge_partition_memory_single_buffer_max_spill_size"] = hs.huge_partition_memory_single_buffer_max_spill_size
    update: dict[str, Any] = {}
    for name, section, up in (("localfile_store", ls, ls_up), ("hdfs_store", hd, hd_up), ("app_config", ac, ac_up)):
        changed = {k: v for k, v in up.items() if getattr(section, k) != v}
        if changed:
            update[name] = section.model_copy(update=changed)
    return cfg.model_copy(update=update) if update else cfg


def _dotted_get(cfg: BaseModel, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def riffle_key_notes(cfg: BaseModel, *, applied: BaseModel | None = None,
                     prefix: str = "") -> list[tuple[str, str]]:
    """``(level, message)`` for every Riffle key set in ``cfg`` that is not simply one of ours: what a
    MAPPED key set (read from ``applied``, the config after ``apply_riffle_keys``), which ones are
    accepted but not built (WARNING) and which mean nothing here (INFO). Values in ``riffle_inert``
    (asking for what this server does anyway) give no line."""
    applied = cfg if applied is None else applied
    notes: list[tuple[str, str]] = []
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        key = f"{prefix}{name}"
        extra = riffle_extra(type(cfg), name)
        if not extra:
            if isinstance(value, BaseModel):
                notes.extend(riffle_key_notes(value, applied=applied, prefix=f"{key}."))
            continue
        if name not in cfg.model_fields_set or value is None:
            continue
        if "riffle_inert" in extra and value == extra["riffle_inert"]:
            continue
        note = extra["riffle_note"]
        shown = "set" if isinstance(value, BaseModel) else f"= {value!r}"
        if extra["riffle"] == RiffleKind.NOT_YET:
            notes.append(("WARNING", f"Riffle key {key} {shown}: accepted, not yet implemented here ({note})"))
        elif extra["riffle"] == RiffleKind.NO_EFFECT:
            notes.append(("INFO", f"Riffle key {key} {shown}: no effect here ({note})"))
        else:
            target = extra.get("riffle_target")
            now = ""
            if target and not target.startswith("log."):  # [log]: see LogConfig.effective_*
                now = f"; now {target} = {_dotted_get(applied, target)!r}"
            notes.append(("INFO", f"Riffle key {key} {shown}: {note}{now}"))
    return notes
