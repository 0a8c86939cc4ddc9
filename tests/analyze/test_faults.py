"""Planted faults never reach a verdict; a lossy change is judged on equivalence (issue 55).

``harness bench faults --quick``: one real campaign on the reference runtime (one cycle, two
boots a cell, 2 layers of 8 experts), each treatment against a frozen control with 4 hot:

* ``adaptive``: a clean change. Its hit rate moves (engaged) and its canaries equal the
  control's.
* ``ignored``: the same policy under ``fault: ignore-policy`` (accepted, reported, never run:
  the control's hit rate on every boot) and ``empty``: 8 hot slots under ``fault: empty-hot``
  (reported as set, none resident: no hit on any boot). The refbox profile's signatures find
  both on every boot: *not engaged*.
* ``swapped``: ``fault: swap-weights`` (every 5th expert loaded from the slow tier gets its
  neighbour's weights). No counter shows it; its canaries and scored greedy outputs do, on
  every boot: *corrupt*.
* ``fine`` and ``coarse``: cold experts quantized to 12 and 3 bits, declared lossy with a
  margin of 0.2 on prefix agreement. 12 bits reproduce the control's outputs on all 20 prompts
  (a lower bound of 0.83: 20 is about the fewest that can show 0.8); 3 bits keep about a third:
  *equivalent*, and *not equivalent* whatever its speed.
* ``fine_kl`` and ``coarse_kl``: 6 and 3 bits, declared lossy with a margin of 0.003 nats of
  mean per-token KL, read from the top 5 log-probabilities the refbox streams with every token:
  the same two answers from the distributions rather than the text.

Each such cell's comparisons carry no other label, the gates fail saying which signature,
boot and token, and record, report and terminal say so. Before issue 55 there were no such
labels: every one of these comparisons read *inconclusive* or a decided label.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from harness.benchmarks import faults as bench_faults
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_planted_faults_are_blocked_and_lossy_cells_judged_on_equivalence(tmp_path: Path) -> None:
    figures = bench_faults.run_bench(quick=True, folder=tmp_path)
    assert all(f.passed for f in figures), figures
    (root,) = (p.parent for p in tmp_path.glob("reports-*/*/*/plan.json"))
    analysis = analyze_campaign(root)
    labels: dict[str, set[str]] = {}
    for c in analysis.comparisons:
        labels.setdefault(c.cell, set()).add(str(c.comparison.label))
    assert labels["ignored"] == labels["empty"] == {"not engaged"}, labels
    assert labels["swapped"] == {"corrupt"} and labels["coarse"] == {"not equivalent"}, labels
    assert labels["coarse_kl"] == {"not equivalent"}, labels
    for cell in ("adaptive", "fine", "fine_kl"):
        assert not labels[cell] & {"not engaged", "corrupt", "not equivalent"}, labels

    # Engagement: which signature failed on which boots, and what no signature covers.
    engagement = analysis.engagement
    assert engagement is not None
    rows = {(r.cell, r.knob, r.signature): r for r in engagement.rows}
    moved = "hit_rate outside the control's range"
    assert rows["adaptive", "policy", moved].engaged, rows
    ignored, empty = rows["ignored", "policy", moved], rows["empty", "hot_slots", "hit_rate > 0"]
    assert rows["empty", "hot_slots", moved].engaged  # no hit at all is another share
    assert len(ignored.failed) == ignored.boots == 2
    assert len(empty.failed) == empty.boots == 2
    assert engagement.unverified["ignored"] == ("fault",)
    assert "adaptive" not in engagement.unverified

    # Canaries: every warm boot answered them; only the swapped cell's differ.
    canaries = analysis.canaries
    assert canaries is not None
    assert canaries.checked == {"adaptive": 2, "empty": 2, "ignored": 2, "swapped": 2}
    assert {c.run_id for c in canaries.corrupt} == set(
        analysis.runs.loc[analysis.runs["cell"] == "swapped", "run_id"]
    )
    assert canaries.not_compared["fine"].startswith("the cell is declared lossy")
    first = canaries.corrupt[0]
    assert first.got != first.expected and first.unit in ("token", "character")

    # Equivalence: the lossy pair on either side of its margin.
    equivalence = {r.cell: r for r in analysis.equivalence}
    assert equivalence["fine"].verdict == "equivalent", equivalence
    assert equivalence["coarse"].verdict == "not equivalent", equivalence
    fine_kl, coarse_kl = equivalence["fine_kl"], equivalence["coarse_kl"]
    assert fine_kl.verdict == "equivalent" and coarse_kl.verdict == "not equivalent"
    assert fine_kl.prompts == coarse_kl.prompts == 20 and fine_kl.mean < coarse_kl.mean

    # Where people read: the verdict, the record, the report, the terminal.
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    gates = {g["kind"]: g for g in verdict["gates"]}
    better = gates["better"]["reason"]
    assert (
        "not engaged: policy=adaptive: hit_rate outside the control's range not shown on 2 "
        "of 2 boots" in better
    ), better
    assert "not engaged: hot_slots=8: hit_rate > 0 not shown on 2 of 2 boots" in better
    assert "swapped/warm: ratio" in better and "corrupt (statistically" in better
    assert not gates["canaries"]["passed"] and first.words() in gates["canaries"]["reason"]
    assert gates["equivalence"]["reason"].startswith("coarse: not equivalent, prefix agreement")
    assert "coarse_kl: not equivalent, KL " in gates["equivalence"]["reason"]
    assert not gates["engagement"]["passed"]
    assert gates["engagement"]["reason"].startswith("empty: not engaged: hot_slots=8")
    record = (root / "record.md").read_text(encoding="utf-8")
    lines = {x.split("**")[1]: x for x in record.splitlines() if x.startswith("- **")}
    assert "— not engaged: hot_slots=8: hit_rate > 0 not shown on 2 of 2 boots" in lines["empty"]
    assert "engagement not verified: no signature for fault" in lines["empty"]
    assert (
        "engaged on every boot (policy: hit_rate outside the control's range)"
        in (lines["adaptive"])
    )
    assert "canaries equal the control's on 2 boots" in lines["adaptive"]
    assert (
        "— corrupt: canary outputs differ from the control's on 2 of 2 boots" in (lines["swapped"])
    )
    assert "outputs against the control's: prefix agreement 1.00 [0.83, 1.00]" in lines["fine"]
    assert "nats over 20 prompts, needs <= 0.003" in lines["fine_kl"]
    report = (root / "report.html").read_text(encoding="utf-8")
    assert report.count('<p class="small engagement"><span class="pill bad">') == 2
    for pill in ('bad">corrupt', 'bad">not equivalent', 'neutral">equivalent'):
        assert f'<span class="pill {pill}</span>' in report, pill
    said = run_cli("gate", str(root)).stdout
    assert re.search(r"\d+ not engaged, \d+ corrupt, \d+ not equivalent", said), said
