"""The equivalence endpoint's intervals, held to simulated campaigns of known truth.

The scenario bank is drawn here from named distributions whose means are known in closed form,
not from the harness: agreements that are mostly exactly 1 (a good lossy change, where a few
prompts diverge), a skewed share, and coins; per-prompt KL that is lognormal or exponential.
Each interval's one-sided miss rate (the bound the verdict reads lands on the wrong side of the
true mean) must stay within the 2.5% a 95% interval allows (with room for simulation error),
and the t interval the endpoint used before is shown to miss far more often on the same data.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import numpy as np
import pytest

from harness.analyze.equivalence import _CANTELLI
from harness.stats.bounded import needed_for_lower, needed_for_upper, unit_mean_interval
from harness.stats.distributions import t_ppf

Draw = Callable[[np.random.Generator, int], np.ndarray]

AGREEMENTS: dict[str, tuple[Draw, float]] = {
    # share 1 with chance p, else uniform on [0, 1]: mean p + (1 - p) / 2
    "mostly exact, 1 in 20 diverge": (
        lambda g, n: np.where(g.random(n) < 0.95, 1.0, g.random(n)),
        0.975,
    ),
    "mostly exact, 3 in 20 diverge": (
        lambda g, n: np.where(g.random(n) < 0.85, 1.0, g.random(n)),
        0.925,
    ),
    "beta(5, 1)": (lambda g, n: g.beta(5.0, 1.0, n), 5.0 / 6.0),
    "coins": (lambda g, n: (g.random(n) < 0.5).astype(float), 0.5),
}
TRIALS = 2000
ALLOWED_MISS = 0.025 + 3 * math.sqrt(0.025 * 0.975 / TRIALS)  # nominal, plus 3 standard errors


def _t_lower(values: np.ndarray) -> float:
    n = len(values)
    return float(values.mean() - t_ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n))


@pytest.mark.parametrize("name", list(AGREEMENTS))
@pytest.mark.parametrize("n", [8, 32])
def test_the_agreement_lower_bound_is_above_the_truth_rarely(name: str, n: int) -> None:
    draw, truth = AGREEMENTS[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}/{n}".encode()))
    samples = [draw(rng, n) for _ in range(TRIALS)]
    misses = sum(unit_mean_interval(v.tolist())[0] > truth for v in samples) / TRIALS
    assert misses <= ALLOWED_MISS, (name, n, misses)
    if name.startswith("mostly exact") and n == 8:
        # What the endpoint read before: no spread in most samples, a bound of 1.
        t_misses = sum(_t_lower(v) > truth for v in samples) / TRIALS
        assert t_misses > 0.3, t_misses


def test_all_agreeing_prompts_bound_the_mean_as_the_rule_of_three_says() -> None:
    # n values of 1: the lower bound is 0.025^(1/n), the chance of n heads at that rate.
    for n in (1, 8, 36):
        assert unit_mean_interval([1.0] * n)[0] == pytest.approx(0.025 ** (1 / n))
    assert needed_for_lower(1.0, 0.9) == 36 and needed_for_lower(1.0, 0.8) == 17
    assert needed_for_lower(0.85, 0.9) is None  # a mean under the floor: no count shows it
    # The other way: a mean of 0.67 against 0.8 needs this many prompts to be shown below it.
    n = needed_for_upper(0.67, 0.8)
    assert n is not None and unit_mean_interval([0.67] * n)[1] < 0.8
    assert unit_mean_interval([0.67] * (n - 1))[1] >= 0.8
    assert needed_for_upper(0.85, 0.8) is None
    assert unit_mean_interval([]) == (0.0, 1.0)


KL: dict[str, tuple[Draw, float]] = {
    "lognormal sigma 1": (lambda g, n: g.lognormal(-5.0, 1.0, n), math.exp(-5.0 + 0.5)),
    "exponential": (lambda g, n: g.exponential(0.01, n), 0.01),
}


@pytest.mark.parametrize("name", list(KL))
def test_the_kl_upper_bound_is_below_the_truth_rarely(name: str) -> None:
    draw, truth = KL[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n = 16
    misses = t_misses = 0
    for _ in range(TRIALS):
        v = draw(rng, n)
        spread = v.std(ddof=1) / math.sqrt(n)
        misses += v.mean() + _CANTELLI * spread < truth
        t_misses += v.mean() + t_ppf(0.975, n - 1) * spread < truth
    assert misses / TRIALS <= ALLOWED_MISS, (name, misses / TRIALS)
    if name.startswith("lognormal"):
        assert t_misses / TRIALS > 0.1  # the t bound misses several times what it should
