"""The report's per-box table: each box's effect beside the pooled one, and the interaction
(computed in :mod:`harness.analyze.fleet`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.report import fmt
from harness.report.tables import key_name

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis


def fleet_context(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """One row per comparison: pooled ratio, each box's ratio [CI] (cycles), interaction p;
    None for a campaign on one box."""
    tables = analysis.fleet
    if tables is None or not tables.interactions:
        return None
    boxes = tables.box_names
    rows = []
    for row in tables.interactions:
        per_box = {}
        for entry in row.boxes:
            if entry.ratio is None:
                text = "no cycles"
            else:
                interval = fmt.interval_text(entry.ci_low, entry.ci_high, "[—, —]")
                text = f"{fmt.ratio3(entry.ratio)} {interval} ({entry.n_cycles})"
            per_box[entry.box] = text
        p = row.p_interaction
        rows.append(
            {
                "name": f"{key_name(analysis, row.cell, row.cache_state)} vs {row.vs}",
                "metric": row.metric,
                "pooled": fmt.ratio3(row.pooled_ratio),
                "boxes": [per_box.get(box, "—") for box in boxes],
                "p": "—" if p is None else fmt.num(p),
                "flagged": row.flagged,
                "note": row.note,
            }
        )
    return {"boxes": boxes, "rows": rows}
