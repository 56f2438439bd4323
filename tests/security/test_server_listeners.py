"""The server listens where its config says and nowhere else; a port it cannot open is named, with its
config keys, in one line (no traceback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from riffle_actors.server import ShuffleServer

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _config(tmp_path: Path, grpc_port: int, http_port: int, extra: str = "") -> Path:
    cfg = tmp_path / "server.toml"
    cfg.write_text(f"""grpc_port = {grpc_port}
grpc_bind_address = "127.0.0.1"
http_port = {http_port}
http_bind_address = "127.0.0.1"
grace_period_sec = 0
{extra}
[memory_store]
capacity = "16M"
[localfile_store]
data_paths = ["{tmp_path / 'data'}"]
""")
    return cfg


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_in_use_is_named_with_its_config_keys(tmp_path: Path, which: str):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = _config(tmp_path, port if which == "grpc" else 0, port if which == "http" else 0)
        result = subprocess.run([sys.executable, "-m", "riffle_actors.server", "--config", str(cfg)], env=ENV,
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot listen for {'gRPC' if which == 'grpc' else 'HTTP'} on 127.0.0.1:{port}" in result.stderr
    assert f"(config keys {which}_port / {which}_bind_address)" in result.stderr
    assert "address already in use" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_bind_address_that_is_not_an_ip_is_a_config_error(tmp_path: Path):
    cfg = _config(tmp_path, 0, 0).read_text().replace('grpc_bind_address = "127.0.0.1"',
                                                      'grpc_bind_address = "example.com"')
    (tmp_path / "bad.toml").write_text(cfg)
    result = subprocess.run([sys.executable, "-m", "riffle_actors.server", "--config", str(tmp_path / "bad.toml")],
                            env=ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "grpc_bind_address: 'example.com' is not an IP address" in result.stderr, result.stderr


async def test_listeners_bind_exactly_the_configured_addresses(server_factory):
    srv: ShuffleServer = await server_factory()  # the test config binds 127.0.0.1
    # gRPC listens on an IPv6 socket for an IPv4 address: ::ffff:127.0.0.1 is the same loopback address
    listening = {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port) for c in psutil.Process().net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
    assert ("127.0.0.1", srv.grpc_port) in listening and ("127.0.0.1", srv.http_port) in listening
    wildcard = {(ip, port) for ip, port in listening if port in (srv.grpc_port, srv.http_port)
                and ip != "127.0.0.1"}
    assert not wildcard, wildcard
