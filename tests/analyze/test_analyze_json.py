"""``harness analyze --json`` of fixed run records, pinned by a golden file.

The records are a real demo campaign (tests/data/campaigns/demo-shaped/README.md says how it was
made). Every table a reviewer reads comes from this JSON's numbers, so a change that moves one
shows up here as a diff. On a mismatch the test writes the got-file beside the golden one and
prints a unified diff (:func:`tests.golden.assert_golden`); ``HARNESS_UPDATE_GOLDEN=1`` rewrites
the golden file instead.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import DATA, run_cli
from tests.golden import assert_golden

RECORDS = DATA / "campaigns" / "demo-shaped"
GOLDEN = DATA / "golden" / "demo-shaped.analysis.json"
SIGNIFICANT = 10  # digits kept: far below any difference a reviewer reads, above libm noise


def _canonical(value: Any) -> Any:
    """Floats rounded to SIGNIFICANT digits, so the file compares across numpy builds."""
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return value
        return float(f"{value:.{SIGNIFICANT}g}")
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _analyze(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    root = tmp_path / "demo" / "20261201T100919Z"
    shutil.copytree(RECORDS, root, ignore=shutil.ignore_patterns("README.md"))
    result = run_cli("analyze", str(root), "--json")
    assert result.code == 0, result.stdout + result.stderr
    return root, _canonical(json.loads(result.stdout))


def test_analyze_json_matches_the_golden_file(tmp_path: Path) -> None:
    _, got = _analyze(tmp_path)
    assert_golden(GOLDEN.name, json.dumps(got, indent=2, sort_keys=True) + "\n")


def test_seed_tables_are_in_the_json_and_the_parquet_files(tmp_path: Path) -> None:
    root, got = _analyze(tmp_path)
    tables = got["seed_tables"]
    # The demo's shape: one shift agent → prose, a control and one cell, one cache state.
    ladder = tables["recovery"]
    assert ladder["directions"] == [["agent", "prose"]]
    assert [r["cell"] for r in ladder["rows"]] == ["stale", "seed"]
    assert ladder["rows"][0]["control"] and ladder["rows"][0]["t90"][0]["vs_control"] == 1.0
    (frozen,) = tables["frozen_map"]
    assert (frozen["cell"], frozen["control"]) == ("seed", "stale")
    aggregate = frozen["rows"][0]
    decode = next(c for c in got["comparisons"] if c["metric"] == "decode_tok_s")
    assert aggregate["comparison"]["ratio"] == decode["ratio"]
    assert aggregate["comparison"]["label"] == decode["label"]
    assert [r["cell"] for r in tables["policy"]] == ["stale", "seed"]
    assert tables["predicted"] is None  # no simulated sibling beside these records
    # The same numbers on disk, one table per file.
    recovery = pd.read_parquet(root / "analysis" / "recovery.parquet")
    assert list(recovery["cell"]) == ["stale", "seed"]
    stale, seed = (row["t90"][0] for row in ladder["rows"])
    assert recovery["t90_median_s"].iloc[0] == pytest.approx(stale["median_s"], rel=1e-9)
    # The seed map's cold share barely moves at the shift (peak 0.9% beside the stale map's
    # 12.1%): no excess beyond noise in any run, so T90 is n/a (null), not "never" — which read
    # as the fitted map recovering slower — and its peak and converged shares are still shown.
    assert seed["median_s"] is None and not seed["never_majority"]
    assert seed["no_excess"] == seed["runs"] == 6
    assert seed["peak_cold_share"] < 0.01 < stale["peak_cold_share"]
    assert math.isnan(recovery["t90_median_s"].iloc[1])
    policy = pd.read_parquet(root / "analysis" / "policy.parquet")
    assert policy["hit_rate"].tolist() == pytest.approx([r["hit_rate"] for r in tables["policy"]])
    frozen_rows = pd.read_parquet(root / "analysis" / "frozen_map.parquet")
    assert frozen_rows["label"].tolist() == [r["label"] for r in frozen["rows"]]
