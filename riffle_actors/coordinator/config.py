"""Typed configuration of ``riffle-coordinator``.

This module owns the coordinator's TOML schema (``CoordinatorConfig`` and its sections) and
``load_coordinator_config(path)``. It reuses the shared primitives of ``riffle_actors.config``
(``StrictModel``: frozen, unknown keys rejected; ``LogConfig``; ``ConfigError`` naming every bad
dotted key; ``validate_config``; ``load_toml``), so a typo such as ``[server] heartbeat_timout_sec``
fails with ``server.heartbeat_timout_sec: unknown key`` instead of silently using a default.

It also resolves the ``[admin]`` credentials once, at load time (``AdminCredentials.resolve``: the
section plus the ``RIFFLE_ADMIN_*`` environment variables), so an unusable credential (an
unreadable ``token_file``, a short token in the environment) is a ``ConfigError`` (exit code 2)
like any other bad key; ``CoordinatorConfig.admin_auth()`` hands the result to the runtime.

It does not cover: reading the exclude-nodes file (``riffle_actors.io.exclude_file``), checking heartbeats
(``coordinator.validation``) or turning the config into running actors (``riffle_actors.coordinator_server``).
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
from pathlib import Path

from pydantic import Field, PrivateAttr, field_validator

from riffle_actors.config import (
    AdminConfig,
    BindAddress,
    ConfigError,
    LogConfig,
    MetricsConfig,
    StrictModel,
    load_toml,
    validate_config,
)
from riffle_actors.credentials import AdminCredentialError, AdminCredentials


class AssignmentStrategy(enum.StrEnum):
    """How servers are chosen for a shuffle (``assignment_strategy``)."""

    PARTITION_BALANCE = "partition_balance"  # most free memory per already-assigned partition first
    BASIC = "basic"  # plain round robin over the candidates


class HostStrategy(enum.StrEnum):
    """Whether the replicas of one partition may share a host (``assignment_host_strategy``)."""

    PREFER_DIFF = "prefer_diff"  # different hosts when possible, same host otherwise
    MUST_DIFF = "must_diff"  # different hosts or the request fails
    NONE = "none"  # hosts are not looked at (replicas are still on distinct servers)


class ServerSection(StrictModel):
    """``[server]``: shuffle-server membership."""

    heartbeat_timeout_sec: float = Field(
        30, gt=0, description="a server silent this long is dropped from the registry (LOST)"
    )
    max_servers: int = Field(
        10000, ge=1, description="servers registered at most; heartbeats of new ids are refused when full"
    )
    max_servers_per_host: int = Field(
        64, ge=0, description="server ids registered from one source address (the TCP peer); 0 = no limit"
    )
    allowed_networks: list[str] = Field(
        default_factory=list,
        description="networks (CIDR, e.g. 10.0.0.0/8) heartbeats may come from and advertise; empty = any",
    )

    @field_validator("allowed_networks", mode="after")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        out = []
        for entry in value:
            try:
                out.append(str(ipaddress.ip_network(entry.strip(), strict=False)))
            except ValueError:
                raise ValueError(f"{entry!r} is not a network such as 10.0.0.0/8 or 192.168.1.7/32") from None
        return out


class AppSection(StrictModel):
    """``[app]``: the application registry."""

    heartbeat_timeout_sec: float = Field(
        60, gt=0, description="an app silent this long moves to the historical apps"
    )
    history_size: int = Field(1000, ge=0, description="expired apps kept for /api/historical_apps")
    max_apps: int = Field(
        10000, ge=1, description="live apps registered at most; a new app id is refused (ACCESS_DENIED) when full "
        "(apps already registered keep heartbeating; silent ones expire after heartbeat_timeout_sec)"
    )


class RemoteStorageSection(StrictModel):
    """``[remote_storage]``: what fetchRemoteStorage answers (empty path = none configured)."""

    path: str = Field("", description="remote (HDFS) storage root handed to clients; empty = none")
    conf: dict[str, str] = Field(default_factory=dict, description="Hadoop conf items sent with the path")


class CoordinatorConfig(StrictModel):
    """The whole ``riffle-coordinator`` TOML file."""

    grpc_port: int = Field(21000, ge=0, le=65535, description="gRPC port; 0 = any free port")
    grpc_bind_address: BindAddress = Field(
        "0.0.0.0", description="address gRPC listens on; servers and executors must reach it (0.0.0.0 = all)"
    )
    http_port: int = Field(21001, ge=0, le=65535, description="HTTP JSON API port; 0 = any free port")
    http_bind_address: BindAddress = Field(
        "0.0.0.0", description="address the HTTP API listens on; 127.0.0.1 keeps it off the network"
    )
    assignment_strategy: AssignmentStrategy = Field(
        AssignmentStrategy.PARTITION_BALANCE, description="partition_balance or basic"
    )
    assignment_host_strategy: HostStrategy = Field(
        HostStrategy.PREFER_DIFF, description="prefer_diff, must_diff or none"
    )
    max_assignment_servers: int = Field(
        9, ge=1, le=1000, description="servers per shuffle when the client leaves it to the coordinator, and the "
        "most a client's assignmentShuffleServerNumber gets (as upstream rss.coordinator.shuffle.nodes.max)"
    )
    max_partitions_per_assignment: int = Field(
        1 << 20, ge=1, le=(1 << 31) - 1,
        description="partitionNum a getShuffleAssignments may ask for; more is refused (INVALID_REQUEST). "
        "Default 2^20 = the Spark client's spark.rss.blockId.maxPartitions (its block ids have 20 partition bits); "
        "each partition costs about 50 bytes of response per replica",
    )
    max_data_replica: int = Field(
        3, ge=1, le=16, description="dataReplica a getShuffleAssignments may ask for; more is refused (INVALID_REQUEST)"
    )
    exclude_nodes_file: str | None = Field(
        None, description="file of server ids (one a line, # comments) never assigned; re-read on change"
    )
    exclude_nodes_check_interval_sec: float = Field(
        5, gt=0, description="how often the exclude file's mtime is checked"
    )
    expiry_check_interval_sec: float = Field(
        1, gt=0, description="how often silent servers and apps are looked for"
    )
    server: ServerSection = Field(default_factory=ServerSection)
    app: AppSection = Field(default_factory=AppSection)
    remote_storage: RemoteStorageSection = Field(default_factory=RemoteStorageSection)
    client_conf: dict[str, str] = Field(
        default_factory=dict, description="key -> value pushed to clients by fetchClientConf(V2)"
    )
    admin: AdminConfig = Field(default_factory=AdminConfig)
    tell_servers_on_decommission: bool = Field(
        False, description="on an operator's (cancel-)decommission, also call the server's ShuffleServerInternal "
        "with this coordinator's [admin] credentials (servers and coordinator share them); off: only the "
        "coordinator's override changes. Off by default: the credentials go to the address a server "
        "advertised, so turn it on where heartbeats are trusted (allowed_networks)")
    log: LogConfig = Field(default_factory=LogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    _admin_auth: AdminCredentials | None = PrivateAttr(None)

    def admin_auth(self) -> AdminCredentials:
        """The admin credentials: as resolved by ``load_coordinator_config``, else resolved now.

        Raises ``AdminCredentialError`` (only for a config not built by ``load_coordinator_config``).
        """
        if self._admin_auth is not None:
            return self._admin_auth
        return AdminCredentials.resolve(self.admin)

    @field_validator("client_conf", mode="after")
    @classmethod
    def _check_client_conf(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.strip():
                raise ValueError("client_conf has an empty key")
        return value


def load_coordinator_config(path: str | os.PathLike[str]) -> CoordinatorConfig:
    """Read and validate a coordinator TOML file.

    A relative ``exclude_nodes_file`` or ``[admin] token_file`` resolves against the directory of
    the config file, so a config and its companion files can be moved together. The admin
    credentials are resolved here (see the module docstring). Raises ``ConfigError``.
    """
    data = load_toml(path)
    here = Path(path).resolve().parent
    exclude = data.get("exclude_nodes_file")
    if isinstance(exclude, str) and exclude and not os.path.isabs(exclude):
        data["exclude_nodes_file"] = str(here / exclude)
    admin = data.get("admin")
    if isinstance(admin, dict):
        token_file = admin.get("token_file")
        if isinstance(token_file, str) and token_file and not os.path.isabs(token_file):
            admin["token_file"] = str(here / token_file)
    cfg = validate_config(CoordinatorConfig, data, path)
    try:
        cfg._admin_auth = AdminCredentials.resolve(cfg.admin)
    except AdminCredentialError as e:
        raise ConfigError(path, [_credential_problem(str(e))]) from None
    return cfg


_KEYED = re.compile(r"^(admin\.\w+): (.+)$", re.DOTALL)


def _credential_problem(message: str) -> tuple[str, str]:
    """``(dotted key, reason)`` for an ``AdminCredentialError`` (its message may start with the key)."""
    m = _KEYED.match(message)
    return (m.group(1), m.group(2)) if m else ("admin", message)
