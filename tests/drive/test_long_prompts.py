"""Synthetic long-context prompts: built lengths, determinism, and what a run records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.card import load_card
from harness.drive.client import long_prompt
from harness.drive.workload import build_phases
from harness.execute.campaign import new_campaign_dir
from harness.execute.run import CampaignRunner
from harness.plan.build import build_plan
from tests.conftest import DATA

CARD = f"""
campaign: longctx
box: local
runtime: refbox
prompts:
  pools: [{DATA}/pools/small.jsonl]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 4
  warmup_requests: 0
  request_timeout_s: 60
  phases:
    - {{name: prose, domains: [en-prose], requests: 2, prompt_tokens: 600}}
    - {{name: code, domains: [python], requests: 2}}
cells:
  only:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8", REFBOX_HOT_SLOTS: "4"}}
design: {{order: sequential, cycles: 1, repeats: 1, cache_states: [warm], retries: 0, seed: SEED}}
gates:
  - {{kind: counter, counter: lost_ring_records, max: 0}}
"""


def _card(tmp_path: Path, seed: int = 0) -> Path:
    path = tmp_path / f"longctx-{seed}.yaml"
    path.write_text(CARD.replace("SEED", str(seed)), encoding="utf-8")
    return path


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.text(min_size=0, max_size=80),
    context=st.lists(st.text(min_size=0, max_size=60), min_size=0, max_size=5),
    target=st.integers(min_value=1, max_value=3000),
    seed=st.text(max_size=8),
)
def test_long_prompt_hits_the_target_and_ends_with_the_prompt(
    prompt: str, context: list[str], target: int, seed: str
) -> None:
    built = long_prompt(prompt, context, target, seed)
    assert built.endswith(prompt)
    assert built == long_prompt(prompt, context, target, seed)  # deterministic
    size = len(built.encode("utf-8"))
    own = len(("\n\n" + prompt).encode("utf-8"))
    if own >= target or not any(context):
        assert built == prompt  # nothing to add, or nothing to add it from
    else:
        # Only a multi-byte character cut at the boundary makes it fall short (by < 4 bytes).
        assert target - 4 < size <= target


def test_the_filler_is_the_domain_text_in_a_seeded_order() -> None:
    context = ["alpha " * 5, "beta " * 5, "gamma " * 5, "delta " * 5]
    orders = {long_prompt("Q?", context, 400, str(seed))[:40] for seed in range(20)}
    assert len(orders) > 1  # the seed changes the order
    built = long_prompt("Q?", context, 400, "7")
    body = built[: -len("\n\nQ?")]
    for piece in body.split("\n\n")[:-1]:
        assert piece in context  # whole prompts, repeated; only the last one is cut


def test_build_phases_lengthens_only_the_phases_that_ask(tmp_path: Path) -> None:
    loaded = load_card(_card(tmp_path))
    prose, code = build_phases(loaded, warmup=False)
    for item in prose.items:
        assert item.target_prompt_tokens == 600
        assert item.prompt is not None and 596 < len(item.prompt.encode()) <= 600
        original = next(p for p in loaded.prompts if p.id == item.prompt_id).prompt
        assert original is not None and item.prompt.endswith(original)
    assert prose.items[0].prompt != prose.items[1].prompt  # each request differs
    for item in code.items:
        assert item.target_prompt_tokens is None
        original = next(p for p in loaded.prompts if p.id == item.prompt_id)
        assert item.prompt == original.prompt
    again = build_phases(load_card(_card(tmp_path)), warmup=False)[0]
    assert [i.prompt for i in again.items] == [i.prompt for i in prose.items]


@pytest.mark.slow
def test_a_run_records_the_built_length_and_the_server_counts_it(tmp_path: Path) -> None:
    loaded = load_card(_card(tmp_path))
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    outcome = CampaignRunner(loaded, plan, campaign).execute()
    assert outcome.failed == [] and len(outcome.done) == 1
    requests = pd.read_parquet(campaign.run_dir(outcome.done[0]) / "requests.parquet")
    assert requests["ok"].all()
    long = requests[requests["phase"] == "prose"]
    assert (long["target_prompt_tokens"] == 600).all()
    assert long["prompt_bytes"].between(597, 600).all()
    # The reference tokenizer is byte-level: the server's count is the bytes plus its BOS.
    assert (long["prompt_tokens"] - long["prompt_bytes"]).isin([0, 1]).all()
    short = requests[requests["phase"] == "code"]
    assert short["target_prompt_tokens"].isna().all()
    assert (short["prompt_bytes"] < 200).all()
