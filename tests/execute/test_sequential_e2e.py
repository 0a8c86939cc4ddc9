"""Sequential campaigns end to end on the reference runtime: stop early on a real effect, run to
max_cycles on an A/A without promoting, and every look journalled with what it saw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DATA, run_cli

CARDS = DATA / "cards" / "analysis"
pytestmark = pytest.mark.slow


def _sequential_card(tmp_path: Path, source: str, design: str) -> Path:
    text = (CARDS / source).read_text(encoding="utf-8")
    start = text.index("design:")
    end = text.index("\n", start)
    text = text[:start] + design + text[end:]
    path = tmp_path / source
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _run(card: Path, tmp_path: Path) -> tuple[int, Path, str]:
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--quiet", "--reports", str(reports), timeout_s=1500)
    (root,) = (p.parent for p in reports.glob("*/*/plan.json"))
    return result.code, root, result.stdout + result.stderr


def _looks(root: Path) -> list[dict[str, Any]]:
    lines = (root / "journal.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return [e for e in events if e["event"] == "look"]


def test_a_real_effect_stops_before_max_cycles(tmp_path: Path) -> None:
    design = (
        "design: {order: abba, cycles: 2, max_cycles: 6, sequential: true, repeats: 1, "
        "cache_states: [warm], retries: 1}"
    )
    code, root, output = _run(_sequential_card(tmp_path, "map.yaml", design), tmp_path)
    assert code == 0, output
    looks = _looks(root)
    # Two cycles cannot decide at the first look's level (O'Brien–Fleming spends almost
    # nothing there); the all-hot map's speed-up is decided long before the sixth cycle.
    assert looks[0]["cycles"] == 2 and looks[0]["decision"] == "continue"
    assert looks[-1]["decision"] == "stop" and looks[-1]["cycles"] < 6
    assert [e["cycles"] for e in looks] == list(range(2, looks[-1]["cycles"] + 1))
    assert all(e["nominal_alpha"] < 0.05 for e in looks)
    plan = json.loads((root / "plan.json").read_text())
    assert plan["cycles"] == looks[-1]["cycles"]
    summary = json.loads((root / "analysis" / "summary.json").read_text())
    assert summary["sequential"]["cycles"] == looks[-1]["cycles"]
    labels = {c["metric"]: c["label"] for c in summary["comparisons"]}
    assert labels["decode_tok_s"] == labels["tpot_p50_ms"] == "better"
    assert "look " in output and "stop: every gated metric is decided" in output
    page = (root / "report.html").read_text()
    assert 'id="looks"' in page


def test_an_a_a_campaign_runs_to_max_cycles_and_promotes_nothing(tmp_path: Path) -> None:
    design = (
        "design: {order: abba, cycles: 2, max_cycles: 4, sequential: true, repeats: 1, "
        "cache_states: [warm], retries: 1}"
    )
    code, root, output = _run(_sequential_card(tmp_path, "aa.yaml", design), tmp_path)
    assert code == 1, output
    looks = _looks(root)
    assert [e["cycles"] for e in looks] == [2, 3, 4]
    assert [e["decision"] for e in looks] == ["continue", "continue", "stop"]
    # At the last look both can hold: an A/A may be decided (within noise) as max_cycles is hit.
    why = looks[-1]["why"]
    assert "max_cycles (4) reached" in why or why == "every gated metric is decided", why
    verdict = json.loads((root / "verdict.json").read_text())
    better = [g for g in verdict["gates"] if g["kind"] == "better"]
    assert better and not any(g["passed"] for g in better)
    for gate in better:
        assert "better" not in {str(e["label"]) for e in gate["evidence"].values()}
