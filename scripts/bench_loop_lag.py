#!/usr/bin/env python3
"""Event-loop stall benchmark: does one app's huge shuffle result hold up every other app's RPCs?

Starts ``riffle-server`` as a separate process on a temporary data dir, then two client processes:

- a **probe** app that sends ``appHeartbeat`` every ``--probe-interval-ms`` (10 ms) and records how
  long each answer took;
- a **heavy** app that, phase after phase: reports ``--tasks`` x ``--ids-per-task`` block ids (2M by
  default) the way Spark does, one ``reportShuffleResult`` per map task with ``--inflight`` of them in
  flight; asks ``getShuffleResultForMultiPart`` for every partition; reports the same ids again into
  a second shuffle in as few requests as the server's report caps allow; asks for that shuffle's result.

Each map task writes ``--ids-per-task`` blocks to consecutive partitions (wrapping at ``--partitions``),
with Spark's default block-id layout (21/20/22 bits). A baseline window without load comes first.

``--layout`` (comma-separated; each runs against a fresh server) picks adversarial id layouts
instead of the Spark workload above ("spark"); each is reported in as few
``reportShuffleResult`` as the server's caps allow (``--report-ids``, ``--report-partition-ids``: a hot
partition is filled by several reports), then one ``getShuffleResultForMultiPart`` over every partition:

- ``distinct-highs``: ``--ids`` ids in one partition, every id with a high 32-bit word of its own
  (one Roaring64 bucket per id: the layout a hot partition gets from Uniffle's block ids);
- ``equal-highs``: ``--ids`` ids in one partition, all in one high word (one dense bucket);
- ``huge-partition``: ``--ids`` ids in one partition, Spark block ids of 1000 map tasks;
- ``tiny-partitions``: ``--tiny-partitions`` partitions of ``--tiny-ids`` Spark block ids each.

The last lines give the worst lag per layout: the probe's heartbeat max and the server's gauge.

Prints, per phase: the probe's heartbeat latency (p50/p99/max), the worst event-loop lag the server
itself measured (its ``riffle_server_event_loop_lag_seconds`` gauge, read from ``/metrics`` every
``--scrape-ms``; "n/a" when the server has no such gauge) and the heavy RPCs' own durations.
A benchmark, not a test: nothing is asserted about timings; the exit code is 1 only when a shuffle
result misses ids.

    python scripts/bench_loop_lag.py [--tasks 1000] [--ids-per-task 2000] [--partitions 20000]
    python scripts/bench_loop_lag.py --layout distinct-highs,equal-highs,huge-partition,tiny-partitions

``--gc`` runs no server: in this process, it fills one shuffle's reported ids through
``AppState.report`` for each of ``--gc-partitions`` (200k and 1M) partitions of ``--gc-ids`` (5)
Spark block ids, in reports of at most ``--report-ids`` ids, once with the sets as they are stored
now (``BlockIdSetMap``) and once in the old shape (a dict of one GC-tracked ``BlockIdSet`` per
partition, as a baseline), and prints for each the worst full (generation-2) collection that ran
while reporting (``gc.callbacks``), the worst of 3 explicit ``gc.collect()`` afterwards, the
GC-tracked objects alive, and the old/new ratios.

    python scripts/bench_loop_lag.py --gc [--gc-partitions 200000,1000000]

Figures vary run to run on a shared 2-core box (the three processes share the cores).
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
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROBE_APP = "bench_probe_app"
HEAVY_APP = "bench_heavy_app"
GRPC_OPTS = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
LAG_METRIC = "riffle_server_event_loop_lag_seconds"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ----------------------------------------------------------------------------- probe client
def run_probe(port: int, interval_s: float, ready: mp.Event, stop: mp.Event, out: mp.Queue) -> None:
    """Heartbeat every ``interval_s`` until ``stop``; puts ``[(monotonic send time, latency s, status)]``."""
    import grpc
    import uvloop

    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    async def main() -> list[tuple[float, float, int]]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTS) as channel:
            stub = pbg.ShuffleServerStub(channel)
            await stub.registerShuffle(pb.ShuffleRegisterRequest(
                appId=PROBE_APP, shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)]))
            request = pb.AppHeartBeatRequest(appId=PROBE_APP)
            await stub.appHeartbeat(request)
            ready.set()
            samples = []
            next_at = time.monotonic()
            while not stop.is_set():
                sent = time.monotonic()
                resp = await stub.appHeartbeat(request)
                samples.append((sent, time.monotonic() - sent, resp.status))
                next_at = max(next_at + interval_s, time.monotonic())  # late answers are not made up for
                await asyncio.sleep(next_at - time.monotonic())
            return samples

    out.put(uvloop.run(main()))


# ----------------------------------------------------------------------------- heavy client
def block_ids_by_task(tasks: int, ids_per_task: int, partitions: int) -> list[dict[int, list[int]]]:
    """Per map task: partition -> block ids (Spark layout; task t starts at partition t * ids_per_task)."""
    from riffle_actors.protocol.blockid import SPARK_DEFAULT

    out = []
    for task in range(tasks):
        per_partition: dict[int, list[int]] = {}
        for k in range(ids_per_task):
            slot = task * ids_per_task + k
            partition, seq = slot % partitions, k // partitions  # a task wrapping around reuses seq + 1
            per_partition.setdefault(partition, []).append(SPARK_DEFAULT.get_block_id(seq, partition, task))
        out.append(per_partition)
    return out


def layout_block_ids(layout: str, args: dict) -> dict[int, list[int]]:
    """partition -> block ids of one adversarial layout (see the module docstring)."""
    import random

    from riffle_actors.protocol.blockid import SPARK_DEFAULT

    rng = random.Random(17)
    n = args["ids"]
    if layout == "distinct-highs":
        return {0: [(i << 32) | rng.randrange(1 << 32) for i in range(n)]}
    if layout == "equal-highs":
        return {0: [(5 << 32) | low for low in rng.sample(range(1 << 32), n)]}
    if layout == "huge-partition":
        tasks = 1000
        return {0: [SPARK_DEFAULT.get_block_id(k // tasks, 0, k % tasks) for k in range(n)]}
    if layout == "tiny-partitions":
        per = args["tiny_ids"]
        return {p: [SPARK_DEFAULT.get_block_id(seq, p, p % 1000) for seq in range(per)]
                for p in range(args["tiny_partitions"])}
    raise SystemExit(f"unknown layout {layout!r}")


def capped_reports(merged: dict[int, list[int]], args: dict) -> list[dict[int, list[int]]]:
    """``merged`` cut into reports of at most ``report_ids`` ids (a partition counts one at least) and
    ``report_partition_ids`` ids of one partition: the server's ``[app_config]`` report caps."""
    per_report, per_partition = args["report_ids"], args["report_partition_ids"]
    reports: list[dict[int, list[int]]] = [{}]
    room = per_report
    for p, ids in sorted(merged.items()):
        for i in range(0, max(len(ids), 1), per_partition):
            chunk = ids[i:i + per_partition]
            if max(len(chunk), 1) > room or p in reports[-1]:
                reports.append({})
                room = per_report
            reports[-1][p] = chunk
            room -= max(len(chunk), 1)
    return reports


