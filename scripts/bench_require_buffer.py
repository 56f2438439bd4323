#!/usr/bin/env python3
"""requireBuffer micro-benchmark: what each layer of one call costs, in one run.

Layers, outermost first (server CPU per call, user + system, psutil / ``time.process_time``):

- ``riffle-server`` (a daemon process of this checkout, and of ``--base-repo`` if given): a client
  process pool calls requireBuffer over gRPC; the server's CPU over the calls / calls;
- ``do-nothing grpc.aio``: the same clients against a grpc.aio server whose handler only builds the
  reply (what grpc.aio and protobuf cost per call, whatever the handler does);
- ``do-nothing grpc sync``: the same against grpcio's thread-pool (synchronous) server (the
  other serving mode grpcio has), and ``sync+loop``: that server handing each call to an asyncio
  loop thread and waiting for it, the least a sync-served handler of ours would pay (the actors
  live on the loop);
- in process, no gRPC (``--in-process``): ``ShuffleServerServicer.requireBuffer`` (our wrapper +
  the service + the actors), ``ShuffleService.require_buffer`` (the service + the actors), the one
  actor ask it makes (``CheckBufferRequest`` with the size: the AppActor checks, then hands
  ``RequireBuffer`` on to the MemoryManager, which answers), and its two halves alone (the checks
  only; ``RequireBuffer`` asked of the MemoryManager directly).

    python scripts/bench_require_buffer.py [--calls 20000] [--clients 2] [--concurrency 16]
                                           [--base-repo /path/to/other/checkout]

Every ticket is 1 byte (the server is configured to let one app hold all of them). Figures vary
on a loaded box: compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

APP = "application_1700000000000_0001"
PARTITIONS = 8


# ----------------------------------------------------------------------------- servers
def run_null_server(mode: str, port_q: mp.Queue) -> None:
    """A requireBuffer server that does nothing but answer: grpc.aio on uvloop, or grpcio's sync server."""
    from concurrent import futures

    import grpc

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    if mode in ("sync", "sync+loop"):
        loop = None
        if mode == "sync+loop":  # our handlers need the event loop: each call handed to it and waited for
            import threading

            import uvloop
            loop = uvloop.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()

        async def ticket() -> int:
            return 1

        class Sync(pbg.ShuffleServerServicer):
            def registerShuffle(self, request, context):
                return pb.ShuffleRegisterResponse(status=0)

            def requireBuffer(self, request, context):
                tid = 1 if loop is None else asyncio.run_coroutine_threadsafe(ticket(), loop).result()
                return pb.RequireBufferResponse(status=0, requireBufferId=tid)

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_ShuffleServerServicer_to_server(Sync(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        port_q.put(port)
        server.wait_for_termination()
        return

    import uvloop

    class Aio(pbg.ShuffleServerServicer):
        async def registerShuffle(self, request, context):
            return pb.ShuffleRegisterResponse(status=0)

        async def requireBuffer(self, request, context):
            return pb.RequireBufferResponse(status=0, requireBufferId=1)

    async def main() -> None:
        server = grpc.aio.server()
        pbg.add_ShuffleServerServicer_to_server(Aio(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(port)
        await server.wait_for_termination()

    uvloop.run(main())


def start_riffle(work: Path, name: str, repo: Path) -> tuple[subprocess.Popen, int]:
    cfg = work / f"{name}.toml"
    cfg.write_text(f'grpc_port = 0\nhttp_port = 0\n[memory_store]\ncapacity = "1G"\n'
                   f'app_buffer_ticket_max_number = 100000000\napp_buffer_ticket_max_ratio = 1.0\n'
                   f'[localfile_store]\ndata_paths = ["{work / ("data-" + name)}"]\n'
                   f'[log]\npath = "{work / (name + ".log")}"\nlevel = "WARNING"\n')
    port_file = work / f"{name}.ports.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(cfg),
                             "--port-file", str(port_file)], cwd=repo, env=env)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"server did not start; log: {work / (name + '.log')}")
        time.sleep(0.05)
    return proc, json.loads(port_file.read_text())["grpc_port"]


# ----------------------------------------------------------------------------- clients
def run_client(port: int, calls: int, concurrency: int, go, q: mp.Queue) -> None:
    import grpc
    import uvloop

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    async def main() -> tuple[int, int]:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = pbg.ShuffleServerStub(channel)
        await stub.registerShuffle(pb.ShuffleRegisterRequest(
            appId=APP, shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=PARTITIONS - 1)]))
        req = pb.RequireBufferRequest(requireSize=1, appId=APP, shuffleId=0, partitionIds=list(range(PARTITIONS)))
        await stub.requireBuffer(req)  # warm
        q.put("ready")
        while not go.is_set():
            await asyncio.sleep(0.01)
        bad = 0

        async def loop(n: int) -> None:
            nonlocal bad
            for _ in range(n):
                r = await stub.requireBuffer(req)
                bad += r.status != 0
        per = calls // concurrency
        await asyncio.gather(*(loop(per) for _ in range(concurrency)))
        await channel.close()
        return per * concurrency, bad

    q.put(uvloop.run(main()))


