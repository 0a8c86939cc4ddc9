"""The planner: a card becomes an ordered list of runs.

Order is the whole defence against drift. ``abba`` alternates mirrored cycles ABBA, BAAB, ABBA, …:
one mirrored cycle cancels linear drift, an ABBA+BAAB pair also cancels quadratic drift
(docs/design.md#plan). With more than two cells (a ladder B0/B1/B2…), every cell gets its own
mirrored sub-cycle against the control in each cycle, so each comparison has an adjacent control.
Cache states expand into separate mirrored sub-cycles (cold and warm are never averaged, seed
004), and repeats stay inside a block (one arm in one slot), so the mirror is never broken. Each run
boots its own runtime unless ``design.boot`` shares one (:func:`boot_group`).

Runs are laid out cycle by cycle, so the plan of N cycles begins with the plan of any M < N
cycles, run for run: :func:`extend_plan` grows a campaign by whole cycles and keeps every run
already planned (docs/design.md#plan).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.card import LoadedCard
from harness.card.phase_length import estimate_phase, request_s, washout_requests
from harness.card.schema import BootDesign
from harness.errors import PlanError
from harness.stats.layout import cycle_pattern, fleet_box

# 1: first version (later with `cycles`, absent from older plans, where it is design.cycles)
SCHEMA_VERSION = 1


def cohort_key(comparison: str, cache_state: str, cycle: int) -> str:
    """The cohort of a run: one comparison's mirrored blocks in one cache state and cycle (what
    the guards invalidate as a whole)."""
    return f"{comparison}/{cache_state}/cycle{cycle}"


@dataclass(frozen=True)
class Run:
    """One run: a cell, in a block of a mirrored sub-cycle, in one cache state."""

    index: int
    run_id: str
    cell: str
    cycle: int
    slot: int  # position 0..3 inside a mirrored sub-cycle; control and cell slot sums are equal
    repeat: int
    cache_state: str
    box: str
    pattern: str  # "ABBA", "BAAB" or "SEQ"
    comparison: str  # the treatment cell this sub-cycle compares with the control
    block: str  # the repeats of one arm in one slot of a sub-cycle (each run boots on its own)

    def identity(self) -> dict[str, Any]:
        """The fields a run record repeats from its plan entry."""
        return {
            "run_id": self.run_id,
            "cell": self.cell,
            "cycle": self.cycle,
            "slot": self.slot,
            "repeat": self.repeat,
            "cache_state": self.cache_state,
            "pattern": self.pattern,
            "comparison": self.comparison,
            "block": self.block,
        }

    @property
    def arm(self) -> str:
        """ "A" for the control side of the sub-cycle, "B" for the treatment."""
        return self.pattern[self.slot] if self.pattern != "SEQ" else "A"

    @property
    def sends_warmup(self) -> bool:
        """Whether the run warms the runtime before it measures: a cold run measures from cold."""
        return self.cache_state == "warm"


@dataclass(frozen=True)
class Plan:
    """The ordered runs of a campaign and the card they came from."""

    card: LoadedCard
    runs: tuple[Run, ...]
    # Mirrored cycles planned: the card's design.cycles, or more once extended (extend_plan).
    # The card stays as written, so the campaign directory's card.yaml is the card as run.
    cycles: int
    scale: float = 1.0  # workload scale the card ran at (harness run --scale)

    def estimated_run_s(self) -> float:
        """Rough seconds per run: boot plus the workload, each request its first token and its
        decode at the runtime profile's expected speeds (card/phase_length.py)."""
        return self.card.runtime.expected_boot_s + self.estimated_drive_s()

    def estimated_drive_s(self) -> float:
        """Rough seconds of a run's requests, warm-up and washout included
        (:meth:`estimated_run_s`)."""
        workload = self.card.card.workload
        each = request_s(self.card)
        if workload.phases:
            seconds = sum(estimate_phase(self.card, phase).seconds for phase in workload.phases)
        else:
            seconds = len(self.card.split("heldout")) * workload.passes * each
        seconds += (workload.warmup_requests + washout_requests(self.card)) * each
        return seconds

    def max_runs(self) -> int:
        """The most runs the design may make: a sequential design may grow to max_cycles."""
        design = self.card.card.design
        if not design.sequential or design.max_cycles is None or self.cycles == 0:
            return len(self.runs)
        per_cycle = len(self.runs) / self.cycles
        return round(per_cycle * max(design.max_cycles, self.cycles))

    def estimate_basis(self) -> str:
        """What the estimate assumed, in words."""
        runtime = self.card.runtime
        return (
            f"boot {runtime.expected_boot_s:g} s, first token {runtime.expected_ttft_s:g} s and "
            f"{runtime.expected_tok_s:g} tok/s per request (expected_boot_s, expected_ttft_s, "
            f"expected_tok_s of runtime profile {runtime.name})"
        )

    def washout_text(self) -> str:
        """What the design does about carry-over, in words (the plan's last line)."""
        count = washout_requests(self.card)
        if self.card.card.design.washed_by == "boot":
            runtime = self.card.runtime
            reading = {
                p.name
                for c in self.card.card.cells.values()
                for p in runtime.probes_reading(c.knobs)
            }
            probes = ", ".join(p.name for p in runtime.box_state if p.name in reading)
            sent = f"{count} request(s) of its own cell, then " if count else ""
            return (
                f"washed by boot (design.washed_by): every block boots its own runtime, then "
                f"{sent}its scored requests; what the box keeps across boots is read by the "
                f"probes {probes} before, as and after it scores, and a label waits for them to "
                "settle (a block whose probes did not read is decided as unwashed)"
            )
        if count:
            share = self.card.card.design.washout
            sent = (
                f"washout: {count} request(s) of each warm block's own cell, sent and not "
                f"scored, before it is measured (design.washout {share:g})"
            )
            if share >= 1:
                return (
                    f"{sent}: the comparison is the effect deployed, for state its own traffic "
                    "clears within the washout"
                )
            return (
                f"{sent}: part of a block, so carry-over is still left to the crossover model, "
                "which needs 3 cycles before any label of timed metrics stands"
            )
        if len(self.card.card.cells) < 2:
            return "washout: none (one cell: no other arm runs before a block)"
        return (
            "washout: none (design.washout 0): carry-over is left to the crossover model, "
            "which needs 3 cycles before any label of timed metrics stands"
        )

    def boots(self, boot: BootDesign | None = None) -> dict[str, int]:
        """Boots per box under ``boot`` (default: the card's ``design.boot``)."""
        design = boot or self.card.card.design.boot
        groups: dict[str, set[str]] = {}
        for run in self.runs:
            groups.setdefault(run.box, set()).add(boot_group(run, design) or run.run_id)
        return {box: len(found) for box, found in groups.items()}

    def boot_design_problems(self) -> dict[BootDesign, str]:
        """Each boot design -> why this card cannot take it ("" when it can): the card's own
        check (:func:`~harness.card.checks.shared_boot_problems`) with that design."""
        from harness.card.checks import shared_boot_problems

        loaded = self.card
        found: dict[BootDesign, str] = {}
        for design in BOOT_DESIGNS:
            if design != "per-block" and "cold" in loaded.card.design.cache_states:
                found[design] = "cold runs need a fresh boot"
                continue
            card = loaded.card.model_copy(
                update={"design": loaded.card.design.model_copy(update={"boot": design})}
            )
            problems = shared_boot_problems(card, loaded.runtime)
            found[design] = problems[0][1] if problems else ""
        return found

    def estimated_total_s(
        self, *, boot: BootDesign | None = None, boot_s: float | None = None
    ) -> float:
        """Rough seconds for the whole plan: a fleet's boxes run at once, so its busiest box.

        Each boot costs ``boot_s`` (default: the profile's ``expected_boot_s``) and each run
        its drive; a run on a shared boot its washout too.
        """
        runtime = self.card.runtime
        boot_s = runtime.expected_boot_s if boot_s is None else boot_s
        design = boot or self.card.card.design.boot
        washout_s = 0.0
        if runtime.live is not None and design != "per-block":
            washout_s = runtime.live.washout_s + runtime.live.washout_requests * request_s(
                self.card
            )
        per_box: dict[str, int] = {}
        for run in self.runs:
            per_box[run.box] = per_box.get(run.box, 0) + 1
        boots = self.boots(boot)
        totals = [
            boots[box] * boot_s + count * self.estimated_drive_s() + count * washout_s
            for box, count in per_box.items()
        ]
        return max(totals, default=0.0)

    def to_json(self) -> dict[str, object]:
        """The plan as ``{"schema_version", "campaign", "runs": [...]}`` in execution order."""
        return {
            "schema_version": SCHEMA_VERSION,
            "campaign": self.card.card.campaign,
            "estimated_total_s": round(self.estimated_total_s(), 1),
            "estimated_run_s": round(self.estimated_run_s(), 1),
            "estimate_basis": self.estimate_basis(),
            "max_runs": self.max_runs(),
            "scale": self.scale,
            "cycles": self.cycles,
            "washout_requests": washout_requests(self.card),
            "runs": [
                {
                    "run_id": r.run_id,
                    "cell": r.cell,
                    "cycle": r.cycle,
                    "slot": r.slot,
                    "repeat": r.repeat,
                    "cache_state": r.cache_state,
                    "box": r.box,
                    "pattern": r.pattern,
                    "arm": r.arm,
                    "comparison": r.comparison,
                    "block": r.block,
                }
                for r in self.runs
            ],
        }


