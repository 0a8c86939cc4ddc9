"""The equivalence endpoint's arithmetic, the canaries' first differing token, the card's lossy
declarations, and the reference runtime's load faults that feed them (issue 55)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.special import log_softmax
from scipy.stats import entropy

from harness.analyze.canaries import CanaryCheck, _first_difference
from harness.analyze.equivalence import (
    check_equivalence,
    mean_kl,
    position_kl,
    prefix_agreement,
    token_agreement,
)
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


def _card(margin: float, metric: str = "prefix_agreement") -> Card:
    return Card.model_validate(
        {
            "campaign": "eq",
            "prompts": {"pools": ["p.jsonl"]},
            "cells": {"a": {}, "b": {"lossy": {"margin": margin, "metric": metric}}},
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
    # Six prompts that all agree cannot show a 10% margin: one prompt in ten diverging would
    # go unseen in six about half the time. 36 can.
    (row,) = check_equivalence(_card(0.1), _outputs(same, same))
    assert row.verdict == "not shown" and row.needed == 36 and row.prompts == 6
    assert row.ci95 is not None and row.ci95[0] == pytest.approx(0.025 ** (1 / 6))
    assert "about 36 prompts agreeing as these do would show it" in row.words()
    (row,) = check_equivalence(_card(0.1), _outputs(same * 6, same * 6))
    assert row.verdict == "equivalent" and row.ci95 is not None and row.ci95[0] >= 0.9
    broken = ["abXdefghij"] * 6  # 20% of each output before the first difference
    (row,) = check_equivalence(_card(0.1), _outputs(same, broken))
    assert row.verdict == "not equivalent" and row.mean == pytest.approx(0.2)
    # One prompt of six diverges at once: the mean is 0.83 and its interval straddles 0.9.
    mixed = ["abcdefghij"] * 5 + ["Xbcdefghij"]
    (row,) = check_equivalence(_card(0.1), _outputs(same, mixed))
    assert row.verdict == "not shown" and row.ci95 is not None
    assert row.ci95[0] < 0.9 < row.ci95[1] and row.worst == ("p5",)
    assert "about 102 prompts agreeing as these do would show it falls short" in row.words()
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
    assert Equivalence(metric="kl", margin=2).margin == 2  # nats: no ceiling of 1


def _top(log_p: np.ndarray, n: int) -> dict[str, float]:
    order = np.argsort(-log_p)[:n]
    return {f"t{i}": float(log_p[i]) for i in order}


@pytest.mark.parametrize("seed", range(6))
def test_kl_is_the_full_divergence_coarsened_to_the_shared_top_tokens(seed: int) -> None:
    # Two next-token distributions over 64 tokens; the runtime returns only each one's top 5.
    # The reference figure is scipy's KL of the two full distributions, each summed into the
    # same partition (the tokens both top lists hold, and the rest), computed from the full
    # distributions rather than from the top lists.
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, 64)
    p_log = log_softmax(logits)
    q_log = log_softmax(logits + rng.normal(0, 0.5 + seed * 0.3, 64))
    p_top, q_top = _top(p_log, 5), _top(q_log, 5)
    shared = [int(t[1:]) for t in set(p_top) & set(q_top)]
    rest = np.setdiff1d(np.arange(64), shared)
    p, q = np.exp(p_log), np.exp(q_log)
    coarse_p = np.append(p[shared], p[rest].sum())
    coarse_q = np.append(q[shared], q[rest].sum())
    assert position_kl(p_top, q_top) == pytest.approx(entropy(coarse_p, coarse_q), rel=1e-9)
    assert position_kl(p_top, q_top) <= entropy(p, q) + 1e-12  # never more than the full KL
    # Every token listed: the figure is the full divergence.
    everything_p, everything_q = _top(p_log, 64), _top(q_log, 64)
    assert position_kl(everything_p, everything_q) == pytest.approx(entropy(p, q), rel=1e-6)
    assert position_kl(p_top, p_top) == pytest.approx(0.0, abs=1e-12)


def test_kl_counts_the_positions_of_one_context_and_stops_after_a_divergence() -> None:
    near = {"a": -0.1, "b": -2.5}
    far = {"a": -2.5, "b": -0.1}
    control = [{"token": "a", "top": near}] * 4
    # The cell picks "b" at position 2: that position counts (same context), the rest do not.
    cell = [{"token": "a", "top": near}, {"token": "a", "top": near}]
    cell += [{"token": "b", "top": far}, {"token": "a", "top": far}]
    value = mean_kl(cell, control)  # type: ignore[arg-type]
    assert value == pytest.approx(position_kl(near, far) / 3)
    assert mean_kl([], control) is None  # type: ignore[arg-type]


def _kl_outputs(shift: list[float]) -> pd.DataFrame:
    rows = []
    for i, delta in enumerate(shift):
        ref = {"x": -0.05, "y": -3.0}
        moved = {"x": -0.05 - delta, "y": -3.0 + delta}
        for name, top in (("a", ref), ("b", moved)):
            entries = [{"token": "x", "logprob": top["x"], "top": top}] * 4
            rows.append(
                {"cell": name, "prompt_id": f"p{i}", "phase": "main", "ok": True,
                 "output_text": "xxxx", "logprobs": json.dumps(entries)}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_kl_endpoint_passes_under_its_margin_and_fails_over_it() -> None:
    card = _card(0.05, "kl")
    (row,) = check_equivalence(card, _kl_outputs([0.0] * 6))
    assert row.verdict == "equivalent" and row.mean == pytest.approx(0.0, abs=1e-12)
    (row,) = check_equivalence(card, _kl_outputs([2.0, 2.1, 2.2, 2.0, 2.1, 2.2]))
    assert row.verdict == "not equivalent" and row.ci95 is not None and row.ci95[0] > 0.05
    assert "nats over 6 prompts, needs <= 0.05" in row.words()
    # Without logprobs there is nothing to judge: no prompt, no interval.
    (row,) = check_equivalence(card, _kl_outputs([0.0] * 6).drop(columns="logprobs"))
    assert row.verdict == "not shown" and row.prompts == 0


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


def test_a_kl_margin_without_logprobs_asked_for_is_refused(tmp_path: Path) -> None:
    pool = DATA / "pools" / "small.jsonl"
    card = tmp_path / "kl.yaml"
    card.write_text(
        f"campaign: kl\nruntime: refbox\nprompts: {{pools: [{pool}]}}\ncontrol: a\n"
        "cells:\n  a: {}\n  b: {lossy: {metric: kl, margin: 0.05}}\n",
        encoding="utf-8",
    )
    result = run_cli("validate", str(card))
    assert result.code == 2 and "cells.b.lossy.metric" in result.stdout + result.stderr
    assert "set workload.logprobs" in result.stdout + result.stderr
    card.write_text(card.read_text().replace("control: a", "control: a\nworkload: {logprobs: 5}"))
    assert run_cli("validate", str(card)).code == 0


def test_a_cell_line_says_which_prompts_the_controls_own_boots_left_out() -> None:
    check = CanaryCheck(checked={"b": 2}, unstable=("p1", "p2 (log-probabilities)"))
    assert check.clean_text("b") == (
        "canaries equal the control's on 2 boots (left out, the control's own boots differ: "
        "p1, p2 (log-probabilities))"
    )
    plain = CanaryCheck(checked={"b": 2}).clean_text("b")
    assert plain == "canaries equal the control's on 2 boots"
