"""Simulated campaigns of one design, decided the way the analysis decides them, vectorised.

For ``harness bench sequential`` (10⁵ campaigns a case) and for the cycles a sequential design
is likely to need (:func:`stopping_distribution`): block values are drawn for N campaigns at
once (arm effect, block noise, linear drift, optional steps, and carry-over into the block after
a candidate block, back to back as the planner runs one cell on one box), and every look applies
the labels of
:func:`harness.analyze.stats.compare_cycles` to all of them: the order-balanced D̄ and its
t-interval, the margin, TOST, and the carry-over check on the crossover model's τ̂. Drift
flags (*confounded*) are left out: they need the per-cycle thresholds of
:mod:`harness.analyze.drift` and would only hold labels back. The tests check these labels
against compare_cycles campaign by campaign.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from harness.analyze.crossover import MIN_CARRY_CYCLES, fit_arm_many
from harness.analyze.cycles import Cycle, FloatArray
from harness.analyze.sequential_t import balanced_t

BETTER, WORSE, WITHIN, INCONCLUSIVE, CARRY = 0, 1, 2, 3, 4
CODES = {BETTER: "better", WORSE: "worse", WITHIN: "within noise", INCONCLUSIVE: "inconclusive"}
CODES[CARRY] = "carry-over"
DECIDED = (BETTER, WORSE, WITHIN)


def order_of(cycle: int) -> str:
    """The planner's alternation: ABBA for even cycles, BAAB for odd ones."""
    return "ABBA" if cycle % 2 == 0 else "BAAB"


@dataclass(frozen=True)
class Scenario:
    """What the simulated box does (log scale)."""

    effect: float = 0.0
    block_sd: float = 0.06
    drift_sd: float = 0.0  # SD of the per-campaign linear drift per slot
    step: float = 0.0  # size of a step inside a cycle
    step_chance: float = 0.0  # chance of a step per cycle
    carry_control: float = 0.0  # a control block after a candidate block moves by this
    carry_candidate: float = 0.0  # a candidate block after a candidate block moves by this


def simulate_blocks(
    rng: np.random.Generator, n: int, cycles: int, scenario: Scenario
) -> npt.NDArray[np.float64]:
    """Block values (n campaigns × 4·cycles blocks in time order) of the planner's alternation."""
    arms = np.array([a == "B" for j in range(cycles) for a in order_of(j)], dtype=bool)
    slots = np.arange(4 * cycles, dtype=np.float64)
    y = 4.0 + rng.normal(0.0, scenario.block_sd, (n, slots.size))
    y += rng.normal(0.0, scenario.drift_sd, (n, 1)) * slots[None, :] if scenario.drift_sd else 0.0
    y += scenario.effect * arms[None, :]
    after_b = np.concatenate([[False], arms[:-1]])
    y += scenario.carry_control * (after_b & ~arms)[None, :]
    y += scenario.carry_candidate * (after_b & arms)[None, :]
    if scenario.step and scenario.step_chance:
        for j in range(cycles):
            hit = rng.random(n) < scenario.step_chance
            sign = rng.choice([-1.0, 1.0], size=n)
            start = rng.integers(0, 3, size=n)  # the step lands after slot start
            after = np.arange(4)[None, :] > start[:, None]
            y[:, 4 * j : 4 * j + 4] += (hit * sign * scenario.step)[:, None] * after
    return y


