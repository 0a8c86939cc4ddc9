"""A sequential A/A end to end on the reference runtime: it runs to max_cycles (or stops only when
decided) without promoting. Stopping early on a real effect, with every look journalled, is the
demo's own test (tests/test_campaigns.py::test_demo_end_to_end)."""

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


def test_an_a_a_campaign_stops_only_when_decided_and_promotes_nothing(tmp_path: Path) -> None:
    design = (
        "design: {order: abba, cycles: 2, max_cycles: 3, sequential: true, repeats: 1, "
        "cache_states: [warm], retries: 1}"
    )
    code, root, output = _run(_sequential_card(tmp_path, "aa.yaml", design), tmp_path)
    assert code == 1, output
    looks = _looks(root)
    cycles = [e["cycles"] for e in looks]
    assert cycles == [2, 3][: len(cycles)] and len(cycles) >= 2, cycles
    assert [e["decision"] for e in looks] == ["continue"] * (len(looks) - 1) + ["stop"]
    # An A/A stops early only when every gated metric is decided (within noise, on a quiet
    # machine); else it runs to max_cycles, where both reasons can hold at once.
    why = looks[-1]["why"]
    if cycles[-1] < 3:
        assert why == "every gated metric is decided", why
    else:
        assert "max_cycles (3) reached" in why or why == "every gated metric is decided", why
    verdict = json.loads((root / "verdict.json").read_text())
    better = [g for g in verdict["gates"] if g["kind"] == "better"]
    assert better and not any(g["passed"] for g in better)
    for gate in better:
        assert "better" not in {str(e["label"]) for e in gate["evidence"].values()}
