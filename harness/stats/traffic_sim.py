"""Campaigns on a box that remembers: carry-over as a state that relaxes with traffic.

The block simulator of :mod:`harness.stats.design_sim` says what a block *is* after another
(a fixed shift for a block after a candidate block); an audit showed that is the decision's own
assumption, and a check built on it cannot find it wrong. Physically, carry-over is a state of
the box or the runtime — a skewed adaptive tier, a page cache, heat, clocks — that every request
moves towards the level of the arm that sends it, whichever arm that is. Here that state is
modelled in traffic time and nothing else:

- ``decay``: S relaxes towards the running arm's target with a half-life of ``life`` blocks of
  traffic (heat, an adaptive tier);
- ``evict``: S moves towards the target at a constant rate and gets there after ``life`` blocks
  of traffic, and never by itself (a page cache: only traffic evicts it).

Every request of arm X is shifted by ``gain[X]·S`` on the log scale. The state starts at the
control's target (a box that ran the control), runs through every washout and block of its box
in the planner's order, and a washout is what it is: that many blocks of the arm's own traffic,
not an order of carry-over cleared. Noise is block noise, as in the block simulator.

The decision's own code decides what this simulates (``harness bench sequential``): nothing
here shares its assumption that carry-over is a shift of the block after a switch. Pure and
seeded: numbers in, arrays out.

What the bank showed. Unprobed, no decision of interleaved blocks can do much better than a
washout: heat with a half-life of blocks sits near its mixed level whatever arm runs, both arms
are measured on the same warm box, and D̄ is the candidate's effect at that temperature. Checks
read from the metric within each boot (a block's washout requests against its scored ones,
pooled over switch and same-arm blocks) and from the inner pairs' trend were tried at a fixed
one-sided 5%: they moved heat at a one-block half-life from 23% to 17–19% false *better* for
2–4 points of power, and were not adopted. Probing the state (:mod:`harness.stats.box_state`) is
what holds every case.

Imports have no probes. Unprobed they hold 13 of 20 cases with and without a warm-up of a tenth
of a block (heat at half a block 4.8% and 3.7%, at two blocks 19.4% and 18.1%; state into the
candidate fails from one block on). :func:`most_powerful_bound` (Neyman–Pearson on the block
means, both scenarios known, the level projected out) bounds any test that holds one null at
α/2, and a test holding every null at once does worse still: one requiring the deployed effect
under a traffic-time state model at every half-life of the bank (a grid, tried and not shipped)
held all 20 cases at ≤ 1.3% and found +5% in 19% of imports (56% at 24 cycles). In alternating
blocks, heat that outlives a block is what a faster candidate looks like; only a probe or a
washout longer than the state tells them apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from harness.stats.box_state import BlockTraffic, StateReading
from harness.stats.cycles import FloatArray
from harness.stats.design_sim import Layout, layout_cycles, planned_blocks
from harness.stats.distributions import norm_cdf, norm_isf

KINDS = ("decay", "evict")


@dataclass(frozen=True)
class BoxState:
    """A state of the box that each request moves towards its arm's target (log-scale gains)."""

    kind: str  # "decay" or "evict"
    life: float  # blocks of traffic: the half-life (decay) or the time to turn over (evict)
    gain_control: float  # a control request's log shift per unit of state
    gain_candidate: float  # a candidate request's (any cell's but the control's)
    target_control: float = 0.0  # where the control's traffic drives the state
    target_candidate: float = 1.0  # where a candidate's traffic drives it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.life > 0:
            raise ValueError(f"life must be positive, got {self.life!r}")

    def run(self, start: float, target: float, length: float) -> tuple[float, float]:
        """The state's mean over ``length`` blocks of traffic towards ``target`` from
        ``start``, and its value at the end."""
        gap = start - target
        if length <= 0 or gap == 0.0:
            return start, start
        if self.kind == "decay":
            rate = math.log(2.0) / self.life
            fall = math.exp(-rate * length)
            return target + gap * (1.0 - fall) / (rate * length), target + gap * fall
        reach = abs(gap) * self.life  # blocks until the state arrives
        step = math.copysign(length / self.life, -gap)
        if reach >= length:
            return start + step / 2.0, start + step
        return target + gap * reach / (2.0 * length), target


@dataclass(frozen=True)
class TrafficScenario:
    """What the simulated box does (log scale): the candidate's intrinsic effect, block noise, a
    state that relaxes with traffic, and a box × arm interaction for fleets."""

    effect: float = 0.0  # the candidate's shift at any fixed state
    block_sd: float = 0.03
    state: BoxState | None = None
    interaction_sd: float = 0.0
    interaction_centred: bool = False  # see design_sim.Scenario

    @property
    def deployed(self) -> float:
        """The candidate at its own steady state against the control at its own."""
        s = self.state
        if s is None:
            return self.effect
        own = s.gain_candidate * s.target_candidate - s.gain_control * s.target_control
        return self.effect + own

    def null(self) -> TrafficScenario:
        """The same box with the intrinsic effect set so the deployed effect is exactly 0."""
        return replace(self, effect=self.effect - self.deployed)


@dataclass(frozen=True)
class _Plan:
    """A layout's traffic in the planner's order, per segment (a washout or a scored block):
    its cell, box and length in blocks, and which segments are the compared lane's scored
    blocks, in time order."""

    cell: npt.NDArray[np.int64]
    box: npt.NDArray[np.int64]
    length: FloatArray
    scored: npt.NDArray[np.int64]