def run_heavy(port: int, args: dict, out: mp.Queue) -> None:
    """The phases described in the module docstring; puts a list of phase records."""
    import grpc
    import uvloop

    from riffle_actors.protocol.bitmap import deserialize_block_ids
    from riffle_actors.protocol.proto import uniffle_pb2 as pb
    from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg

    layout = args["layout"]
    if layout == "spark":
        partitions = args["partitions"]
        by_task = block_ids_by_task(args["tasks"], args["ids_per_task"], partitions)
    else:
        by_task = [layout_block_ids(layout, args)]
        partitions = max(by_task[0]) + 1
    expected = sum(len(ids) for task in by_task for ids in task.values())

    def request(shuffle_id: int, task: int, per_partition: dict[int, list[int]]) -> pb.ReportShuffleResultRequest:
        return pb.ReportShuffleResultRequest(
            appId=HEAVY_APP, shuffleId=shuffle_id, taskAttemptId=task, bitmapNum=1,
            partitionToBlockIds=[pb.PartitionToBlockIds(partitionId=p, blockIds=ids)
                                 for p, ids in sorted(per_partition.items())])

    task_requests = ([request(0, task, per_partition) for task, per_partition in enumerate(by_task)]
                     if layout == "spark" else [])
    merged: dict[int, list[int]] = {}
    for per_partition in by_task:
        for p, ids in per_partition.items():
            merged.setdefault(p, []).extend(ids)
    # an adversarial layout is reported within the server's request caps: several reports
    layout_requests = [request(1, i, part) for i, part in enumerate(capped_reports(merged, args))]
    del by_task, merged

    async def main() -> list[dict]:
        phases: list[dict] = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTS) as channel:
            stub = pbg.ShuffleServerStub(channel)
            for shuffle_id in (0, 1):
                await stub.registerShuffle(pb.ShuffleRegisterRequest(
                    appId=HEAVY_APP, shuffleId=shuffle_id,
                    partitionRanges=[pb.ShufflePartitionRange(start=0, end=partitions - 1)]))

            async def timed(rpc, request) -> float:
                t0 = time.perf_counter()
                resp = await rpc(request)
                if resp.status != 0:
                    raise RuntimeError(f"{rpc} failed: {resp.status} {resp.retMsg}")
                return time.perf_counter() - t0

            async def get_all(shuffle_id: int, name: str) -> None:
                await asyncio.sleep(args["gap_s"])
                start = time.monotonic()
                t0 = time.perf_counter()
                layout = pb.BlockIdLayout(sequenceNoBits=21, partitionIdBits=20, taskAttemptIdBits=22)
                resp = await stub.getShuffleResultForMultiPart(pb.GetShuffleResultForMultiPartRequest(
                    appId=HEAVY_APP, shuffleId=shuffle_id, partitions=range(partitions), blockIdLayout=layout))
                took = time.perf_counter() - t0
                end = time.monotonic()
                got = len(deserialize_block_ids(resp.serializedBitmap)) if resp.status == 0 else -1
                phases.append({"name": name, "start": start, "end": end, "rpc": "get", "durations": [took],
                               "bitmap_bytes": len(resp.serializedBitmap), "ids": got, "expected": expected})

            # 1. one report per map task, several in flight (executors report as their tasks end)
            await asyncio.sleep(args["gap_s"])
            if not task_requests:  # an adversarial layout: its capped reports, one after the other
                start = time.monotonic()
                took = [await timed(stub.reportShuffleResult, r) for r in layout_requests]
                phases.append({"name": f"{layout}: {len(took)} reports", "start": start,
                               "end": time.monotonic(), "rpc": "report", "durations": took})
                await get_all(1, f"{layout}: get, all partitions")
                await asyncio.sleep(args["gap_s"])
                return phases
            sem = asyncio.Semaphore(args["inflight"])
            durations: list[float] = []

            async def report(request) -> None:
                async with sem:
                    durations.append(await timed(stub.reportShuffleResult, request))

            start = time.monotonic()
            await asyncio.gather(*(report(r) for r in task_requests))
            phases.append({"name": f"{len(task_requests)} task reports", "start": start,
                           "end": time.monotonic(), "rpc": "report", "durations": durations})
            await get_all(0, "get, all partitions")
            # 2. the same ids as one request
            await asyncio.sleep(args["gap_s"])
            start = time.monotonic()
            took = [await timed(stub.reportShuffleResult, r) for r in layout_requests]
            phases.append({"name": f"{len(took)} big reports", "start": start, "end": time.monotonic(),
                           "rpc": "report", "durations": took})
            await get_all(1, "get, all partitions")
            await asyncio.sleep(args["gap_s"])
        return phases

    out.put(uvloop.run(main()))


