"""The report's "Box load and speed" section: each run's load and reference-step readings and the
campaign's summary, formatted only (computed in :mod:`harness.analyze.box_load`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.report import fmt

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

_MISSING = "not read"


def _value(value: Any, digits: int) -> str:
    """A number with ``digits`` decimals, or "not read" where there is none."""
    text = fmt.fixed(value, digits)
    return _MISSING if text == fmt.MISSING else text


def _pair(before: Any, after: Any, digits: int) -> str:
    """``before / after``, each "not read" where it has no value."""
    return f"{_value(before, digits)} / {_value(after, digits)}"


def box_load_context(analysis: CampaignAnalysis) -> dict[str, Any]:
    """The section's rows (empty when no run recorded readings), the campaign's summary line,
    the warning where a run was loaded or drifted, and the thresholds behind it."""
    load = analysis.box_load
    if load is None:  # an analysis made without the table: nothing was read
        return {"recorded": False, "summary": "not recorded", "warning": None, "rows": []}
    rows = []
    if load.recorded:
        for r in load.rows.to_dict("records"):
            flags = [f for f in ("loaded", "drifted") if r[f]]
            rows.append(
                {
                    "run_id": r["run_id"],
                    "cell": r["cell"],
                    "load": _pair(r["load_before"], r["load_after"], 2),
                    "per_core": _value(r["load_per_core"], 2),
                    "cpus": _value(r["cpus"], 0),
                    "reference_ms": _pair(r["reference_before_ms"], r["reference_after_ms"], 1),
                    "ratio": _pair(r["ratio_before"], r["ratio_after"], 2),
                    "flags": ", ".join(flags),
                    "note": r["note"] or "",
                    "not_recorded": not r["recorded"],
                }
            )
    return {
        "recorded": load.recorded,
        "summary": load.summary,
        "warning": load.warning,
        "rows": rows,
        "loaded_per_core": load.loaded_per_core,
        "drift_pct": round(load.drift * 100),
    }


__all__ = ["box_load_context"]
