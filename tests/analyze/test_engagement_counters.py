"""An engagement signature on a profile's log counter reads the run's own counter delta.

A log counter (llama.cpp's `offloaded N/M layers to GPU`, vLLM's `Total CPU offloaded
parameters`) is no run-table column; before this read, every boot of such a cell failed its
signature even where the engine printed the line, so a GPU build that did offload read *not
engaged*. The boots here are written as the runner writes them (run.json's knobs, counters.json's
delta), the profile frozen by the harness's own freeze; the counter values are the ones the
engine prints on a build that can offload (5/5 layers of the tiny model) and on one that cannot
(no line: the counter is absent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.analyze.engagement import check_engagement
from harness.card.frozen import freeze_inputs
from harness.card.load import load_card
from tests.conftest import REPO

CARD = """\
campaign: offload
runtime: llama-cpp
prompts: {{pools: [{pool}]}}
cells:
  cpu: {{knobs: {{model: /m.gguf, fit: "off"}}}}
  gpu: {{knobs: {{model: /m.gguf, fit: "off", n_gpu_layers: "99"}}}}
control: cpu
"""


def _boot(root: Path, run_id: str, knobs: dict[str, str], delta: dict[str, float]) -> None:
    run = root / "runs" / run_id
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": run_id, "knobs": knobs}))
    (run / "counters.json").write_text(json.dumps({"before": {}, "after": delta, "delta": delta}))


@pytest.mark.parametrize(
    ("printed", "engaged"),
    [({"gpu_layers_offloaded": 5.0}, True), ({}, False), ({"gpu_layers_offloaded": 0.0}, False)],
)
def test_a_log_counter_signature_reads_the_boots_counters(
    tmp_path: Path, printed: dict[str, float], engaged: bool
) -> None:
    card_path = tmp_path / "card.yaml"
    pool = REPO / "campaigns" / "prompts" / "mixed.jsonl"
    card_path.write_text(CARD.format(pool=pool), encoding="utf-8")
    loaded = load_card(card_path)
    root = tmp_path / "campaign"
    root.mkdir()
    freeze_inputs(loaded, root)
    base = {"model": "/m.gguf", "fit": "off"}
    _boot(root, "r0-cpu", base, {})  # a CPU boot prints no offload line
    _boot(root, "r1-gpu", {**base, "n_gpu_layers": "99"}, printed)
    _boot(root, "r2-gpu", {**base, "n_gpu_layers": "99"}, printed)
    runs = pd.DataFrame(
        {
            "run_id": ["r0-cpu", "r1-gpu", "r2-gpu"],
            "cell": ["cpu", "gpu", "gpu"],
            "status": ["ok"] * 3,
        }
    )
    result = check_engagement(root, loaded.card, runs)
    assert result is not None
    (row,) = result.rows
    assert (row.knob, row.signature, row.boots) == ("n_gpu_layers", "gpu_layers_offloaded > 0", 2)
    assert row.engaged is engaged
    assert row.failed == (() if engaged else ("r1-gpu", "r2-gpu"))
