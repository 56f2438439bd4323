"""How ``riffle-ctl`` prints rows (``--format table|json|csv``, ``--json``) and reads them back.

``json`` is JSON lines, one object a line (Riffle's ``query --json``); ``csv`` has a header line.
Both are what ``instance set|add|remove|kill`` reads on stdin when ``--instance`` is absent
(``read_targets``: each record needs ``ip`` and ``http_port``; a JSON array is read too).
``table`` is for people (rich), never parsed.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json", "csv")


def render(names: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        for row in rows:
            out.write(json.dumps(dict(zip(names, row)), default=str) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(["" if v is None else v for v in row] for row in rows)
    else:
        table = Table(show_lines=False, header_style="bold")
        for name in names:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        Console(file=out, width=None if out.isatty() else 200).print(table)
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


#: at most this many instances from stdin (a pipeline that names more is refused, not cut)
MAX_TARGETS = 10_000


def _records(text: str) -> list[Any]:
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "[{":
        try:
            parsed = json.loads(stripped)
            return parsed if isinstance(parsed, list) else [parsed]
        except json.JSONDecodeError:
            lines = [ln.strip().rstrip(",") for ln in stripped.splitlines()]
            try:
                return [json.loads(ln) for ln in lines if ln and ln not in ("[", "]")]
            except json.JSONDecodeError as e:
                raise ValueError(f"stdin is neither JSON lines nor JSON: {e}") from None
    return list(csv.DictReader(io.StringIO(stripped)))


def read_targets(text: str) -> list[dict[str, Any]]:
    """The instances of a pipeline (what ``query --json`` printed): dicts with ``ip``, ``http_port``
    (an int) and ``id`` when the line had one; duplicates dropped. Raises ``ValueError``."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    records = _records(text)
    if len(records) > MAX_TARGETS:
        raise ValueError(f"{len(records)} instances on stdin, at most {MAX_TARGETS}")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"line {i + 1} on stdin is not an object with ip and http_port")  # noqa: TRY004
        ip, port = record.get("ip"), record.get("http_port")
        try:
            port = int(port)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            port = None
        if not ip or port is None or not 0 < port < 65536:
            raise ValueError(f"line {i + 1} on stdin needs ip and http_port (select ip, http_port ... from "
                             f"instances); its columns: {sorted(record)}")
        out[(str(ip), port)] = {"ip": str(ip), "http_port": port, "id": record.get("id")}
    return list(out.values())
