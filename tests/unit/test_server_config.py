"""ServerConfig validation: every problem is a ConfigError naming the dotted key (spec of config.py).

The daemon's exit code 2 on a bad config is tested with the daemon; here only the model.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from riffle_actors.config import ConfigError, ServerConfig, load_config, parse_byte_size, validate_config

PATHS = {"localfile_store": {"data_paths": ["/data/a"]}}


def problems_of(data: dict) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate_config(ServerConfig, data)
    err = info.value
    for key, _reason in err.problems:
        assert key in str(err), "the message lists every dotted key"
    return dict(err.problems)


def with_paths(**sections) -> dict:
    return {**PATHS, **sections}


def test_minimal_config_has_defaults() -> None:
    cfg = validate_config(ServerConfig, with_paths(memory_store={"capacity": "4M"}))
    assert cfg.memory_store.capacity == 4 << 20
    assert cfg.localfile_store.data_paths == ["/data/a"]
    assert cfg.hybrid_store.memory_spill_high_watermark > cfg.hybrid_store.memory_spill_low_watermark


@pytest.mark.parametrize("text, size", [
    ("4M", 4 << 20), ("1.5G", 3 << 29), ("512KiB", 512 << 10), ("64mb", 64 << 20), (" 10 ", 10), (7, 7),
])
def test_byte_sizes(text, size) -> None:
    assert parse_byte_size(text) == size


def test_unknown_top_level_key() -> None:
    assert problems_of(with_paths(bogus_key=1)) == {"bogus_key": "unknown key"}


def test_unknown_nested_key() -> None:
    assert problems_of(with_paths(memory_store={"capacity": "4M", "capacty": "8M"})) == {
        "memory_store.capacty": "unknown key"}


def test_unknown_key_deeper_in_a_section_with_other_errors() -> None:
    probs = problems_of({"localfile_store": {"data_paths": ["/a"], "disk_hgh_watermark": 0.5},
                         "app_config": {"app_heartbeat_timeout_min": -1}})
    assert probs["localfile_store.disk_hgh_watermark"] == "unknown key"
    assert "app_config.app_heartbeat_timeout_min" in probs


@pytest.mark.parametrize("value", ["4Q", "lots", "", "-3M", True, -5])
def test_bad_size(value) -> None:
    probs = problems_of(with_paths(memory_store={"capacity": value}))
    assert list(probs) == ["memory_store.capacity"]


def test_zero_capacity() -> None:
    assert list(problems_of(with_paths(memory_store={"capacity": 0}))) == ["memory_store.capacity"]


def test_bad_nested_size() -> None:
    probs = problems_of(with_paths(hybrid_store={"memory_single_buffer_max_spill_size": "1X"}))
    assert list(probs) == ["hybrid_store.memory_single_buffer_max_spill_size"]


def test_watermark_out_of_range() -> None:
    probs = problems_of(with_paths(hybrid_store={"memory_spill_high_watermark": 1.5}))
    assert list(probs) == ["hybrid_store.memory_spill_high_watermark"]


def test_low_watermark_above_high_is_rejected() -> None:
    probs = problems_of(with_paths(hybrid_store={"memory_spill_high_watermark": 0.3,
                                                 "memory_spill_low_watermark": 0.5}))
    (key, reason), = probs.items()
    assert key.startswith("hybrid_store")
    assert "memory_spill_low_watermark" in reason


def test_low_watermark_above_high_names_the_field() -> None:
    probs = problems_of(with_paths(hybrid_store={"memory_spill_high_watermark": 0.3,
                                                 "memory_spill_low_watermark": 0.5}))
    assert "hybrid_store.memory_spill_low_watermark" in probs


def test_disk_watermarks_inverted() -> None:
    probs = problems_of({"localfile_store": {"data_paths": ["/a"], "disk_high_watermark": 0.5,
                                             "disk_low_watermark": 0.9}})
    (key, reason), = probs.items()
    assert key.startswith("localfile_store") and "disk_low_watermark" in reason


def test_missing_data_paths() -> None:
    probs = problems_of({"memory_store": {"capacity": "4M"}})
    (key, reason), = probs.items()
    assert "data_paths" in f"{key} {reason}" and "localfile_store" in f"{key} {reason}"


def test_missing_data_paths_names_the_key() -> None:
    assert "localfile_store.data_paths" in problems_of({"memory_store": {"capacity": "4M"}})


def test_duplicate_data_paths() -> None:
    probs = problems_of({"localfile_store": {"data_paths": ["/a", "/a"]}})
    assert any(k.startswith("localfile_store") for k in probs)


def test_bad_port_and_quorum_are_all_reported() -> None:
    probs = problems_of(with_paths(grpc_port=70000, http_port=-1))
    assert {"grpc_port", "http_port"} <= set(probs)
    probs = problems_of(with_paths(coordinator_quorum=["no-port"]))
    assert "no-port" in " ".join(probs.values())


def test_wrong_type_in_nested_section() -> None:
    probs = problems_of(with_paths(app_config={"partition_limit_enable": "perhaps"}))
    assert list(probs) == ["app_config.partition_limit_enable"]


def test_config_is_frozen() -> None:
    cfg = validate_config(ServerConfig, PATHS)
    with pytest.raises(ValidationError):
        cfg.grpc_port = 1  # type: ignore[misc]


def test_load_config_file(tmp_path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('grpc_port = 0\n[memory_store]\ncapacity = "8M"\n[localfile_store]\ndata_paths = ["d1"]\n')
    cfg = load_config(path)
    assert cfg.memory_store.capacity == 8 << 20
    assert cfg.localfile_store.data_paths[0].endswith("d1") and cfg.localfile_store.data_paths[0].startswith("/")


def test_load_config_errors_name_the_file(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[memory_store]\ncapacity = \"4M\"\ntypo = 1\n[localfile_store]\ndata_paths = [\"/a\"]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "memory_store.typo" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert info.value.problems[0][0] == "<file>"
    broken = tmp_path / "broken.toml"
    broken.write_text("[memory_store\n")
    with pytest.raises(ConfigError):
        load_config(broken)


def test_hdfs_store_types_and_keys() -> None:
    cfg = validate_config(ServerConfig, with_paths(
        store_type="MEMORY_LOCALFILE_HDFS",
        hybrid_store={"memory_spill_to_cold_threshold_size": "256M",
                      "huge_partition_memory_spill_to_hdfs_threshold_size": "64M"},
        hdfs_store={"max_concurrency": 10, "partition_write_max_concurrency": 4}))
    assert cfg.store_type.has_hdfs and cfg.store_type.has_localfile
    assert cfg.hybrid_store.memory_spill_to_cold_threshold_size == 256 << 20
    assert cfg.hybrid_store.huge_partition_memory_spill_to_hdfs_threshold_size == 64 << 20
    assert cfg.hdfs_store.partition_write_max_concurrency == 4
    assert validate_config(ServerConfig, {"store_type": "MEMORY_HDFS"}).store_type.has_hdfs
    # the default needs no HDFS at all
    assert ServerConfig.model_validate(with_paths()).hybrid_store.memory_spill_to_cold_threshold_size is None


def test_memory_hdfs_has_no_local_tier() -> None:
    assert "localfile_store.data_paths" in problems_of(with_paths(store_type="MEMORY_HDFS"))
    assert problems_of(with_paths(hdfs_store={"bogus": 1})) == {"hdfs_store.bogus": "unknown key"}


def test_hdfs_remote_storage_allow_list_is_normalized_and_checked() -> None:
    cfg = validate_config(ServerConfig, with_paths(store_type="MEMORY_LOCALFILE_HDFS", hdfs_store={
        "remote_storage": [{"path": "HDFS://nn:8020//rss/", "conf": {"dfs.replication": "2"}}, {"path": "/rss2"}]}))
    assert [(b.path, b.conf) for b in cfg.hdfs_store.remote_storage] == [
        ("hdfs://nn:8020/rss", {"dfs.replication": "2"}), ("/rss2", {})]
    assert validate_config(ServerConfig, with_paths()).hdfs_store.remote_storage == []
    problems = problems_of(with_paths(hdfs_store={"remote_storage": [
        {"path": "hdfs://nn/rss/../user"}, {"path": "hdfs://nn/x", "bogus": 1}, {"conf": {}}]}))
    assert "'..' path components" in problems["hdfs_store.remote_storage.0.path"]
    assert problems["hdfs_store.remote_storage.1.bogus"] == "unknown key"
    assert "hdfs_store.remote_storage.2.path" in problems
    twice = problems_of(with_paths(hdfs_store={"remote_storage": [{"path": "hdfs://nn/rss"},
                                                                  {"path": "hdfs://nn/rss/"}]}))
    assert "same path twice" in twice["hdfs_store.remote_storage"]


def test_partition_split_threshold_must_be_below_the_partition_limit() -> None:
    both = {"partition_split_enable": True, "partition_limit_enable": True, "partition_limit_threshold": "1G"}
    problems = problems_of(with_paths(app_config={**both, "partition_split_threshold": "1G"}))
    assert "must be below partition_limit_threshold" in problems["app_config.partition_split_threshold"]
    validate_config(ServerConfig, with_paths(app_config={**both, "partition_split_threshold": "512M"}))
    # either alone: no constraint (Riffle checks only when both are on)
    validate_config(ServerConfig, with_paths(app_config={"partition_split_enable": True}))
