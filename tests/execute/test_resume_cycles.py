"""End to end with the real reference runtime: a campaign grown by a cycle from its own directory.

``harness run --resume DIR --cycles N`` runs only the new cycles' runs, from the card and pool the
directory froze, whatever happened to the originals; a directory made before inputs were frozen
resumes from ``card.path``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.formats.records import Journal
from tests.conftest import DATA, REPO, run_cli

TINY = DATA / "cards" / "e2e" / "tiny.yaml"
pytestmark = pytest.mark.slow


def _campaign(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny card (1 cycle, 4 runs) and its pool in a folder of their own, run once."""
    src = tmp_path / "src"
    (src / "pools").mkdir(parents=True)
    shutil.copy(DATA / "pools" / "small.jsonl", src / "pools" / "small.jsonl")
    card = src / "tiny.yaml"
    card.write_text(TINY.read_text().replace("../../pools/", "pools/"))
    reports = tmp_path / "reports"
    first = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=300)
    assert first.code == 0, first.stdout + first.stderr
    (root,) = reports.glob("tiny/*")
    # The runtime's slow tier (kept between boots for cold runs) is given back at the end.
    assert (root / "box").is_dir() and not (root / "box" / "cache").exists()
    return card, root


def _started(root: Path) -> list[str]:
    return [
        e["run_id"] for e in Journal(root / "journal.jsonl").events() if e["event"] == "run_start"
    ]


def test_a_campaign_grows_by_a_cycle_from_its_frozen_inputs(tmp_path: Path) -> None:
    card, root = _campaign(tmp_path)
    old_plan = json.loads((root / "plan.json").read_text())
    assert old_plan["cycles"] == 1 and len(old_plan["runs"]) == 4
    # The original card is edited (it would plan 5 cycles) and the pool moved away.
    card.write_text(card.read_text().replace("cycles: 1", "cycles: 5"))
    pool = card.parent / "pools" / "small.jsonl"
    pool.rename(tmp_path / "elsewhere.jsonl")

    # From another folder: nothing is looked up beside the card or in ./campaigns.
    grown = run_cli("run", "--resume", str(root), "--cycles", "2", "--quiet", cwd=tmp_path)
    assert grown.code == 0, grown.stdout + grown.stderr
    copy = root / "inputs" / "pools" / "small.jsonl"
    assert f"note: {pool}: gone; using the frozen copy {copy}" in grown.stdout
    assert f"note: {card}: changed since the campaign started" in grown.stdout
    assert not (root / "box" / "cache").exists()  # rebuilt by the first new boot, given back
    assert "extended: 1 → 2 cycles (8 runs planned)" in grown.stdout

    plan = json.loads((root / "plan.json").read_text())
    assert plan["cycles"] == 2 and plan["runs"][:4] == old_plan["runs"]  # field for field
    assert [r["pattern"] for r in plan["runs"][4:]] == ["BAAB"] * 4
    assert [r["cell"] for r in plan["runs"][4:]] == ["wide", "control", "control", "wide"]
    started = _started(root)
    assert started[:4] == [r["run_id"] for r in old_plan["runs"]]
    assert started[4:] == [r["run_id"] for r in plan["runs"][4:]]  # only the new cycle ran
    events = Journal(root / "journal.jsonl").events()
    (extended,) = [e for e in events if e["event"] == "campaign_extended"]
    assert (extended["from"], extended["to"], extended["runs_after"]) == (1, 2, 8)
    summary = json.loads((root / "analysis" / "summary.json").read_text())
    assert {c["n_cycles"] for c in summary["comparisons"]} == {2}

    shrink = run_cli("run", "--resume", str(root), "--cycles", "1", "--quiet")
    assert shrink.code == 2
    assert shrink.stderr.strip() == (
        f"--cycles 1: {root} already has 2 cycles planned (8 runs) and a campaign only grows; "
        "give --cycles 2 or more, or leave --cycles out to resume as planned"
    )
    assert _started(root) == started  # nothing ran


def test_a_directory_made_before_inputs_were_frozen_resumes_from_card_path(
    tmp_path: Path,
) -> None:
    _, root = _campaign(tmp_path)
    # What such a directory looked like: no inputs/, a plan without `cycles`, and a journal
    # without seals (harness.formats.seal came later still).
    shutil.rmtree(root / "inputs")
    plan = json.loads((root / "plan.json").read_text())
    del plan["cycles"]
    (root / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    journal = root / "journal.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines() if line]
    unsealed = [{k: v for k, v in e.items() if k not in ("seal", "files", "prev")} for e in events]
    journal.write_text("".join(json.dumps(e) + "\n" for e in unsealed))
    # ... and no journal head kept for it (that came last).
    (root.parent.parent / "history" / "journal-heads.jsonl").unlink()

    # Its runs complete either way; its verdict is gated only with --allow-unsealed, and is
    # then marked unverified (a stripped seal must not become a PASS).
    resumed = run_cli(
        "run", "--resume", str(root), "--cycles", "2", "--quiet", "--allow-unsealed", cwd=REPO
    )
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    assert "UNVERIFIED:" in resumed.stdout
    assert json.loads((root / "verdict.json").read_text())["verified"] is False
    source = (root / "card.path").read_text().strip()
    assert (
        f"note: {root} keeps no copy of its inputs (made before campaign directories did); "
        f"loading the card from {source}, as before"
    ) in resumed.stdout
    assert len(_started(root)) == 8
    assert json.loads((root / "plan.json").read_text())["cycles"] == 2
    assert not (root / "inputs").exists()  # not frozen after the fact: the originals may differ
