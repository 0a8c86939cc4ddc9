"""The shipped campaigns end to end on the reference runtime, at their smallest scale.

Timing verdicts on a shared two-core CI machine are noise-prone, so these tests assert what the
harness must always get right: every run completes, every record and table exists, the
deterministic evidence (hit rates, expert loads, exact outputs) points the seeds' way, and the
report renders. The timing labels themselves are checked against simulated data in test_stats.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def _variant(card: str, tmp_path: Path, replace: dict[str, str]) -> str:
    """A copy of a shipped card with some text replaced, beside links to its prompts and maps."""
    text = (REPO / "campaigns" / card).read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    folder = tmp_path / "cards"
    folder.mkdir()
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    (folder / card).write_text(text, encoding="utf-8")
    return str(folder / card)


def _run(card: str, tmp_path: Path, scale: str) -> tuple[int, Path, str]:
    reports = tmp_path / "reports"
    path = card if card.startswith("/") else f"campaigns/{card}"
    result = run_cli(
        "run", path, "--quiet", "--scale", scale, "--reports", str(reports), timeout_s=900
    )
    roots = list(reports.glob("*/*/plan.json"))
    assert roots, result.stdout + result.stderr
    return result.code, roots[0].parent, result.stdout + result.stderr


def _verdict(root: Path) -> dict[str, dict[str, object]]:
    verdict = json.loads((root / "verdict.json").read_text())
    return {gate["name"]: gate for gate in verdict["gates"]}


def _comparisons(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / "analysis" / "comparisons.parquet")


def test_demo_end_to_end(tmp_path: Path) -> None:
    code, root, output = _run("demo.yaml", tmp_path, "0.5")
    assert code in (0, 1), output  # 0 pass, 1 a timing gate could not be shown; never 2 or 3
    assert "verdict:" in output and "report:" in output
    gates = _verdict(root)
    assert gates["exact outputs all"]["passed"], gates
    assert gates["counter new_swapout_pages <= 0"]["passed"], gates
    comparisons = _comparisons(root)
    hit = comparisons[comparisons["metric"] == "hit_rate"].iloc[0]
    assert hit["label"] == "better" and hit["ratio"] > 1  # the seed map misses less, always
    loads = comparisons[comparisons["metric"] == "expert_loads"].iloc[0]
    assert loads["label"] == "better" and loads["ratio"] < 0.5
    decode = comparisons[comparisons["metric"] == "decode_tok_s"].iloc[0]
    assert decode["label"] != "worse"
    shifts = pd.read_parquet(root / "analysis" / "shifts.parquet")
    assert set(shifts["from_phase"]) == {"agent"} and set(shifts["to_phase"]) == {"prose"}
    html = (root / "report.html").read_text()
    assert "Verdict" in html or "verdict" in html
    assert (root / "verdict.junit.xml").is_file()


def test_seed_map_heldout_yields_the_frozen_map_table(tmp_path: Path) -> None:
    code, root, output = _run("seed-map-heldout.yaml", tmp_path, "0.3")
    assert code in (0, 1), output
    runs = pd.read_parquet(root / "analysis" / "runs.parquet")
    assert (runs["status"] == "ok").all()
    cells = pd.read_parquet(root / "analysis" / "cells.parquet").set_index("cell")
    for column in ("c1_tok_s", "first_request_tok_s", "hit_rate"):
        assert cells[column].notna().all(), column
    assert cells.loc["seed", "hit_rate"] > cells.loc["stale", "hit_rate"]
    domains = pd.read_parquet(root / "analysis" / "domains.parquet")
    assert {"agent", "en-prose"} <= set(domains["domain"])
    gates = _verdict(root)
    assert gates["quality 0/12"]["passed"]  # no regression against the stale map


def test_hotlist_priority_yields_the_policy_table(tmp_path: Path) -> None:
    # One cycle in each cache state (the card has two): 16 runs of 4 held-out conversations.
    card = _variant("hotlist-priority.yaml", tmp_path, {"cycles: 2": "cycles: 1"})
    code, root, output = _run(card, tmp_path, "0.3")
    assert code in (0, 1), output
    cells = pd.read_parquet(root / "analysis" / "cells.parquet")
    assert set(cells["cache_state"]) == {"warm", "cold"}
    for column in ("decode_tok_s", "hit_rate", "expert_loads", "bytes_read", "tpot_p50_ms"):
        assert cells[column].notna().all(), column
    warm = cells[cells["cache_state"] == "warm"].set_index("cell")
    # Seed 004's direction: the stale legacy priorities lock in; adaptive and trained miss less.
    assert warm.loc["adaptive", "hit_rate"] > warm.loc["legacy", "hit_rate"]
    assert warm.loc["trained", "hit_rate"] > warm.loc["legacy", "hit_rate"]
    assert "survives warm, cold" in _verdict(root)


def test_queue_rate_ladder_yields_the_cell_table(tmp_path: Path) -> None:
    # One repeat per block (the card has the seed's three): 12 runs.
    card = _variant("queue-rate-ladder.yaml", tmp_path, {"repeats: 3": "repeats: 1"})
    code, root, output = _run(card, tmp_path, "0.5")
    assert code in (0, 1), output
    shifts = pd.read_parquet(root / "analysis" / "shifts.parquet")
    directions = set(zip(shifts["from_phase"], shifts["to_phase"], strict=True))
    assert directions == {("agent", "prose"), ("prose", "agent-again")}
    cells = pd.read_parquet(root / "analysis" / "cells.parquet").set_index("cell")
    assert cells["churn_per_min"].notna().all()
    assert cells["c1_tok_s"].notna().all()
    # The stale companion boot misses more than the seed-map boot it is compared with.
    assert cells.loc["stale-b0", "cold_share"] > cells.loc["b0-shipped", "cold_share"]


def test_soak_fails_short_of_its_duration(tmp_path: Path) -> None:
    code, root, output = _run("soak.yaml", tmp_path, "0.1")
    gates = _verdict(root)
    soak = next(g for name, g in gates.items() if name.startswith("soak"))
    # At a tenth of its duration the soak must fail its duration bound, and say so.
    assert code == 1 and not soak["passed"], output
    assert "ran" in str(soak["reason"]) and "of 110 s" in str(soak["reason"])
    assert gates["counter lost_ring_records <= 0"]["passed"]


def test_every_card_documents_how_to_reach_a_real_box() -> None:
    for card in ("demo", "queue-rate-ladder", "seed-map-heldout", "hotlist-priority", "soak"):
        text = (REPO / "campaigns" / f"{card}.yaml").read_text()
        assert text.startswith("#"), f"{card}.yaml should open with what it reproduces"
