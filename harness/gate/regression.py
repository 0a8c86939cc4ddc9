"""The ``regression`` gate: not worse than the last N promoted campaigns, or than a release.

Promoted = a campaign of the same card (campaign name) on the same box whose verdict passed, in
``reports/history`` (:mod:`harness.history.store`), this campaign's own directory left out. Per
cell and cache state, this campaign's run values of the metric are tested against the pooled
values the last N promoted campaigns stored, on the log scale, as a non-inferiority test: with
d = mean ln y_now − mean ln y_before, oriented so that positive is better, the gate passes when
the one-sided (1 − α) Welch lower bound of d lies above −Δ (Δ = ln(1 + margin)): the cell is
not worse by the card's margin. It fails closed: no store, no promoted campaign, fewer than two
values on a side, a run of the cell incomplete, or the metric not recorded.

With ``against: release`` the values before are those the store kept for one release marked in
it (:mod:`harness.history.releases`): the card's ``release``, else the one of this card on this
box marked last (this campaign itself left out). Builds that each pass against the one before
can still add up past the margin; against a fixed release they cannot. No release marked fails
closed; a ``release`` named on the card that is not marked is bad input (exit 2), naming the
card's line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.analyze.across import box_identity, welch_interval
from harness.analyze.campaign import CampaignAnalysis
from harness.card import RegressionGate
from harness.card.checks import Problems
from harness.catalog import METRICS
from harness.errors import CardError
from harness.formats.yamlfile import load_yaml
from harness.gate.result import GateResult, gate_name
from harness.history.releases import Release, read_releases
from harness.history.store import history_dir, read_history
from harness.stats.cycles import UNBOUNDED, finite, log_to_ratio, margin_log

__all__ = ["regression_gate"]


@dataclass(frozen=True)
class _Baseline:
    """The store's rows the gate compares with, and the release they are (None: promoted)."""

    rows: pd.DataFrame
    release: Release | None


def _store(analysis: CampaignAnalysis) -> tuple[Path, pd.DataFrame] | str:
    """The results store beside the campaign and its table, or why there is none."""
    root = analysis.campaign.root
    folder = history_dir(root)
    if folder is None:
        return (
            f"no results store: {root} is not under reports/<campaign>/<stamp>, so it has no "
            "history to compare with"
        )
    return folder, read_history(folder)


def _promoted(analysis: CampaignAnalysis, box: str) -> pd.DataFrame | str:
    """The store's rows of promoted campaigns of this card on this box, or why there are none."""
    store = _store(analysis)
    if isinstance(store, str):
        return store
    folder, table = store
    mine = str(analysis.campaign.root.resolve())
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


def _unknown_release(gate: RegressionGate, analysis: CampaignAnalysis, text: str) -> CardError:
    """Bad input: the card names a release the store does not hold; named at its line."""
    index = next(i for i, g in enumerate(analysis.card.gates) if g is gate)
    problems = Problems(load_yaml(analysis.campaign.card_path()))
    problems.add(("gates", index, "release"), text)
    return CardError(problems.lines[0], problems.lines)


def _release(gate: RegressionGate, analysis: CampaignAnalysis, box: str) -> _Baseline | str:
    """The stored rows of the release the gate is anchored to, or why there are none."""
    store = _store(analysis)
    if isinstance(store, str):
        return store
    folder, table = store
    campaign = analysis.card.campaign
    marks = [r for r in read_releases(folder) if r.campaign == campaign]
    here = [r for r in marks if r.box == box]
    how = "mark the promoted campaign of the released build: harness history release DIR --name"
    if gate.release is not None:
        named = [r for r in here if r.name == gate.release]
        if not named:
            known = ", ".join(f"{r.name} (box {r.box})" for r in marks) or "none"
            raise _unknown_release(
                gate,
                analysis,
                (
                    f"no release {gate.release!r} of {campaign!r} on box {box!r} in {folder} "
                    f"(marked: {known}); {how} {gate.release}, or name a marked one"
                ),
            )
        release = named[-1]
    else:
        # The campaign that is itself the newest release is held to the one before it.
        others = [r for r in here if r.dir != str(analysis.campaign.root.resolve())]
        if not others:
            return (
                f"no release of {campaign!r} on box {box!r} marked in {folder}: nothing to "
                f"anchor to, so the gate fails closed; {how} NAME"
            )
        release = others[-1]
    # The release's values as the store kept them when it was gated; whether a later gating
    # of it passed does not matter: the build shipped.
    rows = table[
        (table["dir"] == release.dir) & (table["campaign"] == campaign) & (table["box"] == box)
    ]
    if rows.empty:
        return (
            f"{release.text()}: its campaign's rows are no longer in the results store "
            f"{folder}, so there is nothing to compare with; gate it again (harness gate DIR) "
            "or mark another release"
        )
    return _Baseline(rows, release)


