"""``riffle-ctl``: argument parsing and the commands (see ``docs/ctl.md``).

    riffle-ctl [--coordinator URL] query "SQL" [--format table|json|csv]
    riffle-ctl [--coordinator URL] instance list [--format ...]
    riffle-ctl [--coordinator URL] instance decommission|cancel-decommission [ID ...] [--pipeline]
    riffle-ctl [--coordinator URL] instance kill [ID ...] [--pipeline] [--coordinator-only]
    riffle-ctl [--coordinator URL] instance tag [ID ...] [--pipeline] [--add TAG ...] [--remove TAG ...]
    riffle-ctl disk-bench PATH|hdfs://NN:PORT/DIR [--hdfs] [--size 256M] [--block-size 1M] [--no-direct] [--format ...]
    riffle-ctl inspect INDEX [DATA] [--format ...]
    riffle-ctl config init server|coordinator [--output FILE] [--force]

Exit status: 0 done; 1 something failed (an id the coordinator refused, a corrupt block, an
unreachable coordinator); 2 a bad command line or a bad SQL statement.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
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
)

#: instance subcommand -> the status it sets (kill: DECOMMISSIONED, no new partitions until ACTIVE again)
STATUS_OF = {"decommission": "DECOMMISSIONING", "cancel-decommission": "ACTIVE", "kill": "DECOMMISSIONED"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="riffle-ctl", description="Operate a riffle cluster.")
    p.add_argument("--coordinator", metavar="URL",
                   help=f"the coordinator's HTTP API, e.g. http://host:21001 (default: ${ENV_COORDINATOR}, "
                        "else http://127.0.0.1:21001)")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("query", help="SQL over the tables instances, active_apps, historical_apps")
    q.add_argument("sql")
    q.add_argument("--format", choices=output.FORMATS, default="table")

    inst = sub.add_parser("instance", help="list or change shuffle servers").add_subparsers(
        dest="action", required=True)
    ls = inst.add_parser("list", help="every registered server")
    ls.add_argument("--format", choices=output.FORMATS, default="table")
    for action, what in (("decommission", "drain: no new partitions (DECOMMISSIONING)"),
                         ("cancel-decommission", "back to ACTIVE (clears decommission and kill)"),
                         ("kill", "stop the server process now (graceful, as SIGTERM) and mark it DECOMMISSIONED"),
                         ("tag", "add or remove operator tags")):
        a = inst.add_parser(action, help=what)
        a.add_argument("ids", nargs="*", metavar="ID", help="server ids (ip-grpcPort[-nettyPort])")
        a.add_argument("--pipeline", action="store_true",
                       help="read the ids from stdin: the JSON or CSV that 'query' printed (its id column)")
        if action == "kill":
            a.add_argument("--coordinator-only", action="store_true",
                           help="only mark DECOMMISSIONED at the coordinator; leave the process running")
        if action == "tag":
            a.add_argument("--add", action="append", default=[], metavar="TAG")
            a.add_argument("--remove", action="append", default=[], metavar="TAG")

    b = sub.add_parser("disk-bench", help="buffered and O_DIRECT write/read throughput of a directory, "
                                          "or append/read throughput of an HDFS directory")
    b.add_argument("path", help="a local directory, or an hdfs:// or viewfs:// URL of a directory")
    b.add_argument("--hdfs", action="store_true",
                   help="PATH is on HDFS (a bare path: the default file system of the Hadoop config)")
    b.add_argument("--size", default="256M", help="bytes per pass (default 256M)")
    b.add_argument("--block-size", default="1M", help="bytes per call, a multiple of 4096 (default 1M)")
    b.add_argument("--no-direct", action="store_true", help="skip the O_DIRECT passes")
    b.add_argument("--format", choices=output.FORMATS, default="table")

    i = sub.add_parser("inspect", help="decode an index file; with the data file, check every block's CRC")
    i.add_argument("index")
    i.add_argument("data", nargs="?")
    i.add_argument("--format", choices=output.FORMATS, default="table")

    c = sub.add_parser("config", help="configuration files").add_subparsers(dest="action", required=True)
    init = c.add_parser("init", help="write a commented starter config")
    init.add_argument("kind", choices=sorted(templates.TEMPLATES))
    init.add_argument("--output", "-o", metavar="FILE", help="file to write (default: stdout)")
    init.add_argument("--force", action="store_true", help="overwrite an existing FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "query":
            return cmd_query(args)
        if args.command == "instance":
            return cmd_instance(args)
        if args.command == "disk-bench":
            return cmd_disk_bench(args)
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


def _coordinator(args: argparse.Namespace) -> Coordinator:
    return Coordinator(coordinator_url(args.coordinator))


def _fetcher(coord: Coordinator):
    sources = {"instances": coord.servers, "active_apps": coord.apps, "historical_apps": coord.historical_apps}
    return lambda table: sources[table]()


def cmd_query(args: argparse.Namespace) -> int:
    try:
        names, rows = tables.run_query(args.sql, _fetcher(_coordinator(args)))
    except tables.QueryError as e:
        raise CtlError(f"bad query: {e}", code=2) from None
    output.render(names, rows, args.format)
    return 0


def cmd_instance(args: argparse.Namespace) -> int:
    coord = _coordinator(args)
    if args.action == "list":
        names, rows = tables.run_query("select id, status, ip, grpc_port, netty_port, http_port, tags, app_count, "
                                       "used_memory, available_memory, disk_count, unhealthy_disks, "
                                       "heartbeat_age_s from instances order by id", _fetcher(coord))
        output.render(names, rows, args.format)
        return 0
    ids = list(args.ids)
    if args.pipeline:
        try:
            ids += output.read_ids(sys.stdin.read())
        except ValueError as e:
            raise CtlError(f"--pipeline: {e}", code=2) from None
    if not ids:
        raise CtlError("no server id given (pass ids, or --pipeline with query output on stdin)"
                       if not args.pipeline else "--pipeline: stdin holds no server; nothing changed", code=0
                       if args.pipeline else 2)
    if args.action == "tag" and not (args.add or args.remove):
        raise CtlError("instance tag needs --add TAG or --remove TAG", code=2)
    failed = 0
    for sid in dict.fromkeys(ids):
        try:
            before = coord.server(sid)
            if args.action == "tag":
                after = coord.set_tags(sid, args.add, args.remove)
                print(f"{sid}: tags {','.join(before['tags']) or '-'} -> {','.join(after['tags']) or '-'}")
            elif args.action == "kill":
                failed += _kill(coord, sid, before, coordinator_only=args.coordinator_only)
            else:
                after = coord.set_status(sid, STATUS_OF[args.action])
                told = after.get("server_told")
                note = ""
                if told is not None:
                    note = f" (server: {told['message']})" if told["ok"] else f" (server not told: {told['message']})"
                print(f"{sid}: {before['status']} -> {after['status']}{note}")
                # the coordinator's change stands either way (no new partitions); a server that was not
                # told just does not stop by itself
                if told is not None and not told["ok"]:
                    print(f"{sid}: warning: changed at the coordinator only; the server itself was not told",
                          file=sys.stderr)
        except CtlError as e:
            if "cannot reach" in str(e):
                raise
            failed += 1
            print(f"{sid}: not changed: {e}", file=sys.stderr)
    if failed:
        print(f"{failed} of {len(set(ids))} server(s) not changed", file=sys.stderr)
    return 1 if failed else 0


def _kill(coord: Coordinator, sid: str, before: dict[str, Any], *, coordinator_only: bool) -> int:
    """Stop one server through its HTTP ``/admin/kill``, then mark it DECOMMISSIONED at the coordinator.

    Returns 1 when the server refused or could not be reached (an unreachable server is still marked
    at the coordinator: it may already be gone), 0 when done."""
    note, failed = "", 0
    if not coordinator_only:
        if not before.get("http_port"):
            raise CtlError("the coordinator knows no HTTP port of this server; use --coordinator-only")
        server = ServerHttp(before["ip"], int(before["http_port"]))
        try:
            answer = server.admin("kill")
            note = f" (server {server.url}: {answer.get('message')})"
        except ServerUnreachable as e:
            note, failed = f" (server not stopped: {e})", 1
        except HttpError as e:  # refused (401/403): the server keeps running, nothing is marked
            raise CtlError(f"server {server.url} refused the kill: {e}") from None
    after = coord.set_status(sid, STATUS_OF["kill"])
    print(f"{sid}: {before['status']} -> {after['status']}{note}")
    if failed:
        print(f"{sid}: marked DECOMMISSIONED at the coordinator only{note}", file=sys.stderr)
    return failed


def cmd_disk_bench(args: argparse.Namespace) -> int:
    try:
        size, block = parse_byte_size(args.size), parse_byte_size(args.block_size)
        if args.hdfs or bench.is_hdfs_url(args.path):
            results = bench.run_hdfs_bench(args.path, size=size, block_size=block, progress_file=sys.stderr)
        else:
            results = bench.run_bench(args.path, size=size, block_size=block, direct=not args.no_direct,
                                      progress_file=sys.stderr)
    except (ValueError, OSError) as e:
        raise CtlError(f"disk-bench: {e}", code=2 if isinstance(e, ValueError) else 1) from None
    rows = [r.as_row() for r in results]
    names = ["mode", "mb_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "blocks", "bytes", "seconds", "skipped"]
    output.render(names, [[row.get(n) for n in names] for row in rows], args.format)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        report = inspect_file.inspect(args.index, args.data)
    except OSError as e:
        raise CtlError(f"inspect: {e.filename or ''}: {e.strerror or e}") from None
    names = ["record", "offset", "length", "uncompress_length", "crc", "block_id", "task_attempt_id"]
    rows: list[list[Any]] = [[i, *e] for i, e in enumerate(report.entries)]
    if args.data is not None:
        names.append("check")
        for i, row in enumerate(rows):
            row.append(report.bad_blocks.get(i, "ok"))
    output.render(names, rows, args.format)
    out = sys.stdout if args.format == "table" else sys.stderr
    for problem in report.problems:
        print(f"problem: {problem}", file=out)
    for i, why in sorted(report.bad_blocks.items()):
        e = report.entries[i]
        print(f"corrupt: record {i} (blockId {e.block_id}, offset {e.offset}, length {e.length}): {why}", file=out)
    checked = "" if args.data is None else f", {len(report.entries) - len(report.bad_blocks)} blocks ok, " \
        f"{len(report.bad_blocks)} corrupt"
    print(f"{len(report.entries)} records{checked}", file=out)
    return 0 if report.ok else 1


def cmd_config(args: argparse.Namespace) -> int:
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
