"""Promotion gates: the card's declarative gates evaluated over a campaign's analysis.

Every gate fails closed: a missing run, a failed run (of the cell or of its reference; other runs
never stand in for it), a counter or metric the runtime did not record, a comparison that could
not be made, or a check that could not fail is a failure with its reason, never a pass; and a
verdict with any planned run incomplete never passes (docs/design.md#gates).
"""

from __future__ import annotations

import hashlib
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.campaign import CampaignAnalysis
from harness.analyze.compare import CellComparison
from harness.analyze.tails import tail_check
from harness.card import (
    BetterGate,
    CounterGate,
    ExactOutputsGate,
    QualityGate,
    RegressionGate,
    SoakGate,
    SurvivesGate,
)
from harness.catalog import METRICS
from harness.errors import EXIT_GATE_FAILED, EXIT_INFRASTRUCTURE, EXIT_OK
from harness.formats.records import write_json_atomic, write_text_atomic
from harness.gate.confirm import mark_unconfirmed
from harness.gate.implicit import IMPLICIT_GATES
from harness.gate.quality import quality_gate
from harness.gate.regression import regression_gate
from harness.gate.result import (
    GateResult,
    gate_cells,
    gate_name,
    incomplete_of,
    incomplete_runs,
    listed,
    required_count,
)
from harness.gate.soak import lockstep_gate, soak_gate
from harness.stats.cycles import interval_text
from harness.stats.decision import Comparison
from harness.stats.labels import Label

_UNSETTLED = ("unconfirmed", "not confirmed")


@dataclass
class Verdict:
    """All gates; ``passed`` only when there was at least one, every gate passed, and every
    planned run completed (a campaign with runs missing proves nothing about them)."""

    campaign: str
    passed: bool
    gates: list[GateResult]
    incomplete_runs: list[str]
    # Cells compared with the control that no better or survives gate decides on: whatever
    # their comparisons say, the verdict did not ask.
    ungated: list[str] = field(default_factory=list)
    # Non-empty when the directory is not sealed from its start, so nothing vouched for what
    # it held: said in verdict.json, JUnit, the terminal, record.md and the report.
    unverified: str = ""
    # The journal's head as verified: kept outside the directory, it catches a rewrite of any
    # line up to it (harness.formats.heads).
    journal_head: str = ""
    # The head given back (--journal-head), which is the journal's last line ("" when none was:
    # then nothing outside vouches for what the directory holds), and the sentence that says so.
    head_checked: str = ""
    checked_against: str = ""
    # The card's confirm.box; the first campaign's directory this one confirms (gate
    # --confirms); the confirming campaign's directory, on the first one (harness.gate.confirm).
    confirm_box: str = ""
    confirms: str = ""
    confirmed_by: str = ""

    @property
    def outcome(self) -> str:
        """ "pass"; "incomplete" (runs missing, no gate failed on complete data: exit 3);
        "unconfirmed" (every gate that did not pass is unconfirmed or undecided, one at least
        unconfirmed: a second box must show it, exit 1); "undecided" (every gate that did not
        pass is undecided: an inconclusive comparison, exit 1); else "fail" (a result worse or
        a gate missed on complete data, exit 1)."""
        if self.passed:
            return "pass"
        if self.exit_code() == EXIT_INFRASTRUCTURE:
            return "incomplete"
        failing = [g for g in self.gates if not g.passed]
        # A first campaign's failure the second box did not show is still its own, unconfirmed.
        waiting = [g.undecided or g.confirmation in _UNSETTLED for g in failing]
        pending = any(g.confirmation in _UNSETTLED for g in failing)
        if pending and all(waiting) and not self.incomplete_runs:
            return "unconfirmed"
        if failing and all(g.undecided for g in failing) and not self.incomplete_runs:
            return "undecided"
        return "fail"

    @property
    def ungated_text(self) -> str:
        """What a verdict did not decide, for the banner, the terminal and record.md; ""
        when every compared cell is gated."""
        if not self.ungated:
            return ""
        cells = ", ".join(self.ungated)
        return (
            f"no gate asks whether {cells} beat{'s' if len(self.ungated) == 1 else ''} the "
            "control: their comparisons are reported, not decided, by this verdict"
        )

    @property
    def word(self) -> str:
        """The headline word: PASS, UNDECIDED, UNCONFIRMED, or FAIL (a failed gate, or runs
        incomplete)."""
        words = {"pass": "PASS", "undecided": "UNDECIDED", "unconfirmed": "UNCONFIRMED"}
        return words.get(self.outcome, "FAIL")

    def exit_code(self) -> int:
        """0 pass; 3 when runs are missing or failed and no gate failed on complete data; else 1."""
        if self.passed:
            return EXIT_OK
        if (
            self.incomplete_runs
            and self.gates
            and all(g.passed or g.incomplete for g in self.gates)
        ):
            return EXIT_INFRASTRUCTURE
        return EXIT_GATE_FAILED

    def to_json(self) -> dict[str, Any]:
        """The ``verdict.json`` payload."""
        return {
            "campaign": self.campaign,
            "passed": self.passed,
            "outcome": self.outcome,
            "incomplete_runs": self.incomplete_runs,
            "ungated": self.ungated,
            # Sealed, and the whole journal under a head given back: a chain that verifies
            # against itself alone is what anyone who can write the directory can make.
            "verified": not self.unverified and bool(self.head_checked),
            "unverified": self.unverified,
            "journal_head": self.journal_head,
            "head_checked": self.head_checked,
            "checked_against": self.checked_against,
            "confirm_box": self.confirm_box,
            "confirms": self.confirms,
            "confirmed_by": self.confirmed_by,
            "gates": [asdict(g) for g in self.gates],
        }


