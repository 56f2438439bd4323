"""The SQL tables of ``riffle-ctl query``: the coordinator's listings loaded into an in-process DuckDB.

| table | from | one row per |
|---|---|---|
| ``instances`` | ``GET /api/servers`` | registered shuffle server |
| ``hosts`` | ``GET /api/servers``, grouped by IP | host (its worker servers together) |
| ``active_apps`` | ``GET /api/apps`` | live application |
| ``historical_apps`` | ``GET /api/historical_apps`` | expired application (newest first) |

Only the tables a statement names are fetched. Columns (``COLUMNS``; times are epoch milliseconds,
sizes bytes, lists comma-joined strings) are documented in ``docs/ctl.md``. A bad statement
raises ``QueryError`` whose message names the unknown table or column and lists what exists.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

# column name -> (DuckDB type, how to read it from the API's dict)
Getter = Callable[[dict[str, Any]], Any]


def _key(name: str) -> Getter:
    return lambda row: row.get(name)


def _joined(name: str) -> Getter:
    return lambda row: ",".join(row.get(name) or ())


def _disk_sum(field: str) -> Getter:
    return lambda row: sum(d.get(field, 0) for d in row.get("disks") or ())


INSTANCE_COLUMNS: dict[str, tuple[str, Getter]] = {
    "id": ("VARCHAR", _key("id")),
    "ip": ("VARCHAR", _key("ip")),
    "grpc_port": ("INTEGER", _key("grpc_port")),
    "netty_port": ("INTEGER", _key("netty_port")),
    "http_port": ("INTEGER", _key("http_port")),
    "status": ("VARCHAR", _key("status")),
    "reported_status": ("VARCHAR", _key("reported_status")),
    "operator_status": ("VARCHAR", _key("operator_status")),
    "excluded": ("BOOLEAN", _key("excluded")),
    "is_healthy": ("BOOLEAN", _key("is_healthy")),
    "tags": ("VARCHAR", _joined("tags")),
    "operator_tags": ("VARCHAR", _joined("operator_tags")),
    "used_memory": ("BIGINT", _key("used_memory")),
    "pre_allocated_memory": ("BIGINT", _key("pre_allocated_memory")),
    "available_memory": ("BIGINT", _key("available_memory")),
    "event_num_in_flush": ("BIGINT", _key("event_num_in_flush")),
    "assigned_partitions": ("BIGINT", _key("assigned_partitions")),
    "total_assigned_partitions": ("BIGINT", _key("total_assigned_partitions")),
    "app_count": ("INTEGER", _key("app_count")),
    # block integrity (docs/faults.md "Integrity"): found corrupt on disk, reads refused, refused at
    # ingest, resent intact
    "corrupt_blocks": ("BIGINT", _key("corrupt_blocks")),
    "corrupt_reads_refused": ("BIGINT", _key("corrupt_reads_refused")),
    "refused_blocks": ("BIGINT", _key("refused_blocks")),
    "repaired_blocks": ("BIGINT", _key("repaired_blocks")),
    "disk_count": ("INTEGER", lambda row: len(row.get("disks") or ())),
    "unhealthy_disks": ("INTEGER", lambda row: sum(1 for d in row.get("disks") or () if d.get("status") != "NORMAL")),
    "disk_capacity": ("BIGINT", _disk_sum("capacity")),
    "disk_used": ("BIGINT", _disk_sum("used_bytes")),
    "registered_ms": ("BIGINT", _key("registered_ms")),
    "last_heartbeat_ms": ("BIGINT", _key("last_heartbeat_ms")),
    "heartbeat_age_s": ("DOUBLE", _key("heartbeat_age_s")),
    "start_time_ms": ("BIGINT", _key("start_time_ms")),
    "version": ("VARCHAR", _key("version")),
    "git_commit_id": ("VARCHAR", _key("git_commit_id")),
    # Riffle's names (riffle-ctl/src/actions/query.rs TableInstance), so its queries run as written
    "urpc_port": ("INTEGER", _key("netty_port")),
    "total_memory": ("BIGINT", lambda row: (row.get("used_memory") or 0) + (row.get("available_memory") or 0)),
    "running_apps": ("INTEGER", _key("app_count")),
}

APP_COLUMNS: dict[str, tuple[str, Getter]] = {
    "app_id": ("VARCHAR", _key("app_id")),
    "user": ("VARCHAR", _key("user")),
    "version": ("VARCHAR", _key("version")),
    "git_commit_id": ("VARCHAR", _key("git_commit_id")),
    "registered_ms": ("BIGINT", _key("registered_ms")),
    "last_heartbeat_ms": ("BIGINT", _key("last_heartbeat_ms")),
    "shuffles": ("INTEGER", _key("shuffles")),
    "partitions": ("BIGINT", _key("partitions")),
    "servers": ("VARCHAR", _joined("servers")),
    "server_count": ("INTEGER", lambda row: len(row.get("servers") or ())),
    # Riffle's names of the same figures
    "registry_timestamp": ("BIGINT", _key("registered_ms")),
    "partition_number": ("BIGINT", _key("partitions")),
}

HISTORICAL_COLUMNS: dict[str, tuple[str, Getter]] = {**APP_COLUMNS, "expired_ms": ("BIGINT", _key("expired_ms"))}

HOST_COLUMNS: dict[str, tuple[str, Getter]] = {
    "ip": ("VARCHAR", _key("ip")),
    "workers": ("INTEGER", _key("workers")),
    "servers": ("VARCHAR", _joined("servers")),
    "grpc_ports": ("VARCHAR", lambda row: ",".join(str(p) for p in row.get("grpc_ports") or ())),
    "active": ("INTEGER", _key("active")),
    "healthy": ("INTEGER", _key("healthy")),
    "used_memory": ("BIGINT", _key("used_memory")),
    "available_memory": ("BIGINT", _key("available_memory")),
    "app_count": ("INTEGER", _key("app_count")),
    "assigned_partitions": ("BIGINT", _key("assigned_partitions")),
}


def host_rows(servers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``GET /api/servers`` grouped by IP: one row per host, whatever number of worker servers it runs
    (``runtime_config.worker_number``), its servers ordered by gRPC port."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for s in servers:
        hosts.setdefault(s.get("ip") or "", []).append(s)
    rows = []
    for ip in sorted(hosts):
        group = sorted(hosts[ip], key=lambda s: s.get("grpc_port") or 0)
        rows.append({
            "ip": ip, "workers": len(group), "servers": [s.get("id") for s in group],
            "grpc_ports": [s.get("grpc_port") for s in group],
            "active": sum(1 for s in group if s.get("status") == "ACTIVE"),
            "healthy": sum(1 for s in group if s.get("is_healthy")),
            **{k: sum(s.get(k) or 0 for s in group)
               for k in ("used_memory", "available_memory", "app_count", "assigned_partitions")},
        })
    return rows


COLUMNS: dict[str, dict[str, tuple[str, Getter]]] = {
    "instances": INSTANCE_COLUMNS,
    "active_apps": APP_COLUMNS,
    "historical_apps": HISTORICAL_COLUMNS,
    "hosts": HOST_COLUMNS,
}


class QueryError(Exception):
    """A statement DuckDB refused, explained with the tables and columns that exist."""


def referenced_tables(sql: str) -> list[str]:
    """Which of our tables a statement names (a word match; DuckDB decides the rest)."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql.lower()))
    return [t for t in COLUMNS if t in words]


