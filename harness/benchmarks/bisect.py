"""``harness bench bisect``: simulated histories of 16 builds, bisected as ``harness bisect`` does.

Each history is 16 builds, the first good and the last bad; with a regression, a random build
(1…15, uniform) and every build after it decode 5% slower; without one, every build is the good
one. Every step is a simulated campaign of the default design (ABBA/BAAB, a whole-block washout
before each block, 3% block noise, :mod:`harness.stats.design_sim`): the reproduction decided
by the analysis's own sequential labels (α 0.05, 3% margin, looks at 3…24 cycles), each search
step by :func:`harness.stats.build_step.call_step` (looks at 5…16 cycles), and the search by
:class:`harness.bisect.search.Search`, the class the verb runs. Side by side on the same
histories' seeds, two baselines: search steps decided by the labels too (*better* or *within
noise* good, *worse* bad, looks at 3…24), and the practice of running each build twice and
calling it by the nearer level with no statistics (one ABBA cycle a step, ``-r 2``).

Figures: the culprit named exactly (target ≥ 95%), mean steps (target ≤ ⌈log₂ 16⌉ + 1 = 5),
"no culprit" without a regression (target ≥ 97.5%), and box time per bisect in block-times
(each cycle 4 scored blocks and 4 washouts: 8 block-times).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.benchmarks import Figure
from harness.bisect.search import Measured, Outcome, Search, call_from_label
from harness.stats.build_step import StepCall, StepDesign, call_step
from harness.stats.cycles import margin_log
from harness.stats.design_sim import (
    CODES,
    Layout,
    Scenario,
    cycle_effects,
    run_looks,
    simulate_blocks,
)
from harness.stats.sequential import SequentialPlan
from harness.stats.sequential_t import balanced_t

SEED = 7100
BUILDS = 16
REGRESSION = math.log(0.95)
BLOCK_SD = 0.03
MARGIN = margin_log(3.0)
ALPHA = 0.05
LAYOUT = Layout(washout=1.0)
DESIGN = StepDesign()
BLOCK_TIMES_PER_CYCLE = 8  # 4 scored blocks, each after a whole block of washout

Step = Callable[[np.random.Generator, float, float], tuple[StepCall, float, float | None, int]]


def _labelled(rng: np.random.Generator, effect: float, max_cycles: int) -> tuple[int, int, float]:
    """A sequential campaign decided by the labels: (label code, cycles used, D̄)."""
    plan = SequentialPlan(3, max_cycles, 1, ALPHA)
    blocks = simulate_blocks(rng, 1, max_cycles, Scenario(effect=effect, block_sd=BLOCK_SD), LAYOUT)
    codes, used = run_looks(blocks, plan.scheduled(), plan.nominal_alpha, MARGIN, layout=LAYOUT)
    cycles = int(used[0])
    mean, _ = balanced_t(cycle_effects(blocks[:, : 4 * cycles]))
    return int(codes[0]), cycles, float(mean[0])


def _by_label(code: int) -> StepCall:
    return call_from_label(CODES.get(code, "inconclusive"))


def reproduce(rng: np.random.Generator, effect: float) -> tuple[StepCall, float, float | None, int]:
    """The bad build against the good one: the analysis's labels, sequentially."""
    code, cycles, mean = _labelled(rng, effect, DESIGN.reproduce_max_cycles)
    return _by_label(code), mean, None, cycles


def sprt_step(
    rng: np.random.Generator, effect: float, delta: float
) -> tuple[StepCall, float, float | None, int]:
    """A search step as ``harness bisect`` decides it."""
    scenario = Scenario(effect=effect, block_sd=BLOCK_SD)
    effects = cycle_effects(simulate_blocks(rng, 1, DESIGN.max_cycles, scenario, LAYOUT))
    mean = se = 0.0
    for m in range(DESIGN.first_cycles, DESIGN.max_cycles + 1):
        means, ses = balanced_t(effects[:, :m])
        mean, se = float(means[0]), float(ses[0])
        call = call_step(mean, se, delta, DESIGN)
        if call is not None:
            return call, mean, se, m
    return StepCall.UNDECIDED, mean, se, DESIGN.max_cycles


def label_step(
    rng: np.random.Generator, effect: float, _delta: float
) -> tuple[StepCall, float, float | None, int]:
    """Baseline: a search step decided by the labels, as the reproduction is."""
    code, cycles, mean = _labelled(rng, effect, DESIGN.reproduce_max_cycles)
    return _by_label(code), mean, None, cycles


