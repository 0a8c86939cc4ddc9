"""The campaign's effect estimate and its parts: the order-balanced D̄ with its standard error,
its between-boxes form for a fleet, each cycle's drift slope and the bound a flagged cycle's
drift puts on D̄, and the variance components that say what buys the most precision.

The formulas, one line each, are in docs/design.md (Statistics); the label rules that read
these are :mod:`harness.stats.decision` and :mod:`harness.stats.labels`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from harness.stats.crossover import ROUNDING, CrossoverFit
from harness.stats.cycles import Cycle
from harness.stats.design_sim import between_boxes_se
from harness.stats.distributions import t_ppf, t_sf
from harness.stats.drift import Flag


@dataclass(frozen=True)
class VarianceComponents:
    """Variances of a block's ln value by level (log scale, squared), and what buys the most.

    ``prompt`` is the prompt-to-prompt part of one block's mean (s_w²/k), ``block`` the
    boot-to-boot rest of the model's residual, ``cycle`` the spread of the cycle levels beyond
    what block noise explains. ``advice`` names the cheapest lever: "prompts per block",
    "cycles" or "boots per block" (docs/design.md#variance-components).
    """

    prompt: float | None
    block: float
    cycle: float | None
    prompts_per_block: int | None
    advice: str


@dataclass(frozen=True)
class Effect:
    """The campaign's effect estimate on the log scale: D̄, its standard error and their df."""

    mean: float
    se: float | None  # None with one cycle
    sd: float | None  # per-cycle SD estimate
    df: int
    weights: tuple[float, ...]  # of each cycle in D̄, in the order given
    boxes: int = 1  # > 1: the SE and df are between boxes (:func:`between_boxes`)

    def interval(self, confidence: float) -> tuple[float, float] | None:
        """Two-sided t-interval D̄ ± t_{(1+c)/2, df}·SE; None with one cycle."""
        if self.se is None:
            return None
        half = t_ppf(0.5 + confidence / 2.0, self.df) * self.se
        return self.mean - half, self.mean + half

    def p_value(self) -> float | None:
        """Two-sided t-test of D̄ against 0; None with one cycle."""
        if self.se is None:
            return None
        if self.se == 0.0:
            return 1.0 if self.mean == 0.0 else 0.0
        return 2.0 * t_sf(abs(self.mean) / self.se, self.df)


def balanced_effect(cycles: Sequence[Cycle]) -> Effect:
    """D̄ with ABBA and BAAB cycles weighted half each, so quadratic drift cancels at any m.

    Under drift γt² an ABBA cycle's D is biased by −2γ and a BAAB cycle's by +2γ; the plain
    mean of an odd number of alternating cycles keeps a bias of ∓2γ/m, the balanced mean
    ½·mean(D | ABBA) + ½·mean(D | BAAB) none. With as many cycles of each order (every even m
    of the planner's alternation) it is the plain mean. Its SE is s·√Σwⱼ², with
    s² = Σ(Dⱼ − D̄)² / (m − 2 + m·Σwⱼ²) unbiased for the per-cycle variance, on m − 1 df.
    """
    d = np.asarray([c.effect for c in cycles], dtype=np.float64)
    m = d.size
    orders = [c.order for c in cycles]
    counts = {o: orders.count(o) for o in set(orders)}
    if len(counts) == 2:
        w = np.asarray([0.5 / counts[o] for o in orders], dtype=np.float64)
    else:
        w = np.full(m, 1.0 / m)
    mean = float(w @ d)
    if m < 2:
        return Effect(mean, None, None, 0, tuple(float(x) for x in w))
    sum_w2 = float(w @ w)
    ss = float(((d - mean) ** 2).sum())
    sd = math.sqrt(ss / (m - 2 + m * sum_w2))
    return Effect(mean, sd * math.sqrt(sum_w2), sd, m - 1, tuple(float(x) for x in w))


def between_boxes(cycles: Sequence[Cycle], effect: Effect) -> Effect:
    """D̄'s SE and df for a verdict about boxes like these, when the cycles ran on 2+ boxes.

    A box × arm interaction (a change that helps on one machine and not another) is, on the
    boxes that ran, a real effect the cycle-level interval estimates correctly, but another box
    would not see it: with two boxes and an interaction SD of 3% the cycle-level interval calls
    a change with no effect on average *better* in ~10% of campaigns. Taking each box's share
    of D̄ as one observation (a cluster-robust variance, Σ_b W_b²(D̄_b − D̄)² · B/(B − 1), on
    B − 1 df) holds the level whatever the interaction; it is never narrower than the
    cycle-level SE. It costs nearly all the power of a 2-box fleet (one df: +10% at 3% block
    noise decided in ~2% of sequential campaigns), which is why it is ``analysis.boxes: random``
    and not the default: ``fixed`` keeps the cycle-level interval, a verdict about these boxes,
    and fails a ``better`` gate where the interaction test finds the boxes disagree.
    """
    if effect.se is None:
        return effect
    se, df = between_boxes_se(
        np.asarray([[c.effect for c in cycles]], dtype=np.float64),
        np.asarray([effect.mean]),
        np.asarray([effect.se]),
        [c.box for c in cycles],
        np.asarray(effect.weights, dtype=np.float64),
    )
    if df is None:
        return effect
    return replace(effect, se=float(se[0]), df=df, boxes=df + 1)


def cycle_slope(c: Cycle) -> float:
    """Least-squares slope per slot of one cycle's drift, free of the arm effect.

    The outer change is 3β and the inner change β under linear drift βt, whatever the arm
    effect (each pairs one arm with itself): β̂ = (3·outer + inner)/10.
    """
    return (3.0 * c.outer_change + c.inner_change) / 10.0


def drift_bias(cycles: Sequence[Cycle], flags: Sequence[Flag], weights: Sequence[float]) -> float:
    """Bound on the bias the flagged cycles' unmodelled drift could put in D̄ (log scale).

    In one cycle with drift dₛ at slots s = 0..3 the bias of D is ±½(d₁ + d₂ − d₀ − d₃). For a
    drift that is monotone within the cycle its size is at most ½|outer − inner| (outer = y₃ − y₀,
    inner = y₂ − y₁): a step between slots gives exactly its bias, a change in one arm mid-cycle
    likewise. Linear drift βt has bias 0 but outer − inner = 2β, so the common trend is taken
    out first: ½|outer − inner − 2β̂₋ⱼ|, β̂₋ⱼ the mean slope of the OTHER cycles (0 with none),
    so a step in one cycle cannot pass itself off as trend. Charging the drift the order
    already cancels would label a real effect under benign linear drift *confounded*.

    The other cycles' slope is a trend only when they are linear. A box that slows in steps (a
    step between the first two blocks of one cycle, between the last two of the next) gives
    every cycle the same outer change, so the trend term nearly vanishes while each cycle's bias
    is half the step, in the same direction. A single step between an outer and an inner block
    on top of any linear trend has bias exactly ½|r| (r = 3·inner − outer, free of the trend).
    So when the trend is not established — a single other cycle, or another cycle flagged
    NONLINEAR — a flagged cycle is charged the larger of the two. The bound of D̄ is the
    weighted sum over the flagged cycles.
    """
    flagged = {f.cycle for f in flags}
    nonlinear = {f.cycle for f in flags if f.kind == "NONLINEAR"}
    slopes = [cycle_slope(c) for c in cycles]
    total = sum(slopes)
    bound = 0.0
    for c, w, slope in zip(cycles, weights, slopes, strict=True):
        if c.index not in flagged:
            continue
        others = len(cycles) - 1
        trend = (total - slope) / others if others else 0.0
        detrended = abs(c.outer_change - c.inner_change - 2.0 * trend)
        established = others >= 2 and not (nonlinear - {c.index})
        bound += w * 0.5 * (detrended if established else max(detrended, abs(c.nonlinearity)))
    return float(bound)


def variance_components(
    fit: CrossoverFit, s_w: float | None, prompts_per_block: int | None
) -> VarianceComponents:
    """Prompt, block and cycle variances of a block's ln value, and the cheapest lever.

    The model's residual variance σ̂² is one block's noise: the prompt part s_w²/k plus the
    boot-to-boot rest. Cycle levels absorb what moves between cycles; their spread beyond the
    levels' own estimation noise (``fit.level_noise``·σ̂², from the model matrix: more than σ̂²/4
    once the slopes and carry-over are fitted, which left it biased upward) is the cycle
    component. D and τ̂ contrast
    blocks within cycles, so the cycle component never reaches them: their variance is
    (σ²_block + σ²_prompt/k)/m·const. Following Kalibera & Jones, the lever is the level whose
    variance dominates what reaches the effect: prompts per block when the prompt part is at
    least the boot part (more prompts in each boot cut it without a boot), else cycles (each
    cycle adds boots and averages drift, where more boots per block only add boots).
    """
    total = fit.residual_sd**2
    prompt = s_w * s_w / prompts_per_block if s_w is not None and prompts_per_block else None
    block = max(0.0, total - (prompt or 0.0))
    levels = np.asarray(fit.cycle_levels, dtype=np.float64)
    noise = fit.level_noise * total
    cycle = max(0.0, float(levels.var(ddof=1)) - noise) if levels.size >= 2 else None
    if cycle is not None and cycle < ROUNDING**2:
        cycle = 0.0  # levels equal up to rounding (crossover.ROUNDING)
    advice = "prompts per block" if prompt is not None and prompt >= block else "cycles"
    return VarianceComponents(prompt, block, cycle, prompts_per_block, advice)
