"""Conservative tail percentiles from order statistics: MLPerf LoadGen's early-stopping bounds.

Written from the published definition (MLPerf Inference rules, appendix "Early Stopping
Criterion", github.com/mlcommons/inference_policies ``inference_rules.adoc`` at ac93e89;
LoadGen's ``loadgen/early_stopping.cc`` and ``results.cc``, github.com/mlcommons/inference at
b66003e), not from its code. A latency
sample is *over* when it exceeds the p-quantile; a system that just fails (its under-rate is
p − d, d the tolerance) yields at most t over of n samples with probability
F(t; n, 1 − (p − d)) = I(p − d; n − t, t + 1), the binomial CDF. The fewest samples that
show the p-quantile holds with t over is the smallest n with that probability ≤ 1 − c
(:func:`min_samples`). LoadGen uses c = 0.99 and d = 0, so its logs print "Processed at least
64 queries" at p90 and "would need to process at least 662 total queries" at p99
(``tests/stats/test_tails.py`` reproduces both and the discard counts of published runs).

The estimate LoadGen reports for single- and multi-stream (:func:`upper_bound`): the largest t
with n ≥ min_samples(p, t), the t − 1 highest samples discarded, the highest left reported,
the t-th largest. It is an upper confidence bound on the p-quantile at c, distribution-free:
it falls below the quantile only when at most t − 1 samples exceed it, which a system at the
quantile does with probability F(t − 1; n, 1 − p) ≤ F(t; n, 1 − p) ≤ 1 − c (one order
statistic more conservative than the bound needs; kept, so the figures are LoadGen's). The
lower bound (:func:`lower_bound`) is the same rule on the mirrored sample. Both assume the
samples independent draws, as LoadGen does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import bdtr

# LoadGen's constants (results.cc, EarlyStopping): confidence 0.99, tolerance 0.
CONFIDENCE = 0.99
TOLERANCE = 0.0


def _check(quantile: float, confidence: float, tolerance: float) -> float:
    """The under-rate of the minimally failing system, p − d, after checking the arguments."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    under = quantile - tolerance
    if not 0.0 < under < 1.0:
        raise ValueError(f"quantile - tolerance must lie in (0, 1), got {under}")
    return under


def _chance(over: int, n: int, under: float) -> float:
    """F(over; n, 1 − under): a minimally failing system has at most ``over`` of n over."""
    return float(bdtr(over, n, 1.0 - under))


def min_samples(
    quantile: float,
    over: int = 1,
    *,
    confidence: float = CONFIDENCE,
    tolerance: float = TOLERANCE,
) -> int:
    """The fewest samples (under + over) that show the ``quantile`` holds at ``confidence``
    with ``over`` samples above it: the smallest n with I(p − d; n − t, t + 1) ≤ 1 − c.

    LoadGen's ``MinPassingQueriesFinder`` returns the under count h; this is h + t, the
    total its logs print ("Processed at least 64 queries" at p90, t = 1).
    """
    # The rules say ≤ 1 − c, LoadGen's binary search < 1 − c: they part only on an exact tie.
    under = _check(quantile, confidence, tolerance)
    if over < 0:
        raise ValueError(f"over must be >= 0, got {over}")
    if over == 0:
        # No sample over: the chance is (p − d)^n (early_stopping.cc's first bracket).
        return max(1, math.ceil(math.log(1.0 - confidence) / math.log(under)))
    low, high = over + 1, 2 * (over + 1)
    while _chance(over, high, under) > 1.0 - confidence:  # the chance falls as n grows
        low, high = high + 1, 2 * high
    while low < high:
        middle = (low + high) // 2
        if _chance(over, middle, under) <= 1.0 - confidence:
            high = middle
        else:
            low = middle + 1
    return low


def allowed_over(
    n: int, quantile: float, *, confidence: float = CONFIDENCE, tolerance: float = TOLERANCE
) -> int:
    """The most samples over the quantile that n samples can carry and still show it: the
    largest t ≥ 1 with n ≥ :func:`min_samples` (p, t); 0 when n < min_samples(p, 1).

    LoadGen's single- and multi-stream loop finds it by counting t up; the chance rises with
    t, so a binary search over t finds the same t.
    """
    under = _check(quantile, confidence, tolerance)
    if n <= 1 or _chance(1, n, under) > 1.0 - confidence:
        return 0
    low, high = 1, n - 1  # F(1) passes; the answer lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if _chance(middle, n, under) <= 1.0 - confidence:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class TailBound:
    """One side's conservative bound on a quantile of a sample.

    ``value`` is None when the sample is too small: ``needed`` samples would give one.
    ``rank`` counts from the bound's own end (the t-th largest for an upper bound, the t-th
    smallest for a lower one); LoadGen's "would discard" is ``rank − 1``.
    """

    quantile: float
    side: str  # "upper" or "lower"
    value: float | None
    n: int
    needed: int
    rank: int
    confidence: float

    @property
    def short(self) -> bool:
        """Whether the sample is too small for the bound."""
        return self.value is None


