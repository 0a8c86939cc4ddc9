"""The gates no card names: every campaign's runs must come from valid cohorts, every cell's
change must show on its boots, every boot's canaries must equal the control's, and every lossy
cell's outputs must stay within its margin (docs/design.md#canaries-and-equivalence). Each
returns None when it has nothing to say of a campaign."""

from __future__ import annotations

from collections.abc import Callable

from harness.analyze.campaign import CampaignAnalysis
from harness.gate.result import GateResult, listed


def _cohorts(analysis: CampaignAnalysis) -> GateResult | None:
    """Fails closed when a guard invalidated any cohort (its runs read ``invalid``)."""
    runs = analysis.runs
    if runs.empty or "status" not in runs.columns:
        return None
    invalid = runs[runs["status"] == "invalid"]
    if invalid.empty:
        return None
    reasons = sorted(set(invalid["reason"].astype(str)))
    return GateResult(
        "cohorts",
        "every cohort valid",
        False,
        f"{len(reasons)} cohort{'' if len(reasons) == 1 else 's'} invalid ({listed(reasons)}); "
        "an invalid cohort is not repaired by a retry: rerun the campaign once the box is fit",
        incomplete=True,
    )


def _canaries(analysis: CampaignAnalysis) -> GateResult | None:
    """Fails when any boot's canaries differ from the control's (its weights were wrong)."""
    check = analysis.canaries
    if check is None or not check.corrupt:
        return None
    cells = sorted({c.cell for c in check.corrupt})
    reasons = [text for cell in cells if (text := check.corrupt_text(cell))]
    evidence = {"corrupt": [{"cell": c.cell, "run_id": c.run_id} for c in check.corrupt]}
    return GateResult(
        "canaries", "every boot's canaries equal the control's", False, "; ".join(reasons), evidence
    )


def _engagement(analysis: CampaignAnalysis) -> GateResult | None:
    """Fails when any cell's change did not show on its boots: a card whose gates never ask
    about that cell (exact outputs, counters) must not pass on a change that never happened."""
    check = analysis.engagement
    failed = [] if check is None else [r for r in check.rows if not r.engaged]
    if check is None or not failed:
        return None
    cells = sorted({r.cell for r in failed})
    reasons = [f"{cell}: {text}" for cell in cells if (text := check.not_engaged_text(cell))]
    evidence = {
        "not_engaged": [
            {"cell": r.cell, "knob": r.knob, "signature": r.signature, "failed": list(r.failed)}
            for r in failed
        ]
    }
    return GateResult(
        "engagement", "every cell's change shows on its boots", False, "; ".join(reasons), evidence
    )


def _equivalence(analysis: CampaignAnalysis) -> GateResult | None:
    """A lossy cell's outputs within its margin of the control's (its second endpoint)."""
    rows = analysis.equivalence
    if not rows:
        return None
    short = [r for r in rows if r.verdict != "equivalent"]
    summary = "; ".join(f"{r.cell}: {r.verdict}, {r.words()}" for r in short or rows)
    evidence = {r.cell: {"verdict": r.verdict, "mean": r.mean, "ci95": r.ci95} for r in rows}
    return GateResult(
        "equivalence", "lossy cells' outputs within their margins", not short, summary, evidence
    )


IMPLICIT_GATES: tuple[Callable[[CampaignAnalysis], GateResult | None], ...] = (
    _cohorts,
    _engagement,
    _canaries,
    _equivalence,
)
