"""A fleet's comparisons box by box, beside the pooled one, and the box × cell interaction.

A cohort runs on one box, so every cycle's paired difference Dⱼ is between runs of one machine;
the pooled comparison (:mod:`.compare`) takes them all. Here each box's cycles are compared on
their own with the same statistics, and the interaction asks whether the effect differs between
boxes: Welch's one-way analysis of variance of the cycles' Dⱼ grouped by box (Welch's t-test for
two boxes), H₀ the same effect on every box. Boxes differ in their noise, and the equal-variance
F test then rejects a true H₀ about twice as often as it should; Welch's does not assume equal
spreads. A change that helps
on one machine and not another is the finding, and the pooled interval does not show it.

It can only be tested where at least two boxes have two cycles or more; otherwise the row says
why and no flag is raised. A cycle whose runs ran on two boxes (a resume moved a dropped box's
unfinished cohort) belongs to neither box's row, nor to the pooled comparison of a fleet.

Welch's test needs three cycles a box: at two it rejected a true H₀ 7.6–10.3% of the time, its
df resting on one df a box. Where some box has only two (8 cycles dealt to 4 boxes) the boxes'
noise is pooled instead (one-way ANOVA; the pooled t for two boxes), which holds α where boxes of
a kind are equally noisy (4.8–5.2% simulated, up to 6.7% when one box is twice as noisy as
another: tests/execute/test_fleet.py). A deterministic metric has no spread within a box: p is
1 when the boxes agree and 0 when they do not. A gated metric with p < α is flagged
``box_interaction``.

What the pooled comparison claims is the card's ``analysis.boxes``. ``fixed`` (the default) is a
verdict about these boxes: D̄'s cycle-level interval, where the interaction is part of the effect
measured, and a ``better`` gate fails (decided, not undecided) where the interaction is flagged
and some box's own label is not *better* (a difference every box calls *better* is one of
size). ``random`` is a verdict about boxes like these
(:func:`harness.stats.effect.between_boxes`): it holds its level whatever the interaction but,
with two boxes, decides almost nothing. Tables: ``analysis/fleet_boxes.parquet`` and
``fleet_interactions.parquet``; ``analyze --json`` key ``fleet``, absent on one box.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.compare import CellComparison, cell_cycles, runs_before
from harness.catalog import METRICS
from harness.stats.decision import compare_cycles


def _scipy_stats() -> Any:
    """scipy.stats, imported when a fleet's boxes are compared (0.4 s a command that a campaign
    on one box does not pay)."""
    from scipy import stats

    return stats


# Fewest cycles a box needs for its Dⱼ to enter the interaction test: a variance needs two.
# Welch's test, which lets each box's noise differ, needs three: at two a box it rejects a true
# "same effect" in 7.6-10.3% of 2-box fleets at α = 5% (its df estimate rests on one df a
# box). Below that the boxes' noise is pooled (one-way ANOVA, the pooled t for two boxes),
# which holds its size where boxes of one kind are equally noisy, so the check runs at the
# default design's sizes (8 cycles dealt to 4 boxes is two a box).
MIN_CYCLES_PER_BOX = 2
WELCH_CYCLES_PER_BOX = 3


@dataclass(frozen=True)
class BoxEffect:
    """One comparison on one box alone: its cycles there and their ratio [CI] and label."""

    cell: str
    vs: str
    cache_state: str
    metric: str
    box: str
    n_cycles: int
    ratio: float | None  # None: no complete cycle on this box
    ci_low: float | None
    ci_high: float | None
    label: str  # "no cycles" where the box has none


@dataclass(frozen=True)
class Interaction:
    """One comparison across the fleet: the pooled ratio, the box × cell interaction's p (None
    where too few boxes have MIN_CYCLES_PER_BOX cycles: ``note`` says why) and each box's own."""

    cell: str
    vs: str
    cache_state: str
    metric: str
    pooled_ratio: float
    p_interaction: float | None
    flagged: bool
    note: str
    boxes: tuple[BoxEffect, ...]