BOOT_DESIGNS: tuple[BootDesign, ...] = ("per-block", "per-cycle", "per-campaign")


def boot_group(run: Run, boot: BootDesign) -> str | None:
    """The boot a run shares with the runs next to it on its box: its cycle's (per-cycle) or
    the campaign's (per-campaign); None when it boots its own (per-block). A runner reuses a
    boot only across consecutive runs of its own share, so a group never spans boxes."""
    if boot == "per-cycle":
        return f"cycle{run.cycle}"
    if boot == "per-campaign":
        return "campaign"
    return None


def _mirrored(items: list[str], cycle: int) -> list[str]:
    """Card order on even cycles, reversed on odd ones, so no item is always first."""
    return list(items) if cycle % 2 == 0 else list(reversed(items))


def cohort_lane(loaded: LoadedCard, comparison: str, cache_state: str) -> int:
    """The lane of a cohort: its cache state × comparison, numbered in card order (a
    sequential design's cells share one lane: a cycle's cells run together)."""
    card = loaded.card
    states: list[str] = list(card.design.cache_states)
    lanes = list(card.treatments) if card.design.order != "sequential" else [""]
    within = lanes.index(comparison) if card.design.order != "sequential" else 0
    return states.index(cache_state) * len(lanes) + within


def build_plan(loaded: LoadedCard, *, scale: float = 1.0, cycles: int | None = None) -> Plan:
    """Expand cells × cycles × cache states × repeats into the ordered runs of the card.

    ``cycles`` overrides ``design.cycles`` (a campaign extended by :func:`extend_plan`).
    """
    card = loaded.card
    design = card.design
    n_cycles = design.cycles if cycles is None else cycles
    if n_cycles < 1:
        raise PlanError(f"cycles must be at least 1, got {n_cycles}")
    specs: list[tuple[str, int, int, str, str, str, str]] = []
    # (cell, cycle, slot, cache_state, pattern, comparison, block)
    if design.order == "sequential":
        for cycle in range(n_cycles):
            for state in _mirrored(list(design.cache_states), cycle):
                for slot, cell in enumerate(card.cells):
                    block = f"c{cycle}-{state}-{cell}"
                    specs.append((cell, cycle, slot, state, "SEQ", cell, block))
    else:
        control = card.control
        if control is None or not card.treatments:
            raise PlanError(f"order {design.order!r} needs a control and at least one other cell")
        for cycle in range(n_cycles):
            pattern = cycle_pattern(cycle)
            for state in _mirrored(list(design.cache_states), cycle):
                for treatment in _mirrored(card.treatments, cycle):
                    for slot, arm in enumerate(pattern):
                        cell = control if arm == "A" else treatment
                        block = f"c{cycle}-{state}-{treatment}-s{slot}"
                        specs.append((cell, cycle, slot, state, pattern, treatment, block))
    boxes = [name for name, _ in loaded.boxes]
    runs: list[Run] = []
    for cell, cycle, slot, state, pattern, comparison, block in specs:
        lane = cohort_lane(loaded, comparison, state)
        for repeat in range(design.repeats):
            index = len(runs)
            run_id = f"{index:04d}-{cell}-c{cycle}-{state}-s{slot}-r{repeat}"
            runs.append(
                Run(
                    index=index,
                    run_id=run_id,
                    cell=cell,
                    cycle=cycle,
                    slot=slot,
                    repeat=repeat,
                    cache_state=state,
                    box=fleet_box(boxes, cycle, lane),
                    pattern=pattern,
                    comparison=comparison,
                    block=block,
                )
            )
    return Plan(card=loaded, runs=tuple(runs), scale=scale, cycles=n_cycles)


