"""The ``soak`` and ``lockstep`` gates: long runs that held, and a simulator that kept pace.

``soak``: each soak run lasted its minimum duration on the ring's own clock, lost no more ring
records than allowed, and kept its inter-token p99 and RSS growth within bounds; without a ring
none of that can be shown, so the run fails the gate. ``lockstep``: the simulator's replay of
the route traces (``harness simulate --lockstep``) diverged from the runtime's decisions no more
than allowed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.analyze.campaign import CampaignAnalysis
from harness.card import LockstepGate, SoakGate
from harness.errors import RecordError
from harness.formats.records import read_json
from harness.gate.result import GateResult, gate_cells, gate_name

__all__ = ["lockstep_gate", "soak_gate"]


def soak_gate(gate: SoakGate, analysis: CampaignAnalysis) -> GateResult:
    name = gate_name(gate)
    cells = gate_cells(gate, analysis, treatments_only=False)
    runs = analysis.runs[analysis.runs["cell"].isin(cells)]
    problems: list[str] = []
    evidence: dict[str, dict[str, Any]] = {}
    if runs.empty:
        return GateResult(gate.kind, name, False, "no soak run in the campaign")
    not_complete = 0
    for row in runs.itertuples():
        key = str(row.run_id)
        if row.status != "ok":
            problems.append(f"{key}: {row.status}: {getattr(row, 'reason', '')}")
            not_complete += 1
            continue
        duration = _number(getattr(row, "ring_duration_s", None))
        lost_value = _number(getattr(row, "ring_lost", None))
        if duration is None or lost_value is None:
            # end - start would count the boot as served, and nothing counted the losses: the
            # soak's claims rest on the ring, so without one the gate cannot be shown to hold.
            evidence[key] = {"duration_s": None, "lost_ring_records": None}
            problems.append(
                f"{key}: no ring records: duration, lost records and inter-token p99 cannot be "
                "shown (the runtime's ring was not collected)"
            )
            continue
        lost = int(lost_value)
        p99 = getattr(row, "ring_itl_p99_ms", None)
        raw_boots = getattr(row, "boots", None)
        boots = (
            int(raw_boots)
            if isinstance(raw_boots, int | float) and not math.isnan(raw_boots)
            else 1
        )
        evidence[key] = {
            "duration_s": duration,
            "boots": boots,
            "lost_ring_records": lost,
            "itl_p99_ms": p99,
        }
        resumed = f" (resumed across {boots} boots)" if boots > 1 else ""
        if duration < gate.min_duration_s:
            problems.append(f"{key}: ran {duration:.0f} s of {gate.min_duration_s:g} s{resumed}")
        if lost > gate.max_lost_records:
            problems.append(f"{key}: {lost} ring records lost")
        if gate.itl_p99_ms_max is not None:
            if p99 is None or (isinstance(p99, float) and math.isnan(p99)):
                problems.append(f"{key}: no inter-token p99 (no decode steps in the ring)")
            elif p99 > gate.itl_p99_ms_max:
                problems.append(f"{key}: inter-token p99 {p99:.2f} ms > {gate.itl_p99_ms_max:g} ms")
        if gate.rss_growth_pct_max is not None:
            growth = getattr(row, "rss_growth_pct", None)
            if growth is None or (isinstance(growth, float) and math.isnan(growth)):
                problems.append(f"{key}: RSS was not sampled, so growth cannot be bounded")
            elif growth > gate.rss_growth_pct_max:
                problems.append(f"{key}: RSS grew {growth:.1f}% > {gate.rss_growth_pct_max:g}%")
    if problems:
        only_incomplete = not_complete == len(problems)
        return GateResult(
            gate.kind, name, False, "; ".join(problems), evidence, incomplete=only_incomplete
        )
    resumed_runs = sum(1 for e in evidence.values() if e.get("boots", 1) > 1)
    note = f"; {resumed_runs} resumed across boots (not one process)" if resumed_runs else ""
    return GateResult(gate.kind, name, True, f"{len(evidence)} soak runs held{note}", evidence)


def _number(value: Any) -> float | None:
    """A finite number from a run-table cell; None for a missing value (None or NaN)."""
    if isinstance(value, int | float | np.integer | np.floating) and math.isfinite(float(value)):
        return float(value)
    return None


def lockstep_gate(gate: LockstepGate, analysis: CampaignAnalysis) -> GateResult:
    path = analysis.campaign.root / "lockstep.json"
    if not path.is_file():
        return GateResult(
            gate.kind,
            gate_name(gate),
            False,
            "no lockstep result in the campaign: run `harness simulate --lockstep` on its route "
            "traces first",
        )
    result = read_json(path)
    divergent = result.get("divergent")
    if isinstance(divergent, bool) or not isinstance(divergent, int):
        raise RecordError(
            f"{path}: `divergent` must be a count, not {divergent!r}; rerun "
            "`harness simulate --lockstep`"
        )
    ok = 0 <= divergent <= gate.max_divergent
    reason = f"{result.get('decisions', 0)} decisions, {divergent} divergent"
    return GateResult(gate.kind, gate_name(gate), ok, reason, result)
