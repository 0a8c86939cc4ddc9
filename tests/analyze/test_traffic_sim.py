"""The traffic-time bank: carry-over as a state every request moves towards its arm's level."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.benchmarks.sequential import ALPHA, FIRST, MARGIN, MAX
from harness.stats.design_sim import BETTER, Layout, run_looks
from harness.stats.sequential import SequentialPlan
from harness.stats.traffic_sim import BoxState, TrafficScenario, simulate_traffic, state_shift


def _per_request(
    state: BoxState, start: float, target: float, blocks: float, k: int
) -> tuple[float, float]:
    """The same state stepped request by request (k a block): its mean over the requests and
    its value after them, an independent reading of BoxState.run."""
    level, seen = start, []
    for _ in range(round(blocks * k)):
        seen.append(level)
        if state.kind == "decay":
            level = target + (level - target) * 2.0 ** (-1.0 / (state.life * k))
        else:
            step = 1.0 / (state.life * k)
            level = max(level - step, target) if level > target else min(level + step, target)
    return float(np.mean(seen)), level


@pytest.mark.parametrize("kind", ["decay", "evict"])
@pytest.mark.parametrize(
    ("start", "target", "blocks"), [(0.0, 1.0, 1.0), (1.0, 0.0, 0.25), (0.3, 1.0, 3.0)]
)
def test_the_state_runs_as_requests_step_it(
    kind: str, start: float, target: float, blocks: float
) -> None:
    state = BoxState(kind, 0.8, -0.03, -0.03)
    mean, end = state.run(start, target, blocks)
    want_mean, want_end = _per_request(state, start, target, blocks, 4000)
    assert mean == pytest.approx(want_mean, abs=2e-3)
    assert end == pytest.approx(want_end, abs=2e-3)


def test_a_washout_is_traffic_and_clears_what_its_length_clears() -> None:
    # Heat with a half-life of a block: the candidate's blocks run hotter than the control's
    # whatever the washout, and the longer the washout the closer each block is to its own
    # steady state (the deployed effect: the candidate -3% hot, the control 0% cool).
    heat = BoxState("decay", 1.0, math.log(0.97), math.log(0.97))
    gaps = []
    for washout in (0.0, 0.25, 1.0, 4.0):
        shift = state_shift(Layout(washout=washout), 4, heat)
        arms = np.array([arm for j in range(4) for arm in ("ABBA" if j % 2 == 0 else "BAAB")])
        gaps.append(float(shift[arms == "B"].mean() - shift[arms == "A"].mean()))
    assert all(a > b for a, b in itertools.pairwise(gaps)), gaps  # less and less biased
    assert gaps[-1] < 0.85 * math.log(0.97) < 0  # four blocks of washout: near the deployed 3%


def test_the_bank_measures_what_a_whole_block_washout_lets_through() -> None:
    # The audit's heat at a half-life of two blocks: a box that heats under candidate traffic
    # and a candidate 3% faster cool, deployed effect exactly 0. The default design calls it
    # better in most campaigns (the audit: 35-78% at 1-3% block noise); a state that clears
    # within a quarter block stays at or under alpha/2.
    plan = SequentialPlan(FIRST, MAX, 1, ALPHA)
    layout = Layout(washout=1.0)
    rates = {}
    for life in (0.25, 2.0):
        heat = BoxState("decay", life, math.log(0.97), math.log(0.97))
        scenario = TrafficScenario(math.log(1.03), 0.02, heat).null()
        assert scenario.deployed == pytest.approx(0.0, abs=1e-15)
        blocks = simulate_traffic(np.random.default_rng(11), 20_000, MAX, scenario, layout)
        codes, _ = run_looks(blocks, plan.scheduled(), plan.nominal_alpha, MARGIN, layout=layout)
        rates[life] = float((codes == BETTER).mean())
    assert rates[0.25] <= 0.025 + 2 * math.sqrt(0.025 * 0.975 / 20_000), rates
    assert rates[2.0] > 0.35, rates
