"""Coordinator config (riffle_actors.coordinator.config): defaults, validation, shipped files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from riffle_actors.config import ConfigError
from riffle_actors.coordinator.config import (
    AssignmentStrategy,
    CoordinatorConfig,
    HostStrategy,
    load_coordinator_config,
)

REPO = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, text: str) -> CoordinatorConfig:
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return load_coordinator_config(path)


def problems(tmp_path: Path, text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    return dict(err.value.problems)


def test_empty_file_gives_the_documented_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    assert (cfg.grpc_port, cfg.http_port) == (21000, 21001)
    assert cfg.server.heartbeat_timeout_sec == 30
    assert cfg.app.heartbeat_timeout_sec == 60 and cfg.app.history_size == 1000
    assert cfg.assignment_strategy is AssignmentStrategy.PARTITION_BALANCE
    assert cfg.assignment_host_strategy is HostStrategy.PREFER_DIFF
    assert cfg.max_assignment_servers == 9
    assert cfg.exclude_nodes_file is None
    assert cfg.client_conf == {} and cfg.remote_storage.path == ""
    assert cfg.log.level == "INFO"


def test_every_section_is_read(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
grpc_port = 0
http_port = 0
assignment_strategy = "basic"
assignment_host_strategy = "must_diff"
max_assignment_servers = 3
exclude_nodes_file = "/etc/riffle/exclude"
[server]
heartbeat_timeout_sec = 12
[app]
heartbeat_timeout_sec = 7.5
history_size = 5
[remote_storage]
path = "hdfs://nn/rss"
conf = { "dfs.replication" = "2" }
[client_conf]
"rss.storage.type" = "MEMORY_LOCALFILE"
[log]
level = "debug"
""",
    )
    assert cfg.assignment_strategy is AssignmentStrategy.BASIC
    assert cfg.assignment_host_strategy is HostStrategy.MUST_DIFF
    assert (cfg.grpc_port, cfg.max_assignment_servers, cfg.exclude_nodes_file) == (0, 3, "/etc/riffle/exclude")
    assert (cfg.server.heartbeat_timeout_sec, cfg.app.heartbeat_timeout_sec, cfg.app.history_size) == (12, 7.5, 5)
    assert cfg.remote_storage.conf == {"dfs.replication": "2"}
    assert cfg.client_conf == {"rss.storage.type": "MEMORY_LOCALFILE"}


def test_unknown_keys_are_rejected_with_their_dotted_name(tmp_path: Path) -> None:
    p = problems(tmp_path, "grpc_prot = 1\n[server]\nheartbeat_timout_sec = 3\n[nope]\nx = 1\n")
    assert p == {"grpc_prot": "unknown key", "server.heartbeat_timout_sec": "unknown key", "nope": "unknown key"}


def test_bad_values_name_the_key(tmp_path: Path) -> None:
    p = problems(
        tmp_path,
        'assignment_strategy = "random"\nassignment_host_strategy = "same"\nhttp_port = 70000\n'
        "max_assignment_servers = 0\n[app]\nhistory_size = -1\n[client_conf]\n\"rss.x\" = 5\n",
    )
    assert set(p) == {
        "assignment_strategy",
        "assignment_host_strategy",
        "http_port",
        "max_assignment_servers",
        "app.history_size",
        "client_conf.rss.x",
    }
    assert "partition_balance" in p["assignment_strategy"]


def test_broken_toml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    assert "<file>" in problems(tmp_path, "grpc_port = = 1")
    with pytest.raises(ConfigError, match="no such file"):
        load_coordinator_config(tmp_path / "absent.toml")


def test_relative_exclude_file_resolves_next_to_the_config(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'exclude_nodes_file = "exclude_nodes"\n')
    assert cfg.exclude_nodes_file == str(tmp_path.resolve() / "exclude_nodes")


