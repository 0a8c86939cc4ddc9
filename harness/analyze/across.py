"""Two campaigns of the same card side by side (``harness compare DIR_A DIR_B``): two builds.

Within a campaign, cells are compared in mirrored cycles. Two campaigns ran at different times,
so nothing pairs their blocks: per cell, cache state and metric, campaign B's block values are
compared with campaign A's as two independent samples on the log scale. d = mean ln y_B − mean
ln y_A (a block's value is the mean over its repeats' ln values), a Welch t-interval at the
card's α (and 1 − 2α for equivalence), and the labels of docs/design.md#statistics with the
card's margin: *better*/*worse* when the interval excludes 0 and |d| ≥ Δ, *within noise* when
the 1 − 2α interval lies inside (−Δ, Δ), else *inconclusive* (also with fewer than two blocks a
side). Ratio = exp(d), B ÷ A. Each campaign's own label against its control is shown beside.

Campaigns from different boxes are refused unless ``cross_box``: a difference would mix the
machine with the build (pyperf refuses to merge runs of different machines for this reason).
The box is the card's box name and, when the directory captured it, the host description in
``boxes/<box>.json``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.analyze.campaign import CampaignAnalysis
from harness.analyze.cell_values import finite
from harness.catalog import METRICS
from harness.errors import BadInput
from harness.formats.records import read_json
from harness.stats.cycles import log_to_ratio, margin_log
from harness.stats.distributions import t_ppf
from harness.stats.labels import decide_label

__all__ = ["box_identity", "compare_campaigns", "welch_interval"]


def box_identity(analysis: CampaignAnalysis) -> tuple[str, str | None]:
    """(box name, host description from the environment capture or None)."""
    card = analysis.card
    name = card.box if isinstance(card.box, str) else (card.box.host or card.box.kind)
    capture = analysis.campaign.root / "boxes" / f"{name}.json"
    host = None
    if capture.is_file():
        value = read_json(capture).get("host")
        host = str(value) if value is not None else None
    return name, host


def _blocks(analysis: CampaignAnalysis, cell: str, state: str, metric: str) -> list[float]:
    """ln block values of a cell: each block's repeats averaged on the log scale."""
    runs = analysis.runs
    if metric not in runs.columns:
        return []
    ok = runs[(runs["status"] == "ok") & (runs["cell"] == cell) & (runs["cache_state"] == state)]
    values: dict[tuple[int, str, int], list[float]] = {}
    for record in ok.to_dict("records"):
        value = finite(record.get(metric))
        if value is None or value <= 0:
            continue
        key = (int(record["cycle"]), str(record["comparison"]), int(record["slot"]))
        values.setdefault(key, []).append(math.log(value))
    return [float(np.mean(v)) for v in values.values()]


def welch_interval(a: list[float], b: list[float], confidence: float) -> tuple[float, float] | None:
    """Welch's t-interval for mean(b) − mean(a) at ``confidence``; None below two values a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    d = float(np.mean(b) - np.mean(a))
    if se == 0:
        return (d, d)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_ppf(0.5 + confidence / 2, float(df)) * se
    return (d - half, d + half)


def _label_of(analysis: CampaignAnalysis, cell: str, state: str, metric: str) -> str | None:
    for item in analysis.comparisons:
        if (item.cell, item.cache_state, item.comparison.metric) == (cell, state, metric):
            return item.comparison.label
    return None


def compare_campaigns(
    a: CampaignAnalysis, b: CampaignAnalysis, *, cross_box: bool = False
) -> list[dict[str, Any]]:
    """One row per cell × cache state × metric both campaigns recorded: B against A."""
    root_a, root_b = a.campaign.root, b.campaign.root
    if a.card.campaign != b.card.campaign:
        raise BadInput(
            f"{root_a} is campaign {a.card.campaign!r}, {root_b} is {b.card.campaign!r}: "
            "compare two campaigns of the same card"
        )
    if list(a.card.cells) != list(b.card.cells):
        raise BadInput(
            f"{root_a} and {root_b} have different cells ({', '.join(a.card.cells)} vs "
            f"{', '.join(b.card.cells)}): not the same card"
        )
    box_a, box_b = box_identity(a), box_identity(b)
    differs = box_a[0] != box_b[0] or (None not in (box_a[1], box_b[1]) and box_a[1] != box_b[1])
    if differs and not cross_box:
        raise BadInput(
            f"{root_a} ran on box {box_a[0]!r}, {root_b} on {box_b[0]!r}"
            + (f" ({box_a[1]!r} vs {box_b[1]!r})" if box_a[1] != box_b[1] else "")
            + ": a difference would mix the machine with the build; pass --cross-box to compare "
            "anyway"
        )
    alpha = a.card.analysis.alpha
    delta = margin_log(a.card.analysis.margin_pct)
    rows: list[dict[str, Any]] = []
    for cell in a.card.cells:
        for state in a.card.design.cache_states:
            for metric, info in METRICS.items():
                ya, yb = _blocks(a, cell, state, metric), _blocks(b, cell, state, metric)
                if not ya or not yb:
                    continue
                d = float(np.mean(yb) - np.mean(ya))
                ci95 = welch_interval(ya, yb, 1 - alpha)
                ci90 = welch_interval(ya, yb, 1 - 2 * alpha)
                label = decide_label(d, ci95, ci90, delta, higher_is_better=info.higher_is_better)
                rows.append(
                    {
                        "cell": cell,
                        "cache_state": state,
                        "metric": metric,
                        "a_value": math.exp(float(np.mean(ya))),
                        "b_value": math.exp(float(np.mean(yb))),
                        # `compare --json` prints these: a ratio past the largest float
                        # (Welch's t on ~1 df at a small α) is null, "∞" in the table.
                        "ratio": finite(log_to_ratio(d)),
                        "ci_low": finite(log_to_ratio(ci95[0])) if ci95 else None,
                        "ci_high": finite(log_to_ratio(ci95[1])) if ci95 else None,
                        "label": label,
                        "blocks_a": len(ya),
                        "blocks_b": len(yb),
                        "a_label": _label_of(a, cell, state, metric),
                        "b_label": _label_of(b, cell, state, metric),
                        "cross_box": differs,
                    }
                )
    return rows
