"""Trends of the results store: per campaign × cell × cache state × metric, with change points.

Computed here once; ``harness history`` prints them and the report draws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.history.changes import change_points
from harness.history.store import history_dir, read_history

__all__ = ["campaign_trends", "trends"]


def trends(table: pd.DataFrame, max_pvalue: float = 0.001) -> list[dict[str, Any]]:
    """One trend per campaign × cell × cache state × metric: its values and change points."""
    out: list[dict[str, Any]] = []
    keys = ["campaign", "cell", "cache_state", "metric"]
    for key, group in table.groupby(keys, sort=True):
        values = [float(v) for v in group["value"]]
        stamps = [str(s) for s in group["stamp"]]
        points = change_points(values, max_pvalue)
        out.append(
            {
                **dict(zip(keys, (str(k) for k in key), strict=True)),
                "stamps": stamps,
                "values": values,
                "labels": [None if pd.isna(v) else str(v) for v in group["label"]],
                "versions": [None if pd.isna(v) else str(v) for v in group["version"]],
                "change_points": [
                    {
                        "index": p.index,
                        "stamp": stamps[p.index],
                        "mean_before": p.mean_before,
                        "mean_after": p.mean_after,
                        "change_pct": p.change_pct,
                        "pvalue": p.pvalue,
                    }
                    for p in points
                ],
            }
        )
    return out


def campaign_trends(root: Path, campaign: str, metrics: list[str]) -> list[dict[str, Any]]:
    """The trends of ``campaign`` on ``metrics`` from the store beside ``root``, for the report:
    only those with two campaigns or more (one point is not a trend)."""
    folder = history_dir(root)
    if folder is None:
        return []
    table = read_history(folder)
    table = table[(table["campaign"] == campaign) & table["metric"].isin(metrics)]
    return [t for t in trends(table) if len(t["values"]) >= 2] if not table.empty else []