def upper_bound(
    samples: Sequence[float] | np.ndarray,
    quantile: float,
    *,
    confidence: float = CONFIDENCE,
    tolerance: float = TOLERANCE,
) -> TailBound:
    """LoadGen's early-stopping estimate of the ``quantile``: the t-th largest finite sample,
    t = :func:`allowed_over` (n) — at least the point percentile, above the true quantile
    with probability at least ``confidence``."""
    values = np.sort(_finite(samples))
    n = int(values.size)
    needed = min_samples(quantile, 1, confidence=confidence, tolerance=tolerance)
    t = allowed_over(n, quantile, confidence=confidence, tolerance=tolerance)
    value = float(values[n - t]) if t else None
    return TailBound(quantile, "upper", value, n, needed, t, confidence)


def lower_bound(
    samples: Sequence[float] | np.ndarray, quantile: float, *, confidence: float = CONFIDENCE
) -> TailBound:
    """The same rule mirrored: the upper bound of the (1 − p)-quantile of −x, negated — the
    t-th smallest sample, below the true quantile with probability at least ``confidence``."""
    mirrored = upper_bound(-_finite(samples), 1.0 - quantile, confidence=confidence)
    value = None if mirrored.value is None else -mirrored.value
    return TailBound(
        quantile, "lower", value, mirrored.n, mirrored.needed, mirrored.rank, confidence
    )


def _finite(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    kept: np.ndarray = values[np.isfinite(values)]
    return kept


@dataclass(frozen=True)
class TailComparison:
    """A cell's tail against the control's from the two pooled samples' bounds.

    *better* needs the cell's bound on its own side of the control's opposite bound (lower is
    better: the cell's upper bound below the control's lower bound), so each bound failing has
    chance at most 1 − c and a false *better* at most 2(1 − c). *worse* is the mirror claim.
    """

    quantile: float
    cell_upper: TailBound
    cell_lower: TailBound
    control_upper: TailBound
    control_lower: TailBound
    higher_is_better: bool = False

    def _better_pair(self) -> tuple[TailBound, TailBound]:
        """(the cell's bound, the control's bound) a *better* stands on."""
        if self.higher_is_better:
            return self.cell_lower, self.control_upper
        return self.cell_upper, self.control_lower

    def _worse_pair(self) -> tuple[TailBound, TailBound]:
        if self.higher_is_better:
            return self.cell_upper, self.control_lower
        return self.cell_lower, self.control_upper

    @staticmethod
    def _apart(first: TailBound, second: TailBound, first_above: bool) -> bool:
        if first.value is None or second.value is None:
            return False
        return first.value > second.value if first_above else first.value < second.value

    @property
    def better(self) -> bool:
        """The bounds show the cell's tail better than the control's."""
        cell, control = self._better_pair()
        return self._apart(cell, control, first_above=self.higher_is_better)

    @property
    def worse(self) -> bool:
        """The bounds show the cell's tail worse than the control's."""
        cell, control = self._worse_pair()
        return self._apart(cell, control, first_above=not self.higher_is_better)

    @property
    def short(self) -> list[tuple[str, TailBound]]:
        """The arms whose sample is too small for the bound a *better* needs."""
        cell, control = self._better_pair()
        return [(arm, b) for arm, b in (("cell", cell), ("control", control)) if b.short]

    def words(self, unit: str = "") -> str:
        """The verdict of the bounds in one clause, for a gate's reason and a report note."""
        pct = f"p{self.quantile * 100:g}"
        short = self.short
        if short:
            return "; ".join(
                f"inconclusive: the {arm}'s {b.side} bound on {pct} needs {b.needed} samples "
                f"(have {b.n})"
                for arm, b in short
            )
        conf = f"{self._better_pair()[0].confidence * 100:g}%"
        if self.worse:
            cell, control = self._worse_pair()
            claim, where = "show the cell worse", "above" if not self.higher_is_better else "below"
        else:
            cell, control = self._better_pair()
            where = "below" if not self.higher_is_better else "above"
            claim = "show the cell better" if self.better else "overlap"
            where = where if self.better else f"not {where}"
        return (
            f"the {pct} bounds {claim}: the cell's {conf} {cell.side} bound "
            f"{_num(cell.value, unit)} (n={cell.n}) {where} the control's {conf} {control.side} "
            f"bound {_num(control.value, unit)} (n={control.n})"
        )


def _num(value: float | None, unit: str) -> str:
    return "none" if value is None else f"{value:.4g}{' ' + unit if unit else ''}"


def compare_tails(
    control: Sequence[float] | np.ndarray,
    cell: Sequence[float] | np.ndarray,
    quantile: float,
    *,
    confidence: float = CONFIDENCE,
    higher_is_better: bool = False,
) -> TailComparison:
    """Both arms' upper and lower bounds on the ``quantile`` and what they show together."""
    return TailComparison(
        quantile,
        upper_bound(cell, quantile, confidence=confidence),
        lower_bound(cell, quantile, confidence=confidence),
        upper_bound(control, quantile, confidence=confidence),
        lower_bound(control, quantile, confidence=confidence),
        higher_is_better,
    )


__all__ = [
    "CONFIDENCE",
    "TOLERANCE",
    "TailBound",
    "TailComparison",
    "allowed_over",
    "compare_tails",
    "lower_bound",
    "min_samples",
    "upper_bound",
]