def extend_plan(plan: Plan, cycles: int) -> Plan:
    """The plan grown to ``cycles`` mirrored cycles in all; every run planned so far is kept.

    The new cycles continue the ABBA/BAAB alternation and the mirrored order of cache states and
    treatments exactly as a plan of ``cycles`` from the start would have them, and the runs
    already planned come first, unchanged (same ids, same fields). Fewer cycles than planned is
    a PlanError: a campaign only grows, runs already made are never dropped.
    """
    if cycles < plan.cycles:
        raise PlanError(
            f"{plan.card.card.campaign}: cannot plan {cycles} cycles, {plan.cycles} are already "
            f"planned and a campaign only grows; ask for {plan.cycles} or more"
        )
    if cycles == plan.cycles:
        return plan
    grown = build_plan(plan.card, scale=plan.scale, cycles=cycles)
    if grown.runs[: len(plan.runs)] != plan.runs:
        # Cannot happen while build_plan lays runs out cycle by cycle; refuse rather than
        # renumber runs that already have records.
        raise PlanError(
            f"extending {plan.card.card.campaign!r} to {cycles} cycles would change runs already "
            "planned; start a new campaign with design.cycles raised"
        )
    return grown


def plan_json_text(plan: Plan) -> str:
    """The plan as indented JSON text."""
    return json.dumps(plan.to_json(), indent=2)


__all__ = [
    "BOOT_DESIGNS",
    "Plan",
    "Run",
    "boot_group",
    "build_plan",
    "cohort_lane",
    "cycle_pattern",
    "extend_plan",
    "fleet_box",
    "plan_json_text",
]