@lru_cache(maxsize=256)
def _plan(layout: Layout, cycles: int) -> _Plan:
    cell: list[int] = []
    box: list[int] = []
    length: list[float] = []
    scored: list[int] = []
    for _, lane, on, _, c in planned_blocks(layout, cycles):
        for size in (layout.washout, 1.0) if layout.sends_washout else (1.0,):
            cell.append(c)
            box.append(on)
            length.append(size)
        if lane == 0:
            scored.append(len(cell) - 1)
    return _Plan(np.array(cell), np.array(box), np.array(length), np.array(scored))


@lru_cache(maxsize=512)
def state_shift(layout: Layout, cycles: int, state: BoxState | None) -> FloatArray:
    """The compared lane's scored blocks' mean log shift from the state, in time order: each
    box's state run through its own traffic in order, from the control's target."""
    plan = _plan(layout, cycles)
    shift = np.zeros(plan.cell.size)
    if state is None:
        return shift[plan.scored]
    level = dict.fromkeys(range(layout.boxes), state.target_control)
    for i in range(plan.cell.size):
        b, control = int(plan.box[i]), int(plan.cell[i]) == 0
        target = state.target_control if control else state.target_candidate
        mean, level[b] = state.run(level[b], target, float(plan.length[i]))
        shift[i] = (state.gain_control if control else state.gain_candidate) * mean
    out: FloatArray = shift[plan.scored]
    return out


def block_means(layout: Layout, cycles: int, scenario: TrafficScenario) -> FloatArray:
    """The compared lane's scored blocks' expected log values, in time order (no noise)."""
    plan = _plan(layout, cycles)
    candidate = (plan.cell[plan.scored] > 0).astype(np.float64)
    means: FloatArray = (
        4.0 + scenario.effect * candidate + state_shift(layout, cycles, scenario.state)
    )
    return means


def most_powerful_bound(
    layout: Layout, cycles: int, null: TrafficScenario, alternative: TrafficScenario, alpha: float
) -> float:
    """The power against ``alternative`` of the most powerful test that holds ``null`` at a
    one-sided ``alpha`` and reads no absolute level (Neyman–Pearson on the block means, both
    scenarios known exactly, the level projected out, block noise known): no decision of these
    blocks, ours or any other, can do better. Independent of the decision's code."""
    gap = block_means(layout, cycles, alternative) - block_means(layout, cycles, null)
    gap = gap - gap.mean()
    distance = float(np.linalg.norm(gap)) / null.block_sd
    return norm_cdf(distance - norm_isf(alpha))


def simulate_traffic(
    rng: np.random.Generator,
    n: int,
    cycles: int,
    scenario: TrafficScenario,
    layout: Layout | None = None,
) -> FloatArray:
    """The compared lane's block values of ``n`` campaigns of ``cycles`` cycles on a box with
    ``scenario``'s state: n × 4·cycles, in time order."""
    layout = layout or Layout()
    plan = _plan(layout, cycles)
    s = scenario
    candidate = (plan.cell[plan.scored] > 0).astype(np.float64)
    base = block_means(layout, cycles, s)
    y: FloatArray = base[None, :] + s.block_sd * rng.standard_normal((n, plan.scored.size))
    if s.interaction_sd:
        own = rng.normal(0.0, s.interaction_sd, (n, layout.boxes))
        if s.interaction_centred:
            own -= own.mean(axis=1, keepdims=True)
        y += own[:, plan.box[plan.scored]] * candidate[None, :]
    return y


def state_readings(layout: Layout, cycles: int, state: BoxState) -> list[StateReading]:
    """What a probe of the state reads for each of the compared lane's scored blocks, in time
    order: before its washout, as it scores, as it ends (exactly: a file the runtime writes)."""
    plan = _plan(layout, cycles)
    level = dict.fromkeys(range(layout.boxes), state.target_control)
    before = np.zeros(plan.cell.size)
    after = np.zeros(plan.cell.size)
    for i in range(plan.cell.size):
        b = int(plan.box[i])
        target = state.target_control if int(plan.cell[i]) == 0 else state.target_candidate
        before[i] = level[b]
        _, level[b] = state.run(level[b], target, float(plan.length[i]))
        after[i] = level[b]
    washout = 1 if layout.sends_washout else 0
    return [
        StateReading(float(before[i - washout]), float(before[i]), float(after[i]))
        for i in plan.scored
    ]


def probed_blocks(layout: Layout, cycles: int, state: BoxState) -> list[BlockTraffic]:
    """The compared lane's blocks as harness.stats.box_state checks them, with one probe
    ("state") reading ``state``."""
    readings = state_readings(layout, cycles, state)
    design = layout_cycles(layout, cycles)
    out = []
    for k, reading in enumerate(readings):
        cycle = design[k // 4]
        before = cycle.before[k % 4] if cycle.before is not None else "-"
        out.append(BlockTraffic(cycle.order[k % 4], before, layout.washout, {"state": reading}))
    return out


__all__ = [
    "KINDS",
    "BoxState",
    "TrafficScenario",
    "block_means",
    "most_powerful_bound",
    "probed_blocks",
    "simulate_traffic",
    "state_readings",
    "state_shift",
]
