"""Pricing designs from a finished campaign (``harness plan CARD --from DIR``).

The levers are checked on fixed needs (effect, spread, variance split), and the whole verb on
the fixed demo-shaped records; the printed table is pinned in tests/test_golden_output.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.analyze.design_cost import Need, cycles_for, decided_by
from harness.stats.crossover import MIN_CARRY_CYCLES
from harness.stats.design_sim import DECIDED, Layout, Scenario, decide_many, simulate_blocks
from harness.stats.power import cycles_to_decide
from tests.conftest import DATA, run_cli

DELTA = float(np.log1p(0.02))


def _need(mean: float, spread: float, prompt_share: float) -> Need:
    return Need("m", mean=mean, spread=spread, margin=DELTA, alpha=0.05, prompt_share=prompt_share)


def test_more_prompts_per_block_cut_cycles_only_where_prompts_are_the_noise() -> None:
    noisy_prompts = [_need(0.05, 0.06, prompt_share=0.9)]
    noisy_boots = [_need(0.05, 0.06, prompt_share=0.0)]
    as_run, _ = cycles_for(noisy_prompts, 1)
    four_x, _ = cycles_for(noisy_prompts, 4)
    assert four_x < as_run
    assert cycles_for(noisy_boots, 4)[0] == cycles_for(noisy_boots, 1)[0]


def test_the_slowest_comparison_sets_the_cycles_and_is_named() -> None:
    needs = [
        Need("fast", mean=0.4, spread=0.05, margin=DELTA, alpha=0.05, prompt_share=0.0),
        Need("slow", mean=0.04, spread=0.05, margin=DELTA, alpha=0.05, prompt_share=0.0),
    ]
    m, limiting = cycles_for(needs, 1)
    assert limiting == "slow" and m == decided_by(0.05, needs[1], 2)


def test_unwashed_blocks_need_the_carry_over_models_cycles() -> None:
    # A huge effect decides in 2 washed cycles; unwashed, on any boot, the label fails closed
    # until the carry-over model has its MIN_CARRY_CYCLES, and a washout of part of a block is
    # priced as what it is: no wash.
    big = [_need(1.0, 0.01, prompt_share=0.0)]
    assert cycles_for(big, 1, layout=Layout(washout=1.0))[0] == 2
    assert cycles_for(big, 1, layout=Layout(washout=0.25))[0] == MIN_CARRY_CYCLES
    assert cycles_for(big, 1)[0] == MIN_CARRY_CYCLES
    assert cycles_for(big, 1, floor=MIN_CARRY_CYCLES)[0] == MIN_CARRY_CYCLES


def test_simulated_count_decides_four_in_five_and_is_never_below_the_t_tests() -> None:
    need = _need(0.06, 0.05, prompt_share=0.0)
    m = decided_by(need.spread, need, 2)
    assert m >= cycles_to_decide(need.spread, need.mean, need.margin, need.alpha)
    # An independent draw: m cycles decide about 80 %, one fewer (if above the floor) less.
    blocks = simulate_blocks(np.random.default_rng(7), 4000, m, Scenario(0.06, 0.05))
    share = float(np.isin(decide_many(blocks, DELTA, 0.05), DECIDED).mean())
    assert share >= 0.76, (m, share)
    if m > 3:
        fewer = float(np.isin(decide_many(blocks[:, : 4 * (m - 1)], DELTA, 0.05), DECIDED).mean())
        assert fewer < 0.84, (m, fewer)


def test_from_a_folder_that_is_no_campaign_is_exit_2_naming_it(tmp_path: Path) -> None:
    result = run_cli("plan", "campaigns/demo.yaml", "--from", str(tmp_path))
    assert result.code == 2 and str(tmp_path) in result.stderr and "Traceback" not in result.stderr


def test_from_a_one_cycle_campaign_says_what_it_needs() -> None:
    ladder = DATA / "campaigns" / "ladder-shaped"
    result = run_cli("plan", "campaigns/queue-rate-ladder.yaml", "--from", str(ladder))
    assert result.code == 2, result.stderr
    assert "at least 2 cycles" in result.stderr and "Traceback" not in result.stderr


def test_a_card_that_gates_no_metric_is_priced_on_what_it_reports(tmp_path: Path) -> None:
    """The queue-rate ladder gates outputs and swap-out only: `plan --from` prices the
    comparisons it reports instead of refusing, and names them as not gated."""
    from harness.analyze.campaign import analyze_campaign
    from harness.analyze.design_cost import decision_needs
    from tests.gate.campaigns import Synth, build_campaign, card_text, faster

    text = card_text("  - {kind: exact_outputs}", cycles=2, cells=("control", "rung"))
    campaign = build_campaign(tmp_path / "ladder", text, Synth(speed=faster(1.2)))
    needs = decision_needs(analyze_campaign(campaign.root))
    assert needs and all(n.name.endswith("(not gated)") for n in needs)
    assert any(n.name.startswith("decode_tok_s rung vs control") for n in needs)
