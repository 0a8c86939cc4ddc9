"""Trends of the results store: per campaign × cell × cache state × metric, with change points.

Computed here once; ``harness history`` prints them. A gated campaign's own trends, as of its
verdict, are written once to its ``analysis/history.json`` (:func:`record_campaign_trends`),
which the report draws and ``harness analyze --json`` returns: neither computes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.errors import HarnessError
from harness.formats.records import write_json_atomic
from harness.history.changes import change_points
from harness.history.store import history_dir, read_history

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

__all__ = ["TRENDS_FILE", "campaign_trends", "record_campaign_trends", "trend_metrics", "trends"]

TRENDS_FILE = "history.json"  # under the campaign's analysis/


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


def trend_metrics(analysis: CampaignAnalysis) -> list[str]:
    """The metrics a campaign's trends follow: its gated and regression-gated ones, else decode
    speed."""
    from harness.analyze.campaign import gated_metrics
    from harness.card import RegressionGate

    metrics = gated_metrics(analysis.card)
    metrics += [g.metric for g in analysis.card.gates if isinstance(g, RegressionGate)]
    return list(dict.fromkeys(metrics)) or ["decode_tok_s"]


def record_campaign_trends(analysis: CampaignAnalysis) -> Path:
    """Write ``analysis/history.json``: the campaign's trends from its store, as of now (after
    its own rows went in), or an ``error`` when the store cannot be read — an unreadable store
    must not cost the campaign its verdict or report. No store: an empty list."""
    root = analysis.campaign.root
    try:
        rows = campaign_trends(root, analysis.card.campaign, trend_metrics(analysis))
        payload: dict[str, Any] = {"trends": rows}
    except HarnessError as exc:
        payload = {"trends": [], "error": exc.message}
    path = root / "analysis" / TRENDS_FILE
    write_json_atomic(path, payload)
    return path
