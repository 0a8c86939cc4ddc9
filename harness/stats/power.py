"""How many cycles a decision needs: power calculations and the "add cycles" warnings.

docs/design.md#cycles-needed: beyond the margin, the cycles a two-sided one-sample t-test needs
for 80% power to detect the observed effect; inside it, the cycles that give the TOST
*within noise* test 80% power at the observed effect. Both tails come from
``scipy.stats.nct.sf`` (``nct.cdf(−t, df, nc)`` returns NaN over much of its range, which
stopped the old search early). Every warning ends with the remedy (resume_hint). Pure.

That count is where the advice starts, not what it says. The number an *inconclusive* (or
*carry-over*) comparison is given is the fewest cycles at which 80% of 2,000 seeded simulated
campaigns of the design — washed or not, blocks with the observed noise — get a decided label
from the analysis's own rule, margin, TOST and carry-over check included
(:func:`harness.stats.design_sim.fixed_cycles_needed`, searched from this count up to 100
cycles; beyond, this count is given as the lower bound it is). The plain count alone promised
80% where the rule decided 36–69%: the margin and the carry-over check cost power the t-test
does not see. With one cycle the spread is s_w/√k, itself a lower bound. A sequential design
simulates its own looks and levels instead (:func:`harness.stats.design_sim.stopping_distribution`):
the cycles by which 80% of its campaigns are decided, or, when fewer are by ``max_cycles``,
that share. The remedy is ``harness run --resume DIR --cycles N`` with N filled in (and the
advice to declare a sequential design, since adding cycles after a look inflates false
positives), the next look, or at ``max_cycles`` a new campaign.
"""

from __future__ import annotations

import math

from scipy import special

from harness.errors import BadInput
from harness.stats.cycles import pct_change
from harness.stats.distributions import chi2_isf, norm_ppf, t_ppf

# The remedy every "add cycles" warning ends with (pyperf style: the warning says what to do).
RESUME_HINT = (
    "harness run --resume DIR --cycles N; declare design.sequential with max_cycles so that "
    "adding cycles after a look does not inflate false positives"
)


def resume_hint(cycles: int) -> str:
    """The fixed design's remedy with the cycle count filled in (``cycles`` in all)."""
    return RESUME_HINT.replace("--cycles N", f"--cycles {cycles}")


_MAX_CYCLES_SEARCH = 100_000


def cycles_needed(s_d: float, margin: float, alpha: float, power: float = 0.8) -> int:
    """Cycles a two-sided one-sample t-test needs to detect an effect of size ``margin`` (log).

    Standard power calculation with the exact noncentral t distribution (as G*Power and
    statsmodels' TTestPower do): smallest m ≥ 2 with
    P(|T| > t_{1−α/2, m−1}) ≥ power, T ~ nct(m − 1, √m·margin/s_d). Capped at 100 000.
    """
    if margin <= 0 or not 0 < alpha < 1 or not 0 < power < 1:
        raise BadInput("cycles_needed: margin > 0, 0 < alpha < 1 and 0 < power < 1 are required")
    if s_d < 0 or not math.isfinite(s_d):
        raise BadInput(f"cycles_needed: s_d must be a finite SD >= 0, got {s_d!r}")
    if s_d == 0:
        return 2

    def achieved(m: int) -> float:
        return two_sided_power(m, margin / s_d, alpha)

    # Start from the normal approximation, then walk to the exact answer.
    z = norm_ppf(1 - alpha / 2) + norm_ppf(power)
    # A float's ** raises OverflowError past 1e308 (an SD of 1e200 log) where * gives inf.
    approx = (z * s_d / margin) * (z * s_d / margin)
    m = _MAX_CYCLES_SEARCH if approx >= _MAX_CYCLES_SEARCH else max(2, math.ceil(approx))
    while m < _MAX_CYCLES_SEARCH and achieved(m) < power:
        m += 1
    while m > 2 and achieved(m - 1) >= power:
        m -= 1
    return m


