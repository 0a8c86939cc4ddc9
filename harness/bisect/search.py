"""Which build to measure next, and what the calls so far conclude: a bisect's pure logic.

docs/design.md#bisect. Builds are in history order; the first is the known good one and the
last the bad one. The first step measures the bad build against the good one (the
reproduction): *worse* goes on, *within noise* or *better* ends with no culprit, anything else
ends undecided. Each later step measures the build halfway between the last build called good
and the first called bad; a build that stays undecided is skipped, as ``git bisect skip``
does, and the nearest untried build in the range is measured instead. The search ends when the
good and bad builds are neighbours (the culprit), or when only skipped builds lie between them
(the culprit is one of those or the first bad one; the bisect names the range).

The same class runs ``harness bisect`` and the simulated histories of ``harness bench
bisect``, so the bench measures the search the verb performs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from harness.errors import BadInput
from harness.stats.build_step import StepCall


class Outcome(StrEnum):
    """How a bisect ended (or that it has not)."""

    RUNNING = "running"
    CULPRIT = "culprit"  # the first bad build, its parent called good
    RANGE = "range"  # the culprit lies among skipped builds and the first one called bad
    NO_CULPRIT = "no culprit"  # the bad build did not reproduce: within noise of the good one
    UNDECIDED = "undecided"  # the reproduction itself stayed undecided


def call_from_label(label: str) -> StepCall:
    """The reproduction's call from its campaign's label: *worse* reproduces the regression,
    *within noise* or *better* does not, anything else is undecided."""
    if label == "worse":
        return StepCall.BAD
    return StepCall.GOOD if label in ("within noise", "better") else StepCall.UNDECIDED


@dataclass(frozen=True)
class Measured:
    """One step's result: its build, its call, and the effect it measured (log, higher is
    better) with that effect's standard error."""

    build: int
    call: StepCall
    effect: float
    se: float | None


@dataclass
class Search:
    """A bisect over ``count`` builds: index 0 good, ``count - 1`` bad."""

    count: int
    steps: list[Measured] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.count < 2:
            raise BadInput(f"a bisect needs a good and a bad build, got {self.count} builds")

    def calls(self) -> dict[int, StepCall]:
        """Each measured build's call (a build is measured once)."""
        return {m.build: m.call for m in self.steps}

    @property
    def reproduced(self) -> Measured | None:
        """The reproduction step, once taken."""
        return self.steps[0] if self.steps else None

    def bounds(self) -> tuple[int, int]:
        """(last build called good, first build called bad) so far."""
        calls = self.calls()
        bad = min((b for b, c in calls.items() if c is StepCall.BAD), default=self.count - 1)
        good = max((b for b, c in calls.items() if c is StepCall.GOOD and b < bad), default=0)
        return good, bad

    def skipped(self) -> list[int]:
        """Builds that stayed undecided, in history order."""
        return sorted(b for b, c in self.calls().items() if c is StepCall.UNDECIDED)

    def outcome(self) -> Outcome:
        """Where the search stands."""
        first = self.reproduced
        if first is None:
            return Outcome.RUNNING
        if first.call is StepCall.GOOD:
            return Outcome.NO_CULPRIT
        if first.call is StepCall.UNDECIDED:
            return Outcome.UNDECIDED
        good, bad = self.bounds()
        if bad - good == 1:
            return Outcome.CULPRIT
        return Outcome.RUNNING if self.next_build() is not None else Outcome.RANGE

    def next_build(self) -> int | None:
        """The build to measure next; None when the search is over."""
        if not self.steps:
            return self.count - 1
        if self.steps[0].call is not StepCall.BAD:
            return None
        good, bad = self.bounds()
        measured = self.calls()
        untried = [b for b in range(good + 1, bad) if b not in measured]
        if not untried:
            return None
        middle = (good + bad) / 2.0
        return min(untried, key=lambda b: (abs(b - middle), b))

    def record(self, measured: Measured) -> None:
        """Add a step's result; it must be for the build :meth:`next_build` named."""
        expected = self.next_build()
        if measured.build != expected:
            raise ValueError(f"step for build {measured.build}, but {expected} was next")
        self.steps.append(measured)

    def regression(self) -> float:
        """δ̂: the regression each search step tests for, pooled over every build called bad
        (precision-weighted; equal weights where a step has no SE)."""
        bad = [m for m in self.steps if m.call is StepCall.BAD]
        if not bad:
            raise ValueError("no build has been called bad yet")
        precise = all(m.se for m in bad)
        weights = [1.0 / (m.se * m.se) if precise and m.se else 1.0 for m in bad]
        return math.fsum(w * m.effect for w, m in zip(weights, bad, strict=True)) / math.fsum(
            weights
        )

    def culprit_range(self) -> tuple[int, int]:
        """(first, last) candidates for the culprit: one build when found."""
        good, bad = self.bounds()
        return good + 1, bad


__all__ = ["Measured", "Outcome", "Search", "call_from_label"]
