"""How the command line and the demo print: aligned tables, ``key  value`` lines and JSON.

Both ``fencepost.cli`` and ``fencepost.demo`` print through these, so the two share one look
without importing each other.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, TextIO


def iso(value: dt.datetime | None) -> str:
    """A time as ISO 8601 UTC with milliseconds (``2026-12-03T13:51:34.015Z``); ``-`` for None."""
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def plain(value: Any) -> Any:
    """Models to JSON-ready values (datetimes as ISO 8601 UTC strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dt.datetime):
        return iso(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    out: TextIO,
    *,
    widths: list[int] | None = None,
    header: bool = True,
) -> None:
    """Aligned columns; numbers right-aligned, everything else left. ``widths``, when given,
    are the columns' widths so far: widened in place to fit these rows, so a caller printing
    one table in parts (``events --follow``) keeps its columns lined up without repeating
    ``header``."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    wide = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if widths is not None:
        if not widths:
            widths.extend(wide)
        widths[:] = [max(a, b) for a, b in zip(widths, wide, strict=True)]
        wide = widths
    numeric = [all(isinstance(r[i], int) for r in rows) and rows for i in range(len(headers))]
    for row in cells if header else cells[1:]:
        parts = [
            c.rjust(w) if numeric[i] else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, wide, strict=True))
        ]
        out.write("  ".join(parts).rstrip() + "\n")


def write_json(value: Any, out: TextIO) -> None:
    """One indented JSON document (models and datetimes converted) and a newline."""
    json.dump(plain(value), out, indent=2)
    out.write("\n")


def key_values(pairs: Sequence[tuple[str, Any]], out: TextIO) -> None:
    """``key  value`` lines with the keys padded to one width (``-`` for None)."""
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        out.write(f"{key.ljust(width)}  {'-' if value is None else value}\n")