# An empty output compares equal to any other empty output and shows nothing about either.
EMPTY_OUTPUT_SHA256 = hashlib.sha256(b"").hexdigest()


def _exact_outputs(gate: ExactOutputsGate, analysis: CampaignAnalysis) -> GateResult:
    name = gate_name(gate)
    reference = gate.vs or analysis.card.control
    if reference is None:
        return GateResult(gate.kind, name, False, "no reference cell: name one with `vs`")
    missing_reference = incomplete_of(analysis.runs, reference)
    if missing_reference:
        return GateResult(
            gate.kind,
            name,
            False,
            f"reference {reference}: runs not complete ({listed(missing_reference)})",
            {"reference": reference, "incomplete": missing_reference},
            incomplete=True,
        )
    outputs = analysis.outputs
    if outputs.empty:
        return GateResult(gate.kind, name, False, "no outputs recorded (no completed runs)")
    outputs = outputs[outputs["phase"] != "quality"]
    ref = outputs[(outputs["cell"] == reference) & outputs["ok"]]
    if ref.empty:
        return GateResult(gate.kind, name, False, f"reference cell {reference!r} has no outputs")
    ref_hash = ref.groupby("prompt_id")["output_sha256"].agg(lambda s: s.mode().iloc[0])
    ref_flaky = ref.groupby("prompt_id")["output_sha256"].nunique()
    evidence: dict[str, Any] = {"reference": reference, "cells": {}}
    failures = []
    on_data = False  # a failure on complete data, not only on missing runs
    for cell in gate_cells(gate, analysis, treatments_only=True):
        if cell == reference:
            continue
        missing_runs = incomplete_of(analysis.runs, cell)
        mine = outputs[(outputs["cell"] == cell) & outputs["ok"]]
        matched, mismatched, allowed, missing, empty = [], [], [], [], []
        for prompt_id, expected in ref_hash.items():
            got = mine[mine["prompt_id"] == prompt_id]["output_sha256"]
            if got.empty:
                missing.append(str(prompt_id))
            elif expected == EMPTY_OUTPUT_SHA256:
                empty.append(str(prompt_id))  # nothing compared is not a match
            elif (got == expected).all():
                matched.append(str(prompt_id))
            elif prompt_id in gate.allow:
                allowed.append(str(prompt_id))
            else:
                mismatched.append(str(prompt_id))
        n = len(ref_hash)
        need = required_count(gate.min_match, n)
        ok = not missing and len(matched) + len(allowed) >= need
        evidence["cells"][cell] = {
            "matched": len(matched),
            "n": n,
            "required": need,
            "mismatched": mismatched,
            "allowed_mismatches": allowed,
            "missing": missing,
            "empty": empty,
            "flaky_in_reference": sorted(str(p) for p, k in ref_flaky.items() if k > 1),
            "incomplete": missing_runs,
        }
        if missing_runs:
            failures.append(f"{cell}: runs not complete ({listed(missing_runs)})")
        elif not ok:
            on_data = True
            detail = f"{cell}: {len(matched)}/{n} match {reference}, need {need}"
            if mismatched:
                detail += f"; differ: {', '.join(mismatched[:5])}"
            if missing:
                detail += f"; missing outputs for {len(missing)} prompts"
            if empty:
                detail += (
                    f"; {len(empty)} prompts with an empty output in {reference} (nothing "
                    "compared is not a match)"
                )
            failures.append(detail)
    if failures:
        return GateResult(
            gate.kind, name, False, "; ".join(failures), evidence, incomplete=not on_data
        )
    summary = ", ".join(
        f"{c}: {e['matched']}/{e['n']}"
        + (f" (+{len(e['allowed_mismatches'])} allowed)" if e["allowed_mismatches"] else "")
        for c, e in evidence["cells"].items()
    )
    return GateResult(gate.kind, name, True, f"outputs match {reference}: {summary}", evidence)


