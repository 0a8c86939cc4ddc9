"""Simulated campaigns of one design, decided the way the analysis decides them, vectorised.

For ``harness bench sequential`` (10⁵ campaigns a case), for the cycles a design is likely to
need (:func:`stopping_distribution`, fixed and sequential designs alike) and for pricing designs
(harness.analyze.design_cost). A :class:`Layout` lays out the runs as the planner does — the
ABBA/BAAB alternation, a washout before every block or none, interleaved lanes of other
treatments, a fleet dealing cycles to boxes (harness.plan.build) — and a :class:`Scenario` says
what each box does: the arm, block noise (normal or heavy-tailed), linear drift, steps, and
carry-over of every first-order kind (into the control, into the candidate, heat after any
candidate block) and of the second order, and a box × arm interaction. Each block's value
depends on what ran before it on its box, washouts included.

Every look applies the labels of :func:`harness.stats.decision.compare_cycles` to all campaigns
at once: the order-balanced D̄ and its t-interval, the margin, TOST, and for unwashed blocks the
deployed-effect check on the crossover model (fail closed below MIN_CARRY_CYCLES cycles). Drift
flags (*confounded*) are left out: they need the per-cycle thresholds of
:mod:`harness.stats.drift` and would only hold labels back. The tests check these labels
against compare_cycles campaign by campaign.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from harness.stats.crossover import MIN_CARRY_CYCLES, fit_terms_many
from harness.stats.cycles import Cycle, FloatArray
from harness.stats.distributions import t_isf
from harness.stats.fewest import fewest
from harness.stats.layout import cycle_pattern, fleet_box
from harness.stats.sequential_t import balanced_t, balanced_weights

BETTER, WORSE, WITHIN, INCONCLUSIVE, CARRY = 0, 1, 2, 3, 4
CODES = {BETTER: "better", WORSE: "worse", WITHIN: "within noise", INCONCLUSIVE: "inconclusive"}
CODES[CARRY] = "carry-over"
DECIDED = (BETTER, WORSE, WITHIN)


def order_of(cycle: int) -> str:
    """The planner's alternation: ABBA for even cycles, BAAB for odd ones."""
    return cycle_pattern(cycle)


@dataclass(frozen=True)
class Scenario:
    """What the simulated box does (log scale). The compared cell is "B", the control "A";
    "a candidate block" is any cell's but the control's (another treatment's too)."""

    effect: float = 0.0  # τ: a candidate block after a control block, against A after A
    block_sd: float = 0.06
    heavy_tails: bool = False  # block noise Student t on 3 df, scaled to block_sd
    drift_sd: float = 0.0  # SD of each box's linear drift per block
    step: float = 0.0  # size of a step inside a cycle
    step_chance: float = 0.0  # chance of a step per cycle
    carry_control: float = 0.0  # a control block right after a candidate block moves by this
    carry_candidate: float = 0.0  # a candidate block right after a candidate block
    carry_after_control: float = 0.0  # a candidate block right after a control block
    heat: float = 0.0  # any block right after a candidate block, itself included
    second_control: float = 0.0  # a control block two after a candidate block
    interaction_sd: float = 0.0  # SD of each box's own arm effect (box × arm interaction)
    # The boxes' own effects centred on these boxes (their mean is 0): the null of a verdict
    # about the boxes that ran (analysis.boxes: fixed). Uncentred, the null is about boxes
    # like these, whose mean is 0 and whose two drawn here are not (analysis.boxes: random).
    interaction_centred: bool = False

    @property
    def deployed(self) -> float:
        """The candidate after itself against the control after itself: what deploying it
        changes (the estimand): τ + carry into a candidate after a candidate + heat."""
        return self.effect + self.carry_candidate + self.heat

    def null(self) -> Scenario:
        """The same box with the arm set so the deployed effect is exactly 0."""
        return replace(self, effect=self.effect - self.deployed)


