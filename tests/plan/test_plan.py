"""The planner: mirrored order, balance, determinism."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.card import Card, load_card
from harness.card.phase_length import request_s
from harness.errors import PlanError
from harness.plan.build import Plan, build_plan, extend_plan
from tests.conftest import DATA, REPO, run_cli, shipped_card_variant

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
    assert design.sequential and design.max_cycles == 6
    assert plan.max_runs() == len(plan.runs) // design.cycles * 6
    assert "expected_ttft_s" in plan.estimate_basis()
    data = plan.to_json()
    assert data["max_runs"] == plan.max_runs() and data["estimate_basis"]


def test_a_shift_phase_too_short_for_t90_is_a_warning_at_validate_and_plan(tmp_path: Path) -> None:
    card = str(REPO / "campaigns" / "demo.yaml")
    shipped = run_cli("validate", card)
    assert shipped.code == 0 and "warning" not in shipped.stdout  # the demo is sized to measure
    # Its until_recovered extension reaches T90's span even at a quarter of its requests.
    quarter = run_cli("validate", "--scale", "0.25", card)
    assert quarter.code == 0 and "warning" not in quarter.stdout, quarter.stdout
    fixed = shipped_card_variant(
        "demo.yaml",
        tmp_path,
        {
            ", until_recovered: 30}": "}",
        },
    )
    for verb in (["validate"], ["plan"]):
        quick = run_cli(*verb, "--scale", "0.25", str(fixed))
        assert quick.code == 0, quick.stderr
        text = " ".join(quick.stdout.split())
        # The demo times recovery on the step clock: a request is max_tokens (48) steps.
        assert "workload.phases.prose: the shift phase serves at most 96 host steps" in text
        assert (
            "under the 288 T90 needs at analysis.converged_span_steps=192 + hold_steps=96" in text
        )
        assert "at --scale 0.25" in text and "at least 24 requests (before scaling)" in text


def test_boot_designs_count_boots_per_cycle_and_price_them() -> None:
    loaded = load_card(DATA / "cards" / "e2e" / "same-boot.yaml")
    plan = build_plan(loaded)
    assert plan.boots("per-block") == {"local": 8}
    assert plan.boots("per-cycle") == {"local": 2}
    assert plan.boots("per-campaign") == {"local": 1}
    drive_s = plan.estimated_drive_s()
    assert plan.estimated_total_s(boot="per-block", boot_s=100) == pytest.approx(800 + 8 * drive_s)
    live = loaded.runtime.live
    assert live is not None
    washout_s = live.washout_requests * request_s(loaded)  # every run of a shared boot
    assert plan.estimated_total_s(boot="per-cycle", boot_s=100) == pytest.approx(
        200 + 8 * drive_s + 8 * washout_s
    )
    # The card's own design is what a plain estimate uses.
    assert plan.estimated_total_s(boot_s=100) == plan.estimated_total_s(
        boot="per-cycle", boot_s=100
    )
    problems = plan.boot_design_problems()
    assert problems == {"per-block": "", "per-cycle": "", "per-campaign": ""}
    # The tiny card's cells differ in env: they cannot share a boot, and the plan says why.
    tiny = build_plan(load_card(DATA / "cards" / "e2e" / "tiny.yaml")).boot_design_problems()
    assert tiny["per-block"] == ""
    assert tiny["per-cycle"].startswith("env differs from control's")


def test_plan_boot_s_prints_every_boot_design() -> None:
    result = run_cli("plan", str(DATA / "cards" / "e2e" / "same-boot.yaml"), "--boot-s", "480")
    assert result.code == 0, result.stderr
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.stdout.splitlines()
        if line.startswith("│ per-")
    }
    assert rows == {"per-block": "8", "per-cycle": "2", "per-campaign": "1"}
    assert "boot designs at 480 s a boot (card: per-cycle)" in result.stdout
    bad = run_cli("plan", str(DATA / "cards" / "e2e" / "same-boot.yaml"), "--boot-s", "x")
    assert bad.code == 2 and "not a number of seconds" in bad.stderr


def test_the_default_washout_is_a_whole_block_and_a_card_of_one_cell_sends_none() -> None:
    # A whole block of the cell's own requests before each warm block (the paired design,
    # which clears carry-over that outlasts a block of other traffic); a soak's one cell has no
    # other arm before it, so a washout there would only lengthen it.
    from harness.card.phase_length import scored_requests, washout_requests

    valid = load_card(DATA / "cards" / "valid.yaml")
    assert valid.card.design.washout == 1.0
    assert washout_requests(valid) == scored_requests(valid)
    soak = build_plan(load_card(REPO / "campaigns" / "soak.yaml"))
    assert washout_requests(soak.card) == 0
    assert soak.washout_text() == "washout: none (one cell: no other arm runs before a block)"


def test_plan_prices_runs_from_the_cards_last_campaign_here(tmp_path: Path) -> None:
    # The profile's expected speeds are one box's guess; the card's last campaign on this box
    # is a measurement: its median run (boot kept, drive rescaled to the planned scale).
    reports = tmp_path / "reports"
    shutil.copytree(DATA / "campaigns" / "demo-washed", reports / "demo" / "20261205T181524Z")
    card = str(REPO / "campaigns" / "demo.yaml")
    half = run_cli("plan", card, "--reports", str(reports), "--scale", "0.5")
    assert half.code == 0, half.stderr
    text = " ".join(half.stdout.split())
    assert "the median of 16 completed runs of" in text and "(--scale 0.5, boot 0.9 s)" in text
    assert "rescaled" not in text
    whole = " ".join(run_cli("plan", card, "--reports", str(reports)).stdout.split())
    assert "its drive rescaled to --scale 1" in whole

    def per_run(words: str) -> str:
        return words.split("measured: ", 1)[1].split(" per run", 1)[0]

    assert per_run(whole) != per_run(text)  # twice the requests: a longer run
    # Nothing measured (another card, or no store): the estimate alone, as before.
    alone = run_cli("plan", card, "--reports", str(tmp_path / "empty"))
    assert alone.code == 0 and "measured:" not in alone.stdout
