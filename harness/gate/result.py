"""One gate's outcome, and the helpers every gate shares (:mod:`.evaluate` and the gates in
modules of their own: quality, soak and lockstep, regression)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.card import (
    BetterGate,
    CounterGate,
    ExactOutputsGate,
    Gate,
    QualityGate,
    RegressionGate,
    SoakGate,
    SurvivesGate,
    parse_fraction,
)

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

__all__ = [
    "GateResult",
    "gate_cells",
    "gate_name",
    "incomplete_of",
    "incomplete_runs",
    "listed",
    "required_count",
]


@dataclass
class GateResult:
    """One gate's outcome, with the reason and the evidence a reviewer needs."""

    kind: str
    name: str
    passed: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    # Failed only because runs it needs are missing or failed: resuming may settle it (exit 3),
    # where a failure on complete data is a verdict (exit 1).
    incomplete: bool = False
    # Failed only because a comparison it needs is inconclusive: not decided either way, and more
    # cycles may settle it. Still exit 1, but named "undecided", never "failed" (worse, missed).
    undecided: bool = False
    # "unconfirmed" (failed on this box; the card's confirm.box must show it before it stands),
    # "confirmed" or "not confirmed" (the second box's answer), or "" (no confirmation asked).
    confirmation: str = ""


def gate_name(gate: Gate) -> str:
    if isinstance(gate, BetterGate):
        return f"better {gate.metric}"
    if isinstance(gate, CounterGate):
        bounds = []
        if gate.min is not None:
            bounds.append(f">= {gate.min:g}")
        if gate.max is not None:
            bounds.append(f"<= {gate.max:g}")
        return f"counter {gate.counter} {' and '.join(bounds)}"
    if isinstance(gate, ExactOutputsGate):
        return f"exact outputs {gate.min_match}"
    if isinstance(gate, SurvivesGate):
        return f"survives {', '.join(gate.cache_states)}"
    if isinstance(gate, QualityGate):
        return f"quality {gate.min_pass}"
    if isinstance(gate, SoakGate):
        return f"soak {gate.min_duration_s:g} s"
    if isinstance(gate, RegressionGate) and gate.against == "release":
        return f"regression {gate.metric} vs release {gate.release or '(newest)'}"
    if isinstance(gate, RegressionGate):
        return f"regression {gate.metric} vs last {gate.last} promoted"
    return gate.kind


def gate_cells(gate: Gate, analysis: CampaignAnalysis, *, treatments_only: bool) -> list[str]:
    if gate.cells:
        return list(gate.cells)
    card = analysis.card
    return list(card.treatments if treatments_only and card.control else card.cells)


def incomplete_runs(runs: pd.DataFrame, cells: list[str]) -> list[str]:
    """Runs of the cells and of their comparisons (the control's blocks) that did not complete."""
    subset = runs[runs["cell"].isin(cells) | runs["comparison"].isin(cells)]
    return [f"{r.run_id} ({r.status})" for r in subset.itertuples() if r.status != "ok"]


def incomplete_of(runs: pd.DataFrame, cell: str) -> list[str]:
    """Runs of one cell that did not complete: outputs of a run that never finished are unknown,
    so the other runs' outputs cannot stand in for them."""
    subset = runs[runs["cell"] == cell]
    return [f"{r.run_id} ({r.status})" for r in subset.itertuples() if r.status != "ok"]


def listed(items: list[str], most: int = 5) -> str:
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


def required_count(fraction: str | int, n: int) -> int:
    if fraction == "all":
        return n
    k, of = parse_fraction(fraction)
    if of is None:
        return k
    return math.ceil(k / of * n - 1e-9)