def cycle_effects(blocks: npt.NDArray[np.float64]) -> FloatArray:
    """Dⱼ per campaign and cycle: ½(B₁ + B₂) − ½(A₁ + A₂)."""
    n, width = blocks.shape
    y = blocks.reshape(n, width // 4, 4)
    inner_minus_outer = 0.5 * (y[:, :, 1] + y[:, :, 2]) - 0.5 * (y[:, :, 0] + y[:, :, 3])
    sign = np.array([1.0 if order_of(j) == "ABBA" else -1.0 for j in range(width // 4)])
    effects: FloatArray = inner_minus_outer * sign[None, :]
    return effects


def decide_many(
    blocks: npt.NDArray[np.float64], margin: float, alpha: float, *, carry_check: bool = True
) -> npt.NDArray[np.int8]:
    """The label code of every campaign (rows of ``blocks``), higher is better."""
    m = blocks.shape[1] // 4
    mean, se = balanced_t(cycle_effects(blocks))
    t95 = float(sps.t.isf(alpha / 2.0, m - 1))
    t90 = float(sps.t.isf(alpha, m - 1))
    codes = np.full(mean.shape, INCONCLUSIVE, dtype=np.int8)
    within = (mean - t90 * se > -margin) & (mean + t90 * se < margin)
    codes[within] = WITHIN
    significant = (np.abs(mean) > t95 * se) & (np.abs(mean) >= margin)
    codes[significant & (mean > 0)] = BETTER
    codes[significant & (mean < 0)] = WORSE
    if carry_check and m >= MIN_CARRY_CYCLES:
        design = [Cycle(j, order_of(j), (0.0, 0.0, 0.0, 0.0)) for j in range(m)]
        arm = fit_arm_many(design, blocks)
        if arm is not None:
            half = float(sps.t.isf(alpha / 2.0, arm.df)) * arm.se
            unsupported = np.where(mean > 0, arm.estimate - half <= 0, arm.estimate + half >= 0)
            codes[significant & unsupported] = CARRY
    return codes


def run_looks(
    blocks: npt.NDArray[np.float64],
    looks: list[int],
    level: Callable[[int], float],
    margin: float,
    *,
    carry_check: bool = True,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """The label each campaign stops on and the cycles it used, looking at ``looks``."""
    n = blocks.shape[0]
    final = np.full(n, INCONCLUSIVE, dtype=np.int8)
    used = np.full(n, looks[-1], dtype=np.int64)
    running = np.ones(n, dtype=bool)
    for m in looks:
        codes = decide_many(blocks[:, : 4 * m], margin, level(m), carry_check=carry_check)
        decided = running & np.isin(codes, DECIDED)
        final[decided] = codes[decided]
        used[decided] = m
        running &= ~decided
        final[running] = codes[running]
    return final, used


__all__ = [
    "BETTER",
    "CARRY",
    "CODES",
    "INCONCLUSIVE",
    "WITHIN",
    "WORSE",
    "Scenario",
    "Stopping",
    "cycle_effects",
    "decide_many",
    "run_looks",
    "simulate_blocks",
    "stopping_distribution",
]


@dataclass(frozen=True)
class Stopping:
    """How a sequential design would end if the effect and spread are as observed."""

    decided_share: float  # campaigns decided (better, worse or within noise) by max_cycles
    cycles_80: int | None  # cycles by which 80% of all campaigns are decided; None if never
    mean_cycles: float  # mean cycles used, undecided campaigns counted at max_cycles


def stopping_distribution(
    looks: list[int],
    level: Callable[[int], float],
    mean: float,
    spread: float,
    margin: float,
    *,
    campaigns: int = 2000,
    seed: int = 0,
) -> Stopping:
    """Simulate the design at the observed effect: D's spread ``spread`` is one block's noise
    (Var D = σ²_block for independent blocks), the labels as the analysis gives them."""
    rng = np.random.default_rng(seed)
    scenario = Scenario(effect=mean, block_sd=max(spread, 1e-12))
    blocks = simulate_blocks(rng, campaigns, looks[-1], scenario)
    codes, used = run_looks(blocks, looks, level, margin)
    decided = np.isin(codes, DECIDED)
    share = float(decided.mean())
    cycles_80: int | None = None
    if share >= 0.8:
        cycles_80 = int(np.quantile(np.where(decided, used, looks[-1] + 1), 0.8, method="higher"))
    return Stopping(share, cycles_80, float(used.mean()))
