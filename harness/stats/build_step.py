"""A bisect step's test: is this build as fast as the good one, or as slow as the bad one?

docs/design.md#bisect. Once the bad build has reproduced its regression against the good one
(an ordinary campaign's *worse*, its effect δ̂ measured), every later step asks a narrower
question than a campaign's labels do: which of two known levels — 0 (the good build's) or δ̂
(the bad one's) — does this build sit at? Wald's sequential probability ratio test answers
that in the fewest cycles; deciding each step by the labels instead (*within noise* needs the
interval inside ±margin) costs 1.5x the box time at 3% block noise and a 5% regression
(``harness bench bisect``: 317 against 476 block-times a bisect, culprits 98.9% against 99.6%).

Each look takes the order-balanced D̄ and its SE over the step's cycles (the same estimator as
:func:`harness.stats.effect.balanced_effect`), and the normal log-likelihood ratio of δ̂
against 0, ``(δ̂·D̄ − δ̂²/2) / SE²``, is held against Wald's bounds ``ln((1 − β)/α)`` (*bad*)
and ``ln(β/(1 − α))`` (*good*). The SE is estimated from the step's own cycles, which makes
early looks overconfident (at α = β = 1% and a first look at 3 cycles the errors were 2% each
way); the first look is at 6 cycles and α = β = 0.05%, which the bench holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from harness.errors import BadInput


class StepCall(StrEnum):
    """What a bisect step found its build to be."""

    GOOD = "good"  # as fast as the good build (or faster)
    BAD = "bad"  # as slow as the bad build
    UNDECIDED = "undecided"  # neither at the step's last look


@dataclass(frozen=True)
class StepDesign:
    """A bisect's step sizes and error rates (the defaults are what the bench holds)."""

    first_cycles: int = 6  # the first look of a search step
    max_cycles: int = 24  # a search step's last look: past it the build stays undecided
    error: float = 0.0005  # Wald's α = β for a search step
    reproduce_max_cycles: int = 24  # the reproduction campaign's last sequential look

    def __post_init__(self) -> None:
        if not 3 <= self.first_cycles <= self.max_cycles:
            raise BadInput(
                f"a bisect step needs 3 <= first cycles <= max cycles, got {self.first_cycles} "
                f"and {self.max_cycles}"
            )
        if not 0.0 < self.error < 0.5:
            raise BadInput(f"a bisect step's error rate lies in (0, 0.5), got {self.error}")
        if self.reproduce_max_cycles < 3:
            raise BadInput(
                f"the reproduction needs at least 3 cycles, got {self.reproduce_max_cycles}"
            )

    @property
    def bounds(self) -> tuple[float, float]:
        """Wald's (lower, upper) bounds on the log-likelihood ratio."""
        a = self.error
        return math.log(a / (1.0 - a)), math.log((1.0 - a) / a)


def log_likelihood_ratio(mean: float, se: float, delta: float) -> float:
    """ln L(δ)/L(0) for an effect estimate ``mean`` with standard error ``se``."""
    return (delta * mean - delta * delta / 2.0) / (se * se)


def call_step(mean: float, se: float | None, delta: float, design: StepDesign) -> StepCall | None:
    """The step's call at one look, or None to look again.

    ``mean`` and ``delta`` are log effects signed so that higher is better (δ̂ < 0: the bad
    build is slower); ``se`` None (too few cycles) decides nothing, and 0 (a deterministic
    metric, every cycle the same) calls the nearer level.
    """
    if se is None or not math.isfinite(se):
        return None
    lower, upper = design.bounds
    if se <= 0.0:
        return StepCall.GOOD if abs(mean) < abs(mean - delta) else StepCall.BAD
    llr = log_likelihood_ratio(mean, se, delta)
    if llr >= upper:
        return StepCall.BAD
    if llr <= lower:
        return StepCall.GOOD
    return None


__all__ = ["StepCall", "StepDesign", "call_step", "log_likelihood_ratio"]