def test_config_is_immutable(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    with pytest.raises(ValidationError):
        cfg.grpc_port = 1  # type: ignore[misc]


def test_shipped_local_config_pushes_storage_and_client_type() -> None:
    cfg = load_coordinator_config(REPO / "config" / "coordinator.toml")
    assert cfg.client_conf["rss.storage.type"] == "MEMORY_LOCALFILE"
    assert cfg.client_conf["rss.client.type"] == "GRPC"


def test_example_config_parses_to_the_defaults() -> None:
    # config/coordinator.example.toml is generated from the model (scripts/gen_config_docs.py).
    cfg = load_coordinator_config(REPO / "config" / "coordinator.example.toml")
    # model_dump: == would also compare the credentials resolved at load time
    assert cfg.model_dump() == CoordinatorConfig().model_dump()


# ------------------------------------------------------------------- issue 8: listeners, admin, admission


@pytest.fixture
def no_admin_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("RIFFLE_ADMIN_TOKEN", "RIFFLE_ADMIN_USER", "RIFFLE_ADMIN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_security_keys_default_to_reachable_listeners_and_no_admin(tmp_path: Path, no_admin_env: Any) -> None:
    cfg = load(tmp_path, "")
    assert (cfg.grpc_bind_address, cfg.http_bind_address) == ("0.0.0.0", "0.0.0.0")
    server = cfg.server
    assert (server.max_servers, server.max_servers_per_host, server.allowed_networks) == (10000, 64, [])
    assert cfg.admin.token is None and cfg.admin_auth().configured is False


def test_security_keys_are_read(tmp_path: Path, no_admin_env: Any) -> None:
    (tmp_path / "admin.token").write_text("from-a-file-0123456789\n")
    cfg = load(
        tmp_path,
        'grpc_bind_address = "::1"\nhttp_bind_address = "localhost"\n'
        '[server]\nmax_servers = 5\nmax_servers_per_host = 0\nallowed_networks = ["10.1.2.3/8", "fd00::/8"]\n'
        '[admin]\ntoken_file = "admin.token"\nbasic_user = "ops"\nbasic_password = "long-enough-pw"\n',
    )
    assert (cfg.grpc_bind_address, cfg.http_bind_address) == ("::1", "127.0.0.1")
    assert cfg.server.allowed_networks == ["10.0.0.0/8", "fd00::/8"]
    assert (cfg.server.max_servers, cfg.server.max_servers_per_host) == (5, 0)
    assert cfg.admin.token_file == str(tmp_path.resolve() / "admin.token")  # relative to the config file
    auth = cfg.admin_auth()
    assert auth.token == "from-a-file-0123456789"
    assert (auth.basic_user, auth.basic_password) == ("ops", "long-enough-pw")


def test_bad_security_values_name_the_key(tmp_path: Path) -> None:
    p = problems(
        tmp_path,
        'grpc_bind_address = "coordinator.example.com"\nhttp_bind_address = ""\n'
        '[server]\nmax_servers = 0\nmax_servers_per_host = -1\nallowed_networks = ["10.0.0.0/33"]\n'
        '[admin]\ntoken = "short"\nbasic_user = "ops"\n',
    )
    assert set(p) == {
        "grpc_bind_address",
        "http_bind_address",
        "server.max_servers",
        "server.max_servers_per_host",
        "server.allowed_networks",
        "admin.token",
    }
    assert "not an IP address" in p["grpc_bind_address"] and "10.0.0.0/33" in p["server.allowed_networks"]


def test_unusable_admin_credentials_are_config_errors(tmp_path: Path, no_admin_env: Any) -> None:
    p = problems(tmp_path, '[admin]\ntoken_file = "missing.token"\n')
    assert list(p) == ["admin.token_file"] and "cannot read" in p["admin.token_file"]
    (tmp_path / "empty.token").write_text("\n")
    assert "is empty" in problems(tmp_path, '[admin]\ntoken_file = "empty.token"\n')["admin.token_file"]
    no_admin_env.setenv("RIFFLE_ADMIN_TOKEN", "too-short")
    p = problems(tmp_path, "")
    assert list(p) == ["admin"] and "RIFFLE_ADMIN_TOKEN" in p["admin"] and "16 characters" in p["admin"]


def test_admin_credentials_from_the_environment_win(tmp_path: Path, no_admin_env: Any) -> None:
    no_admin_env.setenv("RIFFLE_ADMIN_TOKEN", "env-token-0123456789")
    cfg = load(tmp_path, '[admin]\ntoken = "file-token-0123456789"\n')
    assert cfg.admin_auth().token == "env-token-0123456789"
    no_admin_env.delenv("RIFFLE_ADMIN_TOKEN")
    assert cfg.admin_auth().token == "env-token-0123456789"  # resolved once, at load time
