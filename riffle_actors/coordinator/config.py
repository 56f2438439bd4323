"""Typed configuration of ``riffle-coordinator``.

This module owns the coordinator's TOML schema (``CoordinatorConfig`` and its sections) and
``load_coordinator_config(path)``. It reuses the shared primitives of ``riffle_actors.config``
(``StrictModel``: frozen, unknown keys rejected; ``LogConfig``; ``ConfigError`` naming every bad
dotted key; ``validate_config``; ``load_toml``), so a typo such as ``[server] heartbeat_timout_sec``
fails with ``server.heartbeat_timout_sec: unknown key`` instead of silently using a default.

It does not cover: reading the exclude-nodes file (``cluster.ExcludeFile``) or turning the
config into running actors (``coordinator.runtime``).
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

from pydantic import Field, field_validator

from riffle_actors.config import LogConfig, StrictModel, load_toml, validate_config


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


class AppSection(StrictModel):
    """``[app]``: the application registry."""

    heartbeat_timeout_sec: float = Field(
        60, gt=0, description="an app silent this long moves to the historical apps"
    )
    history_size: int = Field(1000, ge=0, description="expired apps kept for /api/historical_apps")


class RemoteStorageSection(StrictModel):
    """``[remote_storage]``: what fetchRemoteStorage answers (empty path = none configured)."""

    path: str = Field("", description="remote (HDFS) storage root handed to clients; empty = none")
    conf: dict[str, str] = Field(default_factory=dict, description="Hadoop conf items sent with the path")


class CoordinatorConfig(StrictModel):
    """The whole ``riffle-coordinator`` TOML file."""

    grpc_port: int = Field(21000, ge=0, le=65535, description="gRPC port; 0 = any free port")
    http_port: int = Field(21001, ge=0, le=65535, description="HTTP JSON API port; 0 = any free port")
    assignment_strategy: AssignmentStrategy = Field(
        AssignmentStrategy.PARTITION_BALANCE, description="partition_balance or basic"
    )
    assignment_host_strategy: HostStrategy = Field(
        HostStrategy.PREFER_DIFF, description="prefer_diff, must_diff or none"
    )
    max_assignment_servers: int = Field(
        9, ge=1, description="servers per shuffle when the client leaves it to the coordinator"
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
    log: LogConfig = Field(default_factory=LogConfig)

    @field_validator("client_conf", mode="after")
    @classmethod
    def _check_client_conf(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.strip():
                raise ValueError("client_conf has an empty key")
        return value


def load_coordinator_config(path: str | os.PathLike[str]) -> CoordinatorConfig:
    """Read and validate a coordinator TOML file.

    A relative ``exclude_nodes_file`` resolves against the directory of the config file, so a
    config and its exclude list can be moved together. Raises ``ConfigError``.
    """
    data = load_toml(path)
    exclude = data.get("exclude_nodes_file")
    if isinstance(exclude, str) and exclude and not os.path.isabs(exclude):
        data["exclude_nodes_file"] = str(Path(path).resolve().parent / exclude)
    return validate_config(CoordinatorConfig, data, path)
