"""Workload phases: which prompts each run sends, in which order."""

from __future__ import annotations

import dataclasses

from harness.card import load_card
from harness.drive.workload import build_phases
from tests.conftest import REPO


def test_a_many_domain_phase_takes_its_domains_in_turn() -> None:
    loaded = load_card(REPO / "campaigns" / "seed-map-heldout.yaml")
    mixed = build_phases(loaded, warmup=False)[0]
    domains = [item.domain for item in mixed.items]
    assert len(domains) == 14
    assert sorted(set(domains[:7])) == sorted(mixed_domains := set(domains))
    assert len(mixed_domains) == 7
    # Every prompt is held out, and none repeats before each domain's prompts have had a turn.
    assert all(item.prompt_id.split("-")[-2] != "fit" for item in mixed.items)
    assert len({item.prompt_id for item in mixed.items}) == 14


def test_single_domain_phases_and_the_quality_suite_come_last() -> None:
    loaded = load_card(REPO / "campaigns" / "seed-map-heldout.yaml")
    phases = build_phases(loaded, warmup=False)
    assert [p.name for p in phases] == ["mixed", "agent", "prose", "quality"]
    assert {i.domain for i in phases[1].items} == {"agent"}
    assert len(phases[-1].items) == 12


def test_warm_up_and_washout_are_the_first_phases_traffic() -> None:
    # They were drawn from every domain of the pool, so the demo's tier had learnt prose (and
    # python, math, ...) before its agent -> prose shift, and the stale map's transient read
    # 4-8% where, warmed on agent traffic as its first phase runs, it reads ~24%.
    loaded = load_card(REPO / "campaigns" / "demo.yaml")
    (warmup,) = build_phases(loaded, warmup=True, count=5)
    assert [item.warmup for item in warmup.items] == [True] * 5
    assert {item.domain for item in warmup.items} == {"agent"}
    # A workload without phases warms on its whole held-out pool, as before.
    card = loaded.card.model_copy(
        update={"workload": loaded.card.workload.model_copy(update={"phases": None})}
    )
    bare = dataclasses.replace(loaded, card=card)
    (pooled,) = build_phases(bare, warmup=True, count=12)
    assert len({item.domain for item in pooled.items}) > 1
