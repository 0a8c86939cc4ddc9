"""A box that remembers, end to end on the reference runtime: heat that relaxes with traffic.

The candidate is faster on a cool box (the control runs every decode step slower by a set
amount) and heats the box under its traffic, each decode step slower as the heat builds, so
that deployed — the candidate on a box it heated, the control on a cool one — it gains nothing.
With a half-life of two blocks of traffic no washout the card sends clears the heat: D̄ reads
the candidate's cool advantage, and only the runtime profile's probe of the heat file sees that
each block began where the other arm had left the box. With a half-life under a tenth of a
block the same campaign settles within its washout and decides on D̄ as it always did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, flat_text, run_cli

pytestmark = pytest.mark.slow

CARD = """\
campaign: heat
description: a candidate faster on a cool box that heats the box under its traffic
box: local
runtime: refbox
prompts:
  pools: [prompts/mixed.jsonl]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 48
  concurrency: 1
  warmup_requests: 1
  phases:
    - {{name: prose, domains: [en-prose], requests: 4}}
cells:
  cool:
    files: {{rowmap: maps/seed.json}}
    knobs: {{policy: adaptive, heat_state: {heat}, heat_slowdown_pct: 300,
            heat_half_life_requests: {half_life}, heat_source: 0, step_slowdown_pct: 300}}
  hot:
    files: {{rowmap: maps/seed.json}}
    knobs: {{policy: adaptive, heat_state: {heat}, heat_slowdown_pct: 300,
            heat_half_life_requests: {half_life}, heat_source: 1}}
control: cool
design: {{order: abba, cycles: 3, washout: 1, seed: 1}}
gates:
  - {{kind: better, metric: decode_tok_s}}
"""


def _campaign(tmp_path: Path, half_life: float) -> tuple[int, Path, str]:
    folder = tmp_path / f"h{half_life:g}"
    folder.mkdir()
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    card = folder / "heat.yaml"
    card.write_text(CARD.format(heat=folder / "heat.json", half_life=half_life), encoding="utf-8")
    reports = folder / "reports"
    result = run_cli("run", str(card), "--quiet", "--reports", str(reports), timeout_s=600)
    roots = list(reports.glob("*/*/plan.json"))
    assert roots, result.stdout + result.stderr
    return result.code, roots[0].parent, flat_text(result.stdout + result.stderr)


def _decode(root: Path) -> pd.Series:
    rows = pd.read_parquet(root / "analysis" / "comparisons.parquet")
    return rows[rows["metric"] == "decode_tok_s"].iloc[0]


def test_heat_that_outlives_the_washout_is_carry_over_and_the_washout_that_clears_it_is_named(
    tmp_path: Path,
) -> None:
    # Two blocks of four requests: a half-life of 8 requests.
    code, root, output = _campaign(tmp_path, 8)
    record = json.loads((root / "runs" / "0001-hot-c0-warm-s1-r0" / "run.json").read_text())
    heat = record["runtime"]["box_state"]["heat"]
    assert heat["start"] < heat["scored"] < heat["end"], heat  # the hot cell heats the box
    assert record["runtime"]["own_requests"] == 5  # its warm-up and its washout
    row = _decode(root)
    assert row["raw_label"] == "better" and row["label"] == "carry-over", row["warnings"]
    # Settled is 3.3 half-lives of own traffic: 6.6 blocks, a washout of 7 blocks.
    assert "box state heat" in row["box_state"] and "design.washout 7" in row["box_state"]
    assert code == 1, output
    assert "box state heat" in output and "before it scores would settle it" in output

    # The same box whose heat settles within a tenth of a block (0.4 of a request): the probe
    # sees every block begin settled, and the label is D̄'s own (deployed, the heat cancels the
    # cool advantage: no better).
    _, root, output = _campaign(tmp_path, 0.4)
    row = _decode(root)
    assert "box state heat: settled before every scored block" in row["box_state"], row["box_state"]
    assert row["label"] == row["raw_label"] and row["label"] != "better", row["warnings"]
