"""How ``riffle-ctl`` prints rows (``--format table|json|csv``) and reads them back (``--pipeline``).

``json`` is one JSON array of objects, ``csv`` has a header line; both are what ``instance ...
--pipeline`` reads on stdin (JSON lines, one object a line, are read too), taking the ``id``
column (``server_id`` also works). ``table`` is for people (rich), never parsed.
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
        out.write(json.dumps([dict(zip(names, row)) for row in rows], default=str) + "\n")
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


def read_ids(text: str) -> list[str]:
    """Server ids from what ``query`` printed (JSON array, JSON lines or CSV); raises ``ValueError``."""
    stripped = text.strip()
    if not stripped:
        return []
    records: list[Any]
    if stripped[0] in "[{":
        try:
            parsed = json.loads(stripped)
            records = parsed if isinstance(parsed, list) else [parsed]
        except json.JSONDecodeError:
            try:
                records = [json.loads(line) for line in stripped.splitlines() if line.strip()]
            except json.JSONDecodeError as e:
                raise ValueError(f"stdin is neither JSON nor JSON lines: {e}") from None
    else:
        records = list(csv.DictReader(io.StringIO(stripped)))
    ids = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"record {i} on stdin is not an object with an id")  # noqa: TRY004 - bad input
        value = record.get("id", record.get("server_id"))
        if value in (None, ""):
            raise ValueError(f"record {i} on stdin has no 'id' column (select id from instances ...); "
                             f"its columns: {sorted(record)}")
        ids.append(str(value))
    return list(dict.fromkeys(ids))
