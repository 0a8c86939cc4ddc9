"""The ``quality`` gate: every cell passes the campaign's quality suite (regex, JSON, schema).

The suite is what the campaign recorded in ``quality.json``; each prompt's check runs on every
output of a cell for it, and a prompt passes only when all of them do. With ``vs``, a cell must
also pass at least as many prompts as the reference. A run that did not complete has unknown
answers: the cell fails as incomplete rather than be judged on its other runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from harness.analyze.campaign import CampaignAnalysis
from harness.card import QualityGate
from harness.errors import RecordError
from harness.formats.prompts import check_problems
from harness.formats.records import read_json
from harness.gate.result import (
    GateResult,
    gate_cells,
    gate_name,
    incomplete_of,
    listed,
    required_count,
)

__all__ = ["check_passes", "quality_gate"]


def check_passes(check: dict[str, Any], text: str) -> bool:
    """Whether ``text`` passes a quality check; an invalid check (see ``check_problems``) passes
    nothing."""
    if check_problems(check):
        return False
    kind = check.get("kind")
    if kind == "regex":
        return re.search(str(check["pattern"]), text) is not None
    try:
        value = json.loads(text.strip())
    except json.JSONDecodeError:
        return False
    if kind == "json_valid":
        return True
    return _matches_schema(value, check.get("schema", {}))


_SCHEMA_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "null": type(None),
}


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: Python's bool is an int (True == 1), JSON's boolean is not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _matches_schema(value: Any, schema: dict[str, Any]) -> bool:
    """The JSON-schema subset quality checks use: type, required, properties, enum."""
    expected = schema.get("type")
    if expected is not None:
        if expected not in _SCHEMA_TYPES:
            return False  # an unknown type accepts nothing (loading refuses it)
        if not isinstance(value, _SCHEMA_TYPES[expected]):
            return False
        # A JSON boolean parses to a Python bool, which isinstance counts as an int.
        if isinstance(value, bool) and expected in ("integer", "number"):
            return False
    if "enum" in schema and not any(_json_equal(value, item) for item in schema["enum"]):
        return False
    if isinstance(value, dict):
        if any(key not in value for key in schema.get("required", [])):
            return False
        for key, sub in schema.get("properties", {}).items():
            if key in value and not _matches_schema(value[key], sub):
                return False
    return True


def _quality_suite(path: Path) -> dict[str, dict[str, Any]]:
    """The suite a campaign recorded, by prompt id; a broken record names its field."""
    prompts = read_json(path).get("prompts")
    if not isinstance(prompts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("id"), str) for p in prompts
    ):
        raise RecordError(
            f"{path}: `prompts` must be a list of objects with a string `id`; the record is "
            "damaged: restore it or rerun the campaign"
        )
    return {p["id"]: p for p in prompts}


def quality_gate(gate: QualityGate, analysis: CampaignAnalysis) -> GateResult:
    name = gate_name(gate)
    path = analysis.campaign.root / "quality.json"
    if not path.is_file():
        return GateResult(gate.kind, name, False, "no quality suite was run in this campaign")
    suite = _quality_suite(path)
    # Loading refuses invalid checks; a campaign recorded before that may still hold one.
    invalid = [
        f"quality check of prompt {prompt_id} is invalid: {'; '.join(problems)}"
        for prompt_id, prompt in suite.items()
        if (problems := check_problems(prompt.get("check")))
    ]
    if invalid:
        return GateResult(gate.kind, name, False, "; ".join(invalid))
    outputs = analysis.outputs
    outputs = outputs[outputs["phase"] == "quality"] if not outputs.empty else outputs
    failures: list[str] = []
    evidence: dict[str, Any] = {}

    def passing(cell: str) -> list[str]:
        if outputs.empty:
            return []
        mine = outputs[(outputs["cell"] == cell) & outputs["ok"]]
        passed = []
        for prompt_id, prompt in suite.items():
            texts = mine[mine["prompt_id"] == prompt_id]["output_text"]
            if len(texts) and all(check_passes(prompt["check"], str(t)) for t in texts):
                passed.append(prompt_id)
        return passed

    cells = gate_cells(gate, analysis, treatments_only=gate.vs is not None)
    # A run that did not complete has unknown answers; the cell's other runs cannot stand in.
    missing = {
        c: incomplete_of(analysis.runs, c) for c in [*cells, *([gate.vs] if gate.vs else [])]
    }
    on_data = False
    floor = len(passing(gate.vs)) if gate.vs else 0
    if gate.vs and missing[gate.vs]:
        # No floor from a partial reference; the cells still have to meet min_pass.
        floor = 0
        failures.append(f"reference {gate.vs}: runs not complete ({listed(missing[gate.vs])})")
    for cell in cells:
        if missing[cell]:
            failures.append(f"{cell}: runs not complete ({listed(missing[cell])})")
            continue
        passed = passing(cell)
        need = max(required_count(gate.min_pass, len(suite)), floor)
        evidence[cell] = {"passed": len(passed), "n": len(suite), "required": need}
        if gate.vs:
            known = None if missing[gate.vs] else floor  # a partial reference proves nothing
            evidence[cell]["reference"] = {"cell": gate.vs, "passed": known}
        if len(passed) < need:
            on_data = True
            failed = sorted(set(suite) - set(passed))
            against = f" ({gate.vs} passes {floor})" if gate.vs else ""
            failures.append(
                f"{cell}: {len(passed)}/{len(suite)} pass, need {need}{against} "
                f"(failing: {', '.join(failed[:5])})"
            )
    if failures:
        return GateResult(
            gate.kind, name, False, "; ".join(failures), evidence, incomplete=not on_data
        )
    counts = "; ".join(
        f"{cell}: {e['passed']}/{e['n']} pass, need {e['required']}"
        + (f" (as many as {gate.vs})" if gate.vs else "")
        for cell, e in evidence.items()
    )
    # "Passes" is the bar's word, not the prompts': a bar of 0 (a reference that passes none)
    # is met by a cell that passes none, which the reason must not read as quality shown.
    reason = f"every cell meets its bar on the quality suite ({counts})"
    if evidence and all(e["passed"] == 0 for e in evidence.values()):
        reason += "; no prompt of the suite passes in any cell, so it shows nothing of quality"
    return GateResult(gate.kind, name, True, reason, evidence)
