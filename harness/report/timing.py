"""How the campaign ran against how it was planned: scale, the most runs the design may make, the
plan's duration estimate with its basis, and the runs' real durations beside it.

Read from ``plan.json`` (written by ``harness run``: ``scale``, ``max_runs``, ``estimated_run_s``,
``estimate_basis``; older plans lack some, and the report says so) and from each run's
``started_at``/``ended_at`` in the run table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from harness.report import fmt
from harness.stats.cycles import finite

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis


def run_timing(analysis: CampaignAnalysis) -> dict[str, Any]:
    """Scale, planned and maximum runs, the estimate and its basis, real run durations."""
    plan = analysis.campaign.plan()
    planned = len(plan.get("runs", []))
    scale = finite(plan.get("scale"))
    estimate_run = finite(plan.get("estimated_run_s"))
    durations: list[float] = []
    starts: list[float] = []
    ends: list[float] = []
    runs = analysis.runs
    if not runs.empty and {"started_at", "ended_at"} <= set(runs.columns):
        for start, end in zip(runs["started_at"], runs["ended_at"], strict=True):
            a, b = finite(start), finite(end)
            if a is not None and b is not None and b >= a:
                durations.append(b - a)
                starts.append(a)
                ends.append(b)
    median_run = float(np.median(durations)) if durations else None
    wall = max(ends) - min(starts) if durations else None
    ratio = median_run / estimate_run if median_run is not None and estimate_run else None
    return {
        "scale": 1.0 if scale is None else scale,
        "planned_runs": planned,
        "max_runs": plan.get("max_runs", planned),
        "estimated_run": fmt.seconds(estimate_run) if estimate_run is not None else None,
        "estimated_total": fmt.seconds(finite(plan.get("estimated_total_s"))),
        "estimate_basis": plan.get("estimate_basis") or "not recorded (a plan from before it was)",
        "timed_runs": len(durations),
        "median_run": fmt.seconds(median_run),
        "run_range": (
            f"{fmt.seconds(min(durations))} – {fmt.seconds(max(durations))}"
            if durations
            else fmt.MISSING
        ),
        "wall": fmt.seconds(wall),
        "real_vs_estimate": (
            f"{ratio:.2f}× the estimate" if ratio is not None else "no estimate per run to compare"
        ),
    }


__all__ = ["run_timing"]
