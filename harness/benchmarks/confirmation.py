"""``harness bench confirmation``: a fleet A/A simulation of confirmation on a second box.

A card's ``confirm: {box: NAME}`` holds one box's *worse* as unconfirmed until a second
campaign of the card on another box shows it too (:mod:`harness.gate.confirm`). This measures,
side by side on the same simulated campaigns, what that buys and costs. Each box's campaign is
decided by the analysis's own labels (:func:`harness.stats.design_sim.decide_many`, checked
against :func:`harness.stats.decision.compare_cycles` by its tests): the default design (ABBA/
BAAB, a whole-block washout), 6 fixed cycles, α 0.05, a 2% margin, 3% block noise. The two
boxes draw their noise from independent generators (seeds ``SEED + 2k`` and ``SEED + 2k + 1``
for case k); the second box's campaign counts only where the first said *worse*, as the gate
asks for it only then.

- A/A: the false *worse* of one box's campaign alone (target ≤ α/2 = 2.5%, within two Monte
  Carlo standard errors) and with confirmation (both boxes *worse*; target ≤ 0.5%); the
  campaigns run per A/A campaign.
- A/A with a box quirk: each box its own arm × box effect (normal, SD 1%, drawn per campaign:
  the one-box false alarm the practice exists for), for the record.
- A true regression (−5%): the share found on one box and confirmed on two, and the campaigns
  run per true failure (1 + the share the first box flags; target ≤ 2: at most one more).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from harness.benchmarks import Figure
from harness.stats.cycles import margin_log
from harness.stats.design_sim import WORSE, Layout, Scenario, decide_many, simulate_blocks

SEED = 5600
CYCLES = 6
ALPHA = 0.05
MARGIN = margin_log(2.0)
BLOCK_SD = 0.03
LAYOUT = Layout(washout=1.0)  # the default design: a whole-block washout before every block
CASES = (
    ("A/A", Scenario(block_sd=BLOCK_SD)),
    ("A/A, box quirk SD 1%", Scenario(block_sd=BLOCK_SD, interaction_sd=0.01)),
    ("regression -5%", Scenario(effect=math.log(0.95), block_sd=BLOCK_SD)),
)


def _worse(seed: int, n: int, scenario: Scenario) -> npt.NDArray[np.bool_]:
    """Which of n campaigns of one box read *worse*."""
    blocks = simulate_blocks(np.random.default_rng(seed), n, CYCLES, scenario, LAYOUT)
    codes = decide_many(blocks, MARGIN, ALPHA, layout=LAYOUT)
    flagged: npt.NDArray[np.bool_] = codes == WORSE
    return flagged


def run_bench(quick: bool = False) -> list[Figure]:
    """Per case: worse on one box, worse confirmed on two, and the campaigns it took."""
    n = 20_000 if quick else 200_000
    half = ALPHA / 2
    allowed = half + 2 * math.sqrt(half * (1 - half) / n)
    figures: list[Figure] = []
    for k, (case, scenario) in enumerate(CASES):
        seeds = (SEED + 2 * k, SEED + 2 * k + 1)
        first = _worse(seeds[0], n, scenario)
        second = _worse(seeds[1], n, scenario)  # an independent box
        alone = float(first.mean())
        confirmed = float((first & second).mean())
        campaigns = 1.0 + alone  # a second campaign only where the first said worse
        where = f"{n} campaigns a box, seeds {seeds[0]} and {seeds[1]}"
        null = case.startswith("A/A")
        plain = case == "A/A"
        word = "false worse" if null else "worse found"
        figures += [
            Figure(
                f"{case}: {word}, one box ({where})",
                alone,
                "share",
                target=f"<= {half:g} (+2 MC SE: {allowed:.4f})" if plain else "",
                passed=alone <= allowed if plain else None,
            ),
            Figure(
                f"{case}: {word}, confirmed on a second box",
                confirmed,
                "share",
                baseline=f"one box {alone:.4f}",
                target="<= 0.005" if plain else "",
                passed=confirmed <= 0.005 if plain else None,
            ),
            Figure(
                f"{case}: campaigns per {'campaign' if null else 'true failure'}",
                campaigns,
                "campaigns",
                baseline="1 without confirmation",
                target="" if null else "<= 2",
                passed=None if null else campaigns <= 2.0,
            ),
        ]
    return figures