def _counter(gate: CounterGate, analysis: CampaignAnalysis) -> GateResult:
    name = gate_name(gate)
    runs = analysis.runs
    cells = gate_cells(gate, analysis, treatments_only=False)
    subset = runs[runs["cell"].isin(cells)]
    if gate.counter == "failed_runs":
        values = {"campaign": float((subset["status"] != "ok").sum())}
    else:
        column = "ring_lost" if gate.counter == "lost_ring_records" else gate.counter
        incomplete = incomplete_runs(runs, cells)
        if incomplete:
            return GateResult(
                gate.kind,
                name,
                False,
                f"runs not complete: {', '.join(incomplete[:5])}",
                incomplete=True,
            )
        values = {}
        # Records, not itertuples: a Prometheus name (vllm:...) is no attribute name.
        for row in subset.to_dict("records"):
            value = row.get(column)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return GateResult(
                    gate.kind,
                    name,
                    False,
                    f"{gate.counter} was not recorded for run {row['run_id']}: the box or "
                    "runtime does not expose it, so the bound cannot be shown to hold",
                )
            values[str(row["run_id"])] = float(value)
    breaches = {
        run: value
        for run, value in values.items()
        if (gate.max is not None and value > gate.max)
        or (gate.min is not None and value < gate.min)
    }
    evidence = {"values": values}
    if breaches:
        worst = ", ".join(f"{run}={value:g}" for run, value in list(breaches.items())[:5])
        # Too many failed runs is still a matter of runs that did not complete.
        return GateResult(
            gate.kind,
            name,
            False,
            f"out of bounds: {worst}",
            evidence,
            incomplete=gate.counter == "failed_runs",
        )
    top = max(values.values()) if values else 0.0
    bounds = " and ".join(
        f"{word} {bound:g}"
        for word, bound in (("min", gate.min), ("max", gate.max))
        if bound is not None
    )
    return GateResult(
        gate.kind,
        name,
        True,
        f"{len(values)} runs within bounds ({bounds}; highest seen {top:g})",
        evidence,
    )


def _comparison(
    analysis: CampaignAnalysis, cell: str, state: str, metric: str
) -> CellComparison | None:
    for item in analysis.comparisons:
        if (item.cell, item.cache_state, item.comparison.metric) == (cell, state, metric):
            return item
    return None


def _finite(value: float | None) -> float | None:
    """verdict.json holds valid JSON numbers: a value that is not finite is no value."""
    return float(value) if value is not None and math.isfinite(value) else None


def _evidence(c: Comparison) -> dict[str, Any]:
    return {
        "ratio": _finite(c.ratio),
        "ci_low": _finite(c.ci_low),
        "ci_high": _finite(c.ci_high),
        "label": str(c.label),
        "n_cycles": c.n_cycles,
    }


def _describe(c: Comparison) -> str:
    ratio = _finite(c.ratio)
    text = f"ratio {ratio:.3f}" if ratio is not None else "no ratio"
    if c.ci_low is not None and c.ci_high is not None:
        text += f" {interval_text(c.ci_low, c.ci_high)}"
    text += f" over {c.n_cycles} cycle{'' if c.n_cycles == 1 else 's'}: {c.label}"
    if c.reason:
        text += f" ({c.reason})"
    return text


def _unrecorded(runs: pd.DataFrame, cell: str, state: str, metric: str) -> list[str]:
    """Completed runs of a comparison (the cell's and its control's) without the metric."""
    subset = runs[
        (runs["cell"].eq(cell) | runs["comparison"].eq(cell))
        & runs["cache_state"].eq(state)
        & runs["status"].eq("ok")
    ]
    if metric not in subset.columns:
        return [str(r) for r in subset["run_id"]]
    values = pd.to_numeric(subset[metric], errors="coerce")
    return [str(r) for r in subset.loc[~np.isfinite(values), "run_id"]]


