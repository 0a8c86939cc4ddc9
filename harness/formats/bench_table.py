"""Result tables of benchmark binaries (ds4-bench CSV, llama-bench CSV/JSON), mapped onto metrics.

A benchmark binary prints one row per test (a context frontier, a pp/tg test); which columns it
writes depends on its build (ds4-bench: 39 in the seed-004 build, other counts in others), so a
column is always found by its header name, never its position, and a mapped header the table
lacks is an error naming the headers it has. Values are numbers or text as written; a mapped
value that is not a number is an error too (never read as 0).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pandas as pd

from harness.errors import BadInput, RecordError
from harness.formats.textfile import parse_json

ResultFormat = Literal["csv", "json"]


def _csv_rows(text: str, where: str, error: type[BadInput]) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    rows: list[dict[str, Any]] = []
    try:
        if not reader.fieldnames:
            raise error(f"{where}: empty result, no CSV header line; check the command's output")
        for number, row in enumerate(reader, start=2):
            if None in row or any(value is None for value in row.values()):
                raise error(
                    f"{where}:{number}: {len(reader.fieldnames)} headers but a row of another "
                    "length; the file is truncated or not this binary's CSV"
                )
            rows.append(dict(row))
    except csv.Error as exc:  # a stray carriage return or NUL inside a row
        raise error(
            f"{where}:{reader.line_num + 1}: not CSV as the benchmark writes it ({exc}); the "
            "result file is damaged: regenerate it"
        ) from None
    return rows


def parse_result_rows(
    text: str, fmt: ResultFormat, where: str, error: type[BadInput] = RecordError
) -> list[dict[str, Any]]:
    """Rows of a CSV (header line first) or JSON (a list of objects, or JSON Lines) table.

    The one reader of these tables: a run's command output (a damaged one is a ``RecordError``)
    and ``harness import`` of a results file (``ResultFileError``) read them alike.
    """
    if fmt == "csv":
        return _csv_rows(text, where, error)
    stripped = text.strip()
    if not stripped:
        raise error(f"{where}: empty result, no JSON rows; check the command's output")
    if stripped.startswith("["):
        data = parse_json(stripped, where, error)
        items = data if isinstance(data, list) else None
    else:  # JSON Lines (llama-bench -o jsonl)
        items = [
            parse_json(line, f"{where}:{n}", error)
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
        items = [item for item in items if item is not None]
    if items is None or not all(isinstance(item, dict) for item in items):
        raise error(f"{where}: JSON result must be a list of objects (one per row)")
    return [dict(item) for item in items]


def _text(value: Any) -> str:
    # How a `where` filter compares: JSON's 0 and CSV's "0" are the same row.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip().strip('"')


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        out = float(str(value).strip().strip('"'))
    except ValueError:
        return None
    return out if math.isfinite(out) else None


def map_result_rows(
    rows: Sequence[Mapping[str, Any]],
    columns: Mapping[str, str],
    *,
    where: str,
    keep: Mapping[str, str | int | float | bool] | None = None,
    scale: Mapping[str, float] | None = None,
    tier: str | None = None,
) -> pd.DataFrame:
    """One row per kept result row: ``row`` (its index in the table) and one column per metric.

    ``columns`` maps metric -> header; ``keep`` keeps only rows whose header equals a value;
    ``scale`` multiplies a metric (GiB to bytes); ``tier`` names the header whose text labels
    the row's tier (a ``tier`` column: the context frontier of a ds4-bench row). Raises
    RecordError naming a missing header with the headers the table has, or a mapped cell that
    is not a number.
    """
    headers: list[str] = list(rows[0]) if rows else []
    needed = [*columns.values(), *(keep or {}), *([tier] if tier else [])]
    absent = [h for h in dict.fromkeys(needed) if not any(h in row for row in rows)]
    if absent or not rows:
        have = ", ".join(headers[:60]) or "none (no rows)"
        raise RecordError(
            f"{where}: no column {', '.join(absent) or '(no rows at all)'} in the result "
            f"(headers: {have}); fix the profile's driver.columns to this binary's header names"
        )
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if any(_text(row.get(h)) != _text(value) for h, value in (keep or {}).items()):
            continue
        mapped: dict[str, Any] = {"row": index}
        if tier is not None:
            mapped["tier"] = _text(row.get(tier))
        for metric, header in columns.items():
            value = _number(row.get(header))
            if value is None:
                raise RecordError(
                    f"{where}: row {index + 1}, column {header} ({metric}) is "
                    f"{row.get(header)!r}, not a number"
                )
            mapped[metric] = value * (scale or {}).get(metric, 1.0)
        out.append(mapped)
    if not out:
        raise RecordError(
            f"{where}: no row has {', '.join(f'{k}={v}' for k, v in (keep or {}).items())}; "
            "fix the profile's driver.where or the command's arguments"
        )
    return pd.DataFrame(out)