# ----------------------------------------------------------------------------- server
def start_server(work: Path, capacity: str, watchdog: Path | None = None,
                 ) -> tuple[subprocess.Popen, int, int]:
    cfg = work / "server.toml"
    cfg.write_text(f"""grpc_port = 0
http_port = 0
grpc_bind_address = "127.0.0.1"
http_bind_address = "127.0.0.1"
[memory_store]
capacity = "{capacity}"
[localfile_store]
data_paths = ["{work / 'data'}"]
[log]
path = "{work / 'server.log'}"
level = "WARNING"
""")
    port_file = work / "ports.json"
    if watchdog is None:
        launch = [sys.executable, "-m", "riffle_actors.server"]
        env = None
    else:  # the same server under scripts/loop_watchdog.py
        launch = [sys.executable, str(REPO / "scripts" / "loop_watchdog.py")]
        env = {**os.environ, "RIFFLE_WATCHDOG_OUT": str(watchdog)}
    server = subprocess.Popen(launch + ["--config", str(cfg), "--port-file", str(port_file)], cwd=REPO, env=env)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"server did not start; log: {work / 'server.log'}")
        time.sleep(0.05)
    time.sleep(0.05)  # the port file may be half written for an instant
    ports = json.loads(port_file.read_text())
    return server, ports["grpc_port"], ports["http_port"]


