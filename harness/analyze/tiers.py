"""Per-tier results of command-driver runs: one row per cell × cache state × tier.

A benchmark binary's rows often stand for tiers (ds4-bench: one row per context frontier, 128 to
32K tokens) that seed 004's rules report apart, never as one score: the run-level metric is a
geomean over rows (:func:`harness.analyze.metrics.bench_metrics`), and this table keeps each
tier's median over the cell's completed runs beside it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

TIER_KEYS = ["cell", "cache_state", "tier"]


def tier_table(frames: list[tuple[str, str, pd.DataFrame]]) -> pd.DataFrame:
    """(cell, cache state, bench.parquet) of each ok run → medians per tier, with run counts."""
    parts = []
    for cell, state, frame in frames:
        if "tier" not in frame.columns or frame.empty:
            continue
        part = frame.drop(columns=["row"], errors="ignore").copy()
        part["cell"], part["cache_state"] = cell, state
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=[*TIER_KEYS, "runs"])
    rows = pd.concat(parts, ignore_index=True)
    metrics = [c for c in rows.columns if c not in TIER_KEYS]
    out = []
    for key, group in rows.groupby(TIER_KEYS, sort=False):
        cell, state, tier = (str(part) for part in key)
        entry: dict[str, object] = {"cell": cell, "cache_state": state, "tier": tier}
        entry["runs"] = len(group)
        for metric in metrics:
            values = group[metric].to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            entry[metric] = float(np.median(values)) if values.size else math.nan
        out.append(entry)
    table = pd.DataFrame(out)
    # Tiers in numeric order where they are numbers (128 before 2048), else as written.
    cells = {cell: i for i, cell in enumerate(dict.fromkeys(table["cell"]))}
    keyed = table.assign(
        _cell=table["cell"].map(cells), _order=pd.to_numeric(table["tier"], errors="coerce")
    )
    keyed = keyed.sort_values(["_cell", "cache_state", "_order", "tier"], kind="stable")
    return keyed.drop(columns=["_cell", "_order"]).reset_index(drop=True)