def drive(label: str, pid: int, port: int, opts) -> dict:
    import psutil

    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=run_client, args=(port, opts.calls // opts.clients, opts.concurrency, go, q))
             for _ in range(opts.clients)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            assert q.get(timeout=60) == "ready"
        proc = psutil.Process(pid)
        c0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
        go.set()
        done = [q.get(timeout=600) for _ in procs]
        c1, t1 = sum(proc.cpu_times()[:2]), time.perf_counter()
        for p in procs:
            p.join(30)
        n = sum(d[0] for d in done)
        return {"name": label, "calls": n, "bad": sum(d[1] for d in done), "cpu_us": (c1 - c0) * 1e6 / n,
                "rate": n / (t1 - t0)}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


# ----------------------------------------------------------------------------- in process
def in_process(opts, work: Path) -> list[dict]:
    """Our layers without gRPC: the servicer, the service, the actor round trips (process CPU per call)."""
    import uvloop

    from riffle_actors.actors.app_messages import CheckBufferRequest
    from riffle_actors.actors.memory import RequireBuffer
    from riffle_actors.config import ServerConfig, validate_config
    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.server import ShuffleServer

    async def main() -> list[dict]:
        cfg = validate_config(ServerConfig, {
            "grpc_port": 0, "grpc_bind_address": "127.0.0.1", "http_port": 0, "http_bind_address": "127.0.0.1",
            "memory_store": {"capacity": "1G", "app_buffer_ticket_max_number": 100_000_000,
                             "app_buffer_ticket_max_ratio": 1.0},
            "localfile_store": {"data_paths": [str(work / "inproc")]}, "log": {"level": "WARNING"}})
        srv = ShuffleServer(cfg)
        await srv.start()
        rows = []
        try:
            svc = srv.service
            await svc.register_shuffle(APP, 0, [(0, PARTITIONS - 1)], local_order=False)
            servicer = srv._grpc_servicer if hasattr(srv, "_grpc_servicer") else None
            if servicer is None:
                from riffle_actors.transport.grpc_server import ShuffleServerServicer
                servicer = ShuffleServerServicer(svc, srv.metrics, replies=srv.replies)
            req = pb.RequireBufferRequest(requireSize=1, appId=APP, shuffleId=0, partitionIds=list(range(PARTITIONS)))
            pids = tuple(range(PARTITIONS))
            app = svc.directory.get(APP)
            layers = {
                "servicer.requireBuffer (wrapper+service+actors)": lambda: servicer.requireBuffer(req, None),
                "service.require_buffer (service+actors)": lambda: svc.require_buffer(APP, 0, 1, pids),
                "AppActor ask CheckBufferRequest+size (the one ask a requireBuffer makes)": lambda: app.ask(
                    CheckBufferRequest(shuffle_id=0, partition_ids=pids, limit_bytes=svc.huge_partition_limit_bytes,
                                       size=1)),
                "AppActor ask CheckBufferRequest (checks only)": lambda: app.ask(CheckBufferRequest(
                    shuffle_id=0, partition_ids=pids, limit_bytes=svc.huge_partition_limit_bytes)),
                "MemoryManager ask RequireBuffer": lambda: svc.memory.ask(RequireBuffer(app_id=APP, shuffle_id=0,
                                                                                       size=1)),
            }
            per = opts.calls // opts.concurrency
            for name, call in layers.items():
                async def loop(call=call) -> None:
                    for _ in range(per):
                        await call()
                t0, w0 = time.process_time(), time.perf_counter()
                await asyncio.gather(*(loop() for _ in range(opts.concurrency)))
                t1, w1 = time.process_time(), time.perf_counter()
                n = per * opts.concurrency
                rows.append({"name": "in-process " + name, "calls": n, "bad": 0, "cpu_us": (t1 - t0) * 1e6 / n,
                             "rate": n / (w1 - w0)})
        finally:
            await srv.stop(0)
        return rows

    return uvloop.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calls", type=int, default=20_000, help="requireBuffer calls per run (over all clients)")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16, help="calls in flight per client process")
    ap.add_argument("--base-repo", type=Path, default=None, help="another checkout's riffle-server, run too")
    ap.add_argument("--no-in-process", action="store_true", help="skip the in-process layer rows")
    opts = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="riffle-rb-"))
    rows = []
    try:
        ctx = mp.get_context("spawn")
        for mode in ("aio", "sync", "sync+loop"):
            q = ctx.Queue()
            null = ctx.Process(target=run_null_server, args=(mode, q), daemon=True)
            null.start()
            try:
                rows.append(drive(f"do-nothing grpc {mode}", null.pid, q.get(timeout=30), opts))
            finally:
                null.terminate()
                null.join(10)
        for name, repo in [("riffle-server", REPO)] + ([("riffle-server [base]", opts.base_repo.resolve())]
                                                        if opts.base_repo else []):
            proc, port = start_riffle(work, name.replace(" ", "_").strip("[]"), repo)
            try:
                rows.append(drive(name, proc.pid, port, opts))
            finally:
                proc.terminate()
                proc.wait(30)
        if not opts.no_in_process:
            rows += in_process(opts, work)
        print(f"load {os.getloadavg()[0]:.2f}; {opts.calls} calls, {opts.clients} clients x {opts.concurrency} "
              f"in flight, {PARTITIONS} partition ids per call")
        print(f"{'layer':60} {'calls/s':>9} {'CPU us/call':>12} {'bad':>4}")
        for r in rows:
            print(f"{r['name']:60} {r['rate']:9.0f} {r['cpu_us']:12.1f} {r['bad']:4d}")
        by = {r["name"]: r for r in rows}
        aio, full = by["do-nothing grpc aio"]["cpu_us"], by["riffle-server"]["cpu_us"]
        print(f"riffle-server / do-nothing grpc.aio: x{full / aio:.2f} (ours: {full - aio:.1f} us/call)")
        print(f"do-nothing sync / aio: x{by['do-nothing grpc sync']['cpu_us'] / aio:.2f}; "
              f"sync handing each call to an event loop / aio: x{by['do-nothing grpc sync+loop']['cpu_us'] / aio:.2f}")
        if "riffle-server [base]" in by:
            print(f"riffle-server / [base]: x{full / by['riffle-server [base]']['cpu_us']:.2f}")
        return 0 if all(r["bad"] == 0 for r in rows) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
