"""Reading the cell table: finite numbers, medians, ratios and (cell, cache state) lookups.

The cell table (``analysis/cells.parquet``) holds one row per cell and cache state with each
metric's median over completed runs; the seed tables and the predictions read it through these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from harness.card import Card
from harness.stats.cycles import finite as finite  # one rule, shared with the report


def median_of(values: Iterable[Any]) -> float | None:
    """Median of the finite values, or None when there are none."""
    clean = [v for v in (finite(x) for x in values) if v is not None]
    return float(np.median(clean)) if clean else None


def ratio_of(control: float | None, cell: float | None) -> float | None:
    """cell ÷ control, or None when either is missing or the control is zero."""
    if control is None or cell is None or control == 0:
        return None
    return cell / control


def cell_keys(card: Card) -> list[tuple[str, str]]:
    """(cell, cache state) pairs in card order."""
    return [(cell, state) for cell in card.cells for state in card.design.cache_states]


def cell_value(cells: pd.DataFrame, cell: str, state: str, column: str) -> float | None:
    """One finite value of the cell table, or None."""
    if cells.empty or column not in cells.columns:
        return None
    hit = cells[(cells["cell"] == cell) & (cells["cache_state"] == state)]
    return None if hit.empty else finite(hit[column].iloc[0])


def jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as None, recursively through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
