#!/usr/bin/env python3
"""Ingest benchmark: riffle-server over gRPC and over urpc, against do-nothing servers, in one run.

Starts ``riffle-server`` as a daemon process (gRPC, and the urpc port for ``--transport urpc``) on a
temporary data dir, then N client processes (``--clients``) that push realistic shuffle traffic
(many partitions, 4-64 KiB blocks, several concurrent senders per process; each send is
requireBuffer + sendShuffleData, like the Uniffle client; over urpc the ticket includes the message
size and the send is a Netty frame) and then read every partition back (memory cursor, then index +
data segments) over the same transport, checking every block byte for byte. The same clients then
write to a do-nothing server of that transport (answers SUCCESS, keeps nothing). For each run it
prints write and read MB/s, p50/p99 latency and the server process's CPU seconds per GB written and
read (psutil: user + system time of the server process over each phase), the server CPU ms per
successful send, and ``refused``: the requireBuffer answers per send that were not SUCCESS (memory
full or a huge partition held back; the client retries 20 ms later, as the Uniffle client backs off),
so a server that spills slowly shows it there and in its CPU per send.

    python scripts/bench_ingest.py [--transport grpc urpc] [--clients 2] [--total-mib 1024]
                                   [--capacity 512M] [--senders 8] [--request-kib 1024]
                                   [--riffle-bin PATH/riffle-server] [--rounds 3]

With ``--riffle-bin`` each round also runs the same clients against a Riffle (Rust) server built
elsewhere (same memory capacity, one data directory, O_DIRECT appends, a riffle-coordinator of ours;
``scripts/rust_riffle.py``) and prints, per transport, ours / Riffle for write and read MB/s and CPU
s/GB, server CPU ms per send, send p99 and peak RSS (medians over ``--rounds``).

The server's own settings can be tried through its environment, e.g. glibc's malloc tunables:
``--server-env MALLOC_MMAP_THRESHOLD_=1048576``; server config variants through ``--variant``, e.g.
``--variant direct --variant buffered:localfile_store.direct_io_append_enable=false --rounds 2``
(every variant of every transport in each round, interleaved). CPU s/GB is user + system; the
``sys`` column is the system (kernel) part. Numbers vary 15-30 % run to run on a shared 2-core box;
compare figures from one run. Each transport gets a fresh server (same config), so the runs do not
share memory state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIB = 1 << 20
GB = 1e9


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ----------------------------------------------------------------------------- do-nothing servers
async def serve_null_urpc() -> int:
    """A do-nothing urpc port on 127.0.0.1 (port 0) on the running loop: reads frames into one reused
    buffer and answers each SUCCESS (type 0), decoding nothing; returns the port."""
    from riffle_actors.protocol import urpc

    class NullUrpc(asyncio.BufferedProtocol):
        def connection_made(self, transport):
            self.t = transport
            self.buf = bytearray(4 << 20)
            self.view = memoryview(self.buf)
            self.have = 0
            self.skip = 0

        def get_buffer(self, hint):
            return self.view[self.have:]

        def buffer_updated(self, n):
            self.have += n
            pos = 0
            while True:
                if self.skip:
                    k = min(self.skip, self.have - pos)
                    pos += k
                    self.skip -= k
                    if self.skip:
                        break
                if self.have - pos < urpc.HEADER_SIZE + 8:
                    break
                h = urpc.decode_header(self.view, pos)
                rid = int.from_bytes(self.view[pos + 9:pos + 17], "big", signed=True)
                self.t.write(urpc.encode_rpc_response(rid, 0, ""))
                pos += urpc.HEADER_SIZE
                self.skip = h.frame_len
            rest = self.have - pos
            self.buf[:rest] = self.buf[pos:self.have]
            self.have = rest

    srv = await asyncio.get_running_loop().create_server(NullUrpc, "127.0.0.1", 0)
    return srv.sockets[0].getsockname()[1]


def _run_null(transport: str, port_q: mp.Queue, engine: str) -> None:
    """Answers requireBuffer/send/register/report SUCCESS over gRPC, served by ``engine`` (LOOP: our
    ``transport.grpc_loop``, the riffle-server default; GRPCIO: grpc.aio); with ``urpc`` also sends over a
    Netty port."""
    import grpc
    import uvloop

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    class Null(pbg.ShuffleServerServicer):
        ticket = 0

        async def registerShuffle(self, request, context):
            return pb.ShuffleRegisterResponse(status=0)

        async def requireBuffer(self, request, context):
            self.ticket += 1
            return pb.RequireBufferResponse(status=0, requireBufferId=self.ticket)

        async def sendShuffleData(self, request, context):
            return pb.SendShuffleDataResponse(status=0)

        async def reportShuffleResult(self, request, context):
            return pb.ReportShuffleResultResponse(status=0)

    async def main() -> None:
        null = Null()
        if engine == "LOOP":
            from riffle_actors.transport.grpc_loop import LoopGrpcServer, LoopMethod

            requests = {"registerShuffle": pb.ShuffleRegisterRequest, "requireBuffer": pb.RequireBufferRequest,
                        "sendShuffleData": pb.SendShuffleDataRequest,
                        "reportShuffleResult": pb.ReportShuffleResultRequest}
            loop_server = LoopGrpcServer(
                {f"/rss.common.ShuffleServer/{name}": LoopMethod(req.FromString, getattr(null, name),
                                                                 lambda m: m.SerializeToString())
                 for name, req in requests.items()}, max_message_bytes=1 << 30)
            port = await loop_server.start("127.0.0.1", 0)
        else:
            server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30),
                                              ("grpc.max_send_message_length", 1 << 30)])
            pbg.add_ShuffleServerServicer_to_server(null, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
        urpc_port = await serve_null_urpc() if transport == "urpc" else 0
        port_q.put((port, urpc_port))
        await asyncio.Event().wait()

    uvloop.run(main())


def run_null_server(transport: str, port_q: mp.Queue) -> None:
    """The do-nothing server on riffle-server's default gRPC engine (LOOP)."""
    _run_null(transport, port_q, "LOOP")


