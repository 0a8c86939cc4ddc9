"""Rows of a results table narrowed by the mapping's ``select`` and reduced to one value.

ds4-bench CSV, llama-bench JSON and the CUDA lane's knee JSON each hold several rows per file
(context sizes, tests, concurrency levels). ``select: {column: value}`` in the mapping keeps the
rows whose columns equal those values; a metric is then the geomean over the kept rows that
report it (the same reduction the harness applies across prompts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.importers.common import SourceBlock, geomean, number

__all__ = ["Selector", "add_metric", "select_rows"]

Selector = dict[str, str | int | float | bool]


def _equal(value: Any, wanted: str | int | float | bool) -> bool:
    if isinstance(wanted, bool) or isinstance(value, bool):
        return value is wanted or str(value).lower() == str(wanted).lower()
    if isinstance(wanted, int | float):
        try:
            return float(value) == float(wanted)
        except (TypeError, ValueError):
            return False
    return str(value) == wanted


def select_rows(
    rows: list[dict[str, Any]], select: Selector, path: Path, columns: set[str]
) -> list[dict[str, Any]]:
    """The rows matching every ``select`` entry; an unknown column or no match is an error."""
    unknown = sorted(set(select) - columns)
    if unknown:
        raise ResultFileError(
            f"{path}: select: {', '.join(unknown)}: no such field; the file has "
            f"{', '.join(sorted(columns))}"
        )
    kept = [r for r in rows if all(_equal(r.get(k), v) for k, v in select.items())]
    if not kept:
        wanted = ", ".join(f"{k}={v}" for k, v in select.items())
        raise ResultFileError(f"{path}: select: no row has {wanted}")
    return kept


def add_metric(
    block: SourceBlock,
    rows: list[dict[str, Any]],
    column: str,
    metric: str,
    *,
    where: str,
    include: Any = None,
) -> None:
    """Set ``metric`` to the geomean of ``column`` over the rows ``include`` accepts.

    A row without the column, or with an empty cell, gives nothing; one holding text where a
    number belongs is an error naming its row. ``where(i)`` names a row in messages.
    """
    block.wanted.setdefault(metric, column)
    values: list[float] = []
    for index, row in enumerate(rows):
        if include is not None and not include(row):
            continue
        raw = row.get(column)
        if raw is None or raw == "":
            continue
        if isinstance(raw, str):
            text = raw
            try:
                raw = float(text)
            except ValueError:
                raise ResultFileError(
                    f"{block.path}:{where}{index}: {column}: {text[:40]!r} is not a number"
                ) from None
        # A speed, a time or a size is positive: a zero or negative one is no measurement (the
        # geomean would skip it and decide on the rest). A hit rate may be 0, never below.
        positive = metric != "hit_rate"
        values.append(
            number(raw, f"{block.path}:{where}{index}: {column}", positive=positive,
                   non_negative=True)
        )  # fmt: skip
    value = geomean(values)
    if value is not None:
        block.metrics[metric] = value
        block.fields[metric] = column if len(values) == 1 else f"geomean of {column} over rows"