@dataclass(frozen=True)
class Layout:
    """How the runs are laid out: the planner's order for one cell, cache state and box, with a
    washout before every block (its share of a block; 0 for none), ``treatments`` lanes per
    cycle (the compared cell's first) and ``boxes`` boxes dealt cycles as a fleet is."""

    washout: float = 0.0
    treatments: int = 1
    boxes: int = 1
    random_boxes: bool = False  # a fleet's interval between boxes (analysis.boxes: random)
    # Each block boots its own runtime and the box's state is probed (design.washed_by: boot):
    # decided as washed whatever the washout's length. The boot clears nothing of the box, so
    # the blocks still carry its state; the probe's check is what must catch it.
    washed_by_boot: bool = False

    @property
    def sends_washout(self) -> bool:
        """Requests of the block's own arm, not scored, run before every block."""
        return self.washout > 0

    @property
    def washed(self) -> bool:
        """Every block follows a washout of at least a whole block of its own arm, so the
        decision may read D̄ as the deployed effect. A shorter one is traffic that clears what
        it clears, priced as such: the blocks are decided as unwashed (the crossover model's
        deployed-effect check), not as if the washout had been whole."""
        return self.washout >= 1.0 or self.washed_by_boot

    @property
    def washout_units(self) -> int:
        """How many orders of carry-over a washout absorbs: one for every whole block of
        traffic it lasts. In traffic time a block's worth of the arm's own requests clears one
        block of after-effects, so after a one-block washout the scored block is the second
        block after the switch and second-order carry-over reaches it; a part of a block clears
        no whole order (it once counted as one, and a one-block washout as two: an audit
        measured what that let through, and harness.stats.traffic_sim models why)."""
        return math.floor(self.washout) if self.sends_washout else 0


@dataclass(frozen=True)
class _Unit:
    box: int
    cycle: int
    lane: int
    slot: int
    cell: int  # 0 the control, 1.. the treatments (1 is the compared one)
    scored: bool
    length: float


