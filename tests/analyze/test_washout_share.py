"""A declared washout washes a block only when it lasts a whole block of the block's requests."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.analyze.compare import cell_cycles
from harness.analyze.runs import _washed_by_boot
from harness.card import load_card
from tests.conftest import REPO


def _runs(washout: int, scored: int, share: float | None) -> pd.DataFrame:
    rows = []
    for slot, cell in enumerate(("control", "wide", "wide", "control")):
        rows.append(
            {
                "run_id": f"r{slot}", "comparison": "wide", "cell": cell, "cache_state": "warm",
                "cycle": 0, "pattern": "ABBA", "slot": slot, "status": "ok",
                "tpot_p50_ms": 10.0 + slot, "washout": washout, "washout_share": share,
                "scored_requests": scored,
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("washout", "scored", "share", "washed"),
    [
        (10, 100, None, False),  # an import's 10 warm-up requests before 100 scored: a tenth
        (100, 100, None, True),  # a whole block
        (2, 8, 0.25, False),  # the card's quarter block (the demo)
        (8, 8, 1.0, True),  # the default
        (0, 8, None, False),
    ],
)
def test_a_part_of_a_block_is_not_a_wash(
    washout: int, scored: int, share: float | None, washed: bool
) -> None:
    runs = _runs(washout, scored, share)
    if share is None:  # load_runs' fallback for records without the card's share (imports)
        runs["washout_share"] = runs["washout"] / runs["scored_requests"]
    cycles, dropped = cell_cycles(runs, {}, "wide", "warm", "tpot_p50_ms")
    assert not dropped and len(cycles) == 1
    assert cycles[0].washed is washed
    assert np.isfinite(cycles[0].effect)


def _record(points: dict[str, float | None] | None) -> dict[str, object]:
    return {"runtime": {"box_state": {"page_cache": points}} if points is not None else {}}


@pytest.mark.parametrize(
    ("washed_by", "points", "washed"),
    [
        ("boot", {"start": 1.0, "scored": 1.0, "end": 0.99}, True),
        ("boot", {"start": 1.0, "scored": None, "end": 1.0}, False),  # a probe that missed
        ("boot", None, False),  # nothing read the box: no wash assumed
        ("washout", {"start": 1.0, "scored": 1.0, "end": 1.0}, False),
    ],
)
def test_a_fresh_boot_washes_a_block_only_where_the_box_was_read(
    washed_by: str, points: dict[str, float | None] | None, washed: bool
) -> None:
    card = load_card(REPO / "campaigns" / "demo.yaml").card
    card = card.model_copy(
        update={"design": card.design.model_copy(update={"washed_by": washed_by})}
    )
    assert _washed_by_boot(card, _record(points)) is washed