def twice_step(
    rng: np.random.Generator, effect: float, delta: float
) -> tuple[StepCall, float, float | None, int]:
    """Baseline: one ABBA cycle, the build called by the nearer level, no statistics."""
    scenario = Scenario(effect=effect, block_sd=BLOCK_SD)
    mean = float(cycle_effects(simulate_blocks(rng, 1, 1, scenario, LAYOUT))[0, 0])
    return (StepCall.BAD if mean < delta / 2 else StepCall.GOOD), mean, None, 1


@dataclass
class Tally:
    """What a set of bisects ended with."""

    histories: int = 0
    right: int = 0
    steps: int = 0
    cycles: int = 0

    def share(self) -> float:
        return self.right / self.histories

    def mean_steps(self) -> float:
        return self.steps / self.histories

    def block_times(self) -> float:
        return BLOCK_TIMES_PER_CYCLE * self.cycles / self.histories


def bisect_history(
    rng: np.random.Generator, culprit: int | None, step: Step, first: Step | None = None
) -> tuple[Search, int]:
    """One simulated bisect: the finished search and the cycles it used."""
    search = Search(BUILDS)
    cycles = 0
    while (build := search.next_build()) is not None:
        slower = culprit is not None and build >= culprit
        effect = REGRESSION if slower else 0.0
        if not search.steps:
            call, mean, se, used = (first or _reproduce_step)(rng, effect, 0.0)
        else:
            call, mean, se, used = step(rng, effect, search.regression())
        search.record(Measured(build, call, mean, se))
        cycles += used
    return search, cycles


def _reproduce_step(
    rng: np.random.Generator, effect: float, _delta: float
) -> tuple[StepCall, float, float | None, int]:
    return reproduce(rng, effect)


def tally(histories: int, seed: int, step: Step, regression: bool) -> Tally:
    """Bisect ``histories`` histories with ``step``; a culprit drawn per history or none."""
    rng = np.random.default_rng(seed)
    out = Tally()
    first = twice_step if step is twice_step else _reproduce_step
    for _ in range(histories):
        culprit = int(rng.integers(1, BUILDS)) if regression else None
        search, cycles = bisect_history(rng, culprit, step, first)
        ended = search.outcome()
        if regression:
            found = ended is Outcome.CULPRIT and search.culprit_range()[0] == culprit
        else:
            found = ended is Outcome.NO_CULPRIT
        out.histories += 1
        out.right += int(found)
        out.steps += len(search.steps)
        out.cycles += cycles
    return out


def run_bench(quick: bool = False) -> list[Figure]:
    """Culprits found, steps, box time, and "no culprit" without a regression."""
    n = 100 if quick else 1000
    limit = math.ceil(math.log2(BUILDS)) + 1
    found = tally(n, SEED, sprt_step, True)
    clean = tally(n, SEED + 1, sprt_step, False)
    labels = tally(n, SEED, label_step, True)
    twice = tally(n, SEED, twice_step, True)
    twice_clean = tally(n, SEED + 1, twice_step, False)
    where = f"{n} histories of {BUILDS} builds, -5% at 3% block noise, seed {SEED}"
    return [
        Figure(
            f"culprit named ({where})",
            found.share(),
            "share",
            baseline=f"labels only {labels.share():.3f}, run twice {twice.share():.3f}",
            target=">= 0.95",
            passed=found.share() >= 0.95,
        ),
        Figure(
            "steps per bisect, with a regression",
            found.mean_steps(),
            "steps",
            baseline=f"labels only {labels.mean_steps():.2f}",
            target=f"<= {limit}",
            passed=found.mean_steps() <= limit,
        ),
        Figure(
            "box time per bisect, with a regression",
            found.block_times(),
            "block-times",
            baseline=f"labels only {labels.block_times():.0f} "
            f"({found.block_times() / labels.block_times():.2f}x)",
        ),
        Figure(
            f'"no culprit" without a regression ({n} histories, seed {SEED + 1})',
            clean.share(),
            "share",
            baseline=f"run twice {twice_clean.share():.3f}",
            target=">= 0.975",
            passed=clean.share() >= 0.975,
        ),
        Figure(
            "box time per bisect, without a regression",
            clean.block_times(),
            "block-times",
            baseline=f"{clean.mean_steps():.2f} steps",
        ),
    ]


__all__ = ["bisect_history", "run_bench", "tally"]
