"""``harness bench sequential``: what sequential looks cost in errors and save in cycles.

Simulates mirrored campaigns (2,000 per case; 400 with ``quick``; seeded) and runs each through
the analysis's own comparison (:func:`harness.analyze.stats.compare_cycles`) at every look of a
design that looks after 3 cycles and then after every cycle up to 12. Blocks carry boot-to-boot
noise (6% per block, as a busy two-core box shows), a random linear drift, and in one cycle in
ten a step of ±10%. Side by side, in the same run:

- **A/A, sequential**: false *better* and false decisions (better or worse) with the
  O'Brien–Fleming-type boundaries, against **naive peeking** at the same looks at a fixed α
  (the baseline);
- **+10%, sequential**: power, and the mean cycles used, against a **fixed design** of the
  cycles that gives the same power (found by the exact power formula at the simulated noise,
  then simulated itself).

A campaign stops at the first look where its one metric is decided (better, worse or within
noise), as the sequential loop does with every gated metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from harness.analyze.cycles import Cycle
from harness.analyze.looks import DECIDED_LABELS
from harness.analyze.power import cycles_needed
from harness.analyze.sequential import SequentialPlan
from harness.analyze.stats import compare_cycles
from harness.benchmarks import Figure

FIRST, MAX = 3, 12
ALPHA = 0.05
BLOCK_SD = 0.06
DRIFT_SD = 0.005  # linear drift per slot, drawn per campaign
STEP = 0.10
STEP_CHANCE = 0.1
EFFECT = math.log(1.10)
SEED = 2026


def _campaign(rng: np.random.Generator, effect: float) -> list[Cycle]:
    """MAX cycles of one simulated campaign, alternating ABBA and BAAB as the planner does."""
    beta = rng.normal(0.0, DRIFT_SD)
    cycles = []
    for j in range(MAX):
        order = "ABBA" if j % 2 == 0 else "BAAB"
        t = 4 * j + np.arange(4)
        y = 4.0 + beta * t + rng.normal(0.0, BLOCK_SD, 4)
        y += np.array([effect if arm == "B" else 0.0 for arm in order])
        if rng.random() < STEP_CHANCE:
            y += rng.choice([-STEP, STEP]) * (np.arange(4) > rng.integers(0, 3))
        cycles.append(Cycle(j, order, (y[0], y[1], y[2], y[3])))
    return cycles


def _label(cycles: list[Cycle], alpha: float) -> str:
    return compare_cycles(cycles, metric="decode_tok_s", alpha=alpha, bootstrap_resamples=0).label


def _run(cycles: list[Cycle], level: Callable[[int], float]) -> tuple[str, int]:
    """The label the campaign stops on, and the cycles it used."""
    label = "inconclusive"
    for m in range(FIRST, MAX + 1):
        label = _label(cycles[:m], level(m))
        if label in DECIDED_LABELS:
            return label, m
    return label, MAX


def run_bench(quick: bool = False) -> list[Figure]:
    """Simulate the four cases and report error rates, power and cycles, side by side."""
    n = 400 if quick else 2000
    design = SequentialPlan(FIRST, MAX, 1, ALPHA)
    nominal = {m: design.nominal_alpha(m) for m in design.scheduled()}

    def sequential(m: int) -> float:
        return nominal[m]

    def naive(m: int) -> float:
        return ALPHA

    rng = np.random.default_rng(SEED)
    null = [_campaign(rng, 0.0) for _ in range(n)]
    real = [_campaign(rng, EFFECT) for _ in range(n)]
    seq_null = [_run(c, sequential) for c in null]
    naive_null = [_run(c, naive) for c in null]
    seq_real = [_run(c, sequential) for c in real]

    def false_rate(results: list[tuple[str, int]]) -> float:
        return sum(label in ("better", "worse") for label, _ in results) / n

    seq_false, naive_false = false_rate(seq_null), false_rate(naive_null)
    seq_better = sum(label == "better" for label, _ in seq_null) / n
    power = sum(label == "better" for label, _ in seq_real) / n
    cycles_used = float(np.mean([m for _, m in seq_real]))
    # Per-cycle SD of D: each block's noise enters D with weight ½, so σ_D = BLOCK_SD.
    fixed_m = max(2, min(MAX, cycles_needed(BLOCK_SD, EFFECT, ALPHA, power=min(power, 0.99))))
    fixed_power = sum(_label(c[:fixed_m], ALPHA) == "better" for c in real) / n
    null_cycles = float(np.mean([m for _, m in seq_null]))
    return [
        Figure(
            "A/A false better, sequential",
            seq_better * 100,
            "%",
            f"{n} campaigns, looks at {FIRST}..{MAX} cycles",
            f"<= {ALPHA * 110:.1f}%",
            seq_better <= ALPHA * 1.1,
        ),
        Figure("A/A false decisions, sequential", seq_false * 100, "%", "better or worse"),
        Figure("A/A false decisions, naive peeking", naive_false * 100, "%", "α each look"),
        Figure(
            "naive ÷ sequential false decisions",
            naive_false / seq_false if seq_false else math.inf,
            "x",
            "same campaigns, same looks",
        ),
        Figure("A/A mean cycles, sequential", null_cycles, "cycles", "stops on within noise"),
        Figure("+10% power, sequential", power * 100, "%", f"max {MAX} cycles"),
        Figure("+10% mean cycles, sequential", cycles_used, "cycles"),
        Figure("fixed design of equal power", float(fixed_m), "cycles", "exact power formula"),
        Figure(
            "+10% power, that fixed design", fixed_power * 100, "%", "simulated, same campaigns"
        ),
        Figure(
            "sequential ÷ fixed cycles",
            cycles_used / fixed_m,
            "x",
            f"fixed {fixed_m} cycles",
            "< 1",
            cycles_used < fixed_m,
        ),
    ]
