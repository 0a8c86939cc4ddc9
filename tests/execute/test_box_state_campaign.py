"""A box that remembers, on the records of real campaigns: heat that relaxes with traffic.

The candidate is faster on a cool box (the control runs every decode step slower by a set
amount) and heats the box under its traffic, each decode step slower as the heat builds, so
that deployed — the candidate on a box it heated, the control on a cool one — it gains nothing.
With a half-life of two blocks of traffic no washout the card sends clears the heat: D̄ reads
the candidate's cool advantage, and only the runtime profile's probe of the heat file sees that
each block began where the other arm had left the box. With a half-life under a tenth of a
block the same campaign settles within its washout and decides on D̄ as it always did.

Both campaigns ran once on the reference runtime (tests/data/cards/analysis/heat-state.yaml,
kept as tests/data/campaigns/heat-outlives and heat-settles by ``python -m tests.make_fixtures``);
``harness gate`` decides a copy of each, as a release gate would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.campaign_dirs import copy_campaign
from tests.conftest import DATA, flat_text, run_cli

pytestmark = pytest.mark.slow


def _campaign(tmp_path: Path, name: str) -> tuple[int, Path, str]:
    root = copy_campaign(DATA / "campaigns" / name, tmp_path / name)
    result = run_cli("gate", str(root), timeout_s=300)
    return result.code, root, flat_text(result.stdout + result.stderr)


def _decode(root: Path) -> pd.Series:
    rows = pd.read_parquet(root / "analysis" / "comparisons.parquet")
    return rows[rows["metric"] == "decode_tok_s"].iloc[0]


def test_heat_that_outlives_the_washout_is_carry_over_and_the_washout_that_clears_it_is_named(
    tmp_path: Path,
) -> None:
    # Two blocks of four requests: a half-life of 8 requests.
    code, root, output = _campaign(tmp_path, "heat-outlives")
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
    _, root, output = _campaign(tmp_path, "heat-settles")
    row = _decode(root)
    assert "box state heat: settled before every scored block" in row["box_state"], row["box_state"]
    assert row["label"] == row["raw_label"] and row["label"] != "better", row["warnings"]
