"""The box's load and speed per run: what ``runtime.box_load`` in each ``run.json`` read
(:mod:`harness.execute.box_load`), as one table, a campaign summary and a warning.

Per run: the 1-minute load before the boot and after the run, the other tasks runnable before
the boot per core (*load per core*; where a box has no ``/proc``, its 1-minute load stands in),
and the reference step's time before and after, each as a ratio to the median of the campaign's
readings on the same box. Per campaign: the highest load per core before any run, the reference
step's spread (slowest ÷ fastest reading on one box), and which runs were *loaded* or *drifted*.

A run without readings (a directory made before they were read, an import, a simulation) is
"not recorded", and a reading that failed says why: no number stands in for either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.stats.cycles import finite

# Loaded: more than half a core's worth of other runnable tasks per core before the boot. Before
# the boot the run's own runtime is not running (a shared boot's sits idle) and the reading
# leaves itself out, so what runs then is other tenants. 0.5 leaves one stray task on a 2-core
# box (the smallest box the harness runs on) unflagged and flags issue 59's loaded box, two
# `yes` loops on two cores (1.0 per core); on a wide box, half its cores taken is where a
# runtime that spreads its steps over every core (the reference runtime's numpy threads,
# llama.cpp's -t, a vLLM CPU worker) starts sharing cores, and its step times stretch.
LOADED_PER_CORE = 0.5
# Drifted: both reference readings of a run (before its boot and after its end) more than 10%
# off the median of the campaign's on that box, the same way. The step is the fastest of five
# repeats, so a short interruption does not move it; readings of a quiet box repeat within a few
# percent, with a single reading now and then far off (a quiet 2-core VM: 16-19 ms, single
# readings of 24-30 ms), which the other reading of the run does not share. 10% is also the
# order of the decode-speed effects a card gates on (its margin is typically 2-5%): drift
# larger than that can make or hide one.
DRIFT = 0.10
NOT_RECORDED = "not recorded"
_SHOWN_RUNS = 6


@dataclass(frozen=True)
class BoxLoad:
    """The box-load table of a campaign and what it says."""

    rows: pd.DataFrame  # one row per run with a record (columns: :data:`COLUMNS`)
    median_reference_ms: dict[str, float] = field(default_factory=dict)  # per box
    max_load_per_core: float | None = None  # before any run
    reference_spread: float | None = None  # slowest ÷ fastest reading, the widest box
    loaded_runs: tuple[str, ...] = ()
    drifted_runs: tuple[str, ...] = ()
    loaded_per_core: float = LOADED_PER_CORE  # the thresholds, for those who render them
    drift: float = DRIFT

    @property
    def recorded(self) -> bool:
        """True when any run carries a reading (read or failed)."""
        return not self.rows.empty and bool(self.rows["recorded"].any())

    @property
    def summary(self) -> str:
        """The campaign in one line."""
        if not self.recorded:
            return (
                f"{NOT_RECORDED}: no run of this campaign carries box-load readings (made "
                "before the harness read them, imported or simulated)"
            )
        read = int(self.rows["reference_before_ms"].notna().sum())
        parts = [f"{read} of {len(self.rows)} runs read before the boot"]
        if self.max_load_per_core is not None:
            parts.append(f"load per core before the boot at most {self.max_load_per_core:.2f}")
        for box, median in sorted(self.median_reference_ms.items()):
            parts.append(f"reference step median {median:.1f} ms on {box}")
        if self.reference_spread is not None:
            parts.append(f"spread {self.reference_spread:.2f}× (slowest ÷ fastest)")
        flagged = sorted({*self.loaded_runs, *self.drifted_runs})
        parts.append(f"loaded or drifted: {_runs(flagged)}" if flagged else "quiet")
        return "; ".join(parts)

    @property
    def warning(self) -> str | None:
        """The campaign warning when a run was measured loaded or drifted; None when quiet."""
        if not self.loaded_runs and not self.drifted_runs:
            return None
        why = []
        if self.loaded_runs:
            why.append(
                f"{_runs(self.loaded_runs)} started with more than {LOADED_PER_CORE} other "
                f"runnable tasks per core (up to {self.max_load_per_core:.2f})"
            )
        if self.drifted_runs:
            why.append(
                f"the reference step of {_runs(self.drifted_runs)} was more than "
                f"{DRIFT:.0%} off the campaign's median before and after, the same way "
                f"(spread {self.reference_spread:.2f}×)"
            )
        return (
            f"box load: {'; '.join(why)}, so timing-derived rows (decode speed, TPOT, T90) "
            "may have moved with the box rather than the cell; rerun on a quiet box, or read "
            "the counter rows (hit rate, swaps, cold share), which load cannot move"
        )

    def to_json(self) -> dict[str, Any]:
        """The summary's ``box_load`` entry."""
        return {
            "summary": self.summary,
            "max_load_per_core": self.max_load_per_core,
            "reference_spread": self.reference_spread,
            "median_reference_ms": self.median_reference_ms,
            "loaded_runs": list(self.loaded_runs),
            "drifted_runs": list(self.drifted_runs),
        }


