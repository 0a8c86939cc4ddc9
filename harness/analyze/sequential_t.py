"""Small-sample sequential boundaries for the campaign's t statistic, by seeded simulation.

docs/design.md#sequential-designs. The O'Brien–Fleming-type spending of
:mod:`harness.analyze.sequential` solves its equations for a statistic that is exactly normal
at every look. The campaign's statistic is a t statistic on m − 1 degrees of freedom whose
variance estimate grows with the looks, and deciding each look at the normal boundary's
nominal level overspends: 5.5–5.7% two-sided instead of 5% for the bench's 3…12-cycle design.

Here the same spending is solved for the t statistic itself. Under H₀ with normal cycle effects
the statistic's law does not depend on the effects' SD, so one seeded simulation per design
(looks, orders, α) gives it: N campaigns of m_max standard normal Dⱼ, the order-balanced t at
every look, and per look the boundary c_k that the survivors of the earlier looks cross with
probability α(t_k) − α(t_{k−1}). Each look then decides at the nominal two-sided level
p_k = 2·P(T_{m_k−1} > c_k) that the fixed analysis understands. Where the simulation expects
fewer than :data:`MIN_CROSSINGS` crossings (the first looks of an O'Brien–Fleming design spend
almost nothing), the normal boundary's nominal level is kept: there it is far out in the tail
and the difference is below what the simulation could resolve. Results are cached per design.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from harness.analyze.cycles import FloatArray

CALIBRATION_CAMPAIGNS = 200_000
CALIBRATION_SEED = 26
MIN_CROSSINGS = 100


def balanced_weights(m: int) -> FloatArray:
    """Weights of the order-balanced mean over m alternating cycles (ABBA first)."""
    orders = np.arange(m) % 2
    n_abba = int((orders == 0).sum())
    n_baab = m - n_abba
    if n_baab == 0:
        return np.full(m, 1.0 / m)
    w: FloatArray = np.where(orders == 0, 0.5 / n_abba, 0.5 / n_baab).astype(np.float64)
    return w


def balanced_t(effects: npt.NDArray[np.float64]) -> tuple[FloatArray, FloatArray]:
    """Order-balanced mean and its SE per row of ``effects`` (campaigns × m cycles).

    The same estimator as :func:`harness.analyze.stats.balanced_effect`, vectorised.
    """
    m = effects.shape[1]
    w = balanced_weights(m)
    mean: FloatArray = effects @ w
    ss = ((effects - mean[:, None]) ** 2).sum(axis=1)
    sum_w2 = float(w @ w)
    sd = np.sqrt(ss / (m - 2 + m * sum_w2))
    se: FloatArray = sd * np.sqrt(sum_w2)
    return mean, se


@lru_cache(maxsize=64)
def t_nominal_levels(
    looks: tuple[int, ...],
    spent_by_look: tuple[float, ...],
    normal_levels: tuple[float, ...],
    campaigns: int = CALIBRATION_CAMPAIGNS,
    seed: int = CALIBRATION_SEED,
) -> tuple[float, ...]:
    """Two-sided nominal levels per look that spend ``spent_by_look`` for the t statistic.

    ``looks`` are cycle counts (each ≥ 2), ``spent_by_look`` the cumulative two-sided α spent by
    each, ``normal_levels`` the normal-theory nominal levels kept where the simulation cannot
    resolve the tail (fewer than :data:`MIN_CROSSINGS` expected crossings).
    """
    rng = np.random.default_rng(seed)
    effects = rng.standard_normal((campaigns, looks[-1]))
    alive = np.ones(campaigns, dtype=bool)
    out: list[float] = []
    previous = 0.0
    for m, spent_k, normal in zip(looks, spent_by_look, normal_levels, strict=True):
        to_spend = spent_k - previous
        previous = spent_k
        if m < 2:  # one cycle has no t statistic and decides nothing
            out.append(normal)
            continue
        mean, se = balanced_t(effects[:, :m])
        t_abs = np.abs(mean / se)
        if alive.all():
            # Nothing stopped before this look: its t statistic's own law gives c exactly.
            c = float(sps.t.isf(to_spend / 2.0, m - 1))
        elif to_spend * campaigns < MIN_CROSSINGS:
            c = float(sps.t.isf(normal / 2.0, m - 1))
        else:
            # The boundary that the campaigns still running cross in a share to_spend of all.
            rank = round(to_spend * campaigns)
            survivors = np.sort(t_abs[alive])[::-1]
            c = float(survivors[min(rank, survivors.size - 1)])
        alive &= t_abs <= c  # a look rejects when p < p_k, i.e. |t| > c
        out.append(float(2.0 * sps.t.sf(c, m - 1)))
    return tuple(out)


__all__ = ["CALIBRATION_CAMPAIGNS", "balanced_t", "balanced_weights", "t_nominal_levels"]