def _better_in(
    analysis: CampaignAnalysis, cells: list[str], states: list[str], metric: str
) -> tuple[bool, list[str], dict[str, Any], bool, bool]:
    """Whether every cell is better in every state, the reasons, the evidence, and whether any
    failure rests on complete data (not only on runs that are missing or failed), and whether
    some failure is decided (worse, within noise, unrecorded, no comparison) rather than only
    inconclusive."""
    reasons, evidence, ok, on_data, decided = [], {}, True, False, False
    for cell in cells:
        incomplete = incomplete_runs(analysis.runs, [cell])
        for state in states:
            key = f"{cell}/{state}"
            item = _comparison(analysis, cell, state, metric)
            if incomplete:
                ok = False
                reasons.append(f"{key}: runs not complete ({', '.join(incomplete[:3])})")
                continue
            # A run without the metric drops its cycle from the comparison; the rest would
            # decide on less than the card asked for, so the gate fails and names the runs.
            unrecorded = _unrecorded(analysis.runs, cell, state, metric)
            if unrecorded:
                ok, on_data, decided = False, True, True
                reasons.append(
                    f"{key}: {metric} was not recorded for runs {', '.join(unrecorded[:3])}"
                    + (f" and {len(unrecorded) - 3} more" if len(unrecorded) > 3 else "")
                    + " (the runtime does not report what it needs, or it is undefined for"
                    " the run), so the cell cannot be compared on it"
                )
                continue
            if item is None:
                ok, on_data, decided = False, True, True
                reasons.append(f"{key}: no comparison on {metric} (no complete cycle)")
                continue
            c = item.comparison
            evidence[key] = _evidence(c)
            if c.label != Label.BETTER:
                ok, on_data = False, True
                decided |= c.label != Label.INCONCLUSIVE
                more = ""
                # More cycles can only settle an inconclusive comparison, not a worse one.
                if c.raw_label == Label.INCONCLUSIVE and c.needed_text and c.cycles_needed:
                    look = analysis.look
                    more = "; " + (
                        look.more_cycles(c.cycles_needed, c.cycles_needed_range)
                        if look is not None
                        else c.needed_text
                    )
                # A tail's better also needs the bound: say if its samples fall short too.
                if (tail := tail_check(analysis.tails, cell, state, metric)) and tail.short:
                    more += f"; and {tail.text}"
                reasons.append(f"{key}: {_describe(c)}{more}")
            elif (split := _boxes_disagree(analysis, cell, state, metric)) is not None:
                # Better on these boxes as a whole, but not on each: the pooled ratio hides a
                # box x cell interaction (analysis.boxes: fixed; random widens the interval).
                ok, on_data, decided = False, True, True
                reasons.append(f"{key}: {_describe(c)}, but {split}")
            elif (tail := tail_check(analysis.tails, cell, state, metric)) and not tail.shown:
                # A p95/p99 better than the control's by the paired runs, but the pooled
                # samples cannot show where the tails lie: more samples settle it.
                ok, on_data = False, True
                decided |= tail.decided
                evidence[key]["tail_bound"] = tail.evidence
                reasons.append(f"{key}: {_describe(c)}, but {tail.text}")
            else:
                if tail:
                    evidence[key]["tail_bound"] = tail.evidence
                tail_text = f"; {tail.text}" if tail else ""
                reasons.append(f"{key}: {_describe(c)}{tail_text}{_fleet_claim(analysis)}")
    return ok, reasons, evidence, on_data, decided


def _fleet_claim(analysis: CampaignAnalysis) -> str:
    """Which boxes a fleet's *better* is about, in the gate's words ('' on one box): ``fixed``
    claims the boxes that ran (a change with no effect on average over boxes like these can
    read *better* on them: harness bench sequential), ``random`` boxes like these."""
    if analysis.fleet is None or len(analysis.fleet.box_names) < 2:
        return ""
    n = len(analysis.fleet.box_names)
    if analysis.card.analysis.boxes == "fixed":
        return (
            f" (about these {n} boxes, analysis.boxes: fixed; for boxes like these set "
            "analysis.boxes: random)"
        )
    return f" (about boxes like these, from {n} boxes' own effects: analysis.boxes: random)"