COLUMNS = (
    "run_id", "cell", "box", "load_before", "load_after", "cpus", "runnable_before",
    "load_per_core", "reference_before_ms", "reference_after_ms", "ratio_before", "ratio_after",
    "loaded", "drifted", "recorded", "note",
)  # fmt: skip


def _runs(run_ids: Sequence[str]) -> str:
    shown = ", ".join(run_ids[:_SHOWN_RUNS])
    more = len(run_ids) - _SHOWN_RUNS
    word = "run" if len(run_ids) == 1 else "runs"
    return f"{word} {shown}" + (f" and {more} more" if more > 0 else "")


def _number(value: Any) -> float | None:
    number = finite(value)
    return number if number is not None and number >= 0 else None


def _reading(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """A checked reading and "" ; or None and why there is none."""
    if raw is None:
        return None, "not read"
    if not isinstance(raw, Mapping):
        return None, "unreadable reading"
    if "error" in raw:
        return None, str(raw["error"])
    cpus = raw.get("cpus")
    reading = {
        "load_1m": _number(raw.get("load_1m")),
        "cpus": cpus if isinstance(cpus, int) and not isinstance(cpus, bool) and cpus > 0 else None,
        "runnable": _number(raw.get("runnable")),
        "reference_ms": _number(raw.get("reference_ms")),
        "reference": str(raw.get("reference", "")),
    }
    if reading["reference_ms"] is None or reading["reference_ms"] == 0:
        return None, "unreadable reading"
    return reading, ""


def _row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One run's row before the ratios: its readings, or why it has none."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(run_id=entry["run_id"], cell=entry["cell"], box=entry["box"] or "")
    raw = entry["box_load"]
    row["recorded"] = isinstance(raw, Mapping)
    if not isinstance(raw, Mapping):
        row["note"] = NOT_RECORDED
        return row
    before, why_before = _reading(raw.get("before"))
    after, why_after = _reading(raw.get("after"))
    notes = [f"before: {why_before}"] if why_before else []
    notes += [f"after: {why_after}"] if why_after else []
    row["note"] = "; ".join(notes)
    row["reference"] = (before or after or {}).get("reference")
    if before is not None:
        row.update(
            load_before=before["load_1m"], cpus=before["cpus"], runnable_before=before["runnable"],
            reference_before_ms=before["reference_ms"],
        )  # fmt: skip
        other = before["runnable"] if before["runnable"] is not None else before["load_1m"]
        if other is not None and before["cpus"]:
            row["load_per_core"] = other / before["cpus"]
    if after is not None:
        row.update(load_after=after["load_1m"], reference_after_ms=after["reference_ms"])
    return row


def box_load_table(entries: Sequence[Mapping[str, Any]]) -> BoxLoad:
    """The box-load table from each run's ``run_id``, ``cell``, ``box`` and ``box_load`` (its
    record's ``runtime.box_load``, None when it has none), in plan order."""
    rows = [_row(e) for e in entries]
    medians: dict[str, float] = {}
    spread: float | None = None
    for box in dict.fromkeys(r["box"] for r in rows):
        # Readings of one box and one reference step compare; another box is another machine.
        mine = [r for r in rows if r["box"] == box and r.get("reference")]
        if not mine:
            continue
        step = max({r["reference"] for r in mine}, key=[r["reference"] for r in mine].count)
        values = [
            v
            for r in mine
            if r["reference"] == step
            for v in (r["reference_before_ms"], r["reference_after_ms"])
            if v is not None
        ]
        if not values:
            continue
        median = float(pd.Series(values).median())
        medians[box] = round(median, 3)
        spread = max(spread or 0.0, max(values) / min(values))
        for r in mine:
            if r["reference"] != step:
                r["note"] = "; ".join(filter(None, [r["note"], f"another reference step: {step}"]))
                continue
            for when in ("before", "after"):
                value = r[f"reference_{when}_ms"]
                r[f"ratio_{when}"] = value / median if value is not None else None
    for r in rows:
        per_core = r["load_per_core"]
        r["loaded"] = per_core is not None and per_core > LOADED_PER_CORE
        ratios = [x for x in (r["ratio_before"], r["ratio_after"]) if x is not None]
        # The block ran between its two readings: it ran on a slower (or faster) machine only
        # when both say so. One reading off alone is a blip of that moment (on a quiet 2-core
        # VM, single readings of 24-30 ms among 16-19 ms ones, the other reading at the median).
        slow = [x - 1 > DRIFT for x in ratios]
        fast = [1 - x > DRIFT for x in ratios]
        r["drifted"] = bool(ratios) and (all(slow) or all(fast))
        r.pop("reference", None)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    per_core = [r["load_per_core"] for r in rows if r["load_per_core"] is not None]
    return BoxLoad(
        rows=frame,
        median_reference_ms=medians,
        max_load_per_core=round(max(per_core), 3) if per_core else None,
        reference_spread=round(spread, 3) if spread is not None else None,
        loaded_runs=tuple(r["run_id"] for r in rows if r["loaded"]),
        drifted_runs=tuple(r["run_id"] for r in rows if r["drifted"]),
    )


__all__ = ["DRIFT", "LOADED_PER_CORE", "NOT_RECORDED", "BoxLoad", "box_load_table"]
