"""The report's runtime tables: a runtime's own counters and its routing, formatted only
(computed in :mod:`harness.analyze.runtime_tables`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.report import fmt
from harness.report.tables import key_name

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis


def runtime_context(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Rows for the counter and routing tables; None when the runtime recorded neither."""
    tables = analysis.runtime
    if not tables:
        return None
    counters = [
        {
            "name": key_name(analysis, row.cell, row.cache_state),
            "control": row.control,
            "figures": [fmt.count(row.values[name]) for name in tables.counter_names],
        }
        for row in tables.counters
    ]
    routing = [
        {
            "cell": cell.cell,
            "runs": cell.runs,
            "balanced": cell.balanced,
            "layers": [
                {
                    "layer": layer.layer,
                    "selections": fmt.count(layer.selections),
                    "top": " · ".join(f"e{e} {fmt.pct(s, 1)}" for e, s in layer.top),
                    "quarter": fmt.pct(layer.top_quarter_share, 1),
                }
                for layer in cell.layers
            ],
        }
        for cell in tables.routing
    ]
    return {"names": list(tables.counter_names), "counters": counters, "routing": routing}
