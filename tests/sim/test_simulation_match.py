"""The simulation a campaign confirms, held against the card: seed 000's miss caught early.

Seed 000's simulator ran its ladder from the September static map while the box booted the seed
map, and both predictions missed. `simulate` records what it replayed; `validate` and `plan`
name each way a card differs from its newest simulation, and the measured campaign's report
says it beside the errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from harness.analyze.campaign import analyze_campaign
from tests.conftest import DATA, REPO, run_cli

WASHED = DATA / "campaigns" / "demo-washed"
TRACE = next((WASHED / "runs").glob("0000-*")) / "route-trace.jsonl"


def _demo(folder: Path, *, seed_map: str = "seed.json", drain_every: int = 128) -> Path:
    """The shipped demo card with its paths made absolute, the seed cell's map and knob set."""
    card = yaml.safe_load((REPO / "campaigns" / "demo.yaml").read_text(encoding="utf-8"))
    here = REPO / "campaigns"
    card["prompts"]["pools"] = [str(here / p) for p in card["prompts"]["pools"]]
    for cell in card["cells"].values():
        cell["files"] = {k: str(here / v) for k, v in cell["files"].items()}
    card["cells"]["seed"]["files"]["rowmap"] = str(here / "maps" / seed_map)
    card["cells"]["seed"]["knobs"]["drain_every"] = drain_every
    path = folder / f"demo-{seed_map}-{drain_every}.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
    return path


def test_validate_and_plan_name_how_a_card_differs_from_its_simulation(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    # The desk simulated the seed cell booting the stale map (the seed's own mistake).
    simulated = _demo(tmp_path, seed_map="stale.json")
    sim = run_cli("simulate", str(simulated), "--traces", str(TRACE), "--reports", str(reports))
    assert sim.code == 0, sim.stderr
    same = run_cli("validate", str(simulated), "--reports", str(reports))
    assert same.code == 0 and "differs from the simulation" not in same.stdout, same.stdout
    card = _demo(tmp_path, drain_every=64)  # the box boots the seed map, with another knob
    checked = run_cli("validate", str(card), "--reports", str(reports))
    assert checked.code == 0, checked.stderr
    lines = [line for line in checked.stdout.splitlines() if "differs from the simulation" in line]
    assert len(lines) == 2, checked.stdout
    assert any("cells.seed.files.rowmap: the boot map differs" in line for line in lines)
    assert any("cells.seed.knobs: drain_every 128 -> 64" in line for line in lines)
    planned = run_cli("plan", str(card), "--reports", str(reports))
    assert planned.code == 0 and "cells.seed.files.rowmap: the boot map differs" in planned.stdout
    # No simulation where the card looks: nothing to say.
    elsewhere = run_cli("validate", str(card), "--reports", str(tmp_path / "none"))
    assert "differs from the simulation" not in elsewhere.stdout


def test_the_report_says_the_simulation_replayed_another_campaign(tmp_path: Path) -> None:
    root = tmp_path / "reports" / "demo" / "20260101T000000Z"
    shutil.copytree(WASHED, root)
    simulated = _demo(tmp_path, seed_map="stale.json")
    sim = run_cli("simulate", str(simulated), "--traces", str(TRACE),
                  "--reports", str(tmp_path / "reports"))  # fmt: skip
    assert sim.code == 0, sim.stderr
    predicted = analyze_campaign(root).seed_tables.predicted
    assert predicted is not None
    assert any("cells.seed.files.rowmap: the boot map differs" in m for m in predicted.mismatches)
    report = run_cli("report", str(root))
    assert report.code == 0, report.stderr
    html = (root / "report.html").read_text(encoding="utf-8")
    assert "The simulation replayed another campaign" in html


def test_predicted_vs_measured_says_whether_it_was_predicted_or_replayed() -> None:
    # A simulation replayed from the measured campaign's own route traces, after it ran,
    # matches it closely by construction: the table must not read as "simulate first".
    from harness.analyze.predicted import provenance

    root = "/r/reports/demo/20260101T000000Z"
    own = [f"{root}/runs/0000-stale-c0-warm-s0-r0/route-trace.jsonl"]
    assert provenance(root, own, 100.0, 50.0).startswith("replayed after this campaign ran")
    relative = ["reports/demo/20260101T000000Z/runs/0001-seed-c0-warm-s1-r0/route-trace.jsonl"]
    assert provenance(root, relative, 100.0, 150.0).startswith("replayed after")
    other = ["/r/fit/route-trace.jsonl"]
    assert provenance(root, other, 100.0, 50.0).startswith("simulated before this campaign")
    assert provenance(root, other, 100.0, 150.0).startswith("simulated after this campaign")
    assert "not recorded" in provenance(root, other, None, 150.0)


def test_a_recovery_row_says_how_many_runs_had_no_t90_to_take() -> None:
    # Seed 000's ladder: a T90 median over 1 run of 18 read like a finding without "17/18 n/a".
    import pandas as pd

    from harness.analyze.predicted import recovery_na

    shifts = pd.DataFrame(
        {
            "run_id": ["r0", "r0", "r1", "r2", "r3"],
            "cell": ["a", "a", "a", "a", "b"],
            "cache_state": ["warm"] * 5,
            "excess": [False, True, False, False, True],
        }
    )
    assert recovery_na(shifts, "a", "warm") == "2/3 n/a"  # r0 had an excess at one shift
    assert recovery_na(shifts, "b", "warm") == ""
