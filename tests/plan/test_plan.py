"""The planner: mirrored order, balance, determinism."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.card import Card, load_card
from harness.errors import PlanError
from harness.plan.build import Plan, build_plan, extend_plan
from tests.conftest import DATA, REPO, run_cli

BASE = load_card(DATA / "cards" / "valid.yaml")


def _plan(cells: int, cycles: int, repeats: int, states: list[str], order: str = "abba") -> Plan:
    raw = BASE.card.model_dump()
    raw["cells"] = {"control": {}} | {f"b{i}": {} for i in range(1, cells)}
    raw["control"] = "control"
    raw["gates"] = []
    raw["design"] = {
        "order": order,
        "cycles": cycles,
        "repeats": repeats,
        "cache_states": states,
    }
    card = Card.model_validate(raw)
    return build_plan(type(BASE)(**{**BASE.__dict__, "card": card}))


def test_two_cells_alternate_abba_baab() -> None:
    plan = _plan(cells=2, cycles=3, repeats=1, states=["warm"])
    letters = "".join("A" if r.cell == "control" else "B" for r in plan.runs)
    assert letters == "ABBA" + "BAAB" + "ABBA"
    assert [r.pattern for r in plan.runs[::4]] == ["ABBA", "BAAB", "ABBA"]


def test_ladder_gives_each_cell_its_own_mirrored_cycle_against_the_control() -> None:
    plan = _plan(cells=3, cycles=2, repeats=1, states=["warm"])
    groups = [plan.runs[i : i + 4] for i in range(0, len(plan.runs), 4)]
    assert [(g[0].cycle, g[0].comparison) for g in groups] == [
        (0, "b1"),
        (0, "b2"),
        (1, "b2"),
        (1, "b1"),
    ]
    for group in groups:
        assert {r.cell for r in group} == {"control", group[0].comparison}


def test_repeats_stay_inside_their_block_and_states_never_mix_in_a_subcycle() -> None:
    plan = _plan(cells=2, cycles=2, repeats=3, states=["warm", "cold"])
    blocks: dict[str, list[int]] = {}
    for run in plan.runs:
        blocks.setdefault(run.block, []).append(run.index)
    for indices in blocks.values():
        assert indices == list(range(indices[0], indices[0] + 3))
    for i in range(0, len(plan.runs), 12):
        assert len({r.cache_state for r in plan.runs[i : i + 12]}) == 1


def test_run_ids_are_unique_and_ordered() -> None:
    plan = _plan(cells=3, cycles=2, repeats=2, states=["warm", "cold"])
    ids = [r.run_id for r in plan.runs]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)


@settings(max_examples=60, deadline=None)
@given(
    cells=st.integers(2, 5),
    cycles=st.integers(1, 6),
    repeats=st.integers(1, 3),
    states=st.sampled_from([["warm"], ["cold"], ["warm", "cold"], ["cold", "warm"]]),
)
def test_mirror_invariants(cells: int, cycles: int, repeats: int, states: list[str]) -> None:
    plan = _plan(cells, cycles, repeats, states)
    # Each cell appears equally often per cycle (the control once per sub-cycle it anchors).
    for cycle in range(cycles):
        counts = Counter(r.cell for r in plan.runs if r.cycle == cycle)
        treated = {c: n for c, n in counts.items() if c != "control"}
        assert len(set(treated.values())) == 1
        assert counts["control"] == sum(treated.values())
    # Within each mirrored sub-cycle the slot sums of control and cell are equal.
    subcycles: dict[tuple[int, str, str], list[tuple[str, int]]] = {}
    for run in plan.runs:
        key = (run.cycle, run.cache_state, run.comparison)
        subcycles.setdefault(key, []).append((run.cell, run.slot))
    for (_, _, treatment), members in subcycles.items():
        control_sum = sum(slot for cell, slot in members if cell == "control")
        cell_sum = sum(slot for cell, slot in members if cell == treatment)
        assert control_sum == cell_sum
    # Deterministic: the same card gives the same plan.
    again = _plan(cells, cycles, repeats, states)
    assert again.runs == plan.runs


def test_sequential_order_runs_cells_in_card_order(tmp_path: Path) -> None:
    plan = _plan(cells=3, cycles=1, repeats=2, states=["warm"], order="sequential")
    assert [r.cell for r in plan.runs] == ["control"] * 2 + ["b1"] * 2 + ["b2"] * 2


def test_plan_of_the_fixture_card() -> None:
    plan = build_plan(load_card(DATA / "cards" / "valid.yaml"))
    assert len(plan.runs) == 3 * 2 * 4 * 2  # cycles × states × slots × repeats
    assert plan.estimated_total_s() > 0


ORDERS = [
    # (order, cells): two-cell A/B, a ladder of three treatments, and cells in sequence.
    ("abba", 2),
    ("abba", 3),
    ("ladder", 4),
    ("sequential", 3),
]
STATES = [["warm"], ["cold"], ["warm", "cold"], ["cold", "warm"]]


@pytest.mark.parametrize(("order", "cells"), ORDERS)
@pytest.mark.parametrize("states", STATES)
@pytest.mark.parametrize("repeats", [1, 2])
def test_a_plan_of_more_cycles_begins_with_the_plan_of_fewer(
    order: str, cells: int, states: list[str], repeats: int
) -> None:
    plans = {m: _plan(cells, m, repeats, states, order) for m in range(1, 6)}
    for m in range(1, 6):
        for n in range(m, 6):
            short, long = plans[m].to_json()["runs"], plans[n].to_json()["runs"]
            assert isinstance(short, list) and isinstance(long, list)
            assert long[: len(short)] == short  # field for field, ids included
            grown = extend_plan(plans[m], n)
            assert grown.runs == plans[n].runs and grown.cycles == n
            ids = [r.run_id for r in grown.runs]
            assert len(set(ids)) == len(ids)
    # The new cycles continue the alternation: cycle j is ABBA for even j, BAAB for odd j.
    patterns = {r.cycle: r.pattern for r in plans[5].runs}
    want = "SEQ" if order == "sequential" else None
    assert [patterns[j] for j in range(5)] == [want or ("ABBA", "BAAB")[j % 2] for j in range(5)]


def test_extending_keeps_the_plan_at_the_same_count_and_refuses_to_shrink() -> None:
    plan = _plan(cells=2, cycles=3, repeats=1, states=["warm"])
    assert extend_plan(plan, 3) is plan
    with pytest.raises(PlanError, match="3 are already planned and a campaign only grows"):
        extend_plan(plan, 2)
    grown = extend_plan(plan, 4)
    assert grown.to_json()["cycles"] == 4 and plan.to_json()["cycles"] == 3
    assert grown.card.card.design.cycles == 3  # the card stays as written


def test_plan_states_its_estimate_basis_and_a_sequential_designs_most_runs() -> None:
    plan = build_plan(load_card(REPO / "campaigns" / "demo.yaml"))
    design = plan.card.card.design
    assert design.sequential and design.max_cycles == 4
    assert plan.max_runs() == len(plan.runs) // design.cycles * 4
    assert "expected_ttft_s" in plan.estimate_basis()
    data = plan.to_json()
    assert data["max_runs"] == plan.max_runs() and data["estimate_basis"]


def test_a_shift_phase_too_short_for_t90_is_a_warning_at_validate_and_plan() -> None:
    card = str(REPO / "campaigns" / "demo.yaml")
    shipped = run_cli("validate", card)
    assert shipped.code == 0 and "warning" not in shipped.stdout  # the demo is sized to measure
    for verb in (["validate"], ["plan"]):
        quick = run_cli(*verb, "--scale", "0.25", card)
        assert quick.code == 0, quick.stderr
        text = " ".join(quick.stdout.split())
        assert "workload.phases.prose: shift phase lasts about" in text
        assert "under the 3 s T90 needs at analysis.converged_span_s=2 + hold_s=1" in text
        assert "at --scale 0.25" in text and "requests (before scaling)" in text