@dataclass
class FleetTables:
    """One interaction row per comparison, each with its per-box effects."""

    interactions: list[Interaction]
    flags: list[dict[str, str]] = field(default_factory=list)

    @property
    def box_names(self) -> list[str]:
        """Every box that ran a comparison, sorted."""
        return sorted({b.box for i in self.interactions for b in i.boxes})

    def _frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        boxes = [asdict(b) for i in self.interactions for b in i.boxes]
        rows = [{k: v for k, v in asdict(i).items() if k != "boxes"} for i in self.interactions]
        return pd.DataFrame(boxes), pd.DataFrame(rows)

    def to_json(self) -> dict[str, Any]:
        """The ``fleet`` key of ``analyze --json``."""
        boxes, interactions = self._frames()
        return {
            "boxes": [_clean_row(r) for r in boxes.to_dict("records")],
            "interactions": [_clean_row(r) for r in interactions.to_dict("records")],
        }

    def frames(self) -> dict[str, pd.DataFrame]:
        """The parquet tables, by file stem."""
        boxes, interactions = self._frames()
        return {"fleet_boxes": boxes, "fleet_interactions": interactions}


def _clean_row(row: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, float | np.floating):
            value = float(value) if math.isfinite(value) else None
        elif isinstance(value, np.integer):
            value = int(value)
        elif isinstance(value, np.bool_):
            value = bool(value)
        out[str(key)] = value
    return out


def interaction_p(effects_by_box: Mapping[str, Sequence[float]]) -> float | None:
    """p of H₀ "the same effect on every box" from each box's cycle effects, or None when
    fewer than two boxes have :data:`MIN_CYCLES_PER_BOX` cycles."""
    groups = [np.asarray(v, dtype=float) for v in effects_by_box.values()]
    groups = [g for g in groups if len(g) >= MIN_CYCLES_PER_BOX]
    if len(groups) < 2:
        return None
    if all(float(np.ptp(g)) == 0.0 for g in groups):
        # Deterministic metrics: no spread within a box; any difference between boxes is real.
        means = {round(float(g.mean()), 12) for g in groups}
        return 1.0 if len(means) == 1 else 0.0
    if min(len(g) for g in groups) < WELCH_CYCLES_PER_BOX:
        p = float(_scipy_stats().f_oneway(*groups).pvalue)  # pooled within-box variance
    elif len(groups) == 2:
        p = float(_scipy_stats().ttest_ind(groups[0], groups[1], equal_var=False).pvalue)
    else:
        p = welch_anova_p(groups)
    return p if math.isfinite(p) else None


def welch_anova_p(groups: Sequence[np.ndarray]) -> float:
    """Welch's (1951) heteroscedastic one-way ANOVA: p of H₀ "all group means equal".

    wᵢ = nᵢ/sᵢ², x̄_w = Σwᵢx̄ᵢ/Σwᵢ, A = Σwᵢ(x̄ᵢ − x̄_w)²/(k − 1),
    Λ = Σ(1 − wᵢ/Σw)²/(nᵢ − 1), F = A / (1 + 2(k − 2)Λ/(k² − 1)) on (k − 1, (k² − 1)/(3Λ)) df.
    A group without spread gets the smallest positive variance of the others (its weight would
    be infinite); when none has spread the caller decides before this.
    """
    k = len(groups)
    n = np.asarray([len(g) for g in groups], dtype=float)
    means = np.asarray([float(np.mean(g)) for g in groups])
    var = np.asarray([float(np.var(g, ddof=1)) for g in groups])
    positive = var[var > 0]
    var = np.where(var > 0, var, positive.min() if positive.size else 1.0)
    w = n / var
    grand = float((w * means).sum() / w.sum())
    a = float((w * (means - grand) ** 2).sum()) / (k - 1)
    lam = float((((1 - w / w.sum()) ** 2) / (n - 1)).sum())
    f = a / (1 + 2 * (k - 2) * lam / (k * k - 1))
    return float(_scipy_stats().f.sf(f, k - 1, (k * k - 1) / (3 * lam)))