def _boxes_disagree(analysis: CampaignAnalysis, cell: str, state: str, metric: str) -> str | None:
    """Why a fleet's pooled *better* does not hold, or None: the interaction test found the
    boxes' effects differ and some box is not *better* on its own (analysis.boxes: fixed).
    A difference every box still calls *better* is one of size, and the pooled label stands."""
    if analysis.fleet is None or analysis.card.analysis.boxes != "fixed":
        return None
    for row in analysis.fleet.interactions:
        if (row.cell, row.cache_state, row.metric) != (cell, state, metric) or not row.flagged:
            continue
        lagging = [b.box for b in row.boxes if b.label != Label.BETTER]
        if not lagging:
            return None
        per_box = ", ".join(f"{b.box} {b.ratio:.3f}" for b in row.boxes if b.ratio is not None)
        return (
            f"the effect differs between boxes ({per_box}; interaction p = "
            f"{row.p_interaction:.3g}) and box {', '.join(lagging)} is not better on its own: "
            "the pooled ratio hides it (analysis.boxes: random asks about boxes like these)"
        )
    return None


def _better(gate: BetterGate, analysis: CampaignAnalysis) -> GateResult:
    cells = gate_cells(gate, analysis, treatments_only=True)
    ok, reasons, evidence, on_data, decided = _better_in(
        analysis, cells, list(analysis.card.design.cache_states), gate.metric
    )
    incomplete = not ok and not on_data
    undecided = not ok and on_data and not decided
    return GateResult(
        gate.kind, gate_name(gate), ok, "; ".join(reasons), evidence, incomplete, undecided
    )


def _survives(gate: SurvivesGate, analysis: CampaignAnalysis) -> GateResult:
    metrics = gate.metrics or [g.metric for g in analysis.card.gates if isinstance(g, BetterGate)]
    if not metrics:
        return GateResult(gate.kind, gate_name(gate), False, "no metric to check: add `metrics`")
    cells = gate_cells(gate, analysis, treatments_only=True)
    all_ok, any_on_data, any_decided = True, False, False
    reasons: list[str] = []
    evidence: dict[str, Any] = {}
    for metric in metrics:
        ok, why, ev, on_data, decided = _better_in(analysis, cells, list(gate.cache_states), metric)
        all_ok &= ok
        any_on_data |= on_data
        any_decided |= decided
        reasons.extend(f"{metric} {r}" for r in why if not ok or "better" in r)
        evidence[metric] = ev
    summary = (
        "; ".join(reasons)
        if not all_ok
        else (f"better in every state ({', '.join(gate.cache_states)}) on {', '.join(metrics)}")
    )
    incomplete = not all_ok and not any_on_data
    undecided = not all_ok and any_on_data and not any_decided
    return GateResult(gate.kind, gate_name(gate), all_ok, summary, evidence, incomplete, undecided)


def evaluate_gates(analysis: CampaignAnalysis) -> Verdict:
    """Evaluate every gate of the card over the analysis."""
    results: list[GateResult] = []
    for gate in analysis.card.gates:
        if isinstance(gate, ExactOutputsGate):
            results.append(_exact_outputs(gate, analysis))
        elif isinstance(gate, CounterGate):
            results.append(_counter(gate, analysis))
        elif isinstance(gate, BetterGate):
            results.append(_better(gate, analysis))
        elif isinstance(gate, SurvivesGate):
            results.append(_survives(gate, analysis))
        elif isinstance(gate, QualityGate):
            results.append(quality_gate(gate, analysis))
        elif isinstance(gate, SoakGate):
            results.append(soak_gate(gate, analysis))
        elif isinstance(gate, RegressionGate):
            results.append(regression_gate(gate, analysis))
        else:
            results.append(lockstep_gate(gate, analysis))
    for implicit in (check(analysis) for check in IMPLICIT_GATES):
        if implicit is not None:
            results.append(implicit)
    confirm_box = mark_unconfirmed(results, analysis)
    incomplete = [f"{r.run_id}" for r in analysis.runs.itertuples() if r.status != "ok"]
    passed = bool(results) and all(r.passed for r in results) and not incomplete
    unverified = "" if analysis.sealed else UNVERIFIED
    return Verdict(
        analysis.card.campaign,
        passed,
        results,
        incomplete,
        ungated_cells(analysis),
        unverified,
        analysis.journal_head,
        analysis.head_checked if analysis.sealed else "",
        analysis.checked_against if analysis.sealed else "",
        confirm_box,
    )


# Why a directory's verdict is unverified: its journal carries no seal from its start.
UNVERIFIED = (
    "the directory is not sealed from its start (made before campaign directories were "
    "sealed, or its seal was stripped), so nothing vouches for what it held"
)