def run_null_aio_server(transport: str, port_q: mp.Queue) -> None:
    """The do-nothing server on grpc.aio (``grpc_engine = "GRPCIO"``)."""
    _run_null(transport, port_q, "GRPCIO")


# ----------------------------------------------------------------------------- client
def run_client(index: int, port: int, urpc_port: int, args: dict, go_write, go_read, result_q: mp.Queue) -> None:
    import grpc
    import uvloop

    from riffle_actors.protocol import urpc
    from riffle_actors.protocol.index import decode_index
    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
    from riffle_actors.records import Block
    from tests.helpers.urpc_client import UrpcConnection

    app = f"bench_app_{index}"
    rng = random.Random(7 + index)
    # a pool of payloads reused by every request keeps the client's own CPU small
    pool = [os.urandom(rng.choice((4, 8, 16, 32, 64)) * 1024) for _ in range(256)]
    pool_crc = [zlib.crc32(p) for p in pool]
    partitions = args["partitions"]
    per_request = args["request_bytes"]
    total = args["total_mib"] * MIB // args["clients"]
    over_urpc = urpc_port > 0
    read_back = args["read_back"]

    async def main() -> dict:
        opts = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
        stub = pbg.ShuffleServerStub(channel)
        conns = [await UrpcConnection.open("127.0.0.1", urpc_port) for _ in range(2)] if over_urpc else []
        await stub.registerShuffle(pb.ShuffleRegisterRequest(
            appId=app, shuffleId=0,
            partitionRanges=[pb.ShufflePartitionRange(start=p, end=p) for p in range(partitions)]))
        sent = 0
        next_block = [index << 40]
        latencies: list[float] = []
        refused = 0  # requireBuffer answers other than SUCCESS (memory full, huge partition): retried in 20 ms
        expected: dict[int, dict[int, int]] = {p: {} for p in range(partitions)}  # partition -> block -> pool idx

        async def sender(sender_id: int) -> None:
            nonlocal sent, refused
            r = random.Random(sender_id * 1000 + index)
            conn = conns[sender_id % len(conns)] if conns else None
            while sent < total:
                sent += per_request
                by_partition: dict[int, list] = {}
                size = nbytes = 0
                while nbytes < per_request:
                    i = r.randrange(len(pool))
                    p = r.randrange(partitions)
                    next_block[0] += 1
                    bid = next_block[0]
                    data = pool[i]
                    if conn is not None:
                        by_partition.setdefault(p, []).append(Block(bid, len(data), len(data), pool_crc[i],
                                                                    sender_id, data))
                    else:
                        by_partition.setdefault(p, []).append(pb.ShuffleBlock(
                            blockId=bid, length=len(data), uncompressLength=len(data), crc=pool_crc[i], data=data,
                            taskAttemptId=sender_id))
                    expected[p][bid] = i
                    nbytes += len(data)
                    size += len(data) + 32
                t0 = time.perf_counter()
                if conn is not None:
                    parts = list(by_partition.items())
                    frame = urpc.encode_send_shuffle_data(0, app, 0, 0, parts, 0)
                    size += len(frame) - urpc.HEADER_SIZE  # the Netty client's ticket includes the message
                while True:
                    rb = await stub.requireBuffer(pb.RequireBufferRequest(
                        requireSize=size, appId=app, shuffleId=0, partitionIds=list(by_partition)))
                    if rb.status == 0:
                        break
                    refused += 1
                    await asyncio.sleep(0.02)
                if conn is not None:
                    rid = conn.next_id()
                    frame = bytearray(frame)
                    frame[9:17] = rid.to_bytes(8, "big")
                    off = 9 + 8 + 4 + len(app.encode()) + 4
                    frame[off:off + 8] = rb.requireBufferId.to_bytes(8, "big", signed=True)
                    resp = await conn.request(bytes(frame), rid, timeout=300)
                    status, msg = resp.status, resp.ret_msg
                else:
                    resp = await stub.sendShuffleData(pb.SendShuffleDataRequest(
                        appId=app, shuffleId=0, requireBufferId=rb.requireBufferId,
                        shuffleData=[pb.ShuffleData(partitionId=p, block=b) for p, b in by_partition.items()]))
                    status, msg = resp.status, resp.retMsg
                if status != 0:
                    raise RuntimeError(f"send failed: {status} {msg}")
                latencies.append(time.perf_counter() - t0)

        await asyncio.get_running_loop().run_in_executor(None, go_write.wait)
        t0 = time.perf_counter()
        w0 = time.time()
        await asyncio.gather(*(sender(i) for i in range(args["senders"])))
        write_s = time.perf_counter() - t0
        written = sum(len(pool[i]) for blocks in expected.values() for i in blocks.values())
        out = {"write_bytes": written, "write_start": w0, "write_end": w0 + write_s, "send_lat": latencies,
               "refused": refused}
        result_q.put(("written", index, out))
        if read_back:
            await asyncio.get_running_loop().run_in_executor(None, go_read.wait)
            read_lat: list[float] = []
            read_bytes = 0
            local_bytes = 0  # of read_bytes, read from local files (index + data segments)
            bad = 0
            r0 = time.time()
            t1 = time.perf_counter()

            async def memory(p: int, last: int, conn) -> tuple[list, object]:
                if conn is not None:
                    rid = conn.next_id()
                    m = await conn.request(urpc.encode_get_memory_data(rid, app, 0, p, last, 14 * MIB), rid, 300)
                    return [(s[0], s[1], s[2]) for s in m.segments], m.body
                m = await stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
                    appId=app, shuffleId=0, partitionId=p, lastBlockId=last, readBufferSize=14 * MIB))
                return [(s.blockId, s.offset, s.length) for s in m.shuffleDataBlockSegments], m.data

            async def index_of(p: int, conn) -> bytes:
                if conn is not None:
                    rid = conn.next_id()
                    ix = await conn.request(urpc.encode_get_local_index(rid, app, 0, p, 1, partitions), rid, 300)
                    return bytes(ix.body)
                ix = await stub.getLocalShuffleIndex(pb.GetLocalShuffleIndexRequest(
                    appId=app, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=partitions))
                return ix.indexData

            async def data_of(p: int, offset: int, length: int, conn):
                if conn is not None:
                    rid = conn.next_id()
                    d = await conn.request(urpc.encode_get_local_data(rid, app, 0, p, offset, length,
                                                                      partition_num=partitions), rid, 300)
                    return d.body
                d = await stub.getLocalShuffleData(pb.GetLocalShuffleDataRequest(
                    appId=app, shuffleId=0, partitionId=p, partitionNumPerRange=1, partitionNum=partitions,
                    offset=offset, length=length, storageId=-1))
                return d.data

            async def read_partition(p: int) -> None:
                nonlocal read_bytes, local_bytes, bad
                conn = conns[p % len(conns)] if conns else None
                got: set[int] = set()
                last = -1
                while True:
                    ts = time.perf_counter()
                    segs, data = await memory(p, last, conn)  # data bound once per response
                    read_lat.append(time.perf_counter() - ts)
                    if not segs:
                        break
                    for bid, off, length in segs:
                        if bid not in got:
                            got.add(bid)
                            read_bytes += length
                            bad += data[off:off + length] != pool[expected[p][bid]]
                    last = segs[-1][0]
                entries = decode_index(await index_of(p, conn))
                seg_start = 0
                while seg_start < len(entries):  # contiguous segments of about 14 MiB
                    seg_end, length = seg_start, 0
                    while seg_end < len(entries) and length < 14 * MIB:
                        length += entries[seg_end].length
                        seg_end += 1
                    ts = time.perf_counter()
                    data = await data_of(p, entries[seg_start].offset, length, conn)
                    read_lat.append(time.perf_counter() - ts)
                    pos = 0
                    for e in entries[seg_start:seg_end]:
                        if e.block_id not in got:
                            got.add(e.block_id)
                            read_bytes += e.length
                            local_bytes += e.length
                            bad += data[pos:pos + e.length] != pool[expected[p][e.block_id]]
                        pos += e.length
                    seg_start = seg_end
                bad += len(set(expected[p]) - got)

            sem = asyncio.Semaphore(4)

            async def guarded(p: int) -> None:
                async with sem:
                    await read_partition(p)

            await asyncio.gather(*(guarded(p) for p in range(partitions)))
            read_s = time.perf_counter() - t1
            result_q.put(("read", index, {"read_bytes": read_bytes, "local_bytes": local_bytes,
                                          "read_start": r0, "read_end": r0 + read_s,
                                          "read_lat": read_lat, "bad": bad}))
        for c in conns:
            await c.close()
        await channel.close()
        return out

    uvloop.run(main())


