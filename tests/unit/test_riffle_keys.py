"""Every key of Riffle's server config is accepted, does what docs/riffle-compat.md says, and the page is current.

docs/riffle-keys.toml lists Riffle 0.27's keys (riffle-server/src/config.rs plus the README's); the
page is generated from it and the config models (scripts/gen_riffle_compat.py), so neither can
drift: a new Riffle key without a field, or a field change without regenerating, fails here.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from riffle_actors.config import (
    ConfigError,
    LogConfig,
    RiffleKind,
    ServerConfig,
    apply_riffle_keys,
    load_config,
    riffle_key_notes,
    validate_config,
)
from riffle_actors.log import level_from_rust_log
from riffle_actors.server import LaunchEnv
from riffle_actors.state.service_health import DiskUsage, ServiceHealthChecks

REPO = Path(__file__).resolve().parents[2]
README_CONFIGS = REPO / "tests" / "integration" / "riffle_readme"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_riffle_compat", REPO / "scripts" / "gen_riffle_compat.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


GEN = _generator()
KEYS = GEN.load_keys()["key"]
BASE = {"localfile_store": {"data_paths": ["/tmp/riffle-keys-test"]}}


def _with(dotted: str, value: Any, base: dict | None = None) -> dict:
    data = _deep_copy(base if base is not None else BASE)
    *parents, last = dotted.split(".")
    table = data
    for part in parents:
        table = table.setdefault(part, {})
    table[last] = value
    return data


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v for k, v in d.items()}


def _sample(key: dict) -> Any:
    return tomllib.loads(f"v = {key['sample']}")["v"]


def _all_samples() -> dict:
    data = _deep_copy(BASE)
    for key in KEYS:
        data = _with(key["name"], _sample(key), data)
    return data


def test_the_compat_page_is_current():
    assert (REPO / "docs" / "riffle-compat.md").read_text() == GEN.render(), \
        "docs/riffle-compat.md is stale: run python scripts/gen_riffle_compat.py"


def test_every_riffle_key_is_a_field_and_in_the_page():
    page = (REPO / "docs" / "riffle-compat.md").read_text()
    assert len(KEYS) >= 90 and len({k["name"] for k in KEYS}) == len(KEYS)
    for key in KEYS:
        GEN.resolve(key["name"])  # raises KeyError naming the missing part
        assert f"| `{key['name']}`" in page, key["name"]
    for entry in GEN.load_keys()["launch"]:
        assert f"`{entry['name']}`" in page


def test_a_config_with_every_riffle_key_set_loads_and_keeps_the_values():
    cfg = validate_config(ServerConfig, _all_samples())
    assert cfg.memory_store.dashmap_shard_amount == 128
    assert cfg.localfile_store.io_uring_options.threads == 2
    assert cfg.hdfs_store.kerberos_security_config.principal == "principal@REALM"
    assert cfg.tracing.jaeger_service_name == "my_service"
    assert cfg.runtime_config.dispatch_thread_num == 100
    assert cfg.health_service_config.alive_app_number_max_limit == 100
    assert cfg.log.log_level == "WARN" and cfg.log.effective_level == "WARNING"


@pytest.mark.parametrize("key", KEYS, ids=[k["name"] for k in KEYS])
def test_each_riffle_key_alone_is_accepted(key):
    table = key["name"].rpartition(".")[0]
    data = _deep_copy(BASE)
    for other in KEYS:  # a table's required keys (e.g. [tracing]'s two) go with any of them
        if other["name"].rpartition(".")[0] == table and other["default"] == "(required in the table)":
            data = _with(other["name"], _sample(other), data)
    validate_config(ServerConfig, _with(key["name"], _sample(key), data))


def test_unknown_keys_are_still_refused_by_name():
    for dotted in ("localfile_store.write_concurrency_per_disc", "runtime_config.read_threads",
                   "health_service_config.alive_apps", "localfile_store.io_uring_options.depth", "tracng.x"):
        with pytest.raises(ConfigError) as e:
            validate_config(ServerConfig, _with(dotted, 1))
        assert (dotted.removesuffix(".x"), "unknown key") in e.value.problems


def test_readme_configs_load():
    bench = load_config(README_CONFIGS / "benchmark.toml")
    assert bench.runtime_config.read_thread_num == 40
    with pytest.raises(ConfigError) as e:  # its coordinator_quorum is a placeholder ("host1:port"), nothing else
        load_config(README_CONFIGS / "all_options.toml")
    assert [k for k, _ in e.value.problems] == ["coordinator_quorum"]
    text = (README_CONFIGS / "all_options.toml").read_text().replace('"host1:port", "host2:port"', '"h1:21000"')
    cfg = validate_config(ServerConfig, tomllib.loads(text))
    assert cfg.log.effective_rotation == "daily"
    for name in ("direct_io.toml", "io_uring.toml", "grafana_metrics.toml"):
        data = tomllib.loads((README_CONFIGS / name).read_text())
        data.setdefault("localfile_store", {})["data_paths"] = ["/tmp/x"]
        validate_config(ServerConfig, data)


# ----------------------------------------------------------------------- what mapped keys do


def test_benchmark_thread_pools_map_onto_ours():
    cfg = apply_riffle_keys(load_config(README_CONFIGS / "benchmark.toml"))
    ls = cfg.localfile_store
    assert ls.disk_write_threads == 4  # write_concurrency_per_disk = 4, under 200 threads / 4 disks
    assert ls.disk_read_threads == 10  # read_thread_num 40 over 4 disks
    assert apply_riffle_keys(cfg) == cfg  # idempotent


def test_riffle_thread_pools_cap_and_clamp():
    data = {"localfile_store": {"data_paths": ["/a", "/b"], "write_concurrency_per_disk": 64},
            "runtime_config": {"read_thread_num": 100, "localfile_write_thread_num": 10, "hdfs_write_thread_num": 20},
            "hybrid_store": {"memory_spill_to_hdfs_concurrency": 500}}
    cfg = apply_riffle_keys(validate_config(ServerConfig, data))
    assert cfg.localfile_store.disk_write_threads == 5  # min(64 -> 16 at most, 10 threads / 2 disks)
    assert cfg.localfile_store.disk_read_threads == 32  # 100 / 2 = 50, at most 32
    assert cfg.hdfs_store.max_concurrency == 20  # min(50, 20, 500)
    ours = validate_config(ServerConfig, _with("localfile_store.disk_read_threads", 3,
                                               _with("runtime_config.read_thread_num", 100)))
    assert apply_riffle_keys(ours).localfile_store.disk_read_threads == 3  # our key wins


def test_riffle_aliases_set_ours_and_a_conflict_names_the_riffle_key():
    data = _with("localfile_store.io_duration_threshold_sec", 300, _with("localfile_store.direct_io_enable", False))
    data = _with("hybrid_store.huge_partition_memory_single_buffer_max_spill_size", "128M", data)
    cfg = apply_riffle_keys(validate_config(ServerConfig, data))
    assert cfg.localfile_store.disk_io_timeout_sec == 300.0
    assert cfg.localfile_store.direct_io_append_enable is False
    assert cfg.app_config.huge_partition_memory_single_buffer_max_spill_size == 128 << 20
    for riffle, ours, a, b in (
            ("localfile_store.write_concurrency_per_disk", "localfile_store.disk_write_threads", 4, 2),
            ("localfile_store.io_duration_threshold_sec", "localfile_store.disk_io_timeout_sec", 300, 60),
            ("localfile_store.direct_io_enable", "localfile_store.direct_io_append_enable", False, True),
            ("hybrid_store.huge_partition_memory_single_buffer_max_spill_size",
             "app_config.huge_partition_memory_single_buffer_max_spill_size", "128M", "64M"),
            ("log.log_level", "log.level", "WARN", "DEBUG"),
            ("log.max_log_files", "log.retention", 10, 5)):
        with pytest.raises(ConfigError) as e:
            validate_config(ServerConfig, _with(ours, b, _with(riffle, a)))
        assert [k for k, _ in e.value.problems] == [riffle], e.value.problems
        assert "Riffle's name of" in e.value.problems[0][1]


def test_start_notes_say_what_each_riffle_only_key_does():
    text = (README_CONFIGS / "all_options.toml").read_text().replace('"host1:port", "host2:port"', '"h1:21000"')
    cfg = validate_config(ServerConfig, tomllib.loads(text))
    notes = riffle_key_notes(cfg, applied=apply_riffle_keys(cfg))
    warnings = [m for level, m in notes if level == "WARNING"]
    # its [hdfs_store.kerberos_security_config] and [tracing] are built (issue 18): no "not yet" line
    assert [m for m in warnings if "accepted, not yet implemented here" in m] == [], warnings
    assert cfg.hdfs_store.kerberos_security_config.principal == "principal@REALM"
    assert cfg.tracing.jaeger_service_name == "my_service"
    infos = [m for level, m in notes if level == "INFO"]
    assert any("memory_store.dashmap_shard_amount = 128: no effect here (" in m for m in infos)
    assert any("runtime_config.http_thread_num = 2: no effect here" in m for m in infos)
    assert any("localfile_store.write_concurrency_per_disk = 4" in m and "now localfile_store.disk_write_threads = 4"
               in m for m in infos)
    # inert values (asking for what this server does anyway) and our own keys give no line
    quiet = validate_config(ServerConfig, _with("conf_reload_enable", False,
                                                _with("localfile_store.direct_io_read_enable", False)))
    assert riffle_key_notes(quiet) == []


def test_every_riffle_only_field_says_how_it_is_treated():
    kinds = {GEN.resolve(k["name"]).kind for k in KEYS}
    # every key of Riffle 0.27 has its effect here, or none in this design (the reason given): none is
    # merely accepted any more ("not yet" is kept for keys a later Riffle adds)
    assert kinds == {"same", *(k.value for k in RiffleKind if k is not RiffleKind.NOT_YET)}


# ----------------------------------------------------------------------- [log], RUST_LOG, launch env


def test_riffle_log_section(tmp_path):
    log = LogConfig(path=f"{tmp_path}/logs/", rotation="Daily", max_log_files=3, log_level="DEBUG")
    assert log.file_path == f"{tmp_path}/logs/riffle-server.log"
    assert (log.effective_rotation, log.effective_retention, log.effective_level) == ("daily", 3, "DEBUG")
    assert LogConfig(path=str(tmp_path)).file_path == str(tmp_path / "riffle-server.log")  # an existing directory
    assert LogConfig(path=str(tmp_path / "s.log")).file_path == str(tmp_path / "s.log")
    assert LogConfig(rotation="Never").effective_rotation is None
    assert LogConfig(rotation="Never", max_file_size="512M").effective_rotation == 512 << 20
    assert LogConfig(rotation="Hourly", max_file_size="512M").effective_rotation == "hourly"
    with pytest.raises(ConfigError):
        validate_config(LogConfig, {"log_level": "LOUD"})


@pytest.mark.parametrize(("value", "level"), [
    ("info", "INFO"), ("INFO", "INFO"), ("debug", "DEBUG"), ("warn", "WARNING"), ("error", "ERROR"),
    ("riffle=debug", "DEBUG"), ("warn,riffle_server=debug", "DEBUG"), ("info,h2=off", "INFO"),
    ("riffle_server::store", "TRACE"), ("off", "CRITICAL")])
def test_rust_log_gives_the_most_verbose_level(value, level):
    assert level_from_rust_log(value) == level


@pytest.mark.parametrize("value", ["riffle=loud", ",", "a b"])
def test_unreadable_rust_log_is_refused(value):
    with pytest.raises(ValueError):
        level_from_rust_log(value)


def test_launch_env():
    env = LaunchEnv.read({"WORKER_IP": " 10.0.0.1 ", "GRPC_PARALLELISM": "100"})
    assert (env.worker_ip, env.grpc_parallelism, env.urpc_parallelism) == ("10.0.0.1", 100, None)
    assert "GRPC_PARALLELISM=100: no effect here" in env.notes()[0]
    assert LaunchEnv.read({}) == LaunchEnv()
    with pytest.raises(ValueError) as e:
        LaunchEnv.read({"WORKER_IP": "host-a", "URPC_PARALLELISM": "0"})
    assert [k for k, _ in e.value.args[0]] == ["WORKER_IP (environment)", "URPC_PARALLELISM (environment)"]


# ----------------------------------------------------------------------- [health_service_config]


def test_app_limit_and_disk_ratio_come_and_go():
    checks = ServiceHealthChecks(alive_app_number_max_limit=2, disk_used_ratio_health_threshold=0.9)
    disks = [DiskUsage("/d1", 100, 50), DiskUsage("/d2", 100, 95)]
    reasons = checks.reasons(apps=3, memory_used=0, rss=None, disks=disks, now=0.0)
    assert len(reasons) == 2
    assert "3 apps registered, more than health_service_config.alive_app_number_max_limit=2" in reasons[0]
    assert reasons[1].startswith("/d2: 95.0% used")
    assert checks.reasons(apps=2, memory_used=0, rss=None, disks=disks[:1], now=1.0) == []


def test_rss_threshold_is_sticky():
    checks = ServiceHealthChecks(memory_allocated_threshold=1000)
    assert checks.reasons(apps=0, memory_used=0, rss=999, disks=(), now=0.0) == []
    assert "memory_allocated_threshold=1000" in checks.reasons(apps=0, memory_used=0, rss=1001, disks=(), now=1)[0]
    assert len(checks.reasons(apps=0, memory_used=0, rss=10, disks=(), now=2.0)) == 1  # until restart


def test_hang_check_needs_unchanged_memory_and_enough_apps():
    checks = ServiceHealthChecks(hang_unchanged_s=300, hang_min_apps=50)
    assert checks.reasons(apps=50, memory_used=7, rss=None, disks=(), now=0.0) == []
    assert checks.reasons(apps=50, memory_used=7, rss=None, disks=(), now=300.0) == []
    assert checks.reasons(apps=49, memory_used=7, rss=None, disks=(), now=400.0) == []  # too few apps: restart
    assert checks.reasons(apps=50, memory_used=7, rss=None, disks=(), now=500.0) == []
    assert checks.reasons(apps=50, memory_used=0, rss=None, disks=(), now=900.0) == []  # 0 never counts
    assert checks.reasons(apps=50, memory_used=0, rss=None, disks=(), now=1500.0) == []
    assert checks.reasons(apps=50, memory_used=8, rss=None, disks=(), now=1600.0) == []
    hung = checks.reasons(apps=60, memory_used=8, rss=None, disks=(), now=1901.0)
    assert len(hung) == 1 and "may be hung" in hung[0]
    assert checks.reasons(apps=60, memory_used=9, rss=None, disks=(), now=1902.0) == hung  # until restart
