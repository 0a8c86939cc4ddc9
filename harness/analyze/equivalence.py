"""A lossy cell's second endpoint: do its outputs agree with the control's within its margin?

docs/design.md#equivalence. A change that trades quality for speed (cold experts at lower
precision, experts skipped) is declared ``lossy: {margin, metric}`` on its cell. Its scored
greedy outputs on the held-out prompts are compared with the control's, prompt by prompt:

* ``prefix_agreement``: the share of the control's output the cell reproduces before the first
  differing character (1 for an identical output, 0 when the first token differs);
* ``token_agreement``: the share of the control's characters the cell's output matches at the
  same position (a crude count: after a divergence the two texts rarely realign);
* ``kl``: the mean per-token KL divergence, in nats, of the cell's next-token distribution from
  the control's, over the positions where both saw the same context (up to and including the
  first differing token), from the top log-probabilities the runtime returned
  (``workload.logprobs``). Only the top N of each side is known, so each position's two
  distributions are compared on the tokens both top lists hold plus one bucket for the rest of
  the mass: a coarsening, so the figure is a lower bound on the full KL (exact when the shared
  tokens hold all the mass).

The unit is the prompt (its value averaged over the cell's boots); the endpoint is the mean over
prompts with a 95% interval. An agreement's is the one for any values in [0, 1]
(:mod:`harness.stats.bounded`: outputs that mostly agree exactly have no spread, and a t
interval over them would claim what a few prompts cannot show); it is *equivalent* when the
lower bound is at least ``1 - margin``, *not equivalent* when the upper bound is below, and
otherwise not shown, with how many prompts would show it. A KL's runs from the t lower bound
(conservative for right-skewed values) to a Cantelli upper bound (see ``_CANTELLI``); it is
*equivalent* when the upper bound is at most ``margin`` and *not equivalent* when the lower
bound is above. KL has no bound free of assumptions: a prompt far off the rest that the sample
missed is not covered (8 prompts of which one in ten is far off: the upper bound holds the true
mean in about half the campaigns). A *better* needs both
endpoints: a not-equivalent cell's comparisons are labelled so, and a *better* whose
equivalence is not shown reads *inconclusive*.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analyze.compare import CellComparison
from harness.card import Card
from harness.card.schema import Equivalence
from harness.stats.bounded import needed_for_lower, needed_for_upper, unit_mean_interval
from harness.stats.distributions import t_ppf
from harness.stats.labels import Label

_MIN_PROMPTS = 3  # a KL over fewer prompts gives no interval worth the name
# A KL's upper bound: Cantelli's one-sided k = sqrt((1 - a) / a) at a = 2.5%, with the sample
# spread, as wide as the distribution-free bound for a known variance. The t bound's 2.4 spreads
# held the true mean in 72-88% of simulated campaigns of skewed (lognormal) per-prompt KL at 8 to
# 32 prompts; this one in 90-99.8% (tests/stats/test_bounded.py).
_CANTELLI = math.sqrt(0.975 / 0.025)


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
    needed: int | None = None  # prompts that, agreeing as these do, would show it (not shown)

    def words(self) -> str:
        """``prefix agreement 0.42 [0.30, 0.55] over 12 prompts, needs >= 0.90`` (a KL: ``kl
        0.012 [0.008, 0.016] nats over 12 prompts, needs <= 0.05``)."""
        if self.metric == "kl":
            ci = f" [{self.ci95[0]:.3g}, {self.ci95[1]:.3g}]" if self.ci95 else " (no interval)"
            return (
                f"KL {self.mean:.3g}{ci} nats over {self.prompts} prompts, needs <= {self.margin:g}"
            )
        ci = f" [{self.ci95[0]:.2f}, {self.ci95[1]:.2f}]" if self.ci95 else " (no interval)"
        way = "show it" if self.mean > 1 - self.margin else "show it falls short"
        more = f" (about {self.needed} prompts agreeing as these do would {way})"
        return (
            f"{self.metric.replace('_', ' ')} {self.mean:.2f}{ci} over {self.prompts} prompts, "
            f"needs >= {1 - self.margin:.2f}" + (more if self.needed else "")
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


def position_kl(reference: dict[str, float], mine: dict[str, float]) -> float:
    """KL(reference || mine) in nats over the tokens both top lists hold and one bucket for the
    rest of each side's mass (a lower bound on the full divergence)."""
    shared = sorted(set(reference) & set(mine))
    p = np.array([math.exp(reference[t]) for t in shared], dtype=np.float64)
    q = np.array([math.exp(mine[t]) for t in shared], dtype=np.float64)
    p = np.append(p, max(0.0, 1.0 - float(p.sum())))
    q = np.append(q, max(0.0, 1.0 - float(q.sum())))
    q = np.maximum(q, 1e-12)  # a bucket the reference fills and the cell never: very far, finite
    keep = p > 0
    return float(np.sum(p[keep] * np.log(p[keep] / q[keep])))