def scrape_lag(http_port: int) -> float | None:
    """The server's loop-lag gauge (max since the previous scrape), or None when it has none."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=60) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(LAG_METRIC + " "):
            return float(line.split()[1])
    return None


class LagTrace:
    """Scrapes of the gauge: each value covers the time since the scrape before it."""

    def __init__(self, http_port: int):
        self.http_port = http_port
        self.last = time.monotonic()
        self.spans: list[tuple[float, float, float | None]] = []
        scrape_lag(http_port)  # resets the server's maximum

    def scrape(self) -> None:
        value = scrape_lag(self.http_port)
        now = time.monotonic()
        self.spans.append((self.last, now, value))
        self.last = now

    def worst(self, start: float, end: float) -> float | None:
        values = [v for s, e, v in self.spans if s < end and e > start]
        if not values or any(v is None for v in values):
            return None
        return max(values)  # type: ignore[type-var]


# ----------------------------------------------------------------------------- --gc
class _OldShape(dict):
    """The reported sets as they were stored before ``BlockIdSetMap``: a dict of ``BlockIdSet``s."""

    def update_and_count(self, partition_id: int, block_ids) -> int:
        from riffle_actors.protocol.bitmap import BlockIdSet

        ids = self.get(partition_id)
        if ids is None:
            ids = self[partition_id] = BlockIdSet()
        return ids.update_and_count(block_ids)


def gc_pauses(partitions: int, ids_per_partition: int, report_ids: int, old_shape: bool) -> dict:
    """One shuffle's reports in this process; the collections they cost (see the module docstring)."""
    import gc

    from riffle_actors.protocol.blockid import SPARK_DEFAULT
    from riffle_actors.runtime import ManualClock
    from riffle_actors.state.app_state import AppLimits, AppState

    state = AppState("bench_gc_app", ManualClock(), 60.0, AppLimits(max_partitions=max(partitions, 1 << 20)))
    state.register_shuffle(0, [(0, partitions - 1)], False)
    if old_shape:
        state.shuffles[0].reported = _OldShape()
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    per_report = max(1, report_ids // ids_per_partition)
    gc.collect()
    gc.callbacks.append(on_gc)
    t0 = time.perf_counter()
    try:
        for first in range(0, partitions, per_report):
            report = ((p, [SPARK_DEFAULT.get_block_id(seq, p, p % 1000) for seq in range(ids_per_partition)])
                      for p in range(first, min(first + per_report, partitions)))
            state.report(0, report)
    finally:
        gc.callbacks.remove(on_gc)
    took = time.perf_counter() - t0
    explicit = []
    for _ in range(3):
        t1 = time.perf_counter()
        gc.collect()
        explicit.append(time.perf_counter() - t1)
    full = [ms for gen, ms in pauses if gen == 2]
    result = {"report_s": took, "full_collections": len(full), "worst_full": max(full, default=0.0),
              "worst_young": max((ms for gen, ms in pauses if gen < 2), default=0.0),
              "collect": max(explicit), "tracked": len(gc.get_objects()),
              "ids": sum(len(ids) for ids in state.shuffles[0].reported.values()) if old_shape
              else state.shuffles[0].reported.id_count()}
    del state
    gc.collect()
    return result


def run_gc_mode(opts: argparse.Namespace) -> int:
    print(f"reported ids and the cyclic GC: one shuffle, {opts.gc_ids} ids a partition, reports of at most "
          f"{opts.report_ids} ids; load {os.getloadavg()[0]:.1f}")
    print(f"{'partitions':>10} {'shape':22} {'report s':>8} {'full GCs':>8} {'worst full ms':>13} "
          f"{'worst young ms':>14} {'gc.collect ms':>13} {'tracked objs':>12}")
    ratios = []
    for partitions in (int(n) for n in opts.gc_partitions.split(",")):
        rows = {}
        for old_shape in (True, False):
            r = rows[old_shape] = gc_pauses(partitions, opts.gc_ids, opts.report_ids, old_shape)
            if r["ids"] != partitions * opts.gc_ids:
                raise SystemExit(f"{r['ids']} ids reported, {partitions * opts.gc_ids} expected")
            shape = "old: dict of BlockIdSet" if old_shape else "now: BlockIdSetMap"
            print(f"{partitions:>10} {shape:22} {r['report_s']:8.2f} {r['full_collections']:8d} "
                  f"{r['worst_full'] * 1000:13.1f} {r['worst_young'] * 1000:14.1f} {r['collect'] * 1000:13.1f} "
                  f"{r['tracked']:>12}")
        old, new = rows[True], rows[False]
        ratios.append(f"{partitions} partitions: gc.collect old/now {old['collect'] / new['collect']:.1f}x, worst "
                      f"full collection while reporting {old['worst_full'] * 1000:.1f} -> {new['worst_full'] * 1000:.1f}"
                      f" ms, tracked objects {old['tracked']} -> {new['tracked']}")
    for line in ratios:
        print(line)
    return 0


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="spark",
                    help="comma-separated: spark, distinct-highs, equal-highs, huge-partition, tiny-partitions")
    ap.add_argument("--tasks", type=int, default=1000, help="map tasks, one report each")
    ap.add_argument("--ids-per-task", type=int, default=2000, help="block ids per map task")
    ap.add_argument("--partitions", type=int, default=20000, help="reduce partitions")
    ap.add_argument("--ids", type=int, default=2_000_000, help="ids of the one-partition layouts")
    ap.add_argument("--tiny-partitions", type=int, default=200_000, help="partitions of tiny-partitions")
    ap.add_argument("--tiny-ids", type=int, default=10, help="ids per partition of tiny-partitions")
    ap.add_argument("--report-ids", type=int, default=1_000_000,
                    help="ids per report of a layout (the server's report_block_id_number_max_limit)")
    ap.add_argument("--report-partition-ids", type=int, default=200_000,
                    help="ids of one partition per report (report_partition_block_id_number_max_limit)")
    ap.add_argument("--watchdog", action="store_true",
                    help="run the server under scripts/loop_watchdog.py and print what held each stall > 50 ms")
    ap.add_argument("--inflight", type=int, default=8, help="task reports in flight at once")
    ap.add_argument("--probe-interval-ms", type=float, default=10.0)
    ap.add_argument("--baseline-s", type=float, default=3.0, help="probe-only window before the load")
    ap.add_argument("--scrape-ms", type=float, default=250.0, help="period of the /metrics scrapes")
    ap.add_argument("--capacity", default="256M", help="server memory capacity")
    ap.add_argument("--gc", action="store_true",
                    help="no server: the cyclic GC's pauses over reported ids, now and in the old shape")
    ap.add_argument("--gc-partitions", default="200000,1000000", help="--gc: reported partitions (comma list)")
    ap.add_argument("--gc-ids", type=int, default=5, help="--gc: block ids per partition")
    opts = ap.parse_args()
    if opts.gc:
        return run_gc_mode(opts)
    bad = 0
    summary = []
    for layout in opts.layout.split(","):
        failed, worst_probe, worst_lag, heavy = run_layout(opts, layout.strip())
        bad += failed
        summary.append((layout, worst_probe, worst_lag, heavy))
    print("worst lag per layout (probe heartbeat max under load / server loop-lag gauge max):")
    for layout, worst_probe, worst_lag, heavy in summary:
        lag_text = "n/a" if worst_lag is None else f"{worst_lag * 1000:.1f} ms"
        print(f"  {layout:16} probe max {worst_probe * 1000:7.1f} ms, loop lag {lag_text:>9}; {heavy}")
    return 1 if bad else 0


