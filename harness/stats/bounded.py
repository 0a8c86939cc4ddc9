"""An interval for the mean of values in [0, 1] that holds whatever their distribution.

The equivalence endpoint's agreements (docs/design.md#canaries-and-equivalence) are shares in
[0, 1] and, for a good lossy change, mostly exactly 1: eight prompts that all agree have no
spread, and a t interval over them is the single point 1, although one prompt in twenty could
diverge unseen. A simulation over such data (tests/stats/test_bounded.py) has the t interval's
lower bound above the true mean in up to 70% of campaigns, where a 95% interval allows 2.5%.

So the interval is Clopper-Pearson's on the sum of the values, as if each were a coin with
that chance of heads: a value in [0, 1] with mean m is less spread than a coin with chance m,
so the binomial's interval is wide enough for it (conservative for values strictly inside, exact
for coins). Its price is width: n values that all equal 1 bound the mean below by
(alpha/2)^(1/n), so showing 0.9 needs 35 of them and 0.8 needs 17; :func:`needed_for_lower`
says how many.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.stats.distributions import beta_ppf
from harness.stats.fewest import fewest


def unit_mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided ``confidence`` interval for the mean of ``values`` (each in [0, 1])."""
    n = len(values)
    if n == 0:
        return 0.0, 1.0
    total = min(float(n), max(0.0, float(sum(values))))
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if total <= 0.0 else beta_ppf(tail, total, n - total + 1.0)
    high = 1.0 if total >= n else beta_ppf(1.0 - tail, total + 1.0, n - total)
    return low, high


def needed_for_lower(mean: float, floor: float, confidence: float = 0.95) -> int | None:
    """How many values with this ``mean`` put the interval's lower bound at ``floor`` or above;
    None when no count can (the mean is not above the floor)."""
    if mean <= floor:
        return None
    return fewest(lambda n: unit_mean_interval([mean] * n, confidence)[0] >= floor)


def needed_for_upper(mean: float, floor: float, confidence: float = 0.95) -> int | None:
    """How many values with this ``mean`` put the interval's upper bound below ``floor``; None
    when no count can (the mean is not below the floor)."""
    if mean >= floor:
        return None
    return fewest(lambda n: unit_mean_interval([mean] * n, confidence)[1] < floor)


__all__ = ["needed_for_lower", "needed_for_upper", "unit_mean_interval"]