def tree_cpu_us(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and every process below it (a multi-worker host)."""
    import psutil

    proc = psutil.Process(pid)
    user, system = cpu_us(pid)
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        user, system = user + t.user, system + t.system
    return user, system


def cpu_s(pid: int) -> float:
    return sum(cpu_us(pid))


def cpu_us(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user, t.system


def run_clients(label: str, server_pid: int, port: int, urpc_port: int, args: dict,
                targets: list[tuple[int, int]] | None = None) -> dict:
    """N client processes; phases start together so the server's CPU time is measured per phase.

    ``targets``: (grpc port, urpc port) of each worker of a multi-worker host; client ``i`` writes to
    worker ``i % len(targets)``, and the server's CPU is that of the parent and all its workers."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go_write, go_read = ctx.Event(), ctx.Event()
    n = args["clients"]
    targets = targets or [(port, urpc_port)]
    measure = tree_cpu_us if len(targets) > 1 or args.get("tree_cpu") else cpu_us
    procs = [ctx.Process(target=run_client, args=(i, *targets[i % len(targets)], args, go_write, go_read, q))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        time.sleep(1.0)  # let the clients import and connect (not a test: a benchmark's settle time)
        c0 = measure(server_pid)
        k0 = sum(sum(cpu_us(p.pid)) for p in procs)
        go_write.set()
        written = [q.get(timeout=3600) for _ in range(n)]
        c1 = measure(server_pid)
        k1 = sum(sum(cpu_us(p.pid)) for p in procs)
        out = {"name": label, "write_bytes": sum(w[2]["write_bytes"] for w in written),
               "write_s": max(w[2]["write_end"] for w in written) - min(w[2]["write_start"] for w in written),
               "send_lat": [x for w in written for x in w[2]["send_lat"]],
               "refused": sum(w[2]["refused"] for w in written),
               "write_cpu_s": sum(c1) - sum(c0), "write_sys_s": c1[1] - c0[1], "client_write_cpu_s": k1 - k0}
        if args["read_back"]:
            if args.get("read_local"):
                wait_spilled(server_pid)
                c1 = measure(server_pid)
            go_read.set()
            reads = [q.get(timeout=3600) for _ in range(n)]
            c2 = measure(server_pid)
            out.update({"read_bytes": sum(r[2]["read_bytes"] for r in reads),
                        "local_bytes": sum(r[2]["local_bytes"] for r in reads),
                        "read_s": max(r[2]["read_end"] for r in reads) - min(r[2]["read_start"] for r in reads),
                        "read_lat": [x for r in reads for x in r[2]["read_lat"]],
                        "read_cpu_s": sum(c2) - sum(c1), "read_sys_s": c2[1] - c1[1],
                        "bad": sum(r[2]["bad"] for r in reads)})
        out["peak_rss"] = peak_rss(server_pid)
        for p in procs:
            p.join(120)
        return out
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)


HTTP_PORTS: dict[int, int] = {}  # server pid -> its HTTP port (from the port file)


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM) in bytes, 0 when unknown; a multi-worker host's parent only."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def start_riffle(work: Path, name: str, binary: str, capacity: str, transport: str) -> tuple:
    """``--riffle-bin``: a riffle-coordinator of ours and a Riffle server heartbeating to it (Riffle does not
    start without one), with the same memory capacity and one data directory; (Riffle, coordinator)."""
    from scripts.rust_riffle import start_riffle as launch

    coord_cfg, coord_ports = work / f"{name}-coordinator.toml", work / f"{name}-coordinator.json"
    coord_cfg.write_text('grpc_port = 0\nhttp_port = 0\ngrpc_bind_address = "127.0.0.1"\n'
                         'http_bind_address = "127.0.0.1"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    coord = subprocess.Popen([sys.executable, "-m", "riffle_actors.coordinator", "--config", str(coord_cfg),
                              "--port-file", str(coord_ports)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not coord_ports.exists():
        if coord.poll() is not None or time.monotonic() > deadline:
            coord.kill()
            raise SystemExit("the coordinator for Riffle did not start")
        time.sleep(0.05)
    quorum = f"127.0.0.1:{json.loads(coord_ports.read_text())['grpc_port']}"
    try:
        riffle = launch(binary, work / name, quorum=quorum, capacity=capacity, data_dir=work / f"data-{name}",
                        urpc=transport == "urpc")
    except BaseException:
        stop(coord)
        raise
    return riffle, coord


def wait_spilled(server_pid: int, timeout_s: float = 600) -> None:
    """``--read-local``: wait until the server has no spill in flight or waiting (its /metrics), so the read
    phase measures reads only and finds the data in local files."""
    import urllib.request

    url = f"http://127.0.0.1:{HTTP_PORTS[server_pid]}/metrics"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                  if line.startswith(("riffle_memory_in_flight_bytes ", "riffle_spill_pending_jobs ",
                                      "riffle_spill_running_jobs "))}
        if values and not any(values.values()):
            return
        time.sleep(0.2)  # a benchmark's poll of another process, not a test
    raise SystemExit("the server's spills did not finish")


