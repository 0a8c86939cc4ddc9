"""A lossy cell's second endpoint: do its outputs agree with the control's within its margin?

docs/design.md#equivalence. A change that trades quality for speed (cold experts at lower
precision, experts skipped) is declared ``lossy: {margin, metric}`` on its cell. Its scored
greedy outputs on the held-out prompts are compared with the control's, prompt by prompt:

* ``prefix_agreement``: the share of the control's output the cell reproduces before the first
  differing character (1 for an identical output, 0 when the first token differs);
* ``token_agreement``: the share of the control's characters the cell's output matches at the
  same position (a crude count: after a divergence the two texts rarely realign).

The unit is the prompt (its value averaged over the cell's boots); the endpoint is the mean over
prompts with a t interval clipped to [0, 1]. It is *equivalent* when the interval's lower bound
is at least ``1 - margin``, *not equivalent* when its upper bound is below, and otherwise not
shown. A *better* needs both endpoints: a not-equivalent cell's comparisons are labelled so, and
a *better* whose equivalence is not shown reads *inconclusive*.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analyze.compare import CellComparison
from harness.card import Card
from harness.card.schema import Equivalence
from harness.stats.distributions import t_ppf
from harness.stats.labels import Label

_MIN_PROMPTS = 3  # fewer prompts give no interval worth the name


@dataclass(frozen=True)
class EquivalenceRow:
    """One lossy cell's agreement with the control, and the endpoint's verdict."""

    cell: str
    metric: str
    margin: float
    prompts: int
    mean: float
    ci95: tuple[float, float] | None
    verdict: str  # "equivalent", "not equivalent" or "not shown"
    worst: tuple[str, ...] = ()  # prompt ids with the lowest agreement

    def words(self) -> str:
        """``prefix agreement 0.42 [0.30, 0.55] over 12 prompts, needs >= 0.90``."""
        ci = f" [{self.ci95[0]:.2f}, {self.ci95[1]:.2f}]" if self.ci95 else " (no interval)"
        return (
            f"{self.metric.replace('_', ' ')} {self.mean:.2f}{ci} over {self.prompts} prompts, "
            f"needs >= {1 - self.margin:.2f}"
        )


def prefix_agreement(got: str, expected: str) -> float:
    """The share of ``expected`` reproduced before the first differing character."""
    if not expected:
        return 1.0 if not got else 0.0
    at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    if at is None:
        at = min(len(got), len(expected))
    return at / len(expected)


def token_agreement(got: str, expected: str) -> float:
    """The share of ``expected``'s characters that ``got`` matches at the same position."""
    if not expected:
        return 1.0 if not got else 0.0
    return sum(a == b for a, b in zip(got, expected, strict=False)) / len(expected)


_METRICS = {"prefix_agreement": prefix_agreement, "token_agreement": token_agreement}


def _endpoint(cell: str, spec: Equivalence, per_prompt: pd.Series) -> EquivalenceRow:
    values = per_prompt.to_numpy(dtype=np.float64)
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    ci: tuple[float, float] | None = None
    if n >= _MIN_PROMPTS:
        half = t_ppf(0.975, n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
        ci = (max(0.0, mean - half), min(1.0, mean + half))
    floor = 1.0 - spec.margin
    verdict = "not shown"
    if ci is not None and ci[0] >= floor:
        verdict = "equivalent"
    elif ci is not None and ci[1] < floor:
        verdict = "not equivalent"
    worst = tuple(str(p) for p in per_prompt.sort_values().index[:3] if per_prompt[p] < 1.0)
    return EquivalenceRow(cell, spec.metric, spec.margin, n, mean, ci, verdict, worst)


def check_equivalence(card: Card, outputs: pd.DataFrame) -> list[EquivalenceRow]:
    """The equivalence endpoint of every cell declared ``lossy`` with a margin."""
    lossy = {n: c.lossy for n, c in card.cells.items() if isinstance(c.lossy, Equivalence)}
    if not lossy or card.control is None or outputs.empty:
        return []
    scored = outputs[outputs["ok"] & ~outputs["phase"].isin(["quality", "logits"])]
    control = scored[scored["cell"] == card.control]
    # The control's most common output per prompt: its own boots agree on a greedy output.
    reference = control.groupby("prompt_id")["output_text"].agg(lambda s: s.mode().iloc[0])
    rows = []
    for cell, spec in lossy.items():
        mine = scored[scored["cell"] == cell]
        mine = mine[mine["prompt_id"].isin(reference.index)]
        if mine.empty:
            continue
        score = _METRICS[spec.metric]
        values = [
            score(str(text), str(reference[prompt]))
            for prompt, text in zip(mine["prompt_id"], mine["output_text"], strict=True)
        ]
        per_prompt = pd.Series(values, index=mine["prompt_id"].to_numpy()).groupby(level=0).mean()
        rows.append(_endpoint(cell, spec, per_prompt))
    return rows


def apply_equivalence(
    rows: list[EquivalenceRow], comparisons: list[CellComparison]
) -> list[CellComparison]:
    """The comparisons with each lossy cell's equivalence folded into its label."""
    by_cell = {r.cell: r for r in rows}
    out = []
    for item in comparisons:
        row = by_cell.get(item.cell)
        comparison = item.comparison
        if row is not None and row.verdict == "not equivalent":
            comparison = dataclasses.replace(
                comparison,
                label=Label.NOT_EQUIVALENT,
                not_equivalent=f"outputs not equivalent: {row.words()}",
            )
        elif row is not None and row.verdict == "not shown" and comparison.label == Label.BETTER:
            comparison = dataclasses.replace(
                comparison,
                label=Label.INCONCLUSIVE,
                not_equivalent=f"equivalence not shown: {row.words()}",
            )
        out.append(dataclasses.replace(item, comparison=comparison))
    return out


__all__ = [
    "EquivalenceRow",
    "apply_equivalence",
    "check_equivalence",
    "prefix_agreement",
    "token_agreement",
]