def nct_sf(t: float, df: int, nc: float) -> float:
    """P(T > t), T ~ nct(df, nc); scipy returns NaN beyond |nc| ≈ 1e10 (a deterministic
    metric's effect over a rounding-size SD), where the answer is 1 or 0 to 1e-9 and is given
    as such (tost_power once returned NaN there, and the search ran to 100,000 cycles)."""
    # The special function, not scipy.stats.nct.sf: the same number to 1e-16 (absolute) at ~6 µs
    # instead of ~100 µs, and an analysis asks for tens of thousands of them.
    value = 1.0 - float(special.nctdtr(df, nc, t))
    if math.isnan(value):
        return 1.0 if nc > t else 0.0
    return min(1.0, max(0.0, value))


def two_sided_power(m: int, effect_over_sd: float, alpha: float) -> float:
    """P(|T| > t_{1−α/2, m−1}), T ~ nct(m − 1, √m·effect/sd): both tails by ``nct.sf``.

    The lower tail P(T < −t) is written as ``nct.sf(t, df, −nc)`` (the same number by
    symmetry); scipy's ``nct.cdf(−t, df, nc)`` is NaN for large nc at small df.
    """
    tc = t_ppf(1 - alpha / 2, m - 1)
    nc = math.sqrt(m) * effect_over_sd
    return nct_sf(tc, m - 1, nc) + nct_sf(tc, m - 1, -nc)


def tost_power(
    m: int, distance_low: float, distance_high: float, s_d: float, alpha: float
) -> float:
    """Power of the TOST *within noise* test with m cycles (a lower bound, exact in each tail).

    The 90% interval lies inside (−Δ, Δ) when both one-sided tests at α reject: T₁ = (D̄ + Δ)/SE
    and T₂ = (Δ − D̄)/SE each above t_{1−α, m−1}. With the true effect μ, T₁ ~ nct(m − 1,
    √m(Δ + μ)/s) and T₂ ~ nct(m − 1, √m(Δ − μ)/s); P(both) ≥ P(T₁ > t) + P(T₂ > t) − 1.
    ``distance_low`` = Δ + μ, ``distance_high`` = Δ − μ.
    """
    if s_d == 0:
        return 1.0 if min(distance_low, distance_high) > 0 else 0.0
    tc = t_ppf(1 - alpha, m - 1)
    root = math.sqrt(m) / s_d
    low = nct_sf(tc, m - 1, root * distance_low)
    high = nct_sf(tc, m - 1, root * distance_high)
    return max(0.0, low + high - 1.0)