def parse_variant(text: str) -> tuple[str, dict[str, dict[str, str]]]:
    """``NAME[:section.key=value,...]`` -> (name, {section: {key: TOML value}})."""
    name, _, rest = text.partition(":")
    overrides: dict[str, dict[str, str]] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        section, _, field = key.rpartition(".")
        overrides.setdefault(section, {})[field] = value
    return name, overrides


def start_server(work: Path, name: str, capacity: str, transport: str, env_extra: dict,
                 overrides: dict[str, dict[str, str]] | None = None, repo: Path = REPO, workers: int = 0) -> tuple:
    """The server process (of checkout ``repo``), its gRPC and urpc ports, and with ``workers``
    (``runtime_config.worker_number``) the (gRPC, urpc) ports of each worker as a fourth element."""
    data_dir = work / f"data-{name}"
    cfg = work / f"{name}.toml"
    sections: dict[str, dict[str, str]] = {
        "": {"grpc_port": "0", "http_port": "0", **({"urpc_port": "0"} if transport == "urpc" else {})},
        "memory_store": {"capacity": f'"{capacity}"'},
        "localfile_store": {"data_paths": f'["{data_dir}"]'},
        "log": {"path": f'"{work / (name + ".log")}"', "level": '"WARNING"'},
    }
    if workers:
        sections["runtime_config"] = {"worker_number": str(workers)}
    for section, values in (overrides or {}).items():
        sections.setdefault(section, {}).update(values)
    text = "".join(f"{k} = {v}\n" for k, v in sections.pop("").items())
    for section, values in sections.items():
        text += f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
    cfg.write_text(text)
    port_file = work / f"{name}.ports.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]), **env_extra}
    server = subprocess.Popen([sys.executable, "-m", "riffle_actors.server", "--config", str(cfg),
                               "--port-file", str(port_file)], cwd=repo, env=env)
    deadline = time.monotonic() + 30 + 30 * workers
    while not port_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"server did not start; log: {work / (name + '.log')}")
        time.sleep(0.05)
    ports = json.loads(port_file.read_text())
    HTTP_PORTS[server.pid] = ports["http_port"]
    if workers:
        if workers == 1:
            targets = [(ports["grpc_port"], ports.get("urpc_port", 0))]
        else:
            targets = [(ports[f"worker_{k}_grpc_port"], ports.get(f"worker_{k}_urpc_port", 0)) for k in range(workers)]
        return server, ports["grpc_port"], ports.get("urpc_port", 0), targets
    return server, ports["grpc_port"], ports.get("urpc_port", 0)


