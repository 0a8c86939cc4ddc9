"""Comparisons of each cell against the control, per cache state and metric.

A block (one arm in one slot; each of its repeats is its own boot) is summarised as
y = ln(metric), averaged over the block's repeats; requests are never pooled across boots. Cycles
come from the plan's mirrored sub-cycles; a cycle with a missing or failed run is dropped with a
warning rather than filled in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analyze.cycles import Cycle
from harness.analyze.stats import Comparison, apply_holm, compare_cycles
from harness.catalog import METRICS

# Metrics compared by default for every cell (gates may add others from the catalog).
DEFAULT_METRICS = (
    "decode_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "ttft_ms",
    "hit_rate",
    "expert_loads",
    "bytes_read",
)


@dataclass(frozen=True)
class CellComparison:
    """One comparison: a cell vs the control, in one cache state, on one metric."""

    cell: str
    vs: str
    cache_state: str
    comparison: Comparison
    dropped_cycles: tuple[str, ...]


def cell_cycles(
    runs: pd.DataFrame,
    prompt_logs: dict[str, np.ndarray],
    cell: str,
    state: str,
    metric: str,
) -> tuple[list[Cycle], list[str]]:
    """The complete cycles of one comparison on one metric, and why the others were dropped."""
    cycles: list[Cycle] = []
    dropped: list[str] = []
    subset = runs[(runs["comparison"] == cell) & (runs["cache_state"] == state)]
    for cycle, group in subset.groupby("cycle"):
        pattern = str(group["pattern"].iloc[0])
        blocks: list[float] = []
        logs: list[np.ndarray] = []
        missing = ""
        for slot in range(4):
            block = group[group["slot"] == slot]
            values = block[metric].to_numpy(dtype=float) if metric in block else np.array([])
            ok = block["status"].eq("ok").all() and len(block) > 0
            if not ok or not np.all(np.isfinite(values)) or np.any(values <= 0):
                missing = f"slot {slot}" + ("" if ok else " (failed or missing run)")
                break
            blocks.append(float(np.mean(np.log(values))))
            if metric == "decode_tok_s":
                logs.append(np.concatenate([prompt_logs[r] for r in block["run_id"]]))
        if missing:
            dropped.append(f"cycle {cycle}: {missing}")
            continue
        # Blocks without per-prompt values (an imported summary-only file) keep their means.
        aligned = len(logs) == 4 and len({len(x) for x in logs}) == 1 and len(logs[0]) > 0
        if aligned:
            # Replace block means by the prompt-level means so the two agree exactly.
            blocks = [float(np.mean(x)) for x in logs]
        cycles.append(
            Cycle(
                index=int(str(cycle)),
                order=pattern,
                y=(blocks[0], blocks[1], blocks[2], blocks[3]),
                prompt_logs=tuple(logs) if aligned else None,
                prompts_aligned=aligned,
            )
        )
    return cycles, dropped


def compare_cells(
    runs: pd.DataFrame,
    prompt_logs: dict[str, np.ndarray],
    *,
    control: str,
    cells: Sequence[str],
    cache_states: Sequence[str],
    metrics: Sequence[str],
    margin_pct: float,
    alpha: float,
    seed: int = 0,
    gated: Sequence[str] = (),
    remedy: str | None = None,
) -> list[CellComparison]:
    """Every cell × cache state × metric comparison.

    Holm's correction runs over the gate set: the metrics the card's gates decide on, per
    (cell, state). Other metrics are descriptive and keep their own labels; correcting the
    gated claims for every metric the report also shows would punish reporting more.
    """
    out: list[CellComparison] = []
    for cell in cells:
        for state in cache_states:
            family: list[tuple[Comparison, tuple[str, ...]]] = []
            for metric in metrics:
                if metric not in runs.columns or runs[metric].isna().all():
                    continue
                cycles, dropped = cell_cycles(runs, prompt_logs, cell, state, metric)
                if not cycles:
                    continue
                info = METRICS[metric]
                comparison = compare_cycles(
                    cycles,
                    metric=metric,
                    margin_pct=margin_pct,
                    alpha=alpha,
                    higher_is_better=info.higher_is_better,
                    seed=seed,
                    drift_sensitive=not info.deterministic,
                    remedy=remedy,
                )
                family.append((comparison, tuple(dropped)))
            in_gate_set = [c.metric in gated for c, _ in family]
            corrected = iter(
                apply_holm([c for (c, _), g in zip(family, in_gate_set, strict=True) if g])
            )
            for (comparison, skipped), g in zip(family, in_gate_set, strict=True):
                final = next(corrected) if g else comparison
                out.append(CellComparison(cell, control, state, final, skipped))
    return out


def comparison_rows(comparisons: Sequence[CellComparison]) -> list[dict[str, object]]:
    """Flat rows for the parquet table and ``--json``."""
    rows: list[dict[str, object]] = []
    for item in comparisons:
        c = item.comparison
        rows.append(
            {
                "cell": item.cell,
                "vs": item.vs,
                "cache_state": item.cache_state,
                "metric": c.metric,
                "ratio": _finite(c.ratio),
                "ci_low": _finite(c.ci_low),
                "ci_high": _finite(c.ci_high),
                "p_value": _finite(c.p_value),
                "p_adjusted": _finite(c.p_adjusted),
                "label": c.label,
                "raw_label": c.raw_label,
                "confounded": c.confounded,
                "n_cycles": c.n_cycles,
                "pair_ratio": _finite(c.pair_ratio),
                "bootstrap_low": _finite(c.bootstrap_ci[0]) if c.bootstrap_ci else None,
                "bootstrap_high": _finite(c.bootstrap_ci[1]) if c.bootstrap_ci else None,
                "cycles_needed": c.cycles_needed,
                "warnings": " | ".join(c.warnings + tuple(item.dropped_cycles)),
                "deterministic": METRICS[c.metric].deterministic,
            }
        )
    return rows


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)
