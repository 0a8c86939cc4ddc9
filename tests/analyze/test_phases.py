"""Workload phases: which prompts each run sends, in which order."""

from __future__ import annotations

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
