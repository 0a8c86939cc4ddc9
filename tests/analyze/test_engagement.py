"""A change that never took effect is *not engaged*, never *within noise* (issue 55).

One real campaign on the reference runtime (one cycle: two boots a cell). Against a frozen
control with 4 hot experts: an adaptive policy (its hit rate moves: engaged), the same policy
under the runtime's ``ignore-policy`` fault (accepted, reported, never run: the control's hit
rate on every boot), and 8 hot experts under the ``empty-hot`` fault (reported as set, none
resident: no hit on any boot). The refbox profile's signatures (``policy``: hit_rate outside the
control's range when adaptive; ``hot_slots``: hit_rate > 0, and outside the control's range)
find both faults on every boot; their comparisons carry no other label, their gates fail saying
which signature failed on which boots, and the changed knobs no signature covers are listed as
not verified.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from tests.conftest import DATA, run_cli

pytestmark = pytest.mark.slow

CARD = """\
campaign: engagement
box: local
runtime: refbox
prompts:
  pools: [{pool}]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload: {{max_tokens: 24, warmup_requests: 1, passes: 1, request_timeout_s: 60}}
cells:
  frozen:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{policy: frozen, hot_slots: 4, drain_every: 8}}
  adaptive:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{policy: adaptive, hot_slots: 4, drain_every: 8}}
  ignored:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{policy: adaptive, hot_slots: 4, drain_every: 8, fault: ignore-policy}}
  empty:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8"}}
    knobs: {{policy: frozen, hot_slots: 8, drain_every: 8, fault: empty-hot}}
control: frozen
design: {{order: abba, cycles: 1, repeats: 1, cache_states: [warm], retries: 1}}
gates:
  - {{kind: better, metric: decode_tok_s}}
"""


def test_a_change_that_never_took_effect_is_not_engaged(tmp_path: Path) -> None:
    card = tmp_path / "engagement.yaml"
    card.write_text(CARD.format(pool=DATA / "pools" / "small.jsonl"), encoding="utf-8")
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), timeout_s=900)
    said = result.stdout + result.stderr
    assert result.code == 1, said  # the gates fail: two cells are not engaged
    (root,) = (p.parent for p in reports.glob("*/*/plan.json"))
    analysis = analyze_campaign(root)
    engagement = analysis.engagement
    assert engagement is not None
    rows = {(r.cell, r.knob, r.signature): r for r in engagement.rows}
    moved = "hit_rate outside the control's range"
    assert rows["adaptive", "policy", moved].engaged, rows
    ignored, empty = rows["ignored", "policy", moved], rows["empty", "hot_slots", "hit_rate > 0"]
    assert rows["empty", "hot_slots", moved].engaged  # no hit at all is another share
    assert len(ignored.failed) == ignored.boots == 2
    assert empty.signature == "hit_rate > 0" and len(empty.failed) == empty.boots == 2
    labels = {(c.cell, c.comparison.metric): str(c.comparison.label) for c in analysis.comparisons}
    for cell in ("ignored", "empty"):
        assert {m: v for (c, m), v in labels.items() if c == cell} and all(
            v == "not engaged" for (c, _), v in labels.items() if c == cell
        ), labels
    assert all(v != "not engaged" for (c, _), v in labels.items() if c == "adaptive"), labels
    # What no signature covers is said, not assumed.
    assert engagement.unverified["ignored"] == ("fault",)
    assert "adaptive" not in engagement.unverified
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    (gate,) = [g for g in verdict["gates"] if g["kind"] == "better"]
    assert (
        "not engaged: policy=adaptive: hit_rate outside the control's range not shown on 2 "
        "of 2 boots" in gate["reason"]
    ), gate["reason"]
    assert "not engaged: hot_slots=8: hit_rate > 0 not shown on 2 of 2 boots" in gate["reason"]
    record = (root / "record.md").read_text(encoding="utf-8")
    (line,) = [x for x in record.splitlines() if x.startswith("- **empty**")]
    assert "— not engaged: hot_slots=8: hit_rate > 0 not shown on 2 of 2 boots" in line, line
    assert line.endswith("; engagement not verified: no signature for fault"), line
    (line,) = [x for x in record.splitlines() if x.startswith("- **adaptive**")]
    assert "engaged on every boot (policy: hit_rate outside the control's range)" in line
    report = (root / "report.html").read_text(encoding="utf-8")
    assert report.count('<p class="small engagement"><span class="pill bad">') == 2
    assert "not engaged" in said  # the terminal says it too
