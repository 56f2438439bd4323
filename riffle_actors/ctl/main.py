"""``riffle-ctl``: argument parsing and the commands, in Riffle's shapes (see ``docs/ctl.md``).

    riffle-ctl query [--coordinator URL|NAME] --sql SQL [--json | --format table|json|csv]
    riffle-ctl instance set    [--instance IP:HTTP_PORT] (--status STATE | --tags a1,a2) [--coordinator URL|NAME]
    riffle-ctl instance add    [--instance IP:HTTP_PORT] --tag TAG [--coordinator URL|NAME]
    riffle-ctl instance remove [--instance IP:HTTP_PORT] --tag TAG [--coordinator URL|NAME]
    riffle-ctl instance kill   [--instance IP:HTTP_PORT] [--force] [--interval-secs N --timeout-secs N]
                               [--coordinator URL|NAME]
    riffle-ctl bench disk append --dir D --batch-number N --concurrency C --write-size S
                                 [--disk-throughput T --throttle] [--direct]
    riffle-ctl bench disk read --dir D --read-size S --batch-number N --concurrency C [--read-ahead]
                               [--sleep-millis-per-batch MS] [--direct]
    riffle-ctl bench disk profile --dir D [--min-block-size 4KB --max-block-size 64MB --min-concurrency 1
                                  --max-concurrency 16 --test-duration-secs 10]
    riffle-ctl bench hdfs append --file-path hdfs://NN:PORT/FILE --total-size S --batch-size S
    riffle-ctl inspect file --index-file F [--data-file F]
    riffle-ctl config init --file CLUSTERS.toml
    riffle-ctl config template server|coordinator [--output FILE] [--force]

``instance ...`` without ``--instance`` reads the instances from stdin, JSON lines with ``ip`` and
``http_port`` (what ``query --json`` prints). Without ``--coordinator`` it talks to each server's
HTTP ``/admin`` (Riffle); with it, the change is the coordinator's override of that server (found
by ip and HTTP port): status ACTIVE / DECOMMISSIONING / DECOMMISSIONED and operator tags, which
stand even when the server cannot be reached.

Exit status: 0 done; 1 something failed (a refused or unreachable instance, a corrupt block, an
unreachable coordinator); 2 a bad command line or a bad SQL statement; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from riffle_actors.config import parse_byte_size
from riffle_actors.ctl import bench, inspect_file, output, tables, templates
from riffle_actors.ctl.api import (
    ENV_COORDINATOR,
    Coordinator,
    CtlError,
    HttpError,
    ServerHttp,
    ServerUnreachable,
    coordinator_url,
    init_clusters,
)

#: ``--status`` values: Riffle's ServerState names (``riffle-server/src/server_state_manager.rs``);
#: ``-`` or ``_``, any case
STATES = ("active", "decommissioning", "cancel-decommission", "decommissioned", "unhealthy", "healthy")
#: ``--status`` with ``--coordinator``: the coordinator's override it sets
COORDINATOR_STATUS = {"active": "ACTIVE", "healthy": "ACTIVE", "cancel-decommission": "ACTIVE",
                      "decommissioning": "DECOMMISSIONING", "decommissioned": "DECOMMISSIONED"}


def _state(value: str) -> str:
    v = value.strip().lower().replace("_", "-")
    if v not in STATES:
        raise argparse.ArgumentTypeError(f"invalid status {value!r}; one of: {', '.join(STATES)}")
    return v


def _size(value: str) -> int:
    try:
        return parse_byte_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _coordinator_arg(p: argparse.ArgumentParser, help_: str) -> None:
    p.add_argument("--coordinator", "-c", metavar="URL|NAME", help=help_)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="riffle-ctl", description="Riffle cluster ops, benchmarks and local data "
                                                               "inspection (Riffle's riffle-ctl command shapes).")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("query", help="SQL over the tables instances, hosts, active_apps, historical_apps")
    _coordinator_arg(q, f"coordinator HTTP URL, host:port or a cluster id of 'config init' "
                        f"(default: ${ENV_COORDINATOR}, else http://127.0.0.1:21001)")
    q.add_argument("--sql", "-s", required=True)
    q.add_argument("--json", action="store_true", help="JSON lines, one row a line (the same as --format json)")
    q.add_argument("--format", choices=output.FORMATS, default=None)

    inst = sub.add_parser("instance", help="change riffle-server instances (one, or JSON lines on stdin)")
    inst.add_argument("--instance", "-i", dest="instance_before", metavar="IP:HTTP_PORT",
                      help="the target, before or after the verb (as Riffle's)")
    inst_sub = inst.add_subparsers(dest="action", required=True)
    for action, what in (("set", "set the status or replace the tags"), ("add", "add a tag"),
                         ("remove", "remove a tag"), ("kill", "stop the server process")):
        a = inst_sub.add_parser(action, help=what)
        a.add_argument("--instance", "-i", metavar="IP:HTTP_PORT",
                       help="the target; omit it to read JSON lines with ip and http_port from stdin")
        _coordinator_arg(a, "change the coordinator's override of the instance instead of telling the server "
                            "(kill: stop the server, then mark it DECOMMISSIONED there)")
        if action == "set":
            g = a.add_mutually_exclusive_group(required=True)
            g.add_argument("--status", type=_state, metavar="STATE", help=", ".join(STATES))
            g.add_argument("--tags", metavar="a1,a2", help="replace the tags (built-in ones always stay)")
        elif action in ("add", "remove"):
            a.add_argument("--tag", required=True)
        else:
            a.add_argument("--force", "-f", action="store_true",
                           help="stop even while apps are registered (without it a server with apps refuses)")
            a.add_argument("--interval-secs", type=float, default=0.0,
                           help="then poll the state every N seconds until the server is DECOMMISSIONED or gone")
            a.add_argument("--timeout-secs", type=float, default=0.0, help="how long to poll (0: no polling)")

    b = sub.add_parser("bench", help="IO benchmarks and profilers").add_subparsers(dest="target", required=True)
    disk = b.add_parser("disk", help="local disk IO benchmarks").add_subparsers(dest="kind", required=True)
    ap = disk.add_parser("append", help="concurrent appends, optionally throttled")
    ap.add_argument("--dir", "-d", required=True)
    ap.add_argument("--batch-number", "-b", type=int, required=True)
    ap.add_argument("--concurrency", "-c", type=int, required=True)
    ap.add_argument("--write-size", "-w", type=_size, required=True)
    ap.add_argument("--disk-throughput", type=_size, default=None, help="the --throttle limit, bytes per second")
    ap.add_argument("--throttle", "-t", action="store_true")
    rd = disk.add_parser("read", help="concurrent reads of freshly written files")
    rd.add_argument("--dir", "-d", required=True)
    rd.add_argument("--read-size", "-r", type=_size, required=True)
    rd.add_argument("--batch-number", "-b", type=int, required=True)
    rd.add_argument("--concurrency", "-c", type=int, required=True)
    rd.add_argument("--read-ahead", action="store_true")
    rd.add_argument("--sleep-millis-per-batch", type=int, default=0)
    pf = disk.add_parser("profile", help="throughput across block sizes and concurrency")
    pf.add_argument("--dir", "-d", required=True)
    pf.add_argument("--min-block-size", type=_size, default=_size("4KB"))
    pf.add_argument("--max-block-size", type=_size, default=_size("64MB"))
    pf.add_argument("--min-concurrency", type=int, default=1)
    pf.add_argument("--max-concurrency", type=int, default=16)
    pf.add_argument("--test-duration-secs", type=float, default=10.0)
    for cmd in (ap, rd):
        cmd.add_argument("--direct", action="store_true", help="O_DIRECT (sizes: multiples of 4096)")
    hdfs = b.add_parser("hdfs", help="HDFS IO benchmarks").add_subparsers(dest="kind", required=True)
    ha = hdfs.add_parser("append", help="appends as the HDFS tier writes, then a read")
    ha.add_argument("--file-path", "-f", required=True, help="hdfs:// or viewfs:// URL of a new file")
    ha.add_argument("--total-size", "-t", type=_size, required=True)
    ha.add_argument("--batch-size", "-b", type=_size, required=True)
    for cmd in (ap, rd, pf, ha):
        cmd.add_argument("--format", choices=output.FORMATS, default="table")

    i = sub.add_parser("inspect", help="inspect local shuffle data").add_subparsers(dest="kind", required=True)
    f = i.add_parser("file", help="decode an index file; with the data file, check every block's CRC")
    f.add_argument("--index-file", "-i", required=True)
    f.add_argument("--data-file", "-d")
    f.add_argument("--format", choices=output.FORMATS, default="table")

    c = sub.add_parser("config", help="riffle-ctl's clusters, and starter configs").add_subparsers(
        dest="action", required=True)
    init = c.add_parser("init", help="set up the named clusters (cluster id -> coordinator URL) of --coordinator")
    init.add_argument("--file", "-f", required=True, help="TOML: [[clusters]] cluster_id, coordinator_url")
    tpl = c.add_parser("template", help="write a commented starter config of a daemon")
    tpl.add_argument("kind", choices=sorted(templates.TEMPLATES))
    tpl.add_argument("--output", "-o", metavar="FILE", help="file to write (default: stdout)")
    tpl.add_argument("--force", action="store_true", help="overwrite an existing FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "query":
            return cmd_query(args)
        if args.command == "instance":
            return cmd_instance(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        return cmd_config(args)
    except CtlError as e:
        print(f"riffle-ctl: {e}", file=sys.stderr)
        return e.code
    except BrokenPipeError:  # e.g. | head
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the commands clean up in their finally blocks
        print("riffle-ctl: interrupted", file=sys.stderr)
        return 130


def _fetcher(coord: Coordinator):
    sources = {"instances": coord.servers, "hosts": lambda: tables.host_rows(coord.servers()),
               "active_apps": coord.apps, "historical_apps": coord.historical_apps}
    return lambda table: sources[table]()


def cmd_query(args: argparse.Namespace) -> int:
    fmt = args.format or ("json" if args.json else "table")
    if args.json and fmt != "json":
        raise CtlError(f"--json and --format {fmt} disagree", code=2)
    try:
        names, rows = tables.run_query(args.sql, _fetcher(Coordinator(coordinator_url(args.coordinator))))
    except tables.QueryError as e:
        raise CtlError(f"bad query: {e}", code=2) from None
    output.render(names, rows, fmt)
    return 0


# ------------------------------------------------------------------------------------------ instance

def _targets(args: argparse.Namespace) -> list[dict[str, Any]]:
    args.instance = args.instance or args.instance_before
    if args.instance:
        ip, sep, port = args.instance.rpartition(":")
        if not sep or not ip or not port.isdigit() or not 0 < int(port) < 65536:
            raise CtlError(f"--instance {args.instance!r}: expected IP:HTTP_PORT, e.g. 192.168.1.1:19998", code=2)
        return [{"ip": ip.strip("[]"), "http_port": int(port), "id": None}]
    if sys.stdin is None or sys.stdin.isatty():
        raise CtlError("no instance given: pass --instance IP:HTTP_PORT or pipe JSON lines (query ... --json)",
                       code=2)
    try:
        return output.read_targets(sys.stdin.read(1 << 24))
    except ValueError as e:
        raise CtlError(f"stdin: {e}", code=2) from None


def _name(t: dict[str, Any]) -> str:
    return f"{t['ip']}:{t['http_port']}"


def cmd_instance(args: argparse.Namespace) -> int:
    targets = _targets(args)
    if not targets:
        print("riffle-ctl: stdin holds no instance; nothing changed", file=sys.stderr)
        return 0
    if args.action == "set" and args.tags is not None and not [t for t in args.tags.split(",") if t.strip()]:
        raise CtlError("--tags must not be empty", code=2)
    coord = Coordinator(coordinator_url(args.coordinator)) if args.coordinator else None
    if coord is not None and args.action == "set" and args.status == "unhealthy":
        raise CtlError("the coordinator has no UNHEALTHY override: drop --coordinator to tell the server itself, "
                       "or use --status decommissioning", code=2)
    if args.action == "kill" and args.interval_secs > 0 and args.timeout_secs > 0 and len(targets) > 1:
        raise CtlError("--interval-secs/--timeout-secs wait for one instance (--instance), not a pipeline", code=2)
    step: Callable[[dict[str, Any]], str]
    if coord is not None:
        by_addr = {(s.get("ip"), s.get("http_port")): s for s in coord.servers()}

        def step(t: dict[str, Any]) -> str:
            server = by_addr.get((t["ip"], t["http_port"]))
            if server is None and t.get("id"):
                server = next((s for s in by_addr.values() if s["id"] == t["id"]), None)
            if server is None:
                raise CtlError(f"the coordinator at {coord.url} lists no server with HTTP port {_name(t)}")
            return _coordinator_step(args, coord, server)
    else:
        def step(t: dict[str, Any]) -> str:
            return f"{_name(t)}: {_server_step(args, ServerHttp(t['ip'], t['http_port']))}"

    failed: list[str] = []
    for t in targets:
        try:
            print(step(t), flush=True)
        except CtlError as e:
            if coord is not None and "cannot reach the coordinator" in str(e):
                raise
            failed.append(_name(t))
            print(f"{_name(t)}: not changed: {e}", file=sys.stderr, flush=True)
    if len(targets) > 1 or failed:
        print(f"Total: {len(targets)}. Success: {len(targets) - len(failed)}. Failed: {len(failed)}",
              file=sys.stderr)
        if failed:
            print(f"Failed list: {failed}", file=sys.stderr)
    return 1 if failed else 0


def _server_step(args: argparse.Namespace, server: ServerHttp) -> str:
    """One instance through its own ``/admin`` (Riffle's query form)."""
    from urllib.parse import quote

    before = server.state()
    if args.action == "set" and args.status is not None:
        server.riffle("update_state=" + args.status.upper().replace("-", "_"))
        return f"{before.get('state')} -> {server.state().get('state')}"
    if args.action in ("set", "add", "remove"):
        if args.action == "set":
            query = "update_tags=" + quote(",".join(t.strip() for t in args.tags.split(",") if t.strip()), safe=",")
        else:
            query = ("add_tag=" if args.action == "add" else "delete_tag=") + quote(args.tag, safe="")
        server.riffle(query)
        return f"tags {','.join(before.get('tags') or []) or '-'} -> {','.join(server.state().get('tags') or []) or '-'}"
    return _kill(args, server, before)


def _kill(args: argparse.Namespace, server: ServerHttp, before: dict[str, Any]) -> str:
    try:
        answer = server.riffle("kill=force" if args.force else "kill")
    except HttpError as e:
        if e.status == 409:
            raise CtlError(f"{e} (pass --force to stop it with its apps)") from None
        raise
    if answer != "OK":
        raise CtlError(f"the server answered {answer[:200]!r}, not OK")
    note = f"{before.get('state')} -> stopping ({before.get('apps', 0)} app(s))"
    if args.interval_secs > 0 and args.timeout_secs > 0:
        deadline = time.monotonic() + args.timeout_secs
        while time.monotonic() < deadline:
            try:
                state = server.state().get("state")
            except ServerUnreachable:
                return note + "; the server is gone"
            if state == "DECOMMISSIONED":
                return note + "; DECOMMISSIONED"
            time.sleep(args.interval_secs)
        raise CtlError(f"{note}; still answering after {args.timeout_secs:g}s")
    return note


def _coordinator_step(args: argparse.Namespace, coord: Coordinator, server: dict[str, Any]) -> str:
    sid = server["id"]
    if args.action == "set" and args.status is not None:
        after = coord.set_status(sid, COORDINATOR_STATUS[args.status])
        told = after.get("server_told")
        if told is not None and not told["ok"]:  # the coordinator's change stands either way
            print(f"{sid}: warning: changed at the coordinator only; the server itself was not told",
                  file=sys.stderr)
        return f"{sid}: {server['status']} -> {after['status']}{_told(after)}"
    if args.action in ("set", "add", "remove"):
        if args.action == "set":
            want = {t.strip() for t in args.tags.split(",") if t.strip()}
            have = set(server.get("operator_tags") or ())
            add, remove = sorted(want - have), sorted(have - want)
        else:
            add, remove = ([args.tag], []) if args.action == "add" else ([], [args.tag])
        after = coord.set_tags(sid, add, remove)
        return f"{sid}: tags {','.join(server['tags']) or '-'} -> {','.join(after['tags']) or '-'}"
    # kill: stop the process through its /admin, then take it out at the coordinator
    http = ServerHttp(server["ip"], int(server["http_port"]))
    note = ""
    try:
        note = f" (server {http.url}: {_kill(args, http, http.state())})"
    except ServerUnreachable as e:
        note = f" (server not stopped: {e})"
    after = coord.set_status(sid, "DECOMMISSIONED")
    return f"{sid}: {server['status']} -> {after['status']}{note}"


def _told(after: dict[str, Any]) -> str:
    told = after.get("server_told")
    if told is None:
        return ""
    return f" (server: {told['message']})" if told["ok"] else f" (server not told: {told['message']})"


# ------------------------------------------------------------------------------------------ bench

def cmd_bench(args: argparse.Namespace) -> int:
    try:
        if args.target == "hdfs":
            results = bench.run_hdfs_bench(args.file_path, size=args.total_size, block_size=args.batch_size,
                                           progress_file=sys.stderr)
        elif args.kind == "append":
            results = bench.run_append(args.dir, concurrency=args.concurrency, batch_number=args.batch_number,
                                       write_size=args.write_size, disk_throughput=args.disk_throughput,
                                       throttle=args.throttle, direct=args.direct, progress_file=sys.stderr)
        elif args.kind == "read":
            results = bench.run_read(args.dir, concurrency=args.concurrency, batch_number=args.batch_number,
                                     read_size=args.read_size, read_ahead=args.read_ahead,
                                     sleep_millis_per_batch=args.sleep_millis_per_batch, direct=args.direct,
                                     progress_file=sys.stderr)
        else:
            results = bench.run_profile(args.dir, min_block_size=args.min_block_size,
                                        max_block_size=args.max_block_size, min_concurrency=args.min_concurrency,
                                        max_concurrency=args.max_concurrency,
                                        test_duration_s=args.test_duration_secs, progress_file=sys.stderr)
    except (ValueError, OSError) as e:
        raise CtlError(f"bench {args.target} {args.kind}: {e}", code=2 if isinstance(e, ValueError) else 1) from None
    rows = [r.as_row() for r in results]
    names = list(dict.fromkeys(k for row in rows for k in row))
    output.render(names, [[row.get(n) for n in names] for row in rows], args.format)
    return 0


# ------------------------------------------------------------------------------------------ inspect, config

def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        report = inspect_file.inspect(args.index_file, args.data_file)
    except OSError as e:
        raise CtlError(f"inspect: {e.filename or ''}: {e.strerror or e}") from None
    names = ["record", "offset", "length", "uncompress_length", "crc", "block_id", "task_attempt_id"]
    rows: list[list[Any]] = [[i, *e] for i, e in enumerate(report.entries)]
    if args.data_file is not None:
        names.append("check")
        for i, row in enumerate(rows):
            row.append(report.bad_blocks.get(i, "ok"))
    output.render(names, rows, args.format)
    out = sys.stdout if args.format == "table" else sys.stderr
    for problem in report.problems:
        print(f"problem: {problem}", file=out)
    for i, why in sorted(report.bad_blocks.items()):
        entry = report.entries[i]
        print(f"corrupt: record {i} (blockId {entry.block_id}, offset {entry.offset}, length {entry.length}): {why}",
              file=out)
    checked = "" if args.data_file is None else f", {len(report.entries) - len(report.bad_blocks)} blocks ok, " \
        f"{len(report.bad_blocks)} corrupt"
    print(f"{len(report.entries)} records{checked}", file=out)
    return 0 if report.ok else 1


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "init":
        meta, clusters = init_clusters(args.file)
        print(f"{len(clusters)} cluster(s) from {os.path.abspath(args.file)} (recorded in {meta}): "
              f"{', '.join(f'{k} -> {v}' for k, v in sorted(clusters.items())) or '-'}")
        return 0
    text = templates.TEMPLATES[args.kind]
    if args.output is None:
        sys.stdout.write(text)
        return 0
    if os.path.exists(args.output) and not args.force:
        raise CtlError(f"{args.output} exists; pass --force to overwrite it", code=2)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.output} (riffle-{args.kind} --config {args.output})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