def planned_blocks(layout: Layout, cycles: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Every block as the planner lays them out, in order (each box runs its share in this
    order): its cycle, lane, box, slot and cell (0 the control, 1.. the treatments)."""
    boxes = [str(b) for b in range(layout.boxes)]
    for j in range(cycles):
        lanes = list(range(layout.treatments))
        for lane in lanes if j % 2 == 0 else lanes[::-1]:
            box = int(fleet_box(boxes, j, lane))
            for slot, arm in enumerate(cycle_pattern(j)):
                yield j, lane, box, slot, 0 if arm == "A" else 1 + lane


def _units(layout: Layout, cycles: int) -> list[_Unit]:
    """Every block and washout in the planner's order."""
    out: list[_Unit] = []
    for j, lane, box, slot, cell in planned_blocks(layout, cycles):
        parts = layout.washout_units  # one unit per order of carry-over it absorbs
        for _ in range(parts):
            out.append(_Unit(box, j, lane, slot, cell, False, layout.washout / parts))
        # A washout shorter than a block absorbs no order: it only takes time.
        rest = layout.washout if layout.sends_washout and not parts else 0.0
        out.append(_Unit(box, j, lane, slot, cell, True, 1.0 + rest))
    return out


def _label(cell: int | None) -> str:
    return "-" if cell is None else "A" if cell == 0 else "B" if cell == 1 else "X"


@dataclass(frozen=True)
class _Sequence:
    """A layout's units as arrays: each unit's cell, box, what ran one and two before it on
    its box (-1: nothing), when it started on its box (in blocks), and the compared lane's
    scored blocks (``keep``)."""

    cell: npt.NDArray[np.int64]
    box: npt.NDArray[np.int64]
    prev: npt.NDArray[np.int64]
    prev2: npt.NDArray[np.int64]
    clock: FloatArray
    keep: npt.NDArray[np.bool_]


@lru_cache(maxsize=256)
def _sequence(layout: Layout, cycles: int) -> _Sequence:
    units = _units(layout, cycles)
    prev = np.full(len(units), -1)
    prev2 = np.full(len(units), -1)
    clock = np.zeros(len(units))
    seen: dict[int, list[int]] = {}
    elapsed: dict[int, float] = {}
    for i, u in enumerate(units):
        history = seen.setdefault(u.box, [])
        prev[i] = history[-1] if history else -1
        prev2[i] = history[-2] if len(history) > 1 else -1
        clock[i] = elapsed.get(u.box, 0.0)
        elapsed[u.box] = clock[i] + u.length
        history.append(u.cell)
    return _Sequence(
        np.array([u.cell for u in units]),
        np.array([u.box for u in units]),
        prev,
        prev2,
        clock,
        np.array([u.scored and u.lane == 0 for u in units]),
    )


@lru_cache(maxsize=256)
def _layout_cycles(layout: Layout, cycles: int) -> tuple[Cycle, ...]:
    return tuple(layout_cycles(layout, cycles))


def layout_cycles(layout: Layout, cycles: int) -> list[Cycle]:
    """The compared lane's cycles as the analysis builds them: order, what ran on the box before
    each block (before its washout, if washed) and whether it was washed; values 0."""
    seq = _sequence(layout, cycles)
    scored = np.flatnonzero(seq.keep)
    # A washout runs on the same box right before its block: what ran before the block's
    # washout is what ran before the washout's own turn.
    ran = seq.prev[scored - layout.washout_units]
    labels = [_label(None if int(c) < 0 else int(c)) for c in ran]
    out = []
    for j in range(cycles):
        b0, b1, b2, b3 = labels[4 * j : 4 * j + 4]
        out.append(
            Cycle(j, order_of(j), (0.0, 0.0, 0.0, 0.0), before=(b0, b1, b2, b3),
                  washed=layout.washed, box=_cycle_box(layout, j))
        )  # fmt: skip
    return out


def _cycle_box(layout: Layout, cycle: int) -> str | None:
    """The box the compared lane's cycle runs on (None on one box)."""
    if layout.boxes < 2:
        return None
    return fleet_box([str(b) for b in range(layout.boxes)], cycle, 0)


def between_boxes_se(
    effects: FloatArray,
    mean: FloatArray,
    se: FloatArray,
    boxes: Sequence[str | None],
    weights: FloatArray | None = None,
) -> tuple[FloatArray, int | None]:
    """D̄'s SE between boxes for every campaign (row of ``effects``) at once, never below the
    cycle-level ``se``, and its df; the cycle-level SE and None on one box. ``weights`` are the
    cycles' in D̄ (default: the planner's alternation). See
    :func:`harness.stats.effect.between_boxes` for why."""
    names = sorted({b for b in boxes if b is not None})
    if len(names) < 2 or any(b is None for b in boxes):
        return se, None
    w = balanced_weights(effects.shape[1]) if weights is None else weights
    total = np.zeros(effects.shape[0])
    for name in names:
        mine = np.asarray([b == name for b in boxes])
        share = float(w[mine].sum())
        box_mean = (effects[:, mine] @ w[mine]) / share
        total += (share * (box_mean - mean)) ** 2
    n = len(names)
    out: FloatArray = np.maximum(np.sqrt(total * n / (n - 1)), se)
    return out, n - 1


def simulate_blocks(
    rng: np.random.Generator,
    n: int,
    cycles: int,
    scenario: Scenario,
    layout: Layout | None = None,
) -> npt.NDArray[np.float64]:
    """The compared lane's block values: n campaigns × 4·cycles blocks in time order."""
    layout = layout or Layout()
    seq = _sequence(layout, cycles)
    cell, box, prev, prev2, clock, keep = (
        seq.cell, seq.box, seq.prev, seq.prev2, seq.clock, seq.keep
    )  # fmt: skip
    is_b, is_a = cell == 1, cell == 0
    after_cand, two_after = prev > 0, prev2 > 0
    s = scenario
    shift = (
        s.effect * is_b
        + s.carry_control * (is_a & after_cand)
        + s.carry_candidate * (~is_a & after_cand)
        + s.carry_after_control * (~is_a & (prev == 0))
        + s.heat * after_cand
        + s.second_control * (is_a & two_after)
    )[keep]
    width = int(keep.sum())
    if s.heavy_tails:
        noise = rng.standard_t(3, (n, width)) / np.sqrt(3.0)
    else:
        noise = rng.standard_normal((n, width))
    y: npt.NDArray[np.float64] = 4.0 + s.block_sd * noise + shift[None, :]
    on_box = box[keep]
    if s.drift_sd:
        slopes = rng.normal(0.0, s.drift_sd, (n, layout.boxes))
        y += slopes[:, on_box] * clock[keep][None, :]
    if s.interaction_sd:
        own = rng.normal(0.0, s.interaction_sd, (n, layout.boxes))
        if s.interaction_centred:
            own -= own.mean(axis=1, keepdims=True)
        y += own[:, on_box] * is_b[keep][None, :]
    if s.step and s.step_chance:
        for j in range(cycles):
            hit = rng.random(n) < s.step_chance
            sign = rng.choice([-1.0, 1.0], size=n)
            start = rng.integers(0, 3, size=n)  # the step lands after slot start
            after = np.arange(4)[None, :] > start[:, None]
            y[:, 4 * j : 4 * j + 4] += (hit * sign * s.step)[:, None] * after
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
    blocks: npt.NDArray[np.float64],
    margin: float,
    alpha: float,
    *,
    layout: Layout | None = None,
    design: Sequence[Cycle] | None = None,
    carry_check: bool = True,
) -> npt.NDArray[np.int8]:
    """The label code of every campaign (rows of ``blocks``), higher is better.

    ``design`` gives the cycles' orders and what ran before each block (default: the
    ``layout``'s, :func:`layout_cycles`); ``carry_check`` False decides on D̄ alone.
    """
    layout = layout or Layout()
    m = blocks.shape[1] // 4
    effects = cycle_effects(blocks)
    mean, se = balanced_t(effects)
    codes = np.full(mean.shape, INCONCLUSIVE, dtype=np.int8)
    if m < 2:
        return codes
    cycles = tuple(design) if design is not None else _layout_cycles(layout, m)
    df = m - 1
    if layout.random_boxes:
        se, box_df = between_boxes_se(effects, mean, se, [c.box for c in cycles])
        df = df if box_df is None else box_df
    t95 = t_isf(alpha / 2.0, df)
    t90 = t_isf(alpha, df)
    within = (mean - t90 * se > -margin) & (mean + t90 * se < margin)
    codes[within] = WITHIN
    significant = (np.abs(mean) > t95 * se) & (np.abs(mean) >= margin)
    codes[significant & (mean > 0)] = BETTER
    codes[significant & (mean < 0)] = WORSE
    if not carry_check:
        return codes
    washed = all(c.washed for c in cycles)
    terms = fit_terms_many(cycles, blocks) if m >= MIN_CARRY_CYCLES else None
    if terms is None or not terms.with_carry:
        if not washed:
            codes[significant] = CARRY  # nothing estimates the carry-over: fail closed
        return codes
    level = t_isf(alpha / 2.0, terms.df)
    if washed:
        # The washout's evidence: where carry-over it should have cleared is still beyond
        # noise, the label needs the deployed effect too (it can only be withheld here).
        left = np.zeros(mean.shape, dtype=bool)
        for name in ("carry_control", "carry_candidate"):
            estimate, se = terms.estimate[name], terms.se[name]
            left |= np.abs(estimate) > level * se
    else:
        left = np.ones(mean.shape, dtype=bool)
    half = level * terms.se["deployed"]
    deployed = terms.estimate["deployed"]
    unsupported = np.where(mean > 0, deployed - half <= 0, deployed + half >= 0)
    codes[significant & left & unsupported] = CARRY
    return codes


