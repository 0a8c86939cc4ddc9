"""The seed write-ups' tables, computed once from a campaign's analysis tables.

Four tables, each named after the section of the seed it reproduces (docs/design.md#seed-tables):

- the recovery ladder (seed 000 §4): T90 per shift direction, the ratio to the control, steady
  churn and converged C1 per phase;
- the frozen-map comparison (seed 000 §5): aggregate C1, C1 per domain and the first request
  after boot, control against each cell, with the statistics of the aggregate row;
- the policy table (seed 004): decode speed and TPOT beside the drift-proof counter evidence;
- predicted against measured: a simulated campaign's predictions beside the box's measurements.

Values are raw numbers (no formatting); ``analyze --json``, ``analysis/*.parquet`` and the
report all read them from here. Pure functions of the frames they are handed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from harness.analyze.cell_values import cell_keys, cell_value, finite, jsonable, median_of, ratio_of
from harness.analyze.predicted import PredictedVsMeasured
from harness.analyze.recovery import general_note, step_clock, times_recovery
from harness.analyze.recovery_stats import (
    median_never_slowest,
    ratio_interval,
    ratio_reason,
    run_times,
    shift_excess,
    time_range,
)
from harness.analyze.swap_table import SwapCost, median_interval, swap_cost_frame, swap_cost_table
from harness.card import Card
from harness.errors import BadInput

FROZEN_METRIC = "decode_tok_s"  # the metric of the frozen-map table's aggregate row


# ---- recovery ladder (seed 000 §4) -----------------------------------------------------------


@dataclass(frozen=True)
class T90:
    """Recovery of one cell in one shift direction, over its runs (recovery_stats defines it).

    ``median_s``: None when no run had a measurable shift (all "n/a (no excess)" or no runs),
    inf when at least half the measurable runs never recovered. ``range_s``: fastest and
    slowest measurable run (slowest inf: some run never recovered). ``vs_control`` is finite or
    None, with ``vs_control_note`` saying why it is None; ``vs_control_ci`` its bootstrap
    interval over runs (bounds may be 0 or inf). Cold shares are medians over runs of each
    run's peak and converged value after the shift. Times are in ``unit``: "s", or "steps" on
    the step clock, where ``wall_median_s`` is the median over the same runs of the wall
    seconds their recoveries took on the box (load stretches those, not the steps).
    """

    from_phase: str
    to_phase: str
    median_s: float | None
    runs: int
    never: int  # measurable runs that never recovered within the phase
    no_excess: int  # runs whose peak did not exceed the converged value: T90 n/a
    range_s: tuple[float, float] | None
    vs_control: float | None
    vs_control_ci: tuple[float, float] | None
    vs_control_note: str | None
    t2x_median_s: float | None
    t2x_never: int
    peak_cold_share: float | None
    converged_cold_share: float | None
    # The swap queue at its budget after the shift (analyze/saturation.py): medians over the
    # runs whose trace logs drains; None: not measured (no drain events).
    at_budget_layers: float | None = None
    layers: int | None = None
    saturated_s: float | None = None
    unit: str = "s"
    wall_median_s: float | None = None

    @property
    def never_majority(self) -> bool:
        """True when the median is "never" (at least half the measurable runs never recovered)."""
        return self.median_s is not None and math.isinf(self.median_s)

    def to_json(self) -> dict[str, Any]:
        """JSON form: "never" is null beside ``never_majority: true``; an infinite bound of a
        range or interval is the string "inf" (a range's top: some run never recovered), and a
        T2x median of never is the string "never"."""
        data = jsonable(asdict(self))
        data["range_s"] = _bounds(self.range_s)
        data["vs_control_ci"] = _bounds(self.vs_control_ci)
        if self.t2x_median_s is not None and math.isinf(self.t2x_median_s):
            data["t2x_median_s"] = "never"
        return {**data, "never_majority": self.never_majority}


def _bounds(pair: tuple[float, ...] | None) -> list[float | str] | None:
    if pair is None:
        return None
    return [("inf" if math.isinf(v) else v) for v in pair]


@dataclass(frozen=True)
class RecoveryRow:
    """One (cell, cache state) row of the recovery ladder."""

    cell: str
    cache_state: str
    control: bool
    description: str
    t90: tuple[T90, ...]  # one per direction, in the ladder's direction order
    churn_per_min: float | None
    converged_tok_s: dict[str, float | None]  # per phase after a shift, median over runs
    c1_tok_s: float | None  # whole run: C1, else decode speed
    note_ids: tuple[int, ...]  # 1-based indices into the ladder's notes
    # Per phase: the median's 95% bootstrap interval over runs (None under 2 runs) and the runs.
    converged_ci: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    converged_runs: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        data = jsonable(asdict(self))
        data["t90"] = [t.to_json() for t in self.t90]
        return dict(data)


@dataclass(frozen=True)
class RecoveryLadder:
    """Seed 000 §4: T90 per shift direction, ratio to the control, churn, converged C1."""

    directions: tuple[tuple[str, str], ...]
    phases: tuple[str, ...]
    rows: tuple[RecoveryRow, ...]
    notes: tuple[str, ...]
    window_s: float
    hold_s: float
    # 1-based ids of the notes about timing a recovery (not about a phase's cold share): a
    # report on a frozen map, where nothing recovers, leaves them out.
    timing_notes: tuple[int, ...] = ()
    # The step clock's window and hold (host steps), None on the seconds clock.
    window_steps: int | None = None
    hold_steps: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        clock = (
            {"window_steps": self.window_steps, "hold_steps": self.hold_steps}
            if self.window_steps is not None
            else {}
        )
        return {
            "directions": [list(d) for d in self.directions],
            "phases": list(self.phases),
            "rows": [r.to_json() for r in self.rows],
            "notes": list(self.notes),
            "window_s": self.window_s,
            "hold_s": self.hold_s,
            **clock,
        }

    def frame(self) -> pd.DataFrame:
        """One row per (cell, cache state, direction) for ``analysis/recovery.parquet``."""
        rows = []
        for row in self.rows:
            for t in row.t90:
                u = "_steps" if t.unit == "steps" else "_s"  # the columns say their unit
                wall = {"t90_wall_median_s": t.wall_median_s} if t.unit == "steps" else {}
                rows.append(
                    {
                        "cell": row.cell,
                        "cache_state": row.cache_state,
                        "from_phase": t.from_phase,
                        "to_phase": t.to_phase,
                        f"t90_median{u}": t.median_s,
                        f"t90_min{u}": t.range_s[0] if t.range_s else None,
                        f"t90_max{u}": t.range_s[1] if t.range_s else None,
                        **wall,
                        "runs": t.runs,
                        "never": t.never,
                        "no_excess": t.no_excess,
                        "t90_vs_control": t.vs_control,
                        "t90_vs_control_lo": t.vs_control_ci[0] if t.vs_control_ci else None,
                        "t90_vs_control_hi": t.vs_control_ci[1] if t.vs_control_ci else None,
                        f"t2x_median{u}": t.t2x_median_s,
                        "peak_cold_share": t.peak_cold_share,
                        "converged_cold_share": t.converged_cold_share,
                        "at_budget_layers": t.at_budget_layers,
                        "saturated_s": t.saturated_s,
                        "converged_tok_s": row.converged_tok_s.get(t.to_phase),
                        "churn_per_min": row.churn_per_min,
                        "c1_tok_s": row.c1_tok_s,
                    }
                )
        return pd.DataFrame(rows)


def _queue_medians(sel: pd.DataFrame) -> dict[str, Any]:
    """The queue's saturation over a cell's runs in one direction: medians of the runs that
    measured it (their trace logs drains); nothing where none did."""
    if sel.empty or "peak_at_budget" not in sel.columns:
        return {}
    measured = sel[sel["peak_at_budget"].notna()]
    if measured.empty:
        return {}
    return {
        "at_budget_layers": median_of(measured["peak_at_budget"]),
        "layers": int(measured["layers"].max()),
        "saturated_s": median_of(measured["saturated_s"]),
    }


def t90_median(values: Iterable[Any]) -> tuple[float | None, int]:
    """Median T90 where "never" (None) counts as infinitely slow; and how many never recovered.

    The median is inf when at least half the runs never recovered, None when there are no runs.
    Every value is a measurable run's (its shift had an excess): see recovery_stats.
    """
    times = [math.inf if finite(v) is None else float(v) for v in values]
    return median_never_slowest(times), sum(1 for v in times if math.isinf(v))


def _summarise(
    direction: tuple[str, str],
    sel: pd.DataFrame,
    base: list[float] | None,
    base_median: float | None,
    seed: int,
    resolution_s: float = 0.0,
    unit: str = "s",
) -> tuple[T90, list[float]]:
    """One cell's T90 in one direction; also its measurable runs' times (for the control's).
    ``unit`` "steps": read on the step clock (``resolution_s`` is then its window in steps)."""
    excess = shift_excess(sel) if not sel.empty else pd.Series([], dtype=bool)
    column = "_steps" if unit == "steps" else "_s"
    if not sel.empty and f"t90{column}" not in sel.columns:
        raise BadInput(
            "this campaign was analysed before T90 had a step clock: re-run `harness analyze` "
            "on it (its rings are kept)"
        )
    times, no_excess = run_times(sel[f"t90{column}"] if not sel.empty else [], excess)
    t2x, _ = run_times(sel[f"t2x{column}"] if not sel.empty else [], excess)
    wall, _ = run_times(sel["t90_s"] if not sel.empty else [], excess)
    median = median_never_slowest(times)
    ratio = ci = None
    note = None
    if base is not None:
        note = ratio_reason(median, base_median, (len(times), len(base)))
        if note is None and median is not None and base_median:
            ratio = median / base_median
        ci = ratio_interval(times, base, resolution_s=resolution_s, seed=seed)
    # Peak and converged are measured in every run, a flat one too: a fitted map's 0.9% beside
    # a stale map's 12.1% is the contrast T90 n/a alone would hide.
    measured = sel
    return (
        T90(
            from_phase=direction[0],
            to_phase=direction[1],
            median_s=median,
            runs=len(sel),
            never=sum(1 for v in times if math.isinf(v)),
            no_excess=no_excess,
            range_s=time_range(times),
            vs_control=ratio,
            vs_control_ci=ci,
            vs_control_note=note,
            t2x_median_s=median_never_slowest(t2x),
            t2x_never=sum(1 for v in t2x if math.isinf(v)),
            peak_cold_share=median_of(measured["peak"]) if not measured.empty else None,
            converged_cold_share=median_of(measured["converged"]) if not measured.empty else None,
            **_queue_medians(sel),
            unit=unit,
            wall_median_s=median_never_slowest(wall) if unit == "steps" else None,
        ),
        times,
    )


def _directions(shifts: pd.DataFrame) -> list[tuple[str, str]]:
    directions: list[tuple[str, str]] = []
    if not shifts.empty:
        for pair in zip(shifts["from_phase"], shifts["to_phase"], strict=True):
            key = (str(pair[0]), str(pair[1]))
            if key not in directions:
                directions.append(key)
    return directions


def _shifts_of(shifts: pd.DataFrame, cell: str, state: str) -> pd.DataFrame:
    if shifts.empty:
        return shifts
    return shifts[(shifts["cell"] == cell) & (shifts["cache_state"] == state)]


def _in_direction(shifts: pd.DataFrame, direction: tuple[str, str]) -> pd.DataFrame:
    return shifts[(shifts["from_phase"] == direction[0]) & (shifts["to_phase"] == direction[1])]


def recovery_ladder(card: Card, cells: pd.DataFrame, shifts: pd.DataFrame) -> RecoveryLadder | None:
    """The recovery ladder, or None when the campaign has no shift and no churn to show."""
    has_churn = "churn_per_min" in cells.columns and bool(cells["churn_per_min"].notna().any())
    if shifts.empty and not has_churn:
        return None
    directions = _directions(shifts)
    phases = list(dict.fromkeys(to for _, to in directions))
    control = card.control
    clock = step_clock(card.analysis)
    unit = "steps" if clock is not None else "s"
    resolution = float(clock.window) if clock is not None else card.analysis.window_s
    control_times: dict[tuple[str, tuple[str, str]], list[float]] = {}
    for key_state in card.design.cache_states if control else ():
        for direction in directions:
            sel = _in_direction(_shifts_of(shifts, str(control), key_state), direction)
            _, control_times[(key_state, direction)] = _summarise(
                direction, sel, None, None, 0, unit=unit
            )
    rows: list[RecoveryRow] = []
    notes: list[str] = []
    for cell, state in cell_keys(card):
        mine = _shifts_of(shifts, cell, state)
        t90s: list[T90] = []
        row_notes: list[str] = []
        for direction in directions:
            sel = _in_direction(mine, direction)
            base = None if cell == control else control_times.get((state, direction))
            summary, _ = _summarise(
                direction, sel, base, median_never_slowest(base or []), card.design.seed,
                resolution, unit,
            )  # fmt: skip
            if cell == control and summary.median_s is not None:
                summary = replace(summary, vs_control=1.0)  # itself, by definition
            t90s.append(summary)
            for note in sel.get("notes", []):
                for part in str(note).split("; "):
                    if part:
                        row_notes.append(f"{direction[0]}→{direction[1]}: {general_note(part)}")
        speeds = {
            phase: [
                v
                for v in (finite(x) for x in mine[mine["to_phase"] == phase]["converged_tok_s"])
                if v is not None
            ]
            if not mine.empty
            else []
            for phase in phases
        }
        converged = {phase: median_of(values) for phase, values in speeds.items()}
        note_ids = []
        n_runs = max(1, len(set(mine["run_id"])) if not mine.empty else 1)
        for note, times in Counter(row_notes).items():
            text = f"{note} ({times} of {n_runs} runs)"
            if text not in notes:
                notes.append(text)
            note_ids.append(notes.index(text) + 1)
        c1 = cell_value(cells, cell, state, "c1_tok_s")
        if c1 is None:
            c1 = cell_value(cells, cell, state, "decode_tok_s")
        rows.append(
            RecoveryRow(
                cell=cell,
                cache_state=state,
                control=cell == control,
                description=card.cells[cell].description,
                t90=tuple(t90s),
                churn_per_min=cell_value(cells, cell, state, "churn_per_min"),
                converged_tok_s=converged,
                c1_tok_s=c1,
                note_ids=tuple(note_ids),
                converged_ci={
                    p: median_interval(v, seed=card.design.seed) for p, v in speeds.items()
                },
                converged_runs={p: len(v) for p, v in speeds.items()},
            )
        )
    return RecoveryLadder(
        directions=tuple(directions),
        phases=tuple(phases),
        rows=tuple(rows),
        notes=tuple(notes),
        window_s=card.analysis.window_s,
        hold_s=card.analysis.hold_s,
        timing_notes=tuple(i for i, note in enumerate(notes, 1) if times_recovery(note)),
        window_steps=clock.window if clock is not None else None,
        hold_steps=clock.hold if clock is not None else None,
    )


# ---- frozen-map comparison (seed 000 §5) -----------------------------------------------------


@dataclass(frozen=True)
class FrozenRow:
    """One line of a frozen-map table: the control's value, the cell's, and their ratio."""

    label: str
    control: float | None
    cell: float | None
    ratio: float | None  # cell ÷ control
    metric: str | None  # the comparison behind this line's statistics, if it has one
    comparison: dict[str, Any] | None  # ratio, CI and label of that comparison
    note: str | None = None  # why a line with both values has no ratio


@dataclass(frozen=True)
class FrozenMapTable:
    """Seed 000 §5 for one cell against the control in one cache state."""

    cell: str
    control: str
    cache_state: str
    rows: tuple[FrozenRow, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return dict(jsonable(asdict(self)))


COMPARISON_FIELDS = (
    "ratio", "ci_low", "ci_high", "label", "raw_label", "n_cycles", "control_level", "cell_level",
)  # fmt: skip


def _comparison_of(
    comparisons: pd.DataFrame, cell: str, state: str, metric: str
) -> dict[str, Any] | None:
    if comparisons.empty:
        return None
    hit = comparisons[
        (comparisons["cell"] == cell)
        & (comparisons["cache_state"] == state)
        & (comparisons["metric"] == metric)
    ]
    if hit.empty:
        return None
    row = hit.iloc[0]
    out: dict[str, Any] = {}
    for name in COMPARISON_FIELDS:
        value = row.get(name)
        out[name] = value if isinstance(value, str) else finite(value)
    return out


def _paired(frame: pd.DataFrame, control: str, cell: str, state: str) -> pd.DataFrame:
    """The control's rows of the cohorts it ran in against ``cell`` (the blocks paired with
    it), beside the cell's own; records without a comparison column keep every control row."""
    mine = frame[frame["cache_state"] == state] if not frame.empty else frame
    if mine.empty or "comparison" not in mine.columns:
        return mine
    own_control = (mine["cell"] == control) & (mine["comparison"] == cell)
    if not own_control.any():
        return mine
    return mine[own_control | (mine["cell"] != control)]


def frozen_map_tables(
    card: Card,
    cells: pd.DataFrame,
    domains: pd.DataFrame,
    comparisons: pd.DataFrame,
    runs: pd.DataFrame | None = None,
) -> list[FrozenMapTable]:
    """One table per treatment and cache state; none without a control. Every row's control
    value comes from the control blocks paired with that cell (one control per row): the
    aggregate from the comparison's own blocks (its ratio is then exactly cell ÷ control), the
    per-domain and first-request rows from the control runs of that cell's cohorts."""
    control = card.control
    if control is None or not card.treatments:
        return []
    ok = runs[runs["status"] == "ok"] if runs is not None and not runs.empty else pd.DataFrame()
    tables = []
    for cell in card.treatments:
        for state in card.design.cache_states:
            stat = _comparison_of(comparisons, cell, state, FROZEN_METRIC)
            if stat and stat.get("control_level") and stat.get("cell_level"):
                aggregate = (stat["control_level"], stat["cell_level"])
            else:
                aggregate = (
                    cell_value(cells, control, state, FROZEN_METRIC),
                    cell_value(cells, cell, state, FROZEN_METRIC),
                )
            rows = [_frozen_row("aggregate C1 (decode tok/s, geomean)", *aggregate, stat)]
            if not domains.empty:
                paired = _paired(domains, control, cell, state)
                for domain in sorted(set(domains["domain"].astype(str))):
                    pick = paired[paired["domain"] == domain]
                    sides = [
                        pick[pick["cell"] == c]["decode_tok_s"].dropna() for c in (control, cell)
                    ]
                    rows.append(
                        _frozen_row(
                            f"{domain} C1",
                            median_of(sides[0]),
                            median_of(sides[1]),
                            runs=(len(sides[0]), len(sides[1])),
                        )
                    )
            first: tuple[float | None, float | None] = (
                cell_value(cells, control, state, "first_request_tok_s"),
                cell_value(cells, cell, state, "first_request_tok_s"),
            )
            first_runs = None
            if not ok.empty and "first_request_tok_s" in ok.columns:
                paired = _paired(ok, control, cell, state)
                picks = [
                    paired[paired["cell"] == c]["first_request_tok_s"].dropna()
                    for c in (control, cell)
                ]
                first = (median_of(picks[0]), median_of(picks[1]))
                first_runs = (len(picks[0]), len(picks[1]))
            rows.append(_frozen_row("first request after boot", *first, runs=first_runs))
            tables.append(FrozenMapTable(cell, control, state, tuple(rows)))
    return tables


# The fewest runs a side a frozen-map line's ratio of medians is printed from (the aggregate
# line's comes from its comparison, which says how many cycles it rests on).
MIN_MEDIAN_RUNS = 2


def _frozen_row(
    label: str,
    control: float | None,
    cell: float | None,
    stat: dict[str, Any] | None = None,
    *,
    runs: tuple[int, int] | None = None,
) -> FrozenRow:
    ratio, note = ratio_of(control, cell), None
    if runs is not None and ratio is not None and min(runs) < MIN_MEDIAN_RUNS:
        ratio = None
        note = (
            f"medians of {runs[1]} run(s) beside the control's {runs[0]}: a ratio needs "
            f"{MIN_MEDIAN_RUNS} a side"
        )
    return FrozenRow(label, control, cell, ratio, FROZEN_METRIC if stat else None, stat, note)


def frozen_map_frame(tables: list[FrozenMapTable]) -> pd.DataFrame:
    """One row per table line for ``analysis/frozen_map.parquet``."""
    rows = []
    for table in tables:
        for r in table.rows:
            stat = r.comparison or {}
            rows.append(
                {
                    "cell": table.cell,
                    "control": table.control,
                    "cache_state": table.cache_state,
                    "label": r.label,
                    "control_value": r.control,
                    "cell_value": r.cell,
                    "ratio": r.ratio,
                    "comparison_ratio": stat.get("ratio"),
                    "ci_low": stat.get("ci_low"),
                    "ci_high": stat.get("ci_high"),
                    "comparison_label": stat.get("label"),
                }
            )
    return pd.DataFrame(rows)


# ---- policy table (seed 004) -----------------------------------------------------------------

POLICY_COLUMNS = (
    "runs_ok",
    "runs_planned",
    "decode_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "hit_rate",
    "expert_loads",
    "bytes_read",
    "expert_loads_per_request",
    "bytes_read_per_request",
    "new_swapout_pages",
)
POLICY_EVIDENCE = ("hit_rate", "expert_loads", "bytes_read")  # without any, no table


@dataclass(frozen=True)
class PolicyRow:
    """One (cell, cache state) row: timing beside the drift-proof counter evidence."""

    cell: str
    cache_state: str
    control: bool
    values: dict[str, float | None]  # POLICY_COLUMNS, medians over completed runs

    def to_json(self) -> dict[str, Any]:
        """JSON form: the values flattened beside the keys."""
        return {
            "cell": self.cell,
            "cache_state": self.cache_state,
            "control": self.control,
            **jsonable(self.values),
        }


def policy_table(card: Card, cells: pd.DataFrame) -> list[PolicyRow]:
    """Seed 004's per-cell table; empty when no run reported hit or load counters."""
    if cells.empty or not any(
        c in cells.columns and cells[c].notna().any() for c in POLICY_EVIDENCE
    ):
        return []
    return [
        PolicyRow(
            cell,
            state,
            cell == card.control,
            {column: cell_value(cells, cell, state, column) for column in POLICY_COLUMNS},
        )
        for cell, state in cell_keys(card)
    ]


# ---- all of them -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedTables:
    """Every seed table of one campaign (each None or empty where it does not apply)."""

    recovery: RecoveryLadder | None
    frozen_map: tuple[FrozenMapTable, ...]
    policy: tuple[PolicyRow, ...]
    predicted: PredictedVsMeasured | None
    swap_cost: tuple[SwapCost, ...] = ()  # seed 000 §6, per cell

    def to_json(self) -> dict[str, Any]:
        """The ``seed_tables`` object of ``harness analyze --json``."""
        return {
            "recovery": self.recovery.to_json() if self.recovery else None,
            "frozen_map": [t.to_json() for t in self.frozen_map],
            "policy": [r.to_json() for r in self.policy],
            "predicted": self.predicted.to_json() if self.predicted else None,
            "swap_cost": [r.to_json() for r in self.swap_cost],
        }

    def frames(self) -> dict[str, pd.DataFrame]:
        """File stem → table, for ``analysis/<stem>.parquet`` (empty tables included)."""
        return {
            "recovery": self.recovery.frame() if self.recovery else pd.DataFrame(),
            "frozen_map": frozen_map_frame(list(self.frozen_map)),
            "policy": pd.DataFrame([r.to_json() for r in self.policy]),
            "predicted": self.predicted.frame() if self.predicted else pd.DataFrame(),
            "swap_cost": swap_cost_frame(list(self.swap_cost)),
        }


def build_seed_tables(
    card: Card,
    cells: pd.DataFrame,
    shifts: pd.DataFrame,
    domains: pd.DataFrame,
    comparisons: pd.DataFrame,
    predicted: PredictedVsMeasured | None = None,
    runs: pd.DataFrame | None = None,
) -> SeedTables:
    """Every seed table from the campaign's cell, shift, domain, comparison and run tables."""
    return SeedTables(
        recovery=recovery_ladder(card, cells, shifts),
        frozen_map=tuple(frozen_map_tables(card, cells, domains, comparisons, runs)),
        policy=tuple(policy_table(card, cells)),
        predicted=predicted,
        swap_cost=tuple(swap_cost_table(card, runs)) if runs is not None else (),
    )


__all__ = [
    "T90",
    "FrozenMapTable",
    "FrozenRow",
    "PolicyRow",
    "RecoveryLadder",
    "RecoveryRow",
    "SeedTables",
    "build_seed_tables",
]
