"""The equivalence endpoint's arithmetic, the canaries' first differing token, the card's lossy
declarations, and the reference runtime's load faults that feed them (issue 55)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.analyze.canaries import _first_difference
from harness.analyze.equivalence import check_equivalence, prefix_agreement, token_agreement
from harness.card.schema import Card, Equivalence
from harness.refbox.model import ModelConfig, expert_weights
from harness.refbox.tiers import RowmapTiers, SlowTier
from tests.conftest import DATA, run_cli


def test_agreement_counts_what_the_control_wrote() -> None:
    assert prefix_agreement("abcd", "abcd") == 1.0
    assert prefix_agreement("abXd", "abcd") == 0.5
    assert prefix_agreement("Xbcd", "abcd") == 0.0
    assert prefix_agreement("ab", "abcd") == 0.5  # a shorter output stops agreeing where it ends
    assert token_agreement("abXd", "abcd") == 0.75
    assert prefix_agreement("", "") == token_agreement("", "") == 1.0


def _card(margin: float) -> Card:
    return Card.model_validate(
        {
            "campaign": "eq",
            "prompts": {"pools": ["p.jsonl"]},
            "cells": {"a": {}, "b": {"lossy": {"margin": margin}}},
            "control": "a",
        }
    )


def _outputs(control: list[str], cell: list[str]) -> pd.DataFrame:
    rows = [
        {"cell": name, "prompt_id": f"p{i}", "phase": "main", "ok": True, "output_text": text}
        for name, texts in (("a", control), ("b", cell))
        for i, text in enumerate(texts)
    ]
    return pd.DataFrame(rows)


def test_the_endpoint_passes_fails_or_says_not_shown() -> None:
    same = ["abcdefghij"] * 6
    (row,) = check_equivalence(_card(0.1), _outputs(same, same))
    assert row.verdict == "equivalent" and row.ci95 == (1.0, 1.0) and row.prompts == 6
    broken = ["abXdefghij"] * 6  # 20% of each output before the first difference
    (row,) = check_equivalence(_card(0.1), _outputs(same, broken))
    assert row.verdict == "not equivalent" and row.mean == pytest.approx(0.2)
    # One prompt of six diverges at once: the mean is 0.83 and its interval straddles 0.9.
    mixed = ["abcdefghij"] * 5 + ["Xbcdefghij"]
    (row,) = check_equivalence(_card(0.1), _outputs(same, mixed))
    assert row.verdict == "not shown" and row.ci95 is not None
    assert row.ci95[0] < 0.9 < row.ci95[1] and row.worst == ("p5",)
    assert "needs >= 0.90" in row.words()


def test_the_first_differing_token_is_named_by_its_stream_chunk() -> None:
    got = {"text": "the cat sat", "pieces": ["the", " cat", " sat"]}
    assert _first_difference(got, "the cow sat") == (1, " cat", " cow")
    assert _first_difference(got, "the cat sat down") == (2, " sat", " sat")


def test_a_lossy_control_or_a_margin_on_sampled_outputs_is_refused(tmp_path: Path) -> None:
    pool = DATA / "pools" / "small.jsonl"
    base = (
        "campaign: lossy\nruntime: refbox\nprompts: {{pools: [{pool}]}}\n"
        "workload: {{temperature: {t}}}\ncontrol: a\n"
        "cells:\n  a: {{lossy: {a}}}\n  b: {{lossy: {{margin: 0.1}}}}\n"
    )
    for name, a, t, message in (
        ("control", "true", 0, "cells.a.lossy"),
        ("sampled", "false", 0.7, "cells.b.lossy.margin"),
    ):
        card = tmp_path / f"{name}.yaml"
        card.write_text(base.format(pool=pool, a=a, t=t), encoding="utf-8")
        result = run_cli("validate", str(card))
        assert result.code == 2, result.stdout + result.stderr
        assert message in result.stdout + result.stderr


def test_a_margin_must_leave_room_both_ways() -> None:
    with pytest.raises(ValueError):
        Equivalence(margin=0)
    with pytest.raises(ValueError):
        Equivalence(margin=1)


def test_the_load_faults_change_loads_and_never_the_file() -> None:
    cfg = ModelConfig(layers=1, experts=4, d_model=8, d_ff=16)
    truth = expert_weights(cfg, 0)
    swapped = SlowTier(cfg, 0, None, swap_every=2)
    assert np.array_equal(swapped.load(0, 2), truth[2].ravel())
    assert np.array_equal(swapped.load(0, 2), truth[3].ravel())  # the 2nd load: 2's neighbour
    coarse = SlowTier(cfg, 0, None, bits=3)
    loaded = coarse.load(0, 1)
    assert not np.array_equal(loaded, truth[1].ravel())
    assert len(np.unique(loaded)) <= 2**3 - 1  # a 3-bit symmetric grid
    tiers = RowmapTiers(swapped, [[0]])
    tiers.swap(0, promoted=1, evicted=0)  # the evicted row is not written back over the file
    assert np.array_equal(swapped.read(0, 0), truth[0].ravel())