def _base_label(name: str) -> str:
    """The [base] twin of a run's label (see ``--base-repo``)."""
    return name + " [base]"


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def scaling(opts: argparse.Namespace) -> int:
    """``--workers 1 2``: the same workload against hosts of N workers, interleaved over ``--rounds``;
    prints aggregate write MB/s, server and client CPU s/GB per N, medians over the rounds, and the
    ratios against N = 1 (or the first N given) of the same run."""
    env_extra = dict(kv.split("=", 1) for kv in opts.server_env)
    base_args = {"total_mib": opts.total_mib, "partitions": opts.partitions, "senders": opts.senders,
                 "request_bytes": opts.request_kib * 1024, "clients": opts.clients, "read_back": True,
                 "tree_cpu": True}
    work = Path(tempfile.mkdtemp(prefix="riffle-bench-"))
    results: dict[tuple[str, int], list[dict]] = {}
    ok = True
    try:
        print(f"N-worker scaling: {opts.total_mib} MiB, {opts.partitions} partitions, {opts.request_kib} KiB per "
              f"send, {opts.clients} client processes x {opts.senders} senders, host memory {opts.capacity}, "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}", flush=True)
        for rnd in range(opts.rounds):
            for transport in opts.transport:
                for n in opts.workers:
                    name = f"host-{transport}-{n}-{rnd}"
                    server, _, _, targets = start_server(work, name, opts.capacity, transport, env_extra, workers=n)
                    try:
                        r = run_clients(f"{n} worker(s) {transport}", server.pid, 0, 0, base_args,
                                        targets=[(g, u if transport == "urpc" else 0) for g, u in targets])
                    finally:
                        stop(server)
                    ok = ok and r["bad"] == 0
                    results.setdefault((transport, n), []).append(r)
                    shutil.rmtree(work / f"data-{name}", ignore_errors=True)
                    print(f"  done: {n} worker(s) {transport}, round {rnd + 1} (load {os.getloadavg()[0]:.2f}): "
                          f"{r['write_bytes'] / MIB / r['write_s']:.1f} MB/s", flush=True)

        def med(values: list[float]) -> float:
            return sorted(values)[len(values) // 2]

        print(f"{'transport':9} {'workers':>7} {'write MB/s':>10} {'x N=first':>9} {'CPU s/GB':>8} "
              f"{'client CPU s/GB':>15} {'read MB/s':>9} {'bad':>4}")
        for transport in opts.transport:
            first = None
            for n in opts.workers:
                rs = results[(transport, n)]
                mbps = med([r["write_bytes"] / MIB / r["write_s"] for r in rs])
                cpu = med([r["write_cpu_s"] / (r["write_bytes"] / GB) for r in rs])
                client = med([r["client_write_cpu_s"] / (r["write_bytes"] / GB) for r in rs])
                read = med([r["read_bytes"] / MIB / r["read_s"] for r in rs])
                first = first or mbps
                print(f"{transport:9} {n:7d} {mbps:10.1f} {mbps / first:9.2f} {cpu:8.2f} {client:15.2f} {read:9.1f} "
                      f"{sum(r['bad'] for r in rs):4d}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_riffle_ratios(rows: list[dict], transports: list[str]) -> None:
    """``--riffle-bin``: per transport, medians over the rounds of ours (the first variant) and Riffle's
    figures, and the ratios ours / Riffle."""
    def med(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    figures = {
        "write MB/s": lambda r: r["write_bytes"] / MIB / r["write_s"],
        "write CPU s/GB": lambda r: r["write_cpu_s"] / (r["write_bytes"] / GB),
        "server CPU ms/send": lambda r: r["write_cpu_s"] * 1e3 / max(1, len(r["send_lat"])),
        "requireBuffer refused/send": lambda r: r.get("refused", 0) / max(1, len(r["send_lat"])),
        "send p99 ms": lambda r: percentile(r["send_lat"], .99) * 1e3,
        "read MB/s": lambda r: r["read_bytes"] / MIB / r["read_s"],
        "read CPU s/GB": lambda r: r["read_cpu_s"] / (r["read_bytes"] / GB),
        "peak RSS MiB": lambda r: r["peak_rss"] / MIB,
    }
    print(f"ours / Riffle, medians over the rounds: {'figure':26} {'ours':>9} {'Riffle':>9} {'ratio':>6}")
    for transport in transports:
        ours = [r for r in rows if r.get("transport") == transport and r.get("variant") == 0]
        theirs = [r for r in rows if r.get("transport") == transport and r.get("variant") == "riffle"]
        if not ours or not theirs:
            continue
        for figure, f in figures.items():
            a, b = med([f(r) for r in ours]), med([f(r) for r in theirs])
            print(f"  {transport:5} {figure:26} {a:9.2f} {b:9.2f} {a / b if b else float('nan'):6.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--transport", nargs="+", choices=("grpc", "urpc"), default=["grpc", "urpc"])
    ap.add_argument("--clients", type=int, default=2, help="client processes (one saturates before the server)")
    ap.add_argument("--total-mib", type=int, default=1024, help="data written per run (over all clients)")
    ap.add_argument("--capacity", default="512M", help="server memory capacity")
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--senders", type=int, default=8, help="concurrent requireBuffer+send loops per client")
    ap.add_argument("--request-kib", type=int, default=1024, help="payload bytes per sendShuffleData")
    ap.add_argument("--server-env", nargs="*", default=[], help="NAME=VALUE for the riffle-server process")
    ap.add_argument("--no-baseline", action="store_true", help="skip the do-nothing servers")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME[:section.key=value,...]: a server config to compare (repeatable; runs interleave), "
                         "e.g. buffered:localfile_store.direct_io_append_enable=false")
    ap.add_argument("--read-local", action="store_true",
                    help="read back from local files: every server spills a partition buffer above 64K "
                         "(hybrid_store.memory_single_buffer_max_spill_size, unless a variant sets it) and the "
                         "read phase starts once no spill is in flight; prints the read CPU s/GB ratio of each "
                         "variant to the first one of its transport, per round")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every (transport, variant) run, interleaved")
    ap.add_argument("--base-repo", type=Path, default=None,
                    help="another checkout (e.g. the main branch): each variant also runs with its riffle-server, "
                         "interleaved, labelled [base], and the ratios this/base are printed")
    ap.add_argument("--riffle-bin", default=None,
                    help="a Riffle (Rust) riffle-server binary (not part of this project): each round also runs "
                         "the workload against it, interleaved, and the ratios ours/Riffle are printed")
    ap.add_argument("--workers", type=int, nargs="+", default=None, metavar="N",
                    help="the N-worker scaling curve instead of the variants: one host per N "
                         "(runtime_config.worker_number = N, memory --capacity in all), clients spread over its "
                         "workers; server CPU is the parent's and its workers', client CPU is printed too")
    opts = ap.parse_args()
    if opts.workers:
        return scaling(opts)
    variants = [(n, o, REPO) for n, o in ([parse_variant(v) for v in opts.variant] or [("", {})])]
    if opts.read_local:
        for _n, o, _r in variants:
            o.setdefault("hybrid_store", {}).setdefault("memory_single_buffer_max_spill_size", '"64K"')
    if opts.base_repo is not None:
        variants = [v for n, o, r in variants for v in ((n, o, r), (n + " [base]" if n else "[base]", o,
                                                                   opts.base_repo.resolve()))]
    env_extra = dict(kv.split("=", 1) for kv in opts.server_env)
    base_args = {"total_mib": opts.total_mib, "partitions": opts.partitions, "senders": opts.senders,
                 "request_bytes": opts.request_kib * 1024, "clients": opts.clients}
    work = Path(tempfile.mkdtemp(prefix="riffle-bench-"))
    rows = []
    ok = True
    try:
        print(f"workload: {opts.total_mib} MiB, {opts.partitions} partitions, 4-64 KiB blocks, "
              f"{opts.request_kib} KiB per send, {opts.clients} client processes x {opts.senders} senders; "
              f"server capacity {opts.capacity}; server env {env_extra or '-'}", flush=True)
        for transport, rnd in ((t, r) for r in range(opts.rounds) for t in opts.transport):
            if not opts.no_baseline:
                ctx = mp.get_context("spawn")
                q = ctx.Queue()
                null = ctx.Process(target=run_null_server, args=(transport, q), daemon=True)
                null.start()
                try:
                    port, uport = q.get(timeout=30)
                    rows.append(run_clients(f"do-nothing {transport}", null.pid, port, uport,
                                            {**base_args, "read_back": False}))
                finally:
                    null.terminate()
                    null.join(10)
            for vi, (vname, overrides, repo) in enumerate(variants):
                label = f"riffle-server {transport}" + (f" {vname}" if vname else "")
                name = f"riffle-{transport}-{rnd}-{vi}"
                server, port, uport = start_server(work, name, opts.capacity, transport, env_extra, overrides, repo)
                try:
                    r = run_clients(label, server.pid, port, uport if transport == "urpc" else 0,
                                    {**base_args, "read_back": True, "read_local": opts.read_local})
                    r.update(transport=transport, round=rnd, variant=vi)
                    rows.append(r)
                    ok = ok and r["bad"] == 0
                finally:
                    stop(server)
                shutil.rmtree(work / f"data-{name}", ignore_errors=True)
                print(f"  done: {label} (load {os.getloadavg()[0]:.2f})", flush=True)
            if opts.riffle_bin:
                name = f"rust-riffle-{transport}-{rnd}"
                riffle, coord = start_riffle(work, name, opts.riffle_bin, opts.capacity, transport)
                try:
                    r = run_clients(f"Riffle {transport}", riffle.proc.pid, riffle.grpc_port, riffle.urpc_port,
                                    {**base_args, "read_back": True})
                    r.update(transport=transport, round=rnd, variant="riffle")
                    rows.append(r)
                    ok = ok and r["bad"] == 0
                finally:
                    riffle.stop()
                    stop(coord)
                shutil.rmtree(work / f"data-{name}", ignore_errors=True)
                print(f"  done: Riffle {transport} (load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"{'server':30} {'write MB/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'CPU s/GB':>8} {'sys':>5} "
              f"{'ms/send':>7} {'refused':>7} | "
              f"{'read MB/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'CPU s/GB':>8} {'sys':>5}")
        for r in rows:
            w = r["write_bytes"] / MIB / r["write_s"]
            gb = r["write_bytes"] / GB
            line = (f"{r['name']:30} {w:10.1f} {percentile(r['send_lat'], .5) * 1e3:7.2f} "
                    f"{percentile(r['send_lat'], .99) * 1e3:7.2f} {r['write_cpu_s'] / gb:8.2f} "
                    f"{r['write_sys_s'] / gb:5.2f} {r['write_cpu_s'] * 1e3 / max(1, len(r['send_lat'])):7.3f} "
                    f"{r.get('refused', 0) / max(1, len(r['send_lat'])):7.3f} | ")
            if "read_bytes" in r:
                rgb = r["read_bytes"] / GB
                line += (f"{r['read_bytes'] / MIB / r['read_s']:9.1f} {percentile(r['read_lat'], .5) * 1e3:7.2f} "
                         f"{percentile(r['read_lat'], .99) * 1e3:7.2f} {r['read_cpu_s'] / rgb:8.2f} "
                         f"{r['read_sys_s'] / rgb:5.2f}")
            else:
                line += f"{'-':>9} {'-':>7} {'-':>7} {'-':>8} {'-':>5}"
            print(line)
        by = {r["name"]: r for r in rows}  # the last round of each
        if "riffle-server grpc" in by and "riffle-server urpc" in by:
            g, u = by["riffle-server grpc"], by["riffle-server urpc"]
            print(f"write MB/s urpc/grpc: {(u['write_bytes'] / u['write_s']) / (g['write_bytes'] / g['write_s']):.2f}")
        if opts.base_repo is not None:
            for r in rows:
                base = by.get(_base_label(r["name"]))
                if base is None or base is r or r["name"].endswith("[base]"):
                    continue
                ratio = (r["write_cpu_s"] / r["write_bytes"]) / (base["write_cpu_s"] / base["write_bytes"])
                speed = (r["write_bytes"] / r["write_s"]) / (base["write_bytes"] / base["write_s"])
                print(f"{r['name']} vs [base] (last round): write CPU/GB x{ratio:.2f}, write MB/s x{speed:.2f}")
        if opts.riffle_bin:
            print_riffle_ratios(rows, opts.transport)
        if opts.read_local:
            first = {(r["transport"], r["round"]): r for r in rows if r.get("variant") == 0}
            for r in rows:
                if r.get("variant", 0) == 0:
                    continue
                f = first[(r["transport"], r["round"])]
                ratio = (r["read_cpu_s"] / r["read_bytes"]) / (f["read_cpu_s"] / f["read_bytes"])
                speed = (r["read_bytes"] / r["read_s"]) / (f["read_bytes"] / f["read_s"])
                print(f"round {r['round']}: {r['name']} vs {f['name']}: read CPU/GB x{ratio:.2f}, "
                      f"read MB/s x{speed:.2f}")
        for r in rows:
            if "local_bytes" in r:
                print(f"{r['name']}: {r['local_bytes'] / max(1, r['read_bytes']):.1%} of the bytes read came from "
                      f"local files")
        for r in rows:
            if "bad" in r:
                print(f"{r['name']}: read back {r['read_bytes'] / MIB:.0f} MiB, bad or missing blocks: {r['bad']}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
