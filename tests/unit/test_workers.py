"""The cut of one host's config into its worker servers (``riffle_actors.workers``), the host's merged
``/metrics`` page, and ``riffle-server``'s choice between today's server, the parent and a worker."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from riffle_actors.config import ConfigError, ServerConfig
from riffle_actors.host import HostLaunch
from riffle_actors.server import _load_checked
from riffle_actors.workers import (
    ENV_WORKER_INDEX,
    ENV_WORKER_NUMBER,
    WorkerLayoutError,
    check_layout,
    label_sample,
    merge_metrics,
    worker_config,
    worker_ports,
)


def cfg(n: int, **top) -> ServerConfig:
    data = {"grpc_port": 19999, "urpc_port": 21000, "http_port": 20010,
            "memory_store": {"capacity": "10G"}, "max_reply_bytes": "1G",
            "localfile_store": {"data_paths": ["/d1", "/d2"], "io_limiter": {"capacity": "300M"}},
            "health_service_config": {"memory_allocated_threshold": "30G"},
            "log": {"path": "/var/log/riffle/server.log"},
            "runtime_config": {"worker_number": n}, **top}
    return ServerConfig.model_validate(data)


def test_one_worker_is_the_config_as_is() -> None:
    c = cfg(1)
    assert worker_config(c, 0) is c
    check_layout(c)


def test_each_worker_gets_its_ports_its_share_of_memory_and_its_subdirectories() -> None:
    c = cfg(4)
    w = [worker_config(c, k) for k in range(4)]
    assert [x.grpc_port for x in w] == [19999, 20000, 20001, 20002]
    assert [x.urpc_port for x in w] == [21000, 21001, 21002, 21003]
    assert {x.http_port for x in w} == {0}  # the host's http_port is the parent's
    assert {x.memory_store.capacity for x in w} == {10 * (1 << 30) // 4}
    assert {x.max_reply_bytes for x in w} == {(1 << 30) // 4}
    assert {x.health_service_config.memory_allocated_threshold for x in w} == {30 * (1 << 30) // 4}
    assert {x.localfile_store.io_limiter.capacity for x in w} == {300 * (1 << 20) // 4}  # the disks are shared
    assert w[2].localfile_store.data_paths == ["/d1/.worker-2", "/d2/.worker-2"]
    assert w[3].log.path == "/var/log/riffle/server.worker-3.log"
    assert {x.runtime_config.worker_number for x in w} == {1}  # a worker is a plain server
    # what is not the host's stays as the operator wrote it
    assert {x.memory_store.buffer_ticket_timeout_sec for x in w} == {c.memory_store.buffer_ticket_timeout_sec}
    # the operator's config is not changed
    assert c.grpc_port == 19999 and c.localfile_store.data_paths == ["/d1", "/d2"]
    with pytest.raises(ValueError, match="worker 4 of 4"):
        worker_config(c, 4)


def test_port_zero_stays_zero_and_urpc_off_stays_off() -> None:
    c = cfg(3, grpc_port=0, urpc_port=None)
    assert worker_ports(c, 2).grpc_port == 0 and worker_ports(c, 2).urpc_port is None
    c = cfg(3, urpc_port=0)
    assert worker_ports(c, 2).urpc_port == 0
    check_layout(cfg(3, grpc_port=0, urpc_port=0, http_port=0))


def test_the_reply_budget_keeps_its_floor() -> None:
    c = cfg(64, max_reply_bytes="16M", grpc_port=30000, urpc_port=31000)
    assert worker_config(c, 0).max_reply_bytes == 1 << 20


@pytest.mark.parametrize(("top", "says"), [
    ({"grpc_port": 20000}, "grpc_port 20000..20015, which overlaps http_port 20010..20010"),
    ({"grpc_port": 19990, "urpc_port": 20000}, "grpc_port 19990..20005, which overlaps urpc_port 20000..20015"),
    ({"grpc_port": 65530}, "need grpc_port 65530..65545, beyond port 65535"),
])
def test_port_ranges_that_collide_are_refused(top: dict, says: str) -> None:
    with pytest.raises(WorkerLayoutError, match=says) as e:
        check_layout(cfg(16, **top))
    assert e.value.key == "runtime_config.worker_number"


def test_the_worker_number_is_bounded() -> None:
    with pytest.raises(ValueError, match="runtime_config.worker_number"):
        cfg(257)
    with pytest.raises(ValueError, match="runtime_config.worker_number"):
        cfg(0)


# --------------------------------------------------------------------------- which process is this


def write_config(tmp_path: Path, n: int, grpc_port: int = 0) -> str:
    path = tmp_path / "server.toml"
    path.write_text(f'grpc_port = {grpc_port}\nhttp_port = 20010\n[memory_store]\ncapacity = "64M"\n'
                    f'[localfile_store]\ndata_paths = ["{tmp_path / "data"}"]\n[runtime_config]\nworker_number = {n}\n')
    return str(path)


def test_riffle_server_is_the_parent_above_one_worker_and_a_worker_when_the_parent_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_WORKER_INDEX, raising=False)
    assert isinstance(_load_checked(write_config(tmp_path, 1)), ServerConfig)
    launch = _load_checked(write_config(tmp_path, 2))
    assert isinstance(launch, HostLaunch) and launch.log is launch.cfg.log
    monkeypatch.setenv(ENV_WORKER_INDEX, "1")
    monkeypatch.setenv(ENV_WORKER_NUMBER, "2")
    worker = _load_checked(write_config(tmp_path, 2))
    assert isinstance(worker, ServerConfig)
    assert worker.localfile_store.data_paths == [str(tmp_path / "data" / ".worker-1")]
    assert worker.memory_store.capacity == 32 << 20
    # the file changed under the host: the worker refuses to start (exit 2), naming the key
    with pytest.raises(ConfigError, match="runtime_config.worker_number"):
        _load_checked(write_config(tmp_path, 3))


def test_a_layout_that_does_not_fit_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_WORKER_INDEX, raising=False)
    with pytest.raises(ConfigError, match="runtime_config.worker_number.*overlaps http_port"):
        _load_checked(write_config(tmp_path, 16, grpc_port=20000))


# --------------------------------------------------------------------------- the host's /metrics


PAGE = """# HELP riffle_apps apps
# TYPE riffle_apps gauge
riffle_apps 3.0
# HELP riffle_read_bytes_total bytes read
# TYPE riffle_read_bytes_total counter
riffle_read_bytes_total{source="memory"} 5.0
riffle_read_bytes_total{source="localfile"} 7.0
# HELP riffle_empty_labels x
# TYPE riffle_empty_labels gauge
riffle_empty_labels{} 1.0
"""


def test_a_sample_gets_the_worker_label_first() -> None:
    assert label_sample("a 1", 3) == 'a{worker="3"} 1'
    assert label_sample('a{b="x y"} 1', 3) == 'a{worker="3",b="x y"} 1'
    assert label_sample("a{} 1", 0) == 'a{worker="0"} 1'


def test_the_host_page_merges_families_and_labels_every_sample() -> None:
    own = "# HELP riffle_host_workers n\n# TYPE riffle_host_workers gauge\nriffle_host_workers 2\n"
    text = merge_metrics([(0, PAGE), (1, PAGE.replace("3.0", "4.0"))], own)
    assert text.count("# TYPE riffle_read_bytes_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}  # a valid page
    got = {(s.name, tuple(sorted(s.labels.items())), s.value) for f in families.values() for s in f.samples}
    assert ("riffle_apps", (("worker", "0"),), 3.0) in got
    assert ("riffle_apps", (("worker", "1"),), 4.0) in got
    assert ("riffle_read_bytes_total", (("source", "localfile"), ("worker", "1")), 7.0) in got
    assert ("riffle_empty_labels", (("worker", "1"),), 1.0) in got
    assert ("riffle_host_workers", (), 2.0) in got
    # a family's samples stay together (the text format wants that), worker 0 before worker 1
    lines = [line for line in text.splitlines() if line.startswith("riffle_apps")]
    assert lines == ['riffle_apps{worker="0"} 3.0', 'riffle_apps{worker="1"} 4.0']
