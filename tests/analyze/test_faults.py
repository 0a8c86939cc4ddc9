"""Planted faults never reach a verdict; a lossy change is judged on equivalence (issue 55).

``harness bench faults --quick``: two real campaigns on the reference runtime (one cycle, two
boots a cell, 2 layers of 8 experts), each treatment against a frozen control with 4 hot. The
faults' (20 prompts):

* ``adaptive``: a clean change. Its hit rate moves (engaged) and its canaries equal the
  control's.
* ``ignored``: the same policy under ``fault: ignore-policy`` (accepted, reported, never run:
  the control's hit rate on every boot) and ``empty``: 8 hot slots under ``fault: empty-hot``
  (reported as set, none resident: no hit on any boot). The refbox profile's signatures find
  both on every boot: *not engaged*.
* ``swapped``: ``fault: swap-weights`` (every 5th expert loaded from the slow tier gets its
  neighbour's weights). No counter shows it; its canaries and scored greedy outputs do, on
  every boot: *corrupt*.
* ``nudged``: ``fault: scale-logits`` (every logit times 1.1). Every greedy output is the
  control's; the log-probabilities the card asks for are not: *corrupt*, by those alone.

The lossy modes' (60 prompts, modes of a divergence fixed by construction):

* ``fine`` and ``coarse``: 0.5% and 10% of output bytes flipped to the runner-up (a mean
  prefix agreement of 0.97 and 0.54), declared lossy with a margin of 0.2: *equivalent*, and
  *not equivalent* whatever its speed.
* ``fine_kl`` and ``coarse_kl``: 0.0005 and 0.3 of every next-byte distribution moved onto its
  runner-up (at most 0.0005 nats, at least 0.047), declared lossy with a margin of 0.003 nats
  of mean per-token KL, read from the top 5 log-probabilities the refbox streams with every
  token: the same two answers from the distributions rather than the text.

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
    (root,) = (p.parent for p in tmp_path.glob("reports-faults-*/*/*/plan.json"))
    (lossy_root,) = (p.parent for p in tmp_path.glob("reports-lossy-*/*/*/plan.json"))
    analysis = analyze_campaign(root)
    lossy = analyze_campaign(lossy_root)
    labels: dict[str, set[str]] = {}
    for c in analysis.comparisons:
        labels.setdefault(c.cell, set()).add(str(c.comparison.label))
    assert labels["ignored"] == labels["empty"] == {"not engaged"}, labels
    assert labels["swapped"] == labels["nudged"] == {"corrupt"}, labels
    for c in lossy.comparisons:
        labels.setdefault(c.cell, set()).add(str(c.comparison.label))
    assert labels["coarse"] == labels["coarse_kl"] == {"not equivalent"}, labels
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
    assert canaries.checked == {"adaptive": 2, "empty": 2, "ignored": 2, "swapped": 2, "nudged": 2}
    runs = analysis.runs
    assert {c.run_id for c in canaries.corrupt} == set(
        runs.loc[runs["cell"].isin(["swapped", "nudged"]), "run_id"]
    )
    nudged = [c for c in canaries.corrupt if c.cell == "nudged"]
    assert {c.unit for c in nudged} == {"log-probability"}, nudged
    assert re.search(r"canary-\d token \d+'s log-probability -", nudged[0].words()), nudged
    assert abs(float(nudged[0].got) - float(nudged[0].expected)) > 0.05
    lossy_canaries = lossy.canaries
    assert lossy_canaries is not None and not lossy_canaries.corrupt
    assert lossy_canaries.not_compared["fine"].startswith("the cell is declared lossy")
    first = next(c for c in canaries.corrupt if c.cell == "swapped")
    assert first.got != first.expected and first.unit in ("token", "character")

    # Equivalence: the lossy pair on either side of its margin.
    equivalence = {r.cell: r for r in lossy.equivalence}
    assert equivalence["fine"].verdict == "equivalent", equivalence
    assert equivalence["coarse"].verdict == "not equivalent", equivalence
    fine_kl, coarse_kl = equivalence["fine_kl"], equivalence["coarse_kl"]
    assert fine_kl.verdict == "equivalent" and coarse_kl.verdict == "not equivalent"
    assert fine_kl.prompts == coarse_kl.prompts == 60
    assert fine_kl.mean <= 0.0005 and 0.047 <= coarse_kl.mean <= 0.357

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
    assert not gates["engagement"]["passed"]
    assert gates["engagement"]["reason"].startswith("empty: not engaged: hot_slots=8")
    lossy_verdict = json.loads((lossy_root / "verdict.json").read_text(encoding="utf-8"))
    lossy_gates = {g["kind"]: g for g in lossy_verdict["gates"]}
    said = lossy_gates["equivalence"]["reason"]
    assert said.startswith("coarse: not equivalent, prefix agreement"), said
    assert "coarse_kl: not equivalent, KL " in said
    record = (root / "record.md").read_text(encoding="utf-8")
    lines = {x.split("**")[1]: x for x in record.splitlines() if x.startswith("- **")}
    assert "— not engaged: hot_slots=8: hit_rate > 0 not shown on 2 of 2 boots" in lines["empty"]
    assert "engagement not verified: no signature for fault" in lines["empty"]
    assert (
        "engaged on every boot (policy: hit_rate outside the control's range)"
        in (lines["adaptive"])
    )
    assert "canaries equal the control's on 2 boots" in lines["adaptive"]
    assert "— corrupt: " in lines["swapped"] and "— corrupt: " in lines["nudged"]
    assert "outputs differ from the control's on 2 of 2 boots" in lines["swapped"]
    assert "log-probabilities differ from the control's on 2 of 2 boots" in lines["nudged"]
    record = (lossy_root / "record.md").read_text(encoding="utf-8")
    lines = {x.split("**")[1]: x for x in record.splitlines() if x.startswith("- **")}
    fine = equivalence["fine"]
    assert fine.ci95 is not None
    agreement = f"prefix agreement {fine.mean:.2f} [{fine.ci95[0]:.2f}, {fine.ci95[1]:.2f}]"
    assert f"outputs against the control's: {agreement}" in lines["fine"], lines["fine"]
    assert "nats over 60 prompts, needs <= 0.003" in lines["fine_kl"]
    report = (root / "report.html").read_text(encoding="utf-8")
    assert report.count('<p class="small engagement"><span class="pill bad">') == 2
    assert '<span class="pill bad">corrupt</span>' in report
    report = (lossy_root / "report.html").read_text(encoding="utf-8")
    for pill in ('bad">not equivalent', 'neutral">equivalent'):
        assert f'<span class="pill {pill}</span>' in report, pill
    said = run_cli("gate", str(root)).stdout
    assert re.search(r"\d+ not engaged, \d+ corrupt", said), said
    said = run_cli("gate", str(lossy_root)).stdout
    assert re.search(r", \d+ not equivalent", said), said
