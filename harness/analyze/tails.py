"""Tail metrics judged from order-statistic bounds over pooled samples (docs/design.md#statistics).

A p95/p99 of one run is a point percentile; the paired comparison of those per run says
whether the cell moved the tail, not whether so few samples show where the tail lies. For a
gated tail metric the analysis also pools each arm's samples over the comparison's completed
runs (per-request TPOT for ``tpot_p*``, per-token gaps for ``itl_p99_ms``) and sets LoadGen's
early-stopping bounds side by side (:mod:`harness.stats.tails`); the gate calls a tail *better*
only where the cell's upper bound lies below the control's lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analyze.metrics import itl_ms, request_metrics
from harness.catalog import METRICS
from harness.stats.tails import CONFIDENCE, TailComparison, compare_tails, min_samples

# Tail metric → (the per-run sample it is a percentile of, the quantile).
TAIL_METRICS: dict[str, tuple[str, float]] = {
    "tpot_p95_ms": ("tpot_ms", 0.95),
    "tpot_p99_ms": ("tpot_ms", 0.99),
    "itl_p99_ms": ("itl_ms", 0.99),
}


def tail_samples(requests: pd.DataFrame, chunks: pd.DataFrame) -> dict[str, np.ndarray]:
    """A run's samples behind its tail metrics: the scored requests' TPOT and their gaps."""
    scored = request_metrics(requests)
    tpot = scored["tpot_ms"].to_numpy(dtype=float)
    return {"tpot_ms": tpot[np.isfinite(tpot)], "itl_ms": itl_ms(chunks, scored["request"])}


@dataclass(frozen=True)
class TailRow:
    """One cell's tail against the control's, in one cache state, on one tail metric."""

    cell: str
    vs: str
    cache_state: str
    metric: str
    comparison: TailComparison

    def words(self) -> str:
        """What the bounds show, with the metric's unit."""
        return self.comparison.words(METRICS[self.metric].unit)


def tail_table(
    runs: pd.DataFrame,
    samples: Mapping[str, Mapping[str, np.ndarray]],
    *,
    control: str,
    cells: Sequence[str],
    cache_states: Sequence[str],
    metrics: Sequence[str],
) -> list[TailRow]:
    """Every cell × cache state × tail metric: each arm's samples pooled over the comparison's
    completed runs (a run without samples adds none, so a short arm says how many it needs)."""
    rows: list[TailRow] = []
    if runs.empty or "comparison" not in runs.columns:
        return rows
    for metric in metrics:
        if metric not in TAIL_METRICS:
            continue
        source, quantile = TAIL_METRICS[metric]
        for cell in cells:
            for state in cache_states:
                subset = runs[
                    runs["comparison"].eq(cell)
                    & runs["cache_state"].eq(state)
                    & runs["status"].eq("ok")
                ]
                arms = [_pooled(subset, samples, arm, source) for arm in (control, cell)]
                comparison = compare_tails(
                    arms[0],
                    arms[1],
                    quantile,
                    confidence=CONFIDENCE,
                    higher_is_better=METRICS[metric].higher_is_better,
                )
                rows.append(TailRow(cell, control, state, metric, comparison))
    return rows


def _pooled(
    subset: pd.DataFrame, samples: Mapping[str, Mapping[str, np.ndarray]], arm: str, source: str
) -> np.ndarray:
    parts = [
        samples[str(run)][source]
        for run in subset.loc[subset["cell"].eq(arm), "run_id"]
        if str(run) in samples
    ]
    return np.concatenate(parts) if parts else np.array([], dtype=float)


def find_tail(rows: Sequence[TailRow], cell: str, state: str, metric: str) -> TailRow | None:
    """The row of one comparison, or None."""
    for row in rows:
        if (row.cell, row.cache_state, row.metric) == (cell, state, metric):
            return row
    return None


@dataclass(frozen=True)
class TailCheck:
    """What a gate's *better* on a tail metric reads: whether the bounds show it, why not."""

    shown: bool
    decided: bool  # a failure more samples cannot settle (the bounds show it worse, or none)
    text: str
    evidence: dict[str, object]
    short: bool = False  # an arm has too few samples for the bound: more requests are needed


def tail_check(rows: Sequence[TailRow], cell: str, state: str, metric: str) -> TailCheck | None:
    """The bounds' verdict on one gated comparison; None for a metric that is no tail."""
    if metric not in TAIL_METRICS:
        return None
    row = find_tail(rows, cell, state, metric)
    if row is None:
        # Fails closed: the analysis kept no samples for this comparison.
        text = f"no order-statistic bound on {metric} was computed (no pooled samples)"
        return TailCheck(False, True, text, {})
    c = row.comparison
    evidence = {k: v for k, v in tail_records([row])[0].items() if k not in _KEYS}
    return TailCheck(c.better, c.worse, row.words(), evidence, short=bool(c.short))


_KEYS = ("cell", "vs", "cache_state", "metric")


def tail_records(rows: Sequence[TailRow]) -> list[dict[str, object]]:
    """Flat rows for ``analysis/tails.parquet`` and ``--json``."""
    out: list[dict[str, object]] = []
    for row in rows:
        c = row.comparison
        out.append(
            {
                "cell": row.cell,
                "vs": row.vs,
                "cache_state": row.cache_state,
                "metric": row.metric,
                "quantile": c.quantile,
                "confidence": c.cell_upper.confidence,
                "cell_n": c.cell_upper.n,
                "control_n": c.control_upper.n,
                "cell_upper": c.cell_upper.value,
                "cell_lower": c.cell_lower.value,
                "control_upper": c.control_upper.value,
                "control_lower": c.control_lower.value,
                "upper_needs": c.cell_upper.needed,
                "lower_needs": c.cell_lower.needed,
                "better": c.better,
                "worse": c.worse,
                "verdict": row.words(),
            }
        )
    return out


# The report's and record.md's method sentence where a gate judges a tail metric.
TAIL_METHOD = (
    "A tail metric (p95/p99) a gate judges is better only when, besides its label, the "
    "samples pooled over each arm's runs (per-request TPOT; per-token gaps for ITL) show it: "
    f"the cell's upper bound below the control's lower bound, each at {CONFIDENCE:.0%} "
    "(MLPerf LoadGen's early-stopping estimate: the t-th largest sample, t the most samples "
    "over the percentile the count allows; the lower bound the same rule mirrored), so a "
    f"false better has chance at most {2 * (1 - CONFIDENCE):.0%}; p95 needs "
    f"{min_samples(0.95)} samples, p99 {min_samples(0.99)}, fewer is inconclusive. The pooled "
    "samples are taken as independent, as LoadGen takes its queries."
)