def fleet_tables(
    runs: pd.DataFrame,
    prompt_logs: dict[str, np.ndarray],
    comparisons: Sequence[CellComparison],
    *,
    margin_pct: float,
    alpha: float,
    seed: int,
    gated: Sequence[str],
) -> FleetTables | None:
    """Per-box rows for every pooled comparison, or None for a campaign on one box."""
    if "box" not in runs.columns:
        return None
    boxes = sorted(str(b) for b in runs["box"].dropna().unique())
    if len(boxes) < 2:
        return None
    interactions: list[Interaction] = []
    flags: list[dict[str, str]] = []
    before = runs_before(runs)
    for item in comparisons:
        c = item.comparison
        info = METRICS[c.metric]
        effects: dict[str, list[float]] = {}
        own_rows: list[BoxEffect] = []
        for box in boxes:
            mine = _cycles_on(runs, box, item.cell, item.cache_state)
            cycles, _ = cell_cycles(
                mine,
                prompt_logs,
                item.cell,
                item.cache_state,
                c.metric,
                control=item.vs,
                before=before,
            )
            row = BoxEffect(
                item.cell, item.vs, item.cache_state, c.metric, box, len(cycles),
                None, None, None, "no cycles",
            )  # fmt: skip
            if cycles:
                own = compare_cycles(
                    cycles,
                    metric=c.metric,
                    margin_pct=margin_pct,
                    alpha=alpha,
                    higher_is_better=info.higher_is_better,
                    seed=seed,
                    drift_sensitive=not info.deterministic,
                    cycles_advice=False,  # a per-box row reads the label and interval only
                )
                row = replace(
                    row, ratio=own.ratio, ci_low=own.ci_low, ci_high=own.ci_high,
                    label=str(own.label),
                )  # fmt: skip
                effects[box] = [cycle.effect for cycle in cycles]
            own_rows.append(row)
        p = interaction_p(effects)
        flagged = p is not None and p < alpha and c.metric in gated
        testable = sum(len(v) >= MIN_CYCLES_PER_BOX for v in effects.values())
        note = (
            ""
            if p is not None
            else f"not testable: {testable} of {len(boxes)} boxes have {MIN_CYCLES_PER_BOX}+ cycles"
        )
        interaction = Interaction(
            item.cell, item.vs, item.cache_state, c.metric, c.ratio, p, flagged, note,
            tuple(own_rows),
        )  # fmt: skip
        interactions.append(interaction)
        if flagged:
            per_box = ", ".join(f"{r.box} {r.ratio:.3f}" for r in own_rows if r.ratio is not None)
            flags.append(
                {
                    "kind": "box_interaction",
                    "cell": item.cell,
                    "cache_state": item.cache_state,
                    "metric": c.metric,
                    "detail": (
                        f"box × cell interaction (p = {p:.3g}): the effect differs between "
                        f"boxes ({per_box}); the pooled ratio {c.ratio:.3f} hides it"
                    ),
                }
            )
    return FleetTables(interactions, flags)


def _cycles_on(runs: pd.DataFrame, box: str, cell: str, state: str) -> pd.DataFrame:
    """The runs of the comparison's cycles that ran wholly on ``box``."""
    subset = runs[(runs["comparison"] == cell) & (runs["cache_state"] == state)]
    whole = [
        cycle for cycle, group in subset.groupby("cycle") if set(group["box"].dropna()) == {box}
    ]
    return subset[subset["cycle"].isin(whole)]


__all__ = [
    "MIN_CYCLES_PER_BOX",
    "WELCH_CYCLES_PER_BOX",
    "FleetTables",
    "fleet_tables",
    "interaction_p",
    "welch_anova_p",
]