def ungated_cells(analysis: CampaignAnalysis) -> list[str]:
    """The compared cells no gate asks about: no better or survives gate covers them (a
    regression gate asks about history, not the control), so a PASS says nothing of whether
    they beat the control."""
    card = analysis.card
    if card.control is None:
        return []
    asked: set[str] = set()
    for gate in card.gates:
        if isinstance(gate, BetterGate | SurvivesGate):
            asked.update(gate_cells(gate, analysis, treatments_only=True))
    compared = sorted({c.cell for c in analysis.comparisons})
    return [cell for cell in compared if cell not in asked]


def incomplete_text(verdict: Verdict) -> str:
    """What the verdict says of a campaign with runs missing or failed, with the remedy."""
    runs = verdict.incomplete_runs
    return (
        f"{len(runs)} planned run{'' if len(runs) == 1 else 's'} missing or failed "
        f"({listed(runs)}): the campaign cannot pass until they complete; "
        "retry them with `harness run --resume DIR`"
    )


# Characters XML 1.0 cannot hold (ElementTree writes them anyway, and a CI's parser then rejects
# the whole report): a control byte from a prompt id or a runtime's output becomes U+FFFD.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    """Text ElementTree escapes (<, >, &, quotes) and XML 1.0 can hold."""
    return _NOT_XML.sub("\ufffd", text)


def write_verdict(verdict: Verdict, root: Path) -> None:
    """Write ``verdict.json`` and ``verdict.junit.xml`` for CI systems."""
    write_json_atomic(root / "verdict.json", verdict.to_json())
    incomplete = bool(verdict.incomplete_runs)
    suite = ET.Element(
        "testsuite",
        name=_xml(f"harness.{verdict.campaign}"),
        tests=str(len(verdict.gates) + incomplete),
        failures=str(sum(not g.passed for g in verdict.gates) + incomplete),
    )
    for gate in verdict.gates:
        name, reason = _xml(gate.name), _xml(gate.reason)
        case = ET.SubElement(suite, "testcase", classname=f"gate.{gate.kind}", name=name)
        if not gate.passed and gate.confirmation == "unconfirmed":
            # Blocks (exit 1) until the second box answers; a CI reads why it is not final.
            text = f"unconfirmed (awaits box {verdict.confirm_box}): {reason}"
            failure = ET.SubElement(case, "failure", type="unconfirmed", message=text[:500])
            failure.text = text
        elif not gate.passed and gate.undecided:
            # Not green (exit 1), but not a regression either: the type and message say so.
            text = f"undecided (inconclusive, not worse): {reason}"
            failure = ET.SubElement(case, "failure", type="undecided", message=text[:500])
            failure.text = text
        elif not gate.passed:
            failure = ET.SubElement(case, "failure", type="failed", message=reason[:500])
            failure.text = reason
        else:
            ET.SubElement(case, "system-out").text = reason
    if verdict.unverified:
        # Allowed (--allow-unsealed), and still said where a CI reads the suite.
        case = ET.SubElement(
            suite, "testcase", classname="campaign.sealed", name="records verified by the seal"
        )
        ET.SubElement(case, "skipped", message=_xml(verdict.unverified)[:500])
    elif verdict.checked_against:
        # Which kept head vouched for the records (a pass), or a skip saying none did.
        case = ET.SubElement(
            suite,
            "testcase",
            classname="campaign.journal_head",
            name="records vouched for by a journal head kept outside the directory",
        )
        text = _xml(verdict.checked_against)
        if verdict.head_checked:
            ET.SubElement(case, "system-out").text = text
        else:
            ET.SubElement(case, "skipped", message=text[:500]).text = text
    if incomplete:
        # A CI reading only the test cases must not see a green suite for a partial campaign.
        case = ET.SubElement(
            suite, "testcase", classname="campaign.complete", name="every planned run completed"
        )
        text = _xml(incomplete_text(verdict))
        ET.SubElement(case, "failure", message=text[:500]).text = text
    root_element = ET.Element("testsuites")
    root_element.append(suite)
    ET.indent(ET.ElementTree(root_element))
    text = ET.tostring(root_element, encoding="unicode", xml_declaration=True)
    write_text_atomic(root / "verdict.junit.xml", text + "\n")


__all__ = ["METRICS", "GateResult", "Verdict", "evaluate_gates", "incomplete_text", "write_verdict"]
