"""The report's per-box table: each box's effect beside the pooled one, and the interaction
(computed in :mod:`harness.analyze.fleet`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.report import fmt
from harness.report.tables import key_name

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis


def fleet_context(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """One row per comparison: pooled ratio, each box's ratio [CI] (cycles), interaction p;
    None for a campaign on one box."""
    tables = analysis.fleet
    if tables is None or tables.boxes.empty:
        return None
    boxes = sorted({str(b) for b in tables.boxes["box"]})
    rows = []
    for row in tables.interactions.to_dict("records"):
        mine = tables.boxes[
            (tables.boxes["cell"] == row["cell"])
            & (tables.boxes["cache_state"] == row["cache_state"])
            & (tables.boxes["metric"] == row["metric"])
        ]
        per_box = {}
        for entry in mine.to_dict("records"):
            if pd.isna(entry["ratio"]):  # None in the analysis, NaN once in a frame
                text = "no cycles"
            else:
                interval = f"[{fmt.ratio3(entry['ci_low'])}, {fmt.ratio3(entry['ci_high'])}]"
                text = f"{fmt.ratio3(entry['ratio'])} {interval} ({entry['n_cycles']})"
            per_box[str(entry["box"])] = text
        p = row["p_interaction"]
        rows.append(
            {
                "name": f"{key_name(analysis, str(row['cell']), str(row['cache_state']))} vs "
                f"{row['vs']}",
                "metric": row["metric"],
                "pooled": fmt.ratio3(row["pooled_ratio"]),
                "boxes": [per_box.get(box, "—") for box in boxes],
                "p": "—" if pd.isna(p) else fmt.num(p),
                "flagged": bool(row["flagged"]),
                "note": str(row["note"] or ""),
            }
        )
    return {"boxes": boxes, "rows": rows}
