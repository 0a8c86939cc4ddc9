"""A change that broke the outputs is *corrupt*; a lossy one is judged on equivalence (issue 55).

One real campaign on the reference runtime (one cycle: two boots a cell), against a frozen
control with 4 of 8 experts hot:

* ``swapped`` runs the runtime's ``swap-weights`` fault: every 5th expert loaded from the slow
  tier gets its neighbour's weights. Nothing in its counters or hit rate shows it; its canaries
  do, on every boot. Each comparison is labelled *corrupt*, the canaries gate fails naming the
  first differing token, and record, report and terminal say so.
* ``fine`` and ``coarse`` load cold experts quantized to 12 and 3 bits, declared lossy with a
  margin of 0.2 on prefix agreement. On this model 12 bits reproduce the control's outputs and
  3 bits keep about a third (measured over 8 prompts: 1.00, and 0.34 [0.05, 0.63]):
  the first is equivalent, the second *not equivalent*, whatever its speed.

Before this the harness had no such labels: every comparison here read *inconclusive*.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow

CARD = """\
campaign: canaries
box: local
runtime: refbox
prompts:
  pools: [{pool}]
  heldout: {{split: heldout}}
workload: {{max_tokens: 12, warmup_requests: 1, passes: 1, request_timeout_s: 60}}
cells:
  frozen:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{expert_bytes: 0, policy: frozen, hot_slots: 4}}
  swapped:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{expert_bytes: 0, policy: frozen, hot_slots: 4, fault: swap-weights}}
  fine:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{expert_bytes: 0, policy: frozen, hot_slots: 4, cold_bits: 12}}
    lossy: {{margin: 0.2}}
  coarse:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{expert_bytes: 0, policy: frozen, hot_slots: 4, cold_bits: 3}}
    lossy: {{margin: 0.2}}
control: frozen
design: {{order: abba, cycles: 1, repeats: 1, cache_states: [warm], retries: 1}}
gates:
  - {{kind: better, metric: decode_tok_s}}
"""


def test_broken_outputs_are_corrupt_and_lossy_cells_are_judged_on_equivalence(
    tmp_path: Path,
) -> None:
    card = tmp_path / "canaries.yaml"
    # 8 held-out prompts: an interval over prompts, and a short campaign.
    lines = (REPO / "campaigns" / "prompts" / "dsbox.jsonl").read_text(encoding="utf-8")
    heldout = [x for x in lines.splitlines() if '"heldout"' in x][:8]
    pool = tmp_path / "pool.jsonl"
    pool.write_text("\n".join(heldout) + "\n", encoding="utf-8")
    card.write_text(CARD.format(pool=pool), encoding="utf-8")
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), timeout_s=900)
    said = result.stdout + result.stderr
    assert result.code == 1, said
    (root,) = (p.parent for p in reports.glob("*/*/plan.json"))
    analysis = analyze_campaign(root)
    labels: dict[str, set[str]] = {}
    for c in analysis.comparisons:
        labels.setdefault(c.cell, set()).add(str(c.comparison.label))
    assert labels["swapped"] == {"corrupt"}, labels
    assert labels["coarse"] == {"not equivalent"}, labels
    assert not labels["fine"] & {"corrupt", "not equivalent"}, labels
    # Every warm boot answered the canaries; the control's and fine's are not corrupt.
    canaries = analysis.canaries
    assert canaries is not None
    assert canaries.checked == {"swapped": 2}
    assert {c.run_id for c in canaries.corrupt} == set(
        analysis.runs.loc[analysis.runs["cell"] == "swapped", "run_id"]
    )
    assert canaries.not_compared["fine"].startswith("the cell is declared lossy")
    first = canaries.corrupt[0]
    assert first.got != first.expected and first.prompt_id.startswith("canary-")
    equivalence = {r.cell: r for r in analysis.equivalence}
    assert equivalence["fine"].verdict == "equivalent", equivalence
    assert equivalence["coarse"].verdict == "not equivalent", equivalence
    assert equivalence["coarse"].ci95 is not None and equivalence["coarse"].ci95[1] < 0.8
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    gates = {g["kind"]: g for g in verdict["gates"]}
    assert not gates["canaries"]["passed"] and first.words() in gates["canaries"]["reason"]
    assert not gates["equivalence"]["passed"]
    assert gates["equivalence"]["reason"].startswith("coarse: not equivalent, prefix agreement")
    assert "swapped/warm: ratio" in gates["better"]["reason"]
    assert "corrupt (statistically" in gates["better"]["reason"]
    record = (root / "record.md").read_text(encoding="utf-8")
    (line,) = [x for x in record.splitlines() if x.startswith("- **swapped**")]
    assert "— corrupt: canary outputs differ from the control's on 2 of 2 boots" in line, line
    (line,) = [x for x in record.splitlines() if x.startswith("- **fine**")]
    assert "outputs against the control's: prefix agreement 1.00 [1.00, 1.00]" in line, line
    report = (root / "report.html").read_text(encoding="utf-8")
    assert '<span class="pill bad">corrupt</span>' in report
    assert '<span class="pill bad">not equivalent</span>' in report
    assert '<span class="pill neutral">equivalent</span>' in report
    assert re.search(r"\d+ corrupt, \d+ not equivalent", said)  # and the terminal