def mean_kl(got: list[dict[str, object]], expected: list[dict[str, object]]) -> float | None:
    """Mean :func:`position_kl` over the positions with one context: up to and including the
    first token the two outputs pick differently. None when no position has both top lists."""
    values = []
    for mine, ref in zip(got, expected, strict=False):
        mine_top, ref_top = mine.get("top"), ref.get("top")
        if isinstance(mine_top, dict) and isinstance(ref_top, dict) and mine_top and ref_top:
            values.append(position_kl(ref_top, mine_top))
        if mine.get("token") != ref.get("token"):
            break
    return float(np.mean(values)) if values else None


def parsed_logprobs(text: object) -> list[dict[str, object]]:
    """A request's ``logprobs`` record (requests.parquet: JSON, one entry a token) as its
    entries; [] where it has none or cannot be read."""
    if not isinstance(text, str):
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _endpoint(cell: str, spec: Equivalence, per_prompt: pd.Series) -> EquivalenceRow:
    values = per_prompt.to_numpy(dtype=np.float64)
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    ci: tuple[float, float] | None = None
    needed: int | None = None
    verdict = "not shown"
    if spec.metric == "kl":
        if n >= _MIN_PROMPTS:
            spread = float(values.std(ddof=1)) / math.sqrt(n)
            ci = (max(0.0, mean - t_ppf(0.975, n - 1) * spread), mean + _CANTELLI * spread)
            if ci[1] <= spec.margin:
                verdict = "equivalent"
            elif ci[0] > spec.margin:
                verdict = "not equivalent"
        worst = tuple(str(p) for p in per_prompt.sort_values().index[::-1][:3] if per_prompt[p] > 0)
    else:
        floor = 1.0 - spec.margin
        if n:
            ci = unit_mean_interval(values.tolist())
            if ci[0] >= floor:
                verdict = "equivalent"
            elif ci[1] < floor:
                verdict = "not equivalent"
            else:
                needed = needed_for_lower(mean, floor) or needed_for_upper(mean, floor)
        worst = tuple(str(p) for p in per_prompt.sort_values().index[:3] if per_prompt[p] < 1.0)
    return EquivalenceRow(cell, spec.metric, spec.margin, n, mean, ci, verdict, worst, needed)


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
        if spec.metric == "kl":
            values = _kl_values(control, reference, mine)
        else:
            score = _METRICS[spec.metric]
            values = [
                score(str(text), str(reference[prompt]))
                for prompt, text in zip(mine["prompt_id"], mine["output_text"], strict=True)
            ]
        numbers = pd.Series(values, index=mine["prompt_id"].to_numpy(), dtype="float64")
        per_prompt = numbers.dropna().groupby(level=0).mean()
        rows.append(_endpoint(cell, spec, per_prompt))
    return rows


def _kl_values(control: pd.DataFrame, reference: pd.Series, mine: pd.DataFrame) -> list[float]:
    """Each of the cell's requests' mean KL from the control's reference output of its prompt
    (a control request whose output is the reference); NaN where either has no logprobs."""
    if "logprobs" not in control.columns or "logprobs" not in mine.columns:
        return [math.nan] * len(mine)
    expected: dict[str, list[dict[str, object]]] = {}
    for prompt, text, logprobs in zip(
        control["prompt_id"], control["output_text"], control["logprobs"], strict=True
    ):
        parsed = parsed_logprobs(logprobs)
        if prompt not in expected and text == reference[prompt] and parsed:
            expected[prompt] = parsed
    out = []
    for prompt, logprobs in zip(mine["prompt_id"], mine["logprobs"], strict=True):
        value = mean_kl(parsed_logprobs(logprobs), expected.get(prompt, []))
        out.append(math.nan if value is None else value)
    return out


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
    "mean_kl",
    "parsed_logprobs",
    "position_kl",
    "prefix_agreement",
    "token_agreement",
]
