"""Which design reaches a decision soonest, priced from a finished campaign.

docs/design.md#what-a-design-costs. A finished campaign measured, for each gated comparison,
the spread of its cycle effects s_D and how a block's variance splits (variance components):
the prompt part s_w²/k and the boot-to-boot rest. It also measured what a boot and a block
cost in seconds. Three levers trade against each other at equal power:

- cycles m: Var(D̄) = s_D²/m;
- prompts per block k′ (more passes over the held-out prompts): only the prompt part shrinks,
  s_D′² = s_D²·(block + prompt·k/k′)/(block + prompt), and each block takes k′/k as long;
- boots (``design.boot``): shared boots cost no variance in this model, only wall time — a
  boot's own random effect, if the campaign ran a boot per block, is inside "block" and would
  only shrink when blocks share a boot, so shared-boot rows are upper bounds on the cycles.

For every combination the cycles to a decision are the fewest at which 80 % of 2,000 seeded
simulated campaigns of the design are decided by the analysis's own labels, the carry-over
check included (:func:`decided_by`), never fewer than the t-test's own count
(:func:`~harness.stats.power.cycles_to_decide`), and never fewer than MIN_CARRY_CYCLES where the
blocks are unwashed (below it the carry-over model cannot check them, on any boot); the largest
over the gated comparisons is the design's (a verdict needs them all). The wall time is the
busiest box's boots × S (``--boot-s``, default the measured boot: ``runtime.boot_s`` of each
boot's first run) plus its blocks (start to end, less the boot) and each shared-boot run's
washout. The soonest design the card can take is marked; one it cannot take keeps its row with
the reason. Pure but for reading the campaign's run records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from harness.analyze.campaign import CampaignAnalysis, analyze_campaign, gated_metrics
from harness.card import LoadedCard
from harness.card.schema import BootDesign
from harness.errors import BadInput
from harness.formats.records import read_json
from harness.plan.build import BOOT_DESIGNS, build_plan
from harness.plan.measured import run_times
from harness.stats.crossover import MIN_CARRY_CYCLES
from harness.stats.design_sim import DECIDED, Layout, Scenario, decide_many, simulate_blocks
from harness.stats.power import cycles_to_decide

# Prompts per block tried, as multiples of what the campaign ran (passes over the pool).
PROMPT_FACTORS = (1, 2, 4)
POWER = 0.8
SIMULATED = 2000  # campaigns simulated per count: the decided share to about ±1 %
MAX_SIMULATED_CYCLES = 64  # beyond it the t-test's count stands alone


@dataclass(frozen=True)
class MeasuredCosts:
    """Seconds a campaign spent: a boot, and a block's measuring (all its requests)."""

    boot_s: float
    block_s: float
    blocks: int


@dataclass(frozen=True)
class Need:
    """One gated comparison's effect, spread and variance split (log scale)."""

    name: str
    mean: float
    spread: float
    margin: float
    alpha: float
    prompt_share: float  # prompt part / (prompt + block), 0 when unknown


@dataclass(frozen=True)
class DesignCost:
    """One design at equal power: its cycles, boots and wall time."""

    boot: BootDesign
    prompt_factor: int
    cycles: int
    boots: int
    wall_s: float
    problem: str  # why the card cannot take this boot design ("" when it can)
    limiting: str  # the comparison that needs the most cycles


def measured_costs(analysis: CampaignAnalysis) -> MeasuredCosts:
    """Mean boot and block seconds from the run records (``runtime.boot_s``, start to end).

    A run that booted spent ``boot_s`` of its time booting; a run on a shared boot measured
    (and washed out) for all of it.
    """
    ok = analysis.runs[analysis.runs["status"] == "ok"]
    boots, blocks = run_times(
        read_json(analysis.campaign.run_dir(str(run_id)) / "run.json") for run_id in ok["run_id"]
    )
    if not blocks:
        raise BadInput(
            f"{analysis.campaign.root}: no finished run with its start and end times; "
            "--from needs a campaign with completed runs"
        )
    return MeasuredCosts(
        boot_s=sum(boots) / len(boots) if boots else 0.0,
        block_s=sum(blocks) / len(blocks),
        blocks=len(blocks),
    )


