"""``harness bench sequential``: the decision rule's error rates and power, over a scenario bank.

Simulates mirrored campaigns (100,000 a case; 10,000 and 5,000 with
``quick``; seeded) of the design four shipped cards use — sequential, looks at 3…8 cycles, α
0.05, 2% margin — and decides each at every look with the analysis's labels applied to all
campaigns at once (:mod:`harness.stats.design_sim`, whose labels the tests check against
:func:`harness.stats.decision.compare_cycles`). Every design ``design:`` offers is run on the
same bank: ABBA/BAAB with a whole-block washout before every block (``washout: 1``, the
default and the paired design: D̄ is the deployed effect by design, and carry-over that survives
a block of other traffic, the second order, clears too), with a quarter-block washout
(``washout: 0.25``: ~0.6× the wall time, clears only the first order) and without one
(``washout: 0``; the deployed effect from the crossover model, fail closed below 3 cycles).
Beside them, for the record, D̄ without washout and without the check (what the decision was
before the crossover model).

The bank, each at 3% block noise with the arm set so that the deployed effect — the candidate
after itself against the control after itself — is exactly 0:

- A/A; carry-over into the control (a control block after a candidate block −3%); into the
  candidate (a control block leaves the next candidate block +3%); heat (the candidate +3% on a
  cool box, and every block after a candidate block −3%, itself included); second order (−3%
  into the control, −1.5% into the control block after that); linear drift (SD 0.5% a block);
  a ±10% step in one cycle in ten; heavy tails (Student t, 3 df); two interleaved treatments
  (the other lane's blocks carry −3% into the control too); a 2-box fleet with a box × arm
  interaction (SD 3%), and one whose boxes agree, decided between cycles (``analysis.boxes:
  fixed``, the default: a verdict about these two boxes, whose null is that their own effects
  average 0) and between boxes (``random``: about boxes like these, whose null is that such
  boxes average 0 while the two drawn need not). Each design is held to the null of the claim
  it makes; the other's figure is printed for the record.

For each: one-sided false *better* (target ≤ α/2 within Monte Carlo error) and, with +5% and
+10% deployed effects at 3% and 6% block noise, power and mean cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from harness.benchmarks import Figure
from harness.stats.cycles import margin_log
from harness.stats.design_sim import BETTER, Layout, Scenario, run_looks, simulate_blocks
from harness.stats.sequential import SequentialPlan

FIRST, MAX = 3, 8
ALPHA = 0.05
MARGIN = margin_log(2.0)
NOISE = 0.03
SEED = 2045
DOWN3, UP3 = math.log(0.97), math.log(1.03)


@dataclass(frozen=True)
class Case:
    """One scenario of the bank: what the box does and how the runs are laid out."""

    name: str
    scenario: Scenario
    treatments: int = 1
    boxes: int = 1
    # Which claim's null the scenario is: "fixed" (these boxes' mean effect 0) gates the
    # cycle-level designs, "random" (boxes like these: mean 0, the two drawn not) only the
    # interval between boxes; a verdict is held to the level of the claim it makes.
    claim: str = "fixed"


BANK = (
    Case("A/A", Scenario(block_sd=NOISE)),
    Case("carry into control", Scenario(block_sd=NOISE, carry_control=DOWN3)),
    Case("carry into candidate", Scenario(block_sd=NOISE, carry_after_control=UP3)),
    Case("heat", Scenario(block_sd=NOISE, effect=UP3, heat=DOWN3)),
    Case(
        "second order",
        Scenario(block_sd=NOISE, carry_control=DOWN3, second_control=math.log(0.985)),
    ),
    Case("linear drift", Scenario(block_sd=NOISE, drift_sd=0.005)),
    Case("step", Scenario(block_sd=NOISE, step=0.10, step_chance=0.1)),
    Case("heavy tails", Scenario(block_sd=NOISE, heavy_tails=True)),
    Case("two treatments", Scenario(block_sd=NOISE, carry_control=DOWN3), treatments=2),
    Case(
        "2-box fleet, these boxes' mean 0",
        Scenario(block_sd=NOISE, interaction_sd=0.03, interaction_centred=True),
        boxes=2,
    ),
    Case(
        "2-box fleet, boxes like these' mean 0",
        Scenario(block_sd=NOISE, interaction_sd=0.03),
        boxes=2,
        claim="random",
    ),
    Case("2-box fleet, boxes agree", Scenario(block_sd=NOISE), boxes=2),
)

# Designs: (name, washout share, the carry-over check). A washout absorbs one order of
# carry-over and one more per whole block it lasts (design_sim.Layout.washout_units), so the
# whole-block washout, the default, is the design for carry-over that survives a block of other
# traffic.
DEFAULT_WASHOUT = 1.0
DESIGNS = (
    ("washout", DEFAULT_WASHOUT, True),
    ("quarter-block washout", 0.25, True),
    ("no washout", 0.0, True),
)
# Power is per cycle: a shorter washout scores the same blocks, so its power is the default's
# (at 1.25 blocks of wall time a block instead of 2); not simulated twice.
POWER_DESIGNS = (DESIGNS[0], DESIGNS[2])
BEFORE = ("no washout, D̄ alone", 0.0, False)
POWER = (
    (math.log(1.05), 0.03),
    (math.log(1.10), 0.03),
    (math.log(1.05), 0.06),
    (math.log(1.10), 0.06),
)


def run_bench(quick: bool = False) -> list[Figure]:
    """Every scenario × design: false *better*, then power and mean cycles."""
    n_null = 10_000 if quick else 100_000
    n_power = 5_000 if quick else 100_000
    plan = SequentialPlan(FIRST, MAX, 1, ALPHA)
    looks = plan.scheduled()
    half = ALPHA / 2
    se = math.sqrt(half * (1 - half) / n_null)
    allowed = half + 2 * se  # ≤ α/2 within Monte Carlo error (two standard errors)
    figures: list[Figure] = []
    seed = SEED
    for case in BANK:
        for name, washout, check in (*DESIGNS, BEFORE):
            layout = Layout(washout=washout, treatments=case.treatments, boxes=case.boxes)
            if case.boxes > 1 and name == BEFORE[0]:
                # For the record: a verdict about boxes like these (analysis.boxes: random).
                name, layout = "washout, boxes random", replace(layout, washout=DEFAULT_WASHOUT)
                layout = replace(layout, random_boxes=True)
                check = True
            seed += 1
            null = case.scenario.null()
            blocks = simulate_blocks(np.random.default_rng(seed), n_null, MAX, null, layout)
            codes, _ = run_looks(
                blocks, looks, plan.nominal_alpha, MARGIN, layout=layout, carry_check=check
            )
            rate = float((codes == BETTER).mean())
            gated = (name, washout, check) in DESIGNS
            if case.boxes > 1:
                gated = (layout.random_boxes) == (case.claim == "random")
            figures.append(
                Figure(
                    f"{case.name}: false better, {name}",
                    rate * 100,
                    "%",
                    f"{n_null} campaigns, looks {FIRST}..{MAX} (MC SE {se * 100:.2f} points)",
                    f"<= {half * 100:.1f}%" if gated else "",
                    rate <= allowed if gated else None,
                )
            )
        designs = [
            (name, Layout(washout, case.treatments, case.boxes))
            for name, washout, _ in POWER_DESIGNS
        ]
        if case.boxes > 1:
            random = Layout(DEFAULT_WASHOUT, case.treatments, case.boxes, random_boxes=True)
            designs.append(("washout, boxes random", random))
        for name, layout in designs:
            for effect, noise in POWER:
                seed += 1
                scenario = replace(case.scenario, block_sd=noise).null()
                scenario = replace(scenario, effect=scenario.effect + effect)
                blocks = simulate_blocks(
                    np.random.default_rng(seed), n_power, MAX, scenario, layout
                )
                codes, used = run_looks(blocks, looks, plan.nominal_alpha, MARGIN, layout=layout)
                power = float((codes == BETTER).mean())
                label = f"+{math.expm1(effect) * 100:.0f}% at {noise * 100:.0f}%"
                headline = case.name == "A/A" and name == "washout" and label == "+5% at 3%"
                figures.append(
                    Figure(
                        f"{case.name}: power {label}, {name}",
                        power * 100,
                        "%",
                        f"mean {float(used.mean()):.2f} cycles, {n_power} campaigns",
                        ">= 80% within 8 cycles" if headline else "",
                        power >= 0.8 if headline else None,
                    )
                )
    figures.append(
        Figure(
            "look levels reach",
            plan.reached_alpha() * 100,
            "%",
            f"two-sided, fresh null campaigns, looks {FIRST}..{MAX}",
        )
    )
    return figures
