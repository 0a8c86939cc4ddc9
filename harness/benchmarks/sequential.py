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
  (the other lane's blocks carry −3% into the control too); 2-, 3- and 4-box fleets with a
  box × arm interaction (SD 3%), and two boxes that agree, decided between cycles
  (``analysis.boxes: fixed``, the default: a verdict about these boxes, whose null is that
  their own effects average 0) and between boxes (``random``: about boxes like these, whose
  null is that such boxes average 0 while the ones drawn need not). Each design is held to the
  null of the claim it makes; the other's figure is printed for the record.

For each: one-sided false *better* (target ≤ α/2 within Monte Carlo error) and, with +5% and
+10% deployed effects at 3% and 6% block noise, power and mean cycles.

That bank shares the decision's own picture of carry-over: a shift of the block after a switch,
which a washout clears by the whole block. A second bank does not
(:mod:`harness.stats.traffic_sim`): carry-over is a state of the box that every request moves
towards its arm's level, with a half-life (or, for a page cache that only traffic evicts, a
turnover time) of a quarter block to three blocks of traffic, into the control, into the
candidate, or heat (the candidate 3% faster on a cool box, every request slower as the box heats
under candidate traffic), at 2% block noise. It runs the default design, the demo's (each block
on a boot of its own after a quarter block of its own traffic, ``washed_by: boot``: decided on D̄,
the box's state read by a probe; a boot clears nothing of the box, so the probe's check is all
that holds it), the same traffic decided as unwashed, the ladder's (a quarter-block washout, 3
fixed cycles, read as ABBA/BAAB) and no washout, through the same decision, and holds each to the
same ≤ α/2 with the state probed; unprobed figures are printed for the record. Imports (6 fixed
cycles, no warm-up or a warm-up of a tenth of a block, decided as unwashed) have no probes: they
are held to ≤ α/2 unprobed, with their power at +5% and 2% block noise, and beside it the
power no decision of those blocks can exceed while it holds the bank's hardest null at α/2
(:func:`harness.stats.traffic_sim.most_powerful_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from harness.benchmarks import Figure
from harness.stats.box_state import check_state
from harness.stats.cycles import margin_log
from harness.stats.design_sim import (
    BETTER,
    CARRY,
    DECIDED,
    Layout,
    Scenario,
    run_looks,
    simulate_blocks,
)
from harness.stats.sequential import SequentialPlan
from harness.stats.traffic_sim import (
    BoxState,
    TrafficScenario,
    most_powerful_bound,
    probed_blocks,
    simulate_traffic,
)

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
    *(
        Case(
            f"{n}-box fleet, {whose} mean 0",
            Scenario(block_sd=NOISE, interaction_sd=0.03, interaction_centred=centred),
            boxes=n,
            claim="fixed" if centred else "random",
        )
        for n in (3, 4)
        for whose, centred in (("these boxes'", True), ("boxes like these'", False))
    ),
)

# Designs: (name, washout share, the carry-over check). A washout absorbs one order of
# carry-over per whole block it lasts (design_sim.Layout.washout_units): the whole-block
# washout, the default, clears the first order and the quarter block none.
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
    figures.extend(traffic_bank(quick))
    figures.append(
        Figure(
            "look levels reach",
            plan.reached_alpha() * 100,
            "%",
            f"two-sided, fresh null campaigns, looks {FIRST}..{MAX}",
        )
    )
    return figures


# The second bank: carry-over as a state that relaxes with traffic (harness.stats.traffic_sim).
TRAFFIC_NOISE = 0.02
LIVES = (0.25, 0.5, 1.0, 2.0, 3.0)  # blocks of traffic
TRAFFIC_SEED = 5400


def traffic_states(life: float) -> tuple[tuple[str, BoxState, float], ...]:
    """(name, state, the candidate's intrinsic effect before the null is set) of each kind."""
    return (
        ("state into control", BoxState("decay", life, DOWN3, 0.0), 0.0),
        (
            "state into candidate",
            BoxState("decay", life, 0.0, UP3, target_control=1.0, target_candidate=0.0),
            0.0,
        ),
        ("heat", BoxState("decay", life, DOWN3, DOWN3), UP3),
        ("page cache (evicted by traffic only)", BoxState("evict", life, DOWN3, 0.0), 0.0),
    )


@dataclass(frozen=True)
class TrafficDesign:
    """A design of the second bank: its washout share and its looks."""

    name: str
    washout: float
    first: int
    last: int
    sequential: bool = True
    washed_by_boot: bool = False  # design.washed_by: boot, decided on D̄ with the probes' check
    probed: bool = True  # an import has no probes: held to α/2 unprobed


TRAFFIC_DESIGNS = (
    TrafficDesign("default (washout 1, looks 3..8)", DEFAULT_WASHOUT, FIRST, MAX),
    TrafficDesign("demo, washed by boot (washout 0.25, looks 4..6)", 0.25, 4, 6, True, True),
    TrafficDesign("washout 0.25, looks 4..6", 0.25, 4, 6),
    TrafficDesign("ladder (washout 0.25, 3 cycles)", 0.25, 3, 3, sequential=False),
    TrafficDesign("no washout (looks 3..8)", 0.0, FIRST, MAX),
    # `harness import`: a tool's fixed runs, no probes; a declared warm-up is a washout of its
    # share of the block (10 of 100 requests: a tenth), decided as unwashed.
    TrafficDesign("import, no warm-up (6 cycles)", 0.0, 6, 6, sequential=False, probed=False),
    TrafficDesign("import, warm-up 0.1 (6 cycles)", 0.1, 6, 6, sequential=False, probed=False),
)


def traffic_bank(quick: bool = False) -> list[Figure]:
    """False *better* of every design on every state kind and life, decided by the analysis's
    labels (design_sim.run_looks), the deployed effect exactly 0: unprobed (the box's state
    unread, which no design here holds beyond a short life) and with a probe that reads the
    state (harness.stats.box_state withholds a label while it has not settled)."""
    n = 10_000 if quick else 100_000
    half = ALPHA / 2
    se = math.sqrt(half * (1 - half) / n)
    allowed = half + 2 * se
    figures: list[Figure] = []
    seed = TRAFFIC_SEED
    for design in TRAFFIC_DESIGNS:
        plan = SequentialPlan(design.first, design.last, 1, ALPHA)
        looks = plan.scheduled() if design.sequential else [design.last]
        level = plan.nominal_alpha if design.sequential else (lambda _m: ALPHA)
        layout = Layout(washout=design.washout, washed_by_boot=design.washed_by_boot)
        held_by = {"unprobed": 0, "state probed": 0}
        gated = "state probed" if design.probed else "unprobed"  # the figure held to α/2
        cases = 0
        for life in LIVES:
            for kind, state, effect in traffic_states(life):
                seed += 1
                scenario = TrafficScenario(effect, TRAFFIC_NOISE, state).null()
                blocks = simulate_traffic(
                    np.random.default_rng(seed), n, design.last, scenario, layout
                )
                cases += 1
                ways: list[tuple[str, Callable[[int], bool] | None]] = [("unprobed", None)]
                if design.probed:
                    ways.append(("state probed", _probe_holds(layout, state)))
                for how, held in ways:
                    codes, _ = run_looks(blocks, looks, level, MARGIN, layout=layout, held=held)
                    rate = float((codes == BETTER).mean())
                    carried = float((codes == CARRY).mean())
                    held_by[how] += rate <= allowed
                    figures.append(
                        Figure(
                            f"traffic-time {kind}, life {life:g} block(s): false better, "
                            f"{design.name}, {how}",
                            rate * 100,
                            "%",
                            f"{n} campaigns at {TRAFFIC_NOISE * 100:g}% block noise; ended "
                            f"carry-over {carried * 100:.1f}% (MC SE {se * 100:.2f} points)",
                            f"<= {half * 100:.1f}%" if how == gated else "",
                            rate <= allowed if how == gated else None,
                        )
                    )
        if not design.probed:
            figures.append(_import_power(design, layout, n))
            figures.append(_import_bound(design, layout))
            figures.extend(_held_figures(design, held_by, cases))
            continue
        power, used, cost = _probed_power(design, looks, level, layout, n)
        headline = design.name.startswith("default")
        figures.append(
            Figure(
                f"traffic-time power +5% at 3%, a flat probe, {design.name}",
                power * 100,
                "%",
                f"mean {used:.2f} cycles, {n} campaigns (the check withholds nothing)",
                ">= 80% within 8 cycles" if headline else "",
                power >= 0.8 if headline else None,
            )
        )
        figures.append(
            Figure(
                f"traffic-time box time per decided campaign, probed vs unprobed, {design.name}",
                cost,
                "x",
                "+5% at 3% block noise, no state: the same campaigns decided with and without "
                "the probe's check",
                "<= 1.2x" if headline else "",
                cost <= 1.2 if headline else None,
            )
        )
        figures.extend(_held_figures(design, held_by, cases))
    return figures


def _held_figures(design: TrafficDesign, held_by: dict[str, int], cases: int) -> list[Figure]:
    return [
        Figure(
            f"traffic-time cases held, {design.name}, {how}",
            count,
            f"of {cases}",
            f"lives {', '.join(f'{v:g}' for v in LIVES)} blocks, four state kinds",
        )
        for how, count in held_by.items()
        if design.probed or how == "unprobed"
    ]


def _import_power(design: TrafficDesign, layout: Layout, n: int) -> Figure:
    """An import's power: +5% at 2% block noise over its fixed cycles, no state."""
    flat = BoxState("decay", 1.0, 0.0, 0.0, target_control=0.5, target_candidate=0.5)
    scenario = TrafficScenario(math.log(1.05), TRAFFIC_NOISE, flat)
    blocks = simulate_traffic(np.random.default_rng(TRAFFIC_SEED), n, design.last, scenario, layout)
    codes, _ = run_looks(blocks, [design.last], lambda _m: ALPHA, MARGIN, layout=layout)
    power = float((codes == BETTER).mean())
    return Figure(
        f"traffic-time power +5% at 2%, {design.name}",
        power * 100,
        "%",
        f"{n} campaigns, decided as unwashed (the crossover model's deployed effect); ended "
        f"carry-over {float((codes == CARRY).mean()) * 100:.1f}%",
        ">= 80%",
        power >= 0.8,
    )


def _import_bound(design: TrafficDesign, layout: Layout) -> Figure:
    """Whether any decision of an import's blocks can meet the import criterion: the power at
    +5% and 2% block noise of the most powerful test that holds one null of the bank at α/2
    (traffic_sim.most_powerful_bound), its least over the bank's nulls."""
    alternative = TrafficScenario(math.log(1.05), TRAFFIC_NOISE, None)
    bounds = []
    for life in LIVES:
        for kind, state, effect in traffic_states(life):
            null = TrafficScenario(effect, TRAFFIC_NOISE, state).null()
            power = most_powerful_bound(layout, design.last, null, alternative, ALPHA / 2)
            bounds.append((power, f"{kind}, life {life:g}"))
    power, case = min(bounds)
    short = sum(p < 0.8 for p, _ in bounds)
    return Figure(
        f"traffic-time power bound +5% at 2%, {design.name}",
        power * 100,
        "%",
        f"the most powerful test that holds {case} at α/2 (Neyman-Pearson, the level projected "
        f"out, both scenarios known): no decision of these blocks can exceed it; {short} of "
        f"{len(bounds)} nulls bound power below 80%",
        ">= 80% (the import criterion is attainable)",
        power >= 0.8,
    )


def _probe_holds(layout: Layout, state: BoxState) -> Callable[[int], bool]:
    """Whether the box-state check withholds a label at the look of m cycles: a probe that reads
    the state exactly (harness.stats.box_state on the simulated readings)."""

    def held(m: int) -> bool:
        return any(c.unsettled for c in check_state(probed_blocks(layout, m, state)))

    return held


def _probed_power(
    design: TrafficDesign,
    looks: list[int],
    level: Callable[[int], float],
    layout: Layout,
    n: int,
) -> tuple[float, float, float]:
    """+5% at 3% block noise on a box with no state: the probe reads a constant, and the check
    must cost no power (it withholds nothing)."""
    flat = BoxState("decay", 1.0, 0.0, 0.0, target_control=0.5, target_candidate=0.5)
    scenario = TrafficScenario(math.log(1.05), 0.03, flat)
    rng = np.random.default_rng(TRAFFIC_SEED)
    blocks = simulate_traffic(rng, n, design.last, scenario, layout)
    held = _probe_holds(layout, flat)
    codes, used = run_looks(blocks, looks, level, MARGIN, layout=layout, held=held)
    plain, plain_used = run_looks(blocks, looks, level, MARGIN, layout=layout)
    # Box time per decided campaign, probed against unprobed (the same blocks): the probe reads
    # a few bytes a block, so only what it withholds could cost cycles.
    ratio = (used.mean() / max(np.isin(codes, DECIDED).mean(), 1e-12)) / (
        plain_used.mean() / max(np.isin(plain, DECIDED).mean(), 1e-12)
    )
    return float((codes == BETTER).mean()), float(used.mean()), float(ratio)
