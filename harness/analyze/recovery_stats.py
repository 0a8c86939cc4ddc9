"""T90 over runs: one definition for every table, figure and record that shows it.

A cell's T90 in one shift direction is summarised over its runs as follows (docs/design.md#t90):

- a run whose shift had no excess (peak ≤ converged, or no lookups) has no T90: it is counted
  apart as "n/a (no excess)" and left out of the median, the range and the ratio;
- among the other runs, "never" (did not recover within the phase) counts as infinitely slow, so
  the median is "never" when at least half never recovered, and the range's top reads "never";
- "vs control" is the ratio of the cell's median to the control's, with a percentile bootstrap
  interval over runs (each arm's runs resampled with replacement, seeded) widened by the
  windows' resolution (a T90 is known to one window either side); where a median is "never"
  the ratio has no finite value and the table says why instead.

Pure functions of the shift rows they are handed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.cell_values import finite

RESAMPLES = 2000
CONFIDENCE = 0.95


def shift_excess(shifts: pd.DataFrame) -> pd.Series[Any]:
    """Which shifts had an excess (records analysed before the column existed: those with T90)."""
    if "excess" in shifts.columns:
        return shifts["excess"].fillna(True).astype(bool)
    return pd.Series([True] * len(shifts), index=shifts.index)


def run_times(times: Iterable[Any], excess: Iterable[Any]) -> tuple[list[float], int]:
    """Measurable runs' times (inf = never) and how many runs had no excess (T90 n/a)."""
    out: list[float] = []
    no_excess = 0
    for value, had_excess in zip(times, excess, strict=True):
        if not bool(had_excess):
            no_excess += 1
            continue
        number = finite(value)
        out.append(math.inf if number is None else number)
    return out, no_excess


def median_never_slowest(times: Sequence[float]) -> float | None:
    """Median with "never" as inf (so inf when at least half never recovered); None if empty."""
    if not times:
        return None
    ordered = sorted(times)
    n = len(ordered)
    mid = ordered[(n - 1) // 2 : n // 2 + 1]  # one value, or the two middle ones
    return math.inf if any(math.isinf(v) for v in mid) else float(np.mean(mid))


def time_range(times: Sequence[float]) -> tuple[float, float] | None:
    """(fastest, slowest) over runs, slowest inf when any run never recovered; None if empty."""
    return (min(times), max(times)) if times else None


# The fewest measurable runs a side a T90 ratio is printed from: what its bootstrap interval
# needs. A median of one run beside another's is one pair of boots, not a finding (a ladder
# rung read "0.60x the control" from one run a side, the opposite of its seed's figure).
MIN_RATIO_RUNS = 2


def ratio_reason(
    cell: float | None, control: float | None, runs: tuple[int, int] = (MIN_RATIO_RUNS,) * 2
) -> str | None:
    """Why a T90 ratio to the control has no finite value, or None when it has one; ``runs``:
    the measurable runs (never included) of the cell and of the control."""
    if min(runs) < MIN_RATIO_RUNS and cell is not None and control is not None:
        return (
            f"{runs[0]} measurable run(s) beside the control's {runs[1]}: a ratio needs "
            f"{MIN_RATIO_RUNS} a side"
        )
    if cell is None or control is None:
        side = "cell" if cell is None else "control"
        return f"{side}: no measurable shift (no excess or no runs)"
    if math.isinf(cell) and math.isinf(control):
        return "both never recovered"
    if math.isinf(control):
        return "the control's median run never recovered; the cell's did"
    if math.isinf(cell):
        return "the cell's median run never recovered; the control's did"
    if control == 0:
        return "control recovered at once (0 s)"
    return None


def ratio_interval(
    cell: Sequence[float],
    control: Sequence[float],
    *,
    resolution_s: float = 0.0,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(cell) ÷ median(control), "never" as inf,
    widened by the times' resolution.

    Each replicate redraws both arms' runs with replacement. A replicate whose ratio is
    undefined (both medians never, or 0/0) is dropped; with more than half dropped, or fewer
    than 2 runs on a side, there is no interval (None). The bounds may be 0 (the control's
    median never in the replicate) or inf (the cell's). Quantiles are order statistics, with
    no interpolation across an infinite bound.

    A T90 is the start of the first window that enters and stays, so the crossing it stands
    for lies within ``resolution_s`` (one window) either side: each replicate's median is
    taken at its worst case — the cell's low and the control's high for the lower bound, and
    the other way round for the upper — so runs that all read the same window give an interval
    as wide as the windows leave the truth, not one of zero width.
    """
    if len(cell) < 2 or len(control) < 2:
        return None
    rng = np.random.default_rng(seed)
    a = np.asarray(cell, dtype=np.float64)
    b = np.asarray(control, dtype=np.float64)
    meds_a = _replicate_medians(a, rng, resamples)
    meds_b = _replicate_medians(b, rng, resamples)
    w = max(0.0, resolution_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.maximum(meds_a - w, 0.0) / (meds_b + w)
        high = (meds_a + w) / np.maximum(meds_b - w, 0.0)
    keep = ~(np.isnan(low) | np.isnan(high))
    if int(keep.sum()) * 2 < resamples:
        return None
    tail = (1 - confidence) / 2
    lo = np.quantile(low[keep], tail, method="inverted_cdf")
    hi = np.quantile(high[keep], 1 - tail, method="inverted_cdf")
    return float(lo), float(hi)


def _replicate_medians(values: np.ndarray[Any, Any], rng: np.random.Generator, n: int) -> Any:
    """Median of each of ``n`` resamples of ``values``, inf where the middle holds an inf."""
    draws = np.sort(values[rng.integers(0, values.size, size=(n, values.size))], axis=1)
    k = values.size
    low, high = draws[:, (k - 1) // 2], draws[:, k // 2]
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(high), math.inf, (low + high) / 2)


__all__ = [
    "CONFIDENCE",
    "median_never_slowest",
    "ratio_interval",
    "ratio_reason",
    "run_times",
    "time_range",
]
