"""``conf_reload_enable`` against a real ``riffle-server`` process: the config file is edited while it
serves, and the test waits on the effect over gRPC and in its log.

- A reloadable change (``app_config.partition_split_threshold``, ``[log] level``) applies live: the
  next requireBuffer names the partition that is now above the threshold, DEBUG lines appear.
- A file that does not load (bad TOML, an unknown key) is logged as an ERROR and ignored: the
  server goes on serving with the config in force.
- A file that also changes a key that cannot change live (``grpc_port``) is ignored whole: its
  reloadable change is not applied either (never half a file).

``conf_reload_interval_sec`` (ours; Riffle's period is a fixed 60 s) is 0.2 s here.
"""

from __future__ import annotations

from pathlib import Path

from riffle_actors.errors import StatusCode
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from tests.helpers import poll_until
from tests.helpers.client import UniffleClient, make_blocks
from tests.helpers.daemon import server_process

APP = "application_1700000000000_0077_1700000000001"


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def test_reload_applies_reloadable_keys_and_ignores_bad_or_restart_only_files(tmp_path: Path):
    tables = '[app_config]\npartition_split_enable = true\npartition_split_threshold = "1G"\n'
    with server_process(tmp_path, top="conf_reload_enable = true\nconf_reload_interval_sec = 0.2\n",
                        tables=tables) as srv:
        cfg = tmp_path / "server.toml"
        original = cfg.read_text()
        assert "is read again every 0.2s" in _log(srv.log)

        async with UniffleClient(srv.target) as client:
            async def split_ids() -> list[int]:
                resp = await client.stub.requireBuffer(pb.RequireBufferRequest(
                    requireSize=100, appId=APP, shuffleId=0, partitionIds=[0]))
                assert resp.status == StatusCode.SUCCESS, resp
                return list(resp.needSplitPartitionIds)

            async def unknown_app_rpc() -> None:  # answered NO_REGISTER, logged at DEBUG
                resp = await client.stub.requireBuffer(pb.RequireBufferRequest(
                    requireSize=1, appId="application_1_0001_2", shuffleId=0))
                assert resp.status == StatusCode.NO_REGISTER

            await client.register_shuffle(APP, 0, range(1))
            await client.send_blocks(APP, 0, make_blocks(0, 1, 5, 2000))
            assert await split_ids() == []
            await unknown_app_rpc()
            assert "requireBuffer -> NO_REGISTER" not in _log(srv.log)  # INFO: no DEBUG lines

            # 1. reloadable keys: applied live
            cfg.write_text(original.replace('partition_split_threshold = "1G"', 'partition_split_threshold = "4K"')
                           .replace(f'path = "{srv.log}"', f'path = "{srv.log}"\nlevel = "DEBUG"'))
            await poll_until(lambda: split_ids(), timeout=30, message="the new split threshold applied")
            assert await split_ids() == [0]
            text = _log(srv.log)
            assert "config reload: app_config.partition_split_threshold changed from 1073741824 to 4096" in text
            assert "config reload: log.level changed from 'INFO' to 'DEBUG'" in text
            await unknown_app_rpc()
            await poll_until(lambda: "requireBuffer -> NO_REGISTER" in _log(srv.log), timeout=10)
            in_force = cfg.read_text()

            # 2. a file that does not load: logged, ignored, the server serves on
            cfg.write_text(in_force + "\n[hybrid_store\n")
            await poll_until(lambda: _log(srv.log).count("not applied, the config in force is kept") == 1,
                             timeout=30)
            assert "not valid TOML" in _log(srv.log)
            cfg.write_text(in_force.replace("conf_reload_enable = true", "conf_reload_enable = true\nno_such_key = 1"))
            await poll_until(lambda: _log(srv.log).count("not applied, the config in force is kept") == 2,
                             timeout=30)
            assert "no_such_key: unknown key" in _log(srv.log)
            assert srv.proc.poll() is None
            assert await split_ids() == [0]

            # 3. a restart-only change refuses the whole file (its reloadable change too)
            cfg.write_text(in_force.replace("grpc_port = 0", "grpc_port = 19999")
                           .replace('partition_split_threshold = "4K"', 'partition_split_threshold = "1G"'))
            await poll_until(lambda: "cannot change without a restart" in _log(srv.log), timeout=30)
            text = _log(srv.log)
            refused = next(line for line in text.splitlines() if "cannot change without a restart" in line)
            assert "grpc_port (0 -> 19999)" in refused and "partition_split_threshold" not in refused.split(
                "cannot change")[0]
            assert await split_ids() == [0]  # still 4K
            assert text.count("config reload: app_config.partition_split_threshold changed") == 1

            # 4. back to a reloadable-only edit: applied again
            cfg.write_text(in_force.replace('partition_split_threshold = "4K"', 'partition_split_threshold = "1G"'))
            await poll_until(lambda: _log(srv.log).count(
                "config reload: app_config.partition_split_threshold changed") == 2, timeout=30)
            assert await split_ids() == []
            await client.unregister_app(APP)