def load(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[dict[str, Any]]) -> None:
    columns = COLUMNS[table]
    con.execute(f"CREATE TABLE {table} (" + ", ".join(f'"{c}" {t}' for c, (t, _) in columns.items()) + ")")
    if rows:
        con.executemany(f"INSERT INTO {table} VALUES (" + ", ".join("?" for _ in columns) + ")",
                        [[get(row) for _, get in columns.values()] for row in rows])


def run_query(sql: str, fetch: Callable[[str], Sequence[dict[str, Any]]]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` over the tables it names; ``fetch(table)`` returns the API rows of a table.

    Returns ``(column names, rows)``; raises ``QueryError``.
    """
    # no extension is fetched from the network behind the operator's back
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
    try:
        named = referenced_tables(sql)
        for table in named:
            load(con, table, fetch(table))
        try:
            cursor = con.execute(sql)
        except duckdb.Error as e:
            raise QueryError(explain(str(e), named)) from None
        if cursor.description is None:
            return [], []
        names = [d[0] for d in cursor.description]
        return names, cursor.fetchall()
    finally:
        con.close()


def explain(message: str, named: Sequence[str] = ()) -> str:
    """DuckDB's message plus what exists: the tables, or the columns of the tables ``named``."""
    first = message.strip().splitlines()[0]
    tables = ", ".join(COLUMNS)
    m = re.search(r'Table with name (\w+) does not exist', message)
    if m:
        return f"unknown table {m.group(1)!r}: the tables are {tables}"
    m = re.search(r'Referenced column "?([^"\s]+)"? not found', message) or \
        re.search(r'column "?([^"\s]+)"? (?:does not exist|not found)', message)
    if m:
        listing = "; ".join(f"{t}: {', '.join(COLUMNS[t])}" for t in (named or COLUMNS))
        return f"unknown column {m.group(1)!r}. Columns of {listing}"
    return f"{first} (tables: {tables}; see docs/ctl.md for their columns)"
