"""SGLang's expert-distribution recorder driven by the run lifecycle, end to end for real: the
shipped campaigns/sglang-kt-refbox.yaml (one cycle, half scale) on the reference runtime in
SGLang's dialect, then `harness collect` and `harness fit-map --format` on what it recorded.

The recorder's figures are checked against what the runtime counted itself: every scored token's
selections (route_selections = Σ (prompt + completion − 1 tokens) × layers × top-k), and KT's GPU
masks × counts against the refbox's own lookups and cold lookups. On a GPU box KTransformers
writes the same file (its masks from the experts on the GPU); this machine has none, so the masks
here come from the refbox's hot tier, in KT's exact file format. The dumps the refbox wrote are
also loaded by real torch (weights_only=True) with the arrays our reader returns.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.formats.expert_distribution import combine_dumps, gpu_hits, read_dump
from harness.formats.maps import read_count_dump
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow

LAYERS, TOP_K = 8, 4  # the refbox's default geometry


def _card(tmp_path: Path) -> Path:
    text = (REPO / "campaigns" / "sglang-kt-refbox.yaml").read_text(encoding="utf-8")
    assert "cycles: 2" in text
    folder = tmp_path / "cards"
    folder.mkdir()
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    card = folder / "sglang-kt-refbox.yaml"
    card.write_text(text.replace("cycles: 2", "cycles: 1"), encoding="utf-8")
    return card


def test_recorder_adapter_on_the_reference_runtime(tmp_path: Path) -> None:
    card = _card(tmp_path)
    reports = tmp_path / "reports"
    result = run_cli(
        "run", str(card), "--quiet", "--scale", "0.5", "--reports", str(reports), timeout_s=600
    )
    roots = list(reports.glob("*/*/plan.json"))
    assert roots, result.stdout + result.stderr
    root = roots[0].parent
    runs = sorted((root / "runs").iterdir())
    assert len(runs) == 4
    for run in runs:
        assert json.loads((run / "run.json").read_text())["status"] == "ok", run.name
        delta = json.loads((run / "counters.json").read_text())["delta"]
        requests = pd.read_parquet(run / "requests.parquet")
        scored = requests[~requests["warmup"]]
        tokens = int((scored["prompt_tokens"] + scored["completion_tokens"] - 1).sum())
        assert delta["route_selections"] == tokens * LAYERS * TOP_K
        assert delta["route_selections"] == delta["lookups"]  # the refbox's own count
        assert delta["misses"] == delta["cold_lookups"] and delta["misses"] > 0
        assert delta["hits"] + delta["misses"] == delta["lookups"]
        # KTransformers' two files: the counts and, beside them, the GPU masks.
        folder = run / "expert-distribution"
        dumps = sorted(folder.glob("expert_distribution_recorder_*.pt"))
        masks = sorted(folder.glob("gpu_expert_distribution_*.pt"))
        assert len(dumps) == len(masks) == 1
        dump = combine_dumps([read_dump(dumps[0]), read_dump(masks[0])], str(folder))
        assert gpu_hits(dump) == (delta["hits"], delta["misses"])
        counts = read_count_dump(run / "route-counts.json")
        assert np.array_equal(counts, dump.counts.sum(axis=0))
    # The frequency-fitted hot set hits more than the stale one, on held-out prompts.
    comparisons = pd.read_parquet(root / "analysis" / "comparisons.parquet")
    hit = comparisons[comparisons["metric"] == "hit_rate"]
    assert len(hit) == 1 and float(hit["ratio"].iloc[0]) > 1.05, hit.to_dict("records")

    # collect records the fit split through the same recorder; fit-map turns it into KT's file.
    collected = tmp_path / "fit"
    result = run_cli(
        "collect", str(card), "--cell", "uniform", "--split", "fit", "--max-tokens", "4",
        "--domains", "en-prose",
        "-o", str(collected), timeout_s=300,
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    recorded = next((collected / "expert-distribution").glob("expert_distribution_recorder_*.pt"))
    frequency = tmp_path / "kt-frequency.pt"
    trace = runs[0] / "route-trace.jsonl"
    result = run_cli(
        "fit-map", str(recorded), "--format", "kt-frequency", "--top", "48", "-o",
        str(frequency), "--score", str(trace),
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    assert "coverage" in result.stdout and "in-sample" not in result.stdout
    assert read_count_dump(collected / "counts.json").sum() == read_dump(recorded).counts.sum()
