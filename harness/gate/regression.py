"""The ``regression`` gate: not worse than the last N promoted campaigns, from the history store.

Promoted = a campaign of the same card (campaign name) on the same box whose verdict passed, in
``reports/history`` (:mod:`harness.history.store`), this campaign's own directory left out. Per
cell and cache state, this campaign's run values of the metric are tested against the pooled
values the last N promoted campaigns stored, on the log scale, as a non-inferiority test: with
d = mean ln y_now − mean ln y_before, oriented so that positive is better, the gate passes when
the one-sided (1 − α) Welch lower bound of d lies above −Δ (Δ = ln(1 + margin)): the cell is
not worse by the card's margin. It fails closed: no store, no promoted campaign, fewer than two
values on a side, a run of the cell incomplete, or the metric not recorded.
"""

from __future__ import annotations

import math

import pandas as pd

from harness.analyze.across import box_identity, welch_interval
from harness.analyze.campaign import CampaignAnalysis
from harness.card import RegressionGate
from harness.catalog import METRICS
from harness.gate.result import GateResult
from harness.history.store import history_dir, read_history
from harness.stats.cycles import UNBOUNDED, finite, log_to_ratio, margin_log

__all__ = ["regression_gate"]


def _name(gate: RegressionGate) -> str:
    return f"regression {gate.metric} vs last {gate.last} promoted"


def _promoted(analysis: CampaignAnalysis, box: str) -> pd.DataFrame | str:
    """The store's rows of promoted campaigns of this card on this box, or why there are none."""
    root = analysis.campaign.root
    folder = history_dir(root)
    if folder is None:
        return (
            f"no results store: {root} is not under reports/<campaign>/<stamp>, so it has no "
            "history to compare with"
        )
    table = read_history(folder)
    mine = str(root.resolve())
    prior = table[
        (table["campaign"] == analysis.card.campaign)
        & (table["box"] == box)
        & table["passed"].astype(bool)
        & (table["dir"] != mine)
    ]
    if prior.empty:
        return (
            f"no promoted campaign of {analysis.card.campaign!r} on box {box!r} in {folder}: "
            "nothing to compare with, so the gate fails closed; promote a baseline first (a "
            "campaign of this card that passes its other gates)"
        )
    return prior


def regression_gate(gate: RegressionGate, analysis: CampaignAnalysis) -> GateResult:
    """Evaluate one regression gate (fails closed; see the module docstring)."""
    name = _name(gate)
    card = analysis.card
    box, _ = box_identity(analysis)
    prior = _promoted(analysis, box)
    if isinstance(prior, str):
        return GateResult(gate.kind, name, False, prior)
    info = METRICS[gate.metric]
    sign = 1.0 if info.higher_is_better else -1.0
    delta = margin_log(card.analysis.margin_pct)
    alpha = card.analysis.alpha
    cells = list(gate.cells or (card.treatments if card.control else card.cells))
    runs = analysis.runs
    failures: list[str] = []
    passes: list[str] = []
    evidence: dict[str, object] = {}
    incomplete = False
    for cell in cells:
        for state in card.design.cache_states:
            key = f"{cell}/{state}"
            mine = runs[(runs["cell"] == cell) & (runs["cache_state"] == state)]
            bad = [str(r) for r in mine[mine["status"] != "ok"]["run_id"]]
            if bad:
                incomplete = True
                failures.append(f"{key}: runs not complete ({', '.join(bad[:5])})")
                continue
            column = mine[gate.metric] if gate.metric in mine.columns else pd.Series([])
            now = [v for v in (finite(x) for x in column) if v is not None and v > 0]
            if len(now) < len(mine) or not now:
                failures.append(f"{key}: {gate.metric} not recorded by every run")
                continue
            rows = prior[
                (prior["cell"] == cell)
                & (prior["cache_state"] == state)
                & (prior["metric"] == gate.metric)
            ]
            rows = rows.sort_values("finished_at").tail(gate.last)
            if rows.empty:
                failures.append(f"{key}: no promoted campaign recorded {gate.metric} for it")
                continue
            before = [
                v for values in rows["block_values"] for v in (finite(x) for x in values)
                if v is not None and v > 0
            ]  # fmt: skip
            ln_now = [sign * math.log(v) for v in now]
            ln_before = [sign * math.log(v) for v in before]
            interval = welch_interval(ln_before, ln_now, 1 - 2 * alpha)
            stamps = [str(s) for s in rows["stamp"]]
            ratio = log_to_ratio(
                sign * (sum(ln_now) / len(ln_now) - sum(ln_before) / len(ln_before))
            )
            evidence[key] = {"ratio": finite(ratio), "against": stamps, "values_now": len(now),
                             "values_before": len(before)}  # fmt: skip
            if interval is None:
                failures.append(
                    f"{key}: {len(now)} value(s) now, {len(before)} before: too few for an "
                    "interval (two a side)"
                )
                continue
            worst = log_to_ratio(sign * interval[0])  # the plausible end nearest "worse"
            # verdict.json holds JSON numbers: a ratio past the largest float is null there.
            evidence[key]["worst_plausible_ratio"] = finite(worst)  # type: ignore[index]
            text = (
                f"{key}: {gate.metric} ratio {_ratio_text(ratio)} against the last "
                f"{len(stamps)} promoted ({', '.join(stamps)}), worst plausible "
                f"{_ratio_text(worst)}"
            )
            if interval[0] > -delta:
                passes.append(text)
            else:
                failures.append(
                    text + f": may be worse than the {card.analysis.margin_pct:g}% margin"
                )
    reason = "; ".join(failures or passes)
    return GateResult(
        gate.kind, name, not failures, reason, evidence, incomplete and bool(failures)
    )


def _ratio_text(ratio: float) -> str:
    """A ratio with three decimals; "∞" past the largest float (:func:`log_to_ratio`)."""
    return f"{ratio:.3f}" if math.isfinite(ratio) else UNBOUNDED