def run_looks(
    blocks: npt.NDArray[np.float64],
    looks: list[int],
    level: Callable[[int], float],
    margin: float,
    *,
    layout: Layout | None = None,
    carry_check: bool = True,
    held: Callable[[int], bool] | None = None,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """The label each campaign stops on and the cycles it used, looking at ``looks``.
    ``held(m)`` True withholds every *better*/*worse* at the look of m cycles (a box state
    the probes found unsettled: harness.stats.box_state)."""
    n = blocks.shape[0]
    final = np.full(n, INCONCLUSIVE, dtype=np.int8)
    used = np.full(n, looks[-1], dtype=np.int64)
    running = np.ones(n, dtype=bool)
    for m in looks:
        codes = decide_many(
            blocks[:, : 4 * m], margin, level(m), layout=layout, carry_check=carry_check
        )
        if held is not None and held(m):
            codes[(codes == BETTER) | (codes == WORSE)] = CARRY
        decided = running & np.isin(codes, DECIDED)
        final[decided] = codes[decided]
        used[decided] = m
        running &= ~decided
        final[running] = codes[running]
    return final, used


@dataclass(frozen=True)
class Stopping:
    """How a design would end if the effect and spread are as observed."""

    decided_share: float  # campaigns decided (better, worse or within noise) by the last look
    cycles_80: int | None  # cycles by which 80% of all campaigns are decided; None if never
    mean_cycles: float  # mean cycles used, undecided campaigns counted at the last look


def stopping_distribution(
    looks: list[int],
    level: Callable[[int], float],
    mean: float,
    spread: float,
    margin: float,
    *,
    layout: Layout | None = None,
    campaigns: int = 2000,
    seed: int = 0,
) -> Stopping:
    """Simulate the design at the observed effect: D's spread ``spread`` is one block's noise
    (Var D = σ²_block for independent blocks), the labels as the analysis gives them."""
    rng = np.random.default_rng(seed)
    scenario = Scenario(effect=mean, block_sd=max(spread, 1e-12))
    blocks = simulate_blocks(rng, campaigns, looks[-1], scenario, layout)
    codes, used = run_looks(blocks, looks, level, margin, layout=layout)
    decided = np.isin(codes, DECIDED)
    share = float(decided.mean())
    cycles_80: int | None = None
    if share >= 0.8:
        cycles_80 = int(np.quantile(np.where(decided, used, looks[-1] + 1), 0.8, method="higher"))
    return Stopping(share, cycles_80, float(used.mean()))


def fixed_cycles_needed(
    mean: float,
    spread: float,
    margin: float,
    alpha: float,
    *,
    layout: Layout | None = None,
    start: int = 2,
    most: int = 100,
    campaigns: int = 2000,
    seed: int = 0,
) -> int | None:
    """The fewest cycles at which a fixed design decides 80% of simulated campaigns at the
    observed effect and spread, by the analysis's own rule (carry-over check included); None
    when not even ``most`` cycles would. Searched by doubling, then bisection."""

    def decides(m: int) -> bool:
        stop = stopping_distribution(
            [m], lambda _: alpha, mean, spread, margin,
            layout=layout, campaigns=campaigns, seed=seed,
        )  # fmt: skip
        return stop.decided_share >= 0.8

    return fewest(decides, start=max(2, start), most=most)  # one cycle has no spread


__all__ = [
    "BETTER",
    "CARRY",
    "CODES",
    "INCONCLUSIVE",
    "WITHIN",
    "WORSE",
    "Layout",
    "Scenario",
    "Stopping",
    "cycle_effects",
    "decide_many",
    "fixed_cycles_needed",
    "layout_cycles",
    "planned_blocks",
    "run_looks",
    "simulate_blocks",
    "stopping_distribution",
]