def decision_needs(analysis: CampaignAnalysis) -> list[Need]:
    """The gated comparisons with a measured spread (two cycles or more). A card that gates on
    no metric (a ladder that reports its rungs and gates outputs) is priced on every comparison
    it reports, each named "(not gated)"."""
    gated = set(gated_metrics(analysis.card))
    measured = [
        item
        for item in analysis.comparisons
        if item.comparison.sd_log_effect is not None and item.comparison.mean_log_effect is not None
    ]
    chosen = [item for item in measured if item.comparison.metric in gated] or measured
    suffix = "" if any(i.comparison.metric in gated for i in chosen) else " (not gated)"
    needs: list[Need] = []
    for item in chosen:
        c = item.comparison
        if c.sd_log_effect is None:
            continue
        share = 0.0
        if c.variance is not None and c.variance.prompt is not None:
            total = c.variance.prompt + c.variance.block
            share = c.variance.prompt / total if total > 0 else 0.0
        needs.append(
            Need(
                name=f"{c.metric} {item.cell} vs {item.vs} ({item.cache_state}){suffix}",
                mean=c.mean_log_effect,
                spread=c.sd_log_effect,
                margin=c.margin_log,
                alpha=c.alpha,
                prompt_share=share,
            )
        )
    if not needs:
        raise BadInput(
            f"{analysis.campaign.root}: no comparison with two cycles or more; --from "
            "needs a finished campaign that ran at least 2 cycles (its gated comparisons are "
            "priced, or every comparison where it gates none)"
        )
    return needs


def cycles_for(
    needs: Sequence[Need], prompt_factor: int, *, floor: int = 2, layout: Layout | None = None
) -> tuple[int, str]:
    """Cycles to decide every comparison with ``prompt_factor``× the prompts, and which limits.

    At least ``floor`` cycles (unwashed blocks need the carry-over model's
    :data:`~harness.stats.crossover.MIN_CARRY_CYCLES`).
    """
    worst, name = 0, ""
    for need in needs:
        share = need.prompt_share
        spread = need.spread * math.sqrt(1.0 - share + share / prompt_factor)
        m = decided_by(spread, need, floor, layout)
        if m > worst:
            worst, name = m, need.name
    return worst, name


def decided_by(spread: float, need: Need, floor: int, layout: Layout | None = None) -> int:
    """The fewest cycles (≥ ``floor``) at which 80 % of simulated campaigns are decided.

    Starts from the t-test's own count (:func:`cycles_to_decide`) and simulates the labels the
    analysis gives for the ``layout`` (washed or not) — for unwashed blocks the deployed-effect
    check included, which costs power that the plain count does not see.
    """
    start = max(floor, cycles_to_decide(spread, need.mean, need.margin, need.alpha))
    if spread == 0:
        return start
    rng = np.random.default_rng(0)
    scenario = Scenario(effect=need.mean, block_sd=spread)
    blocks = simulate_blocks(rng, SIMULATED, MAX_SIMULATED_CYCLES, scenario, layout)
    for m in range(start, MAX_SIMULATED_CYCLES + 1):
        codes = decide_many(blocks[:, : 4 * m], need.margin, need.alpha, layout=layout)
        if float(np.isin(codes, DECIDED).mean()) >= POWER:
            return m
    return max(start, MAX_SIMULATED_CYCLES)


