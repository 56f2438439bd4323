#!/usr/bin/env python3
"""Restart benchmark: how long a ``riffle-server`` takes to start again on data paths full of shuffle data.

For each size in ``--partitions`` it starts a ``riffle-server`` daemon on a fresh data dir, writes that many
partitions over gRPC (``--blocks`` blocks of ``--block-bytes`` each per partition, spread over ``--shuffles``
shuffles of one app, one report per map task, then finishShuffle so everything is on disk), stops it with
SIGTERM, and starts it again on the same ports and paths. It prints, per size:

- ``recovery s``: what the server's own log says the recovery took, and its parts: the scan of the data
  paths (files read and repaired), the plan (bitmaps, lost blocks) and the rebuild of the apps;
- ``start s``: from spawning the process to its port file (the ports listen only after recovery);
- ``empty start s``: the same for a server on an empty data dir (the process's fixed start cost);
- the recovery seconds per 10k partitions, and a check that getShuffleResultForMultiPart answers the
  same after the restart as before it.

    python scripts/bench_restart.py [--partitions 10000 50000] [--shuffles 2] [--blocks 2] [--block-bytes 512]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from riffle_actors.protocol.blockid import UNIFFLE_DEFAULT
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

APP = "app-bench-restart"
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


class Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {"grpc_port": 0, "http_port": 0}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> float:
        """Start; the seconds until the port file appeared."""
        self.starts += 1
        cfg = self.root / "server.toml"
        cfg.write_text(f"""grpc_port = {self.ports['grpc_port']}
http_port = {self.ports['http_port']}
grace_period_sec = 600
[memory_store]
capacity = "1G"
[localfile_store]
data_paths = ["{self.root / 'data'}"]
[log]
path = "{self.log_path}"
""")
        port_file = self.root / "ports.json"
        port_file.unlink(missing_ok=True)
        t = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(cfg),
                                      "--port-file", str(port_file)], env=ENV, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        while True:
            try:
                got = json.loads(port_file.read_text())
                break
            except (FileNotFoundError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"riffle-server exited with {self.proc.returncode}; see {self.log_path}")
            time.sleep(0.01)
        elapsed = time.monotonic() - t
        self.ports = {k: got[k] for k in self.ports}
        return elapsed

    @property
    def log_path(self) -> Path:
        return self.root / f"server{self.starts}.log"

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(900) != 0:
            raise RuntimeError(f"riffle-server exited with {self.proc.returncode}")
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def recovery_seconds(self) -> tuple[float, float, float, float]:
        """(total, scan, plan, rebuild) seconds, from the server's recovery log line."""
        m = re.search(r"recovery took ([0-9.]+)s \(scan ([0-9.]+)s, plan ([0-9.]+)s, rebuild ([0-9.]+)s\)",
                      self.log_path.read_text())
        if m is None:
            raise RuntimeError(f"no recovery line in {self.log_path}")
        return tuple(float(g) for g in m.groups())  # type: ignore[return-value]


def block_id(seq: int, partition: int, task: int) -> int:
    return UNIFFLE_DEFAULT.get_block_id(seq, partition, task)


async def write(port: int, partitions: int, shuffles: int, blocks: int, size: int) -> dict[int, bytes]:
    import grpc

    per_shuffle = partitions // shuffles
    results = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]) as ch:
        stub = pbg.ShuffleServerStub(ch)
        payload = os.urandom(size)
        crc = zlib.crc32(payload)
        for sid in range(shuffles):
            r = await stub.registerShuffle(pb.ShuffleRegisterRequest(
                appId=APP, shuffleId=sid, partitionRanges=[pb.ShufflePartitionRange(start=0, end=per_shuffle - 1)]))
            assert r.status == 0, r.retMsg
            tasks = 8
            for task in range(tasks):
                mine = range(task, per_shuffle, tasks)
                ids: dict[int, list[int]] = {p: [block_id(s, p, task) for s in range(blocks)] for p in mine}
                plist = list(mine)
                for i in range(0, len(plist), 256):
                    chunk = plist[i:i + 256]
                    need = len(chunk) * blocks * (size + 32)
                    t = await stub.requireBuffer(pb.RequireBufferRequest(requireSize=need, appId=APP, shuffleId=sid))
                    assert t.status == 0, t.retMsg
                    r = await stub.sendShuffleData(pb.SendShuffleDataRequest(
                        appId=APP, shuffleId=sid, requireBufferId=t.requireBufferId,
                        shuffleData=[pb.ShuffleData(partitionId=p, block=[pb.ShuffleBlock(
                            blockId=b, length=size, uncompressLength=size, crc=crc, data=payload,
                            taskAttemptId=task) for b in ids[p]]) for p in chunk]))
                    assert r.status == 0, r.retMsg
                r = await stub.reportShuffleResult(pb.ReportShuffleResultRequest(
                    appId=APP, shuffleId=sid, taskAttemptId=task, bitmapNum=1,
                    partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=p, blockIds=v) for p, v in ids.items()]))
                assert r.status == 0, r.retMsg
            r = await stub.finishShuffle(pb.FinishShuffleRequest(appId=APP, shuffleId=sid))
            assert r.status == 0, r.retMsg
        for sid in range(shuffles):
            results[sid] = await result(stub, sid, per_shuffle)
    return results


async def result(stub, sid: int, per_shuffle: int) -> bytes:
    r = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
        appId=APP, shuffleId=sid, partitions=list(range(per_shuffle))))
    assert r.status == 0, r.retMsg
    return r.serializedBitmap


async def read_results(port: int, shuffles: int, per_shuffle: int) -> dict[int, bytes]:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_receive_message_length", 256 << 20)]) as ch:
        stub = pbg.ShuffleServerStub(ch)
        return {sid: await result(stub, sid, per_shuffle) for sid in range(shuffles)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[10_000, 50_000])
    ap.add_argument("--shuffles", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=2, help="blocks per partition")
    ap.add_argument("--block-bytes", type=int, default=512)
    args = ap.parse_args()
    print(f"{'partitions':>10} {'files':>7} {'data MiB':>8} {'empty start s':>13} {'start s':>8} "
          f"{'recovery s':>10} {'scan':>6} {'plan':>6} {'rebuild':>7} {'recovery s/10k':>14} {'same result':>11}")
    for n in args.partitions:
        root = Path(tempfile.mkdtemp(prefix="riffle-bench-restart-"))
        srv = Server(root)
        try:
            empty = srv.start()
            expected = asyncio.run(write(srv.ports["grpc_port"], n, args.shuffles, args.blocks, args.block_bytes))
            srv.stop()
            files = sum(1 for _ in (root / "data").rglob("*") if _.is_file())
            mib = sum(p.stat().st_size for p in (root / "data").rglob("*.data")) / (1 << 20)
            start = srv.start()
            rec, scan, plan, rebuild = srv.recovery_seconds()
            got = asyncio.run(read_results(srv.ports["grpc_port"], args.shuffles, n // args.shuffles))
            srv.stop()
            print(f"{n:>10} {files:>7} {mib:>8.1f} {empty:>13.2f} {start:>8.2f} {rec:>10.3f} {scan:>6.2f} "
                  f"{plan:>6.2f} {rebuild:>7.2f} "
                  f"{rec * 10_000 / n:>14.3f} {got == expected!s:>11}", flush=True)
        finally:
            srv.kill()
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