def _baseline(gate: RegressionGate, analysis: CampaignAnalysis, box: str) -> _Baseline | str:
    if gate.against == "release":
        return _release(gate, analysis, box)
    prior = _promoted(analysis, box)
    return prior if isinstance(prior, str) else _Baseline(prior, None)


def regression_gate(gate: RegressionGate, analysis: CampaignAnalysis) -> GateResult:
    """Evaluate one regression gate (fails closed; see the module docstring)."""
    name = gate_name(gate)
    card = analysis.card
    box, _ = box_identity(analysis)
    baseline = _baseline(gate, analysis, box)
    if isinstance(baseline, str):
        return GateResult(gate.kind, name, False, baseline)
    cells = list(gate.cells or (card.treatments if card.control else card.cells))
    runs = analysis.runs
    failures: list[str] = []
    passes: list[str] = []
    evidence: dict[str, object] = {}
    if baseline.release is not None:
        evidence["release"] = {k: getattr(baseline.release, k) for k in ("name", "stamp", "dir")}
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
            rows = baseline.rows
            rows = rows[
                (rows["cell"] == cell)
                & (rows["cache_state"] == state)
                & (rows["metric"] == gate.metric)
            ]
            if baseline.release is None:
                rows = rows.sort_values("finished_at").tail(gate.last)
            if rows.empty:
                failures.append(
                    f"{key}: no promoted campaign recorded {gate.metric} for it"
                    if baseline.release is None
                    else f"{key}: {baseline.release.text()} recorded no {gate.metric} for it"
                )
                continue
            before = [
                v for values in rows["block_values"] for v in (finite(x) for x in values)
                if v is not None and v > 0
            ]  # fmt: skip
            stamps = [str(s) for s in rows["stamp"]]
            label = (
                f"the last {len(stamps)} promoted ({', '.join(stamps)})"
                if baseline.release is None
                else baseline.release.text()
            )
            ok, text, found = _compare(gate, analysis, now, before, label)
            evidence[key] = {**found, "against": stamps}
            (passes if ok else failures).append(f"{key}: {text}")
    reason = "; ".join(failures or passes)
    return GateResult(
        gate.kind, name, not failures, reason, evidence, incomplete and bool(failures)
    )


def _compare(
    gate: RegressionGate,
    analysis: CampaignAnalysis,
    now: list[float],
    before: list[float],
    against: str,
) -> tuple[bool, str, dict[str, object]]:
    """One cell's non-inferiority test of ``now`` against ``before`` (named ``against``):
    whether it passed, its text and its evidence."""
    card = analysis.card
    sign = 1.0 if METRICS[gate.metric].higher_is_better else -1.0
    ln_now = [sign * math.log(v) for v in now]
    ln_before = [sign * math.log(v) for v in before]
    interval = welch_interval(ln_before, ln_now, 1 - 2 * card.analysis.alpha)
    ratio = log_to_ratio(sign * (sum(ln_now) / len(ln_now) - sum(ln_before) / len(ln_before)))
    evidence: dict[str, object] = {
        "ratio": finite(ratio),
        "values_now": len(now),
        "values_before": len(before),
    }
    if interval is None:
        return (
            False,
            (
                f"{len(now)} value(s) now, {len(before)} before: too few for an "
                "interval (two a side)"
            ),
            evidence,
        )
    worst = log_to_ratio(sign * interval[0])  # the plausible end nearest "worse"
    # verdict.json holds JSON numbers: a ratio past the largest float is null there.
    evidence["worst_plausible_ratio"] = finite(worst)
    text = f"{gate.metric} ratio {_ratio_text(ratio)} against {against}"
    if gate.against == "release":
        # The cumulative change since the release, with the interval the test reads.
        ends = sorted(log_to_ratio(sign * end) for end in interval)
        evidence["interval"] = [finite(end) for end in ends]
        level = 100 * (1 - 2 * card.analysis.alpha)
        text += (
            f": change {_pct_text(ratio)} ({level:g}% interval {_pct_text(ends[0])} to "
            f"{_pct_text(ends[1])})"
        )
    text += f", worst plausible {_ratio_text(worst)}"
    if interval[0] > -margin_log(card.analysis.margin_pct):
        return True, text, evidence
    return False, text + f": may be worse than the {card.analysis.margin_pct:g}% margin", evidence


def _pct_text(ratio: float) -> str:
    """A ratio as a signed percent change, two decimals; "∞" past the largest float."""
    return f"{100 * (ratio - 1):+.2f}%" if math.isfinite(ratio) else UNBOUNDED


def _ratio_text(ratio: float) -> str:
    """A ratio with three decimals; "∞" past the largest float (:func:`log_to_ratio`)."""
    return f"{ratio:.3f}" if math.isfinite(ratio) else UNBOUNDED