def design_costs(
    loaded: LoadedCard, needs: Sequence[Need], costs: MeasuredCosts, *, boot_s: float | None
) -> list[DesignCost]:
    """Every boot design × prompts factor for ``loaded``'s cells, at the measured costs."""
    card = loaded.card
    # A sequential card is priced at its fixed size: the cycles it would need to decide.
    fixed = card.model_copy(
        update={"design": card.design.model_copy(update={"sequential": False, "max_cycles": None})}
    )
    base = replace(loaded, card=fixed)
    live = loaded.runtime.live
    boot_cost = costs.boot_s if boot_s is None else boot_s
    rows: list[DesignCost] = []
    # Unwashed blocks, on any boot, need the carry-over model: MIN_CARRY_CYCLES at least.
    # Washed by boot (a probed box, a boot per block) is priced as washed, D̄ deciding, on a
    # boot per block only: a shared boot washes nothing.
    by_boot = card.design.washed_by == "boot"
    for factor in PROMPT_FACTORS:
        for design in BOOT_DESIGNS:
            layout = Layout(
                washout=card.design.washout, washed_by_boot=by_boot and design == "per-block"
            )
            floor = 2 if layout.washed else MIN_CARRY_CYCLES
            m, limiting = cycles_for(needs, factor, floor=floor, layout=layout)
            plan = build_plan(base, cycles=m)
            washout = 0.0
            if live is not None and design != "per-block":
                request_s = costs.block_s / max(1, _prompts(loaded))
                washout = live.washout_s + live.washout_requests * request_s
            per_box: dict[str, int] = {}
            for run in plan.runs:
                per_box[run.box] = per_box.get(run.box, 0) + 1
            boots = plan.boots(design)
            block_s = costs.block_s * factor + washout
            wall = max(
                (boots[box] * boot_cost + n * block_s for box, n in per_box.items()), default=0.0
            )
            rows.append(
                DesignCost(
                    boot=design,
                    prompt_factor=factor,
                    cycles=m,
                    boots=max(boots.values(), default=0),
                    wall_s=wall,
                    problem=plan.boot_design_problems()[design],
                    limiting=limiting,
                )
            )
    return rows


def _prompts(loaded: LoadedCard) -> int:
    """Scored requests in one block of the card (its phases, or passes over held-out)."""
    workload = loaded.card.workload
    if workload.phases:
        return sum(p.requests or 0 for p in workload.phases) or 1
    return max(1, len(loaded.split("heldout")) * workload.passes)


def soonest(rows: Sequence[DesignCost]) -> DesignCost:
    """The quickest design the card can take (per-block always can)."""
    allowed = [r for r in rows if not r.problem]
    return min(allowed, key=lambda r: (r.wall_s, r.boots, r.prompt_factor))


def price_from(loaded: LoadedCard, campaign_dir: Path, *, boot_s: float | None) -> PricedDesigns:
    """Price every design of ``loaded`` from the campaign in ``campaign_dir``."""
    analysis = analyze_campaign(campaign_dir)
    needs = decision_needs(analysis)
    costs = measured_costs(analysis)
    rows = design_costs(loaded, needs, costs, boot_s=boot_s)
    return PricedDesigns(
        loaded=loaded,
        needs=tuple(needs),
        costs=costs,
        boot_s=costs.boot_s if boot_s is None else boot_s,
        rows=tuple(rows),
        measured_boot=analysis.card.design.boot,
        source=campaign_dir,
    )


@dataclass(frozen=True)
class PricedDesigns:
    """What ``harness plan CARD --from DIR`` prints."""

    loaded: LoadedCard
    needs: tuple[Need, ...]
    costs: MeasuredCosts
    boot_s: float
    rows: tuple[DesignCost, ...]
    measured_boot: BootDesign
    source: Path

    @property
    def soonest(self) -> DesignCost:
        """The quickest design the card can take."""
        return soonest(self.rows)


__all__ = [
    "PROMPT_FACTORS",
    "DesignCost",
    "MeasuredCosts",
    "Need",
    "PricedDesigns",
    "cycles_for",
    "decision_needs",
    "design_costs",
    "measured_costs",
    "price_from",
    "soonest",
]