def cycles_within_noise(
    s_d: float, mean: float, delta: float, alpha: float, power: float = 0.8
) -> int:
    """Smallest m whose TOST has ``power`` to say *within noise* if the effect is ``mean``."""
    low, high = delta + mean, delta - mean
    if s_d == 0:
        return 2
    if min(low, high) <= 0:
        return _MAX_CYCLES_SEARCH

    def enough(m: int) -> bool:
        return tost_power(m, low, high, s_d, alpha) >= power

    m = 2
    while m < _MAX_CYCLES_SEARCH and not enough(m):
        m = m * 2 if m < 1024 else m + 1024
    lo = max(2, m // 2)
    while lo < m:
        mid = (lo + m) // 2
        if enough(mid):
            m = mid
        else:
            lo = mid + 1
    return min(m, _MAX_CYCLES_SEARCH)


def _cycles_to_clear(s_d: float, distance: float, alpha: float) -> int:
    """Smallest m with t_{1−α, m−1}·s_d/√m < distance (a one-sided CI edge moving by distance)."""
    if s_d == 0:
        return 2
    if distance <= 0:
        return _MAX_CYCLES_SEARCH
    m = 2
    while m < _MAX_CYCLES_SEARCH and t_ppf(1 - alpha, m - 1) * s_d / math.sqrt(m) >= (distance):
        m = m * 2 if m < 1024 else m + 1024
    lo = max(2, m // 2)
    while lo < m:  # bisect the last doubling step
        mid = (lo + m) // 2
        if t_ppf(1 - alpha, mid - 1) * s_d / math.sqrt(mid) < distance:
            m = mid
        else:
            lo = mid + 1
    return m


def cycles_to_decide(spread: float, mean: float, delta: float, alpha: float) -> int:
    """Cycles likely to turn this comparison into a verdict, if the effect is as observed.

    Beyond the margin, the question is power to detect the observed effect (never less than
    the margin); inside it, 80% power for the TOST to put the 90% interval inside (−Δ, Δ).
    """
    if abs(mean) >= delta:
        return cycles_needed(spread, abs(mean), alpha)
    return cycles_within_noise(spread, mean, delta, alpha)


def needed_range(
    needed: int, spread: float | None, mean: float, delta: float, alpha: float, m: int
) -> tuple[int, int] | None:
    """How far ``needed`` moves across the spread's 80% interval (χ² on m − 1 df): the count
    scaled by the plain t-test's counts at the interval's ends. None below 3 cycles (one df
    bounds nothing) or without a spread. The effect's own uncertainty is not in it (an effect
    smaller than observed needs more), and the words say so."""
    if spread is None or spread <= 0 or m < 3:
        return None
    df = m - 1
    low_sd = spread * math.sqrt(df / chi2_isf(0.10, df))
    high_sd = spread * math.sqrt(df / chi2_isf(0.90, df))
    middle = cycles_to_decide(spread, mean, delta, alpha)
    if middle <= 0:
        return None
    scale = needed / middle
    low = max(2, math.floor(cycles_to_decide(low_sd, mean, delta, alpha) * scale))
    high = max(low, math.ceil(cycles_to_decide(high_sd, mean, delta, alpha) * scale))
    return low, high


def needed_words(needed: int, span: tuple[int, int] | None) -> str:
    """ "about 12 cycles (8–21 across the spread's 80% interval) would be needed"."""
    if span is None or span[0] == span[1] == needed:
        return f"about {needed} cycles would be needed"
    return (
        f"about {needed} cycles ({span[0]}–{span[1]} across the spread's 80% interval; more if "
        "the effect is smaller than observed) would be needed"
    )


def power_warnings(
    metric: str,
    m: int,
    raw_label: str,
    mean: float,
    sd: float | None,
    needed: int | None,
    delta: float,
    alpha: float,
    margin_pct: float,
    have_spread: bool,
    remedy: str | None = None,
) -> list[str]:
    """benchstat-style "cannot reach significance" warnings, each ending with the remedy."""
    if m == 1:
        more = max(1, (needed or 2) - 1)
        basis = (
            "estimated from the within-block spread, a lower bound"
            if have_spread
            else "the minimum for any interval"
        )
        return [
            f"{metric}: only 1 cycle: no interval; run at least {more} more cycle(s) ({basis}; "
            f"{remedy or resume_hint(1 + more)})"
        ]
    if raw_label != "inconclusive" or sd is None or needed is None:
        return []
    if needed > m:
        target = needed
        why = (
            f"per-cycle SD {sd:.4f} (log) is too large for {m} cycles; if the effect is as "
            f"observed ({pct_change(mean)}), about {needed} cycles decide it (80% power, "
            f"±{margin_pct:g}% margin)"
        )
    else:
        # Enough power for the margin, but D̄ sits near it: narrow the 90% CI past the margin.
        target = max(m + 1, _cycles_to_clear(sd, abs(delta - abs(mean)), alpha))
        why = (
            f"the effect {pct_change(mean)} sits near the ±{margin_pct:g}% margin; about {target} "
            "cycles would narrow the interval enough to decide"
        )
    return [
        f"{metric}: inconclusive: {why}; run at least {target - m} more cycle(s) "
        f"({remedy or resume_hint(target)})"
    ]