def run_layout(opts: argparse.Namespace, layout: str) -> tuple[int, float, float | None, str]:
    """One layout against a fresh server; prints its table. (missing-id count, probe max, lag max, RPC times)."""
    args = {"tasks": opts.tasks, "ids_per_task": opts.ids_per_task, "partitions": opts.partitions,
            "inflight": opts.inflight, "gap_s": 0.5, "layout": layout, "ids": opts.ids,
            "tiny_partitions": opts.tiny_partitions, "tiny_ids": opts.tiny_ids,
            "report_ids": opts.report_ids, "report_partition_ids": opts.report_partition_ids}

    work = Path(tempfile.mkdtemp(prefix="riffle-bench-lag-"))
    watchdog = work / "watchdog.jsonl" if opts.watchdog else None
    server, grpc_port, http_port = start_server(work, opts.capacity, watchdog)
    ctx = mp.get_context("spawn")
    probe_ready, probe_stop = ctx.Event(), ctx.Event()
    probe_q, heavy_q = ctx.Queue(), ctx.Queue()
    probe = ctx.Process(target=run_probe, daemon=True, args=(
        grpc_port, opts.probe_interval_ms / 1000, probe_ready, probe_stop, probe_q))
    heavy = None
    try:
        probe.start()
        if not probe_ready.wait(60):
            raise SystemExit("probe client did not start")
        trace = LagTrace(http_port)
        base_start = time.monotonic()
        while time.monotonic() - base_start < opts.baseline_s:
            time.sleep(opts.scrape_ms / 1000)
            trace.scrape()
        base_end = time.monotonic()
        heavy = ctx.Process(target=run_heavy, args=(grpc_port, args, heavy_q), daemon=True)
        heavy.start()
        phases = None
        while phases is None:
            time.sleep(opts.scrape_ms / 1000)
            trace.scrape()
            if not heavy_q.empty():
                phases = heavy_q.get()
            elif not heavy.is_alive():
                raise SystemExit(f"heavy client died (exit code {heavy.exitcode})")
        trace.scrape()
        probe_stop.set()
        samples = probe_q.get(timeout=60)
    finally:
        probe_stop.set()
        for proc in (probe, heavy):
            if proc is not None:
                proc.join(10)
                if proc.is_alive():
                    proc.terminate()
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        stalls = watchdog.read_text().splitlines() if watchdog is not None and watchdog.exists() else []
        shutil.rmtree(work, ignore_errors=True)
    for line in stalls:  # the watchdog's clock is this one (CLOCK_MONOTONIC): name the phase of each stall
        at = json.loads(line)["at"]
        where = next((row["name"] for row in [{"name": "baseline (no load)", "start": base_start, "end": base_end},
                                              *phases] if row["start"] <= at <= row["end"] + 0.05),
                     "outside the phases (start-up, gaps, shut-down)")
        print(f"stall in {where}: {line}")

    if layout == "spark":
        total = opts.tasks * opts.ids_per_task
        print(f"workload: {opts.tasks} map tasks x {opts.ids_per_task} block ids = {total} ids over "
              f"{opts.partitions} partitions; {opts.inflight} task reports in flight; probe: appHeartbeat every "
              f"{opts.probe_interval_ms:g} ms")
    else:
        print(f"workload: layout {layout}; probe: appHeartbeat every {opts.probe_interval_ms:g} ms")
    print(f"{'phase':30} {'secs':>6} {'probes':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'loop lag ms':>11}  heavy RPCs")
    failed = sum(1 for _, _, status in samples if status != 0)
    rows = [{"name": "baseline (no load)", "start": base_start, "end": base_end}] + phases
    load_latencies: list[float] = []
    bad = 0
    heavy_times = []
    worst_lag: float | None = 0.0
    for row in rows:
        lat = [lat for sent, lat, _ in samples if row["start"] <= sent < row["end"]]
        if row is not rows[0]:
            load_latencies += lat
        lag = trace.worst(row["start"], row["end"])
        if row is not rows[0]:
            worst_lag = None if lag is None or worst_lag is None else max(worst_lag, lag)
        lag_text = "n/a" if lag is None else f"{lag * 1000:.1f}"
        heavy_text = ""
        if "durations" in row:
            d = row["durations"]
            if len(d) == 1:
                heavy_text = f"{row['rpc']} {d[0] * 1000:.0f} ms"
                heavy_times.append(heavy_text)
            else:
                heavy_text = (f"{len(d)} x {row['rpc']}: p50 {percentile(d, 0.5) * 1000:.1f} ms, "
                              f"p99 {percentile(d, 0.99) * 1000:.1f} ms, max {max(d) * 1000:.1f} ms")
        if "ids" in row:
            heavy_text += f", {row['bitmap_bytes']} bytes, {row['ids']} of {row['expected']} ids"
            bad += row["ids"] != row["expected"]
        worst = max(lat, default=float("nan"))
        print(f"{row['name']:30} {row['end'] - row['start']:6.2f} {len(lat):6d} "
              f"{percentile(lat, 0.5) * 1000:8.2f} {percentile(lat, 0.99) * 1000:8.2f} {worst * 1000:8.2f} "
              f"{lag_text:>11}  {heavy_text}")
    print(f"probe under load: {len(load_latencies)} heartbeats, p50 {percentile(load_latencies, 0.5) * 1000:.2f} "
          f"ms, p99 {percentile(load_latencies, 0.99) * 1000:.2f} ms, max {max(load_latencies) * 1000:.2f} ms; "
          f"{failed} failed heartbeats")
    return bad, max(load_latencies, default=float("nan")), worst_lag, ", ".join(heavy_times)


if __name__ == "__main__":
    sys.exit(main())
