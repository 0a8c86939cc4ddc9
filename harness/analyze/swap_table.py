"""Swap cost per cell, as seed 000 §6 measured it: ms per applied swap and the ratio of a
swap-bearing step to the p95 of swap-free steps.

Each run's figures come from its ring (:func:`harness.analyze.ring_figures.swap_cost`: mean
swap-bearing step ÷ p95 swap-free step; (mean swap step − mean swap-free step) ÷ mean swaps per
swap step, in ms). A cell's figure is the median over its runs, with a 95% percentile bootstrap
interval over runs (seeded; none under 2 runs), so a reviewer sees how far boots disagree.
Computed once here; ``analyze --json``, ``analysis/swap_cost.parquet``, the report and
``record.md`` read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.cell_values import cell_keys, finite, jsonable
from harness.analyze.recovery_stats import CONFIDENCE, RESAMPLES
from harness.card import Card


@dataclass(frozen=True)
class SwapCost:
    """One (cell, cache state): swap cost over its runs; None where no run had both kinds."""

    cell: str
    cache_state: str
    control: bool
    runs: int  # runs with a swap cost (swap-bearing and swap-free steps both present)
    swap_steps: int  # swap-bearing steps over those runs
    ms_per_swap: float | None
    ms_per_swap_ci: tuple[float, float] | None
    ratio_to_free_p95: float | None
    ratio_ci: tuple[float, float] | None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return dict(jsonable(asdict(self)))


def median_interval(
    values: list[float], *, seed: int = 0, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the median over runs; None with fewer than 2 runs."""
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    data = np.asarray(values, dtype=np.float64)
    medians = np.median(data[rng.integers(0, data.size, size=(RESAMPLES, data.size))], axis=1)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(medians, [tail, 1 - tail])
    return float(lo), float(hi)


def _finite(values: Any) -> list[float]:
    return [v for v in (finite(x) for x in values) if v is not None]


def swap_cost_table(card: Card, runs: pd.DataFrame) -> list[SwapCost]:
    """Per (cell, cache state) swap cost over completed runs; empty when no run measured one."""
    if runs.empty or "swap_ms_per_swap" not in runs.columns:
        return []
    done = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    if not done["swap_ms_per_swap"].notna().any():
        return []
    out = []
    for cell, state in cell_keys(card):
        mine = done[(done["cell"] == cell) & (done["cache_state"] == state)]
        mine = mine[mine["swap_ms_per_swap"].notna()]
        ms = _finite(mine["swap_ms_per_swap"])
        ratio = _finite(mine["swap_cost_ratio"]) if "swap_cost_ratio" in mine else []
        steps = _finite(mine["swap_steps"]) if "swap_steps" in mine else []
        out.append(
            SwapCost(
                cell=cell,
                cache_state=state,
                control=cell == card.control,
                runs=len(ms),
                swap_steps=int(sum(steps)),
                ms_per_swap=float(np.median(ms)) if ms else None,
                ms_per_swap_ci=median_interval(ms, seed=card.design.seed),
                ratio_to_free_p95=float(np.median(ratio)) if ratio else None,
                ratio_ci=median_interval(ratio, seed=card.design.seed),
            )
        )
    return out


def swap_cost_frame(rows: list[SwapCost]) -> pd.DataFrame:
    """The table for ``analysis/swap_cost.parquet``, intervals as lo/hi columns."""
    records = []
    for r in rows:
        records.append(
            {
                "cell": r.cell,
                "cache_state": r.cache_state,
                "runs": r.runs,
                "swap_steps": r.swap_steps,
                "ms_per_swap": r.ms_per_swap,
                "ms_per_swap_lo": r.ms_per_swap_ci[0] if r.ms_per_swap_ci else None,
                "ms_per_swap_hi": r.ms_per_swap_ci[1] if r.ms_per_swap_ci else None,
                "ratio_to_free_p95": r.ratio_to_free_p95,
                "ratio_lo": r.ratio_ci[0] if r.ratio_ci else None,
                "ratio_hi": r.ratio_ci[1] if r.ratio_ci else None,
            }
        )
    return pd.DataFrame(records)


__all__ = ["SwapCost", "median_interval", "swap_cost_frame", "swap_cost_table"]
