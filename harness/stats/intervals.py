"""Intervals and tests of a mirrored campaign's cycle effects (docs/design.md#statistics).

The one-sample t-interval and t-test of the m cycle effects Dⱼ, the Wilcoxon signed-rank test
beside them, Holm's step-down adjustment (for callers that test several claims as a family),
the per-cycle pair effects, and the cluster bootstrap of the order-balanced ratio. Pure: numbers
in, numbers out; the labels built from them are :mod:`.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from harness.errors import BadInput
from harness.stats.cycles import ORDERS, Cycle, FloatArray, log_to_ratio
from harness.stats.distributions import t_ppf, t_sf

__all__ = [
    "bootstrap_ratio_ci",
    "effects_array",
    "holm",
    "pair_effects",
    "standard_error",
    "t_interval",
    "t_test_p",
    "wilcoxon_p",
]


def t_interval(effects: npt.ArrayLike, confidence: float) -> tuple[float, float]:
    """Two-sided t-interval D̄ ± t_{(1+c)/2, m−1}·s_D/√m of the mean cycle effect (log scale)."""
    d = effects_array(effects)
    if d.size < 2:
        raise BadInput("t_interval: needs at least 2 cycles")
    mean = float(d.mean())
    half = t_ppf(0.5 + confidence / 2.0, d.size - 1) * standard_error(d)
    return mean - half, mean + half


def t_test_p(effects: npt.ArrayLike) -> float:
    """Two-sided one-sample t-test of D against 0: p = 2·P(T_{m−1} > |D̄|/(s_D/√m))."""
    d = effects_array(effects)
    if d.size < 2:
        raise BadInput("t_test_p: needs at least 2 cycles")
    sem = standard_error(d)
    mean = float(d.mean())
    if sem == 0.0:
        # Perfectly consistent cycles: any non-zero effect is certain, a zero one is not evidence.
        return 1.0 if mean == 0.0 else 0.0
    return 2.0 * t_sf(abs(mean) / sem, d.size - 1)


def wilcoxon_p(effects: npt.ArrayLike) -> float:
    """Two-sided Wilcoxon signed-rank p of D against 0 (scipy.stats.wilcoxon, its defaults)."""
    d = effects_array(effects)
    if not np.any(d != 0):
        return 1.0
    from scipy import stats as sps  # only here: the rest of the analysis needs no scipy.stats

    return float(sps.wilcoxon(d).pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni step-down adjusted p-values, in the input order.

    Not applied to the gate set: a verdict passes only when every gate passes (an
    intersection–union test), which holds its level with each gate at α. Holm is for a family
    where any one rejection is the claim (docs/design.md#no-holm-over-the-gate-set).

    Sorted ascending p₍₁₎ ≤ … ≤ p₍ₙ₎: p̃₍ᵢ₎ = max_{j ≤ i} min(1, (n − j + 1)·p₍ⱼ₎). Rejecting
    where p̃ < α is Holm's procedure at family-wise level α.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return []
    if not np.all((p >= 0) & (p <= 1)):
        raise BadInput("holm: p-values must lie in [0, 1]")
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (p.size - np.arange(p.size)) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(v) for v in adjusted]


def effects_array(effects: npt.ArrayLike) -> FloatArray:
    """The cycle effects as a flat float array; a NaN or infinite effect is bad input."""
    d = np.asarray(effects, dtype=np.float64).ravel()
    if not np.isfinite(d).all():
        raise BadInput("cycle effects must be finite")
    return d


def standard_error(d: FloatArray) -> float:
    """s_D/√m, the standard error of the mean cycle effect."""
    return float(d.std(ddof=1) / math.sqrt(d.size))


def pair_effects(cycles: Sequence[Cycle]) -> FloatArray:
    """Effect per ABBA+BAAB pair: mean of two consecutive opposite-order cycles' D.

    A single ABBA is biased by −2γ under quadratic drift γt² and a BAAB by +2γ; their mean is
    not. Cycles are taken in index order and paired greedily; a cycle whose neighbour has the
    same order (or none) is left out.
    """
    ordered = sorted(cycles, key=lambda c: c.index)
    out: list[float] = []
    i = 0
    while i + 1 < len(ordered):
        first, second = ordered[i], ordered[i + 1]
        if first.order != second.order:
            out.append(0.5 * (first.effect + second.effect))
            i += 2
        else:
            i += 1
    return np.asarray(out, dtype=np.float64)


def bootstrap_ratio_ci(
    cycles: Sequence[Cycle],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Two-level percentile bootstrap CI of R = exp(D̄): resample cycles, then prompts.

    Each replicate draws m cycles with replacement (its estimate is the balanced mean of what
    it drew, as :func:`balanced_effect` is of the data) and, for every drawn cycle, redraws the
    prompts of each block with replacement (one shared index set for the four blocks when
    ``prompts_aligned``, so prompt effects cancel in D as they do in the data). Cycles without
    prompt_logs make it a one-level (cycles only) bootstrap. Deterministic for a given seed.
    None with fewer than 2 cycles: prompts alone would ignore boot-to-boot noise.
    """
    m = len(cycles)
    if m < 2 or resamples < 1:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, m, size=(resamples, m))
    # Per replicate, the sum and count of each order's drawn effects: the estimate is the
    # balanced mean, as for the data.
    totals = {order: np.zeros(resamples, dtype=np.float64) for order in ORDERS}
    counts = {order: np.zeros(resamples, dtype=np.float64) for order in ORDERS}
    two_level = all(c.prompt_logs is not None for c in cycles)
    for pos in range(m):
        for j, c in enumerate(cycles):
            rows = np.flatnonzero(picks[:, pos] == j)
            if rows.size == 0:
                continue
            counts[c.order][rows] += 1
            if not two_level:
                totals[c.order][rows] += c.effect
                continue
            totals[c.order][rows] += _resampled_effects(c, rows.size, rng)
    both = (counts["ABBA"] > 0) & (counts["BAAB"] > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        balanced = 0.5 * totals["ABBA"] / counts["ABBA"] + 0.5 * totals["BAAB"] / counts["BAAB"]
    estimates = np.where(both, balanced, (totals["ABBA"] + totals["BAAB"]) / m)
    lo, hi = np.percentile(estimates, [50 * (1 - confidence), 50 * (1 + confidence)])
    return log_to_ratio(float(lo)), log_to_ratio(float(hi))


def _resampled_effects(c: Cycle, n: int, rng: np.random.Generator) -> FloatArray:
    assert c.prompt_logs is not None
    means = []
    shared = rng.integers(0, len(c.prompt_logs[0]), size=(n, len(c.prompt_logs[0])))
    for logs in c.prompt_logs:
        idx = shared if c.prompts_aligned else rng.integers(0, len(logs), size=(n, len(logs)))
        means.append(logs[idx].mean(axis=1))
    s0, s1, s2, s3 = means
    a_sum, b_sum = (s0 + s3, s1 + s2) if c.order == "ABBA" else (s1 + s2, s0 + s3)
    result: FloatArray = 0.5 * b_sum - 0.5 * a_sum
    return result


# --- the main entry -------------------------------------------------------------------------
