"""The report's tables: every comparison row and the seed tables, formatted for reading.

The numbers come from the analysis (:mod:`harness.analyze.seed_tables`, the comparisons);
this module only chooses units and precision and attaches each row's warnings and flags. Each
value is kept twice where a reviewer reads it: raw (``value``), so tests can check the report
against the analysis, and as shown (``text``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.catalog import METRICS
from harness.report import fmt
from harness.report.labels import adaptation, varied_against
from harness.stats.labels import Label

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis
    from harness.analyze.seed_tables import T90, RecoveryLadder

# Labels of the statistics, in the order a reviewer weighs them, with their CSS class.
LABEL_CLASS = {
    "better": "good",
    "worse": "bad",
    "within noise": "neutral",
    "inconclusive": "warn",
    "confounded": "warn",
    "carry-over": "warn",
    "not engaged": "bad",
    "corrupt": "bad",
    "not equivalent": "bad",
}


def frame_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as dicts with string keys (none for an empty frame)."""
    if frame.empty:
        return []
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def interval_header(analysis: CampaignAnalysis) -> str:
    """The comparisons' interval column, at the level its intervals were computed at: the
    card's alpha, or a sequential design's current look's nominal alpha (a 95% header over
    intervals at α 0.0121 would claim less coverage than they have, and mislabel them)."""
    look = analysis.look
    if look is not None and analysis.sequential_plan is not None:
        alpha = look.nominal_alpha
        return f"{100 * (1 - alpha):.4g}% CI (look {look.look}, α {fmt.num(alpha)})"
    return f"{100 * (1 - analysis.card.analysis.alpha):.4g}% CI"


def key_name(analysis: CampaignAnalysis, cell: str, state: str) -> str:
    """A cell's row name: the cell, with its cache state when the card has several."""
    return cell if len(analysis.card.design.cache_states) == 1 else f"{cell} / {state}"


def _cell_value(analysis: CampaignAnalysis, cell: str, state: str, column: str) -> float | None:
    return analysis.cell_value(cell, state, column)


def t90_text(t90: T90) -> str:
    """A cell's T90 median as the report, record and figure show it (recovery_stats defines it)."""
    if t90.median_s is None:
        return "n/a (no excess)" if t90.no_excess else f"{fmt.MISSING} (no shift measured)"
    text = _time_or_never(t90.median_s, t90.unit)
    if t90.unit == "steps" and t90.wall_median_s is not None and math.isfinite(t90.wall_median_s):
        text += f" ({fmt.seconds(t90.wall_median_s)} here)"
    extras = []
    if t90.never and not t90.never_majority:
        extras.append(f"{t90.never}/{t90.runs} never")
    if t90.no_excess:
        extras.append(f"{t90.no_excess}/{t90.runs} n/a")
    return text + (f" ({', '.join(extras)})" if extras else "")


def _time_or_never(value: float, unit: str = "s") -> str:
    """A recovery time in its clock's unit (seconds, or host steps on the step clock)."""
    if math.isinf(value):
        return "never"
    return f"{value:,.0f} steps" if unit == "steps" else fmt.seconds(value)


def t90_range_text(t90: T90) -> str:
    """Fastest–slowest measurable run, "never" at the top when some run never recovered."""
    if t90.range_s is None:
        return fmt.MISSING
    lo, hi = t90.range_s
    if lo == hi:
        return f"{_time_or_never(lo, t90.unit)} (all {t90.runs - t90.no_excess})"
    return f"{_time_or_never(lo, t90.unit)} – {_time_or_never(hi, t90.unit)}"


def _saturated_text(seconds: float | None) -> str:
    if seconds is None:
        return "not measured (no drain events)"
    return "not saturated" if seconds == 0 else fmt.seconds(seconds)


def _at_budget_text(t90: T90) -> str:
    """The most layers the swap queue held at its budget after the shift (median over runs),
    or why there is no figure."""
    if t90.at_budget_layers is None or t90.layers is None:
        return "not measured (no drain events)"
    return f"{t90.at_budget_layers:g} of {t90.layers}"


def _t2x_text(t90: T90) -> str:
    if t90.t2x_median_s is None:
        return "n/a (no excess)" if t90.no_excess else fmt.MISSING
    text = _time_or_never(t90.t2x_median_s, t90.unit)
    return text + (
        f" ({t90.t2x_never}/{t90.runs} never)" if t90.t2x_never and text != "never" else ""
    )


def _bound(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.2f}"


def t90_ratio_text(t90: T90) -> str:
    """The cell's T90 over the control's with its bootstrap interval, or why there is none."""
    if t90.vs_control is None:
        head = f"{fmt.MISSING} ({t90.vs_control_note})" if t90.vs_control_note else fmt.MISSING
    else:
        head = fmt.ratio(t90.vs_control)
    if t90.vs_control_ci is None:
        return head + " [no interval: under 2 runs a side]" if t90.vs_control_note is None else head
    lo, hi = t90.vs_control_ci
    return f"{head} [{_bound(lo)}, {_bound(hi)}]"


def recovery_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Seed 000 §4: T90 per shift direction with its spread, ratio vs control with an interval,
    peak and converged cold share, T2x, steady churn, converged C1."""
    ladder = analysis.seed_tables.recovery
    if ladder is None:
        return None
    # With adaptation frozen in every cell nothing can recover: a T90 of "never" would read as a
    # slow recovery, so the recovery columns say why they are empty; peak and converged stay.
    frozen = adaptation(analysis.card) == "adaptation frozen"
    # ...and notes on a frozen map's T90 ("never recovered", "no excess", a phase too short to
    # measure one) say the same thing again, louder: kept out, the others renumbered so each
    # row's marks still point at its notes.
    notes, numbers = list(ladder.notes), {i: i for i in range(1, len(ladder.notes) + 1)}
    if frozen:
        kept = [(i, n) for i, n in enumerate(ladder.notes, 1) if i not in ladder.timing_notes]
        notes = [n for _, n in kept]
        numbers = {old: new for new, (old, _) in enumerate(kept, 1)}
    rows = []
    for row in ladder.rows:
        rows.append(
            {
                "name": key_name(analysis, row.cell, row.cache_state),
                "cell": row.cell,
                "state": row.cache_state,
                "description": row.description,
                "control": row.control,
                "t90": [
                    {
                        "direction": f"{t.from_phase}→{t.to_phase}",
                        "value": math.inf if t.never_majority else t.median_s,
                        "text": FROZEN_TEXT if frozen else t90_text(t),
                        "range": FROZEN_TEXT if frozen else t90_range_text(t),
                        "ratio": (
                            FROZEN_TEXT
                            if frozen
                            else "1.00× (control)"
                            if row.control
                            else t90_ratio_text(t)
                        ),
                        "t2x": FROZEN_TEXT if frozen else _t2x_text(t),
                        "at_budget": _at_budget_text(t),
                        "saturated": _saturated_text(t.saturated_s),
                        "peak": fmt.pct(t.peak_cold_share, 1),
                        "converged": fmt.pct(t.converged_cold_share, 1),
                        "n": t.runs,
                    }
                    for t in row.t90
                ],
                "churn": {
                    "value": row.churn_per_min,
                    "text": fmt.fixed(row.churn_per_min, 0, "/min"),
                },
                "c1": [
                    {
                        "value": row.converged_tok_s[p],
                        "text": _converged_text(
                            row.converged_tok_s[p],
                            row.converged_ci.get(p),
                            row.converged_runs.get(p),
                        ),
                    }
                    for p in ladder.phases
                ],
                "c1_all": {"value": row.c1_tok_s, "text": fmt.fixed(row.c1_tok_s, 1)},
                "note_ids": [numbers[i] for i in row.note_ids if i in numbers],
            }
        )
    return {
        "directions": [f"{a}→{b}" for a, b in ladder.directions],
        "phases": list(ladder.phases),
        "rows": rows,
        "notes": notes,
        "window_s": ladder.window_s,
        "hold_s": ladder.hold_s,
        "frozen": frozen,
        "definition": (FROZEN_DEFINITION if frozen else t90_definition(ladder)),
    }


def _converged_text(value: float | None, ci: tuple[float, float] | None, runs: int | None) -> str:
    """A converged speed with its interval over runs, or why it has none (a single run)."""
    if value is None:
        return fmt.MISSING
    if ci is None:
        return f"{fmt.fixed(value, 1)} ({runs or 0} run: no interval)"
    return f"{fmt.fixed(value, 1)} [{fmt.fixed(ci[0], 1)}, {fmt.fixed(ci[1], 1)}]"


def _interval(pair: tuple[float, float] | None, decimals: int) -> str:
    if pair is None:
        return "[no interval: under 2 runs]"
    return f"[{pair[0]:.{decimals}f}, {pair[1]:.{decimals}f}]"


def swap_cost_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Seed 000 §6: ms per applied swap and the ratio to the swap-free p95, with intervals."""
    rows = analysis.seed_tables.swap_cost
    if not rows:
        return None
    out = []
    for r in rows:
        why = None if r.runs else "no run had both swap-bearing and swap-free steps"
        out.append(
            {
                "name": key_name(analysis, r.cell, r.cache_state),
                "control": r.control,
                "runs": r.runs,
                "swap_steps": fmt.count(r.swap_steps),
                "ms": (
                    f"{fmt.fixed(r.ms_per_swap, 2, 'ms')} {_interval(r.ms_per_swap_ci, 2)}"
                    if r.ms_per_swap is not None
                    else f"{fmt.MISSING} ({why})"
                ),
                "ratio": (
                    f"{fmt.ratio(r.ratio_to_free_p95)} {_interval(r.ratio_ci, 2)}"
                    if r.ratio_to_free_p95 is not None
                    else f"{fmt.MISSING} ({why or 'a swap-free p95 of 0'})"
                ),
            }
        )
    return {"rows": out, "definition": SWAP_DEFINITION, "not_measured": ROW_COPY_NOT_MEASURED}


SWAP_DEFINITION = (
    "Per run, from the ring's decode steps (prefill steps left out of both sides), each "
    "swap-bearing step against the swap-free steps with as many cold lookups (a cold lookup "
    "reads a row as a swap does): ms per applied swap = (swap-bearing step − mean of those "
    "swap-free steps) ÷ mean swaps per swap-bearing step; ratio = mean swap-bearing step ÷ "
    "p95 of those swap-free steps (seed 000 §6 measured ~1.9× and 1.9–2.4 ms per swap). Per "
    "cell: median over runs, 95% bootstrap interval over runs."
)


# Seed 000 split a swap's cost with CUDA events around the copies; no runtime the harness
# boots reports that split, so the page says so instead of leaving the seed's row out.
ROW_COPY_NOT_MEASURED = (
    "GPU row copy within a swap (seed 000: ~0.26 ms of 1.9–2.4 ms, by CUDA events around the "
    "copies): not measured; no runtime the harness boots times its copies apart from the step."
)

FROZEN_TEXT = "n/a (adaptation frozen)"
FROZEN_DEFINITION = (
    "T90 and T2x are not measured: adaptation is frozen in every cell, so no cell can recover "
    "from a shift; the peak and converged cold share are measured as in any campaign."
)


def t90_definition(ladder: RecoveryLadder) -> str:
    """The caption that defines T90 on the page and in record.md, on the campaign's clock."""
    if ladder.window_steps is None:
        return T90_DEFINITION.format(window_s=ladder.window_s, hold_s=ladder.hold_s)
    return T90_STEPS_DEFINITION.format(
        window_steps=ladder.window_steps, hold_steps=ladder.hold_steps
    )


# One sentence for the HTML caption and record.md, so both define T90 alike.
T90_DEFINITION = (
    "T90: time from the shift until the cold share ({window_s:g} s windows) enters and stays "
    "(held {hold_s:g} s, to the phase's end) at or below converged + 10% of (peak − converged), "
    "or + the late windows' own noise where that is wider (at most half the excess); "
    'median over runs with "never" (not within the phase) counted as slowest, range = fastest '
    '– slowest run; "n/a (no excess)" where the peak did not exceed the converged value by more '
    "than the windows' noise (no T90 exists; such runs are left out). vs control = median ÷ "
    "the control's median, with a 95% bootstrap interval over runs widened by a window either "
    "side, since a T90 is known to one window (∞: the cell's resampled median was never). "
    "T2x: the same to 2 × converged (0 s when the cold share never exceeded 2 × converged). "
    "Peak and converged cold share: medians over runs."
)
T90_STEPS_DEFINITION = (
    "T90, on the step clock: host steps served from the shift until the cold share (windows of "
    "{window_steps:,} steps) enters and stays (held {hold_steps:,} steps, to the phase's end) "
    "at or below converged + 10% of (peak − converged), or + the late windows' own noise "
    "where that is wider (at most half the excess); the seconds those steps took here follow "
    "in brackets (median over runs; a busy box stretches them, not the steps). Median over "
    'runs with "never" (not within the phase) counted as slowest, range = fastest – slowest '
    'run; "n/a (no excess)" where the peak did not exceed the converged value by more than '
    "the windows' noise (no T90 exists; such runs are left out). vs control = median ÷ the "
    "control's median, with a 95% bootstrap interval over runs widened by a window either "
    "side, since a T90 is known to one window (∞: the cell's resampled median was never). "
    "T2x: the same to 2 × converged (0 steps when the cold share never exceeded 2 × "
    "converged). Peak and converged cold share: medians over runs."
)


def _frozen_gap(analysis: CampaignAnalysis, label: str) -> str:
    """Why a frozen-map value is missing: the reason a reviewer needs beside its "—"."""
    if label.startswith("first request") and analysis.card.workload.warmup_requests:
        n = analysis.card.workload.warmup_requests
        return f"the warm-up took the first request after boot: workload.warmup_requests {n}"
    return "no completed run measured it"


def frozen_map_tables(
    analysis: CampaignAnalysis, comparisons: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Seed 000 §5: aggregate C1, per-domain C1 and first request after boot, control vs cell."""
    states = analysis.card.design.cache_states
    tables = []
    for table in analysis.seed_tables.frozen_map:
        rows = []
        for r in table.rows:
            stat = None
            if r.metric is not None:
                stat = next(
                    (
                        c
                        for c in comparisons
                        if c["cell"] == table.cell
                        and c["state"] == table.cache_state
                        and c["metric"] == r.metric
                    ),
                    None,
                )
            missing = r.control is None or r.cell is None
            rows.append(
                {
                    "label": r.label,
                    # Why a value reads "—", shown under the row's label (the cells stay narrow).
                    "why": _frozen_gap(analysis, r.label) if missing else (r.note or ""),
                    "control": {"value": r.control, "text": fmt.fixed(r.control, 1)},
                    "cell": {"value": r.cell, "text": fmt.fixed(r.cell, 1)},
                    "delta": fmt.delta(r.ratio),
                    "stat": stat,
                }
            )
        tables.append(
            {
                "cell": table.cell,
                "control": table.control,
                "state": table.cache_state,
                "title": f"{table.control} vs {table.cell}"
                + ("" if len(states) == 1 else f" ({table.cache_state})")
                + f" (varies {', '.join(varied_against(analysis.card, table.cell)) or 'nothing'})",
                "rows": rows,
            }
        )
    return tables


def policy_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Seed 004: decode t/s, hit rate, loads, bytes read, p50/p95 TPOT, per cell."""
    if not analysis.seed_tables.policy:
        return None
    # A timed phase serves as many requests as the throughput allows: loads and bytes per run
    # would move with speed, so they are shown per request served.
    timed = any(p.duration_s is not None for p in analysis.card.workload.phases or [])
    rows = []
    for row in analysis.seed_tables.policy:
        v = row.values
        p50, p95 = v["tpot_p50_ms"], v["tpot_p95_ms"]
        rows.append(
            {
                "name": key_name(analysis, row.cell, row.cache_state),
                "cell": row.cell,
                "state": row.cache_state,
                "control": row.control,
                "runs": f"{int(v['runs_ok'] or 0)}/{int(v['runs_planned'] or 0)}",
                "decode": {"value": v["decode_tok_s"], "text": fmt.fixed(v["decode_tok_s"], 2)},
                "tpot": {
                    "p50": p50,
                    "p95": p95,
                    "text": f"{fmt.fixed(p50, 2)} / {fmt.fixed(p95, 2)} ms",
                },
                "hit_rate": {"value": v["hit_rate"], "text": fmt.pct(v["hit_rate"])},
                "loads": (
                    {
                        "value": v["expert_loads_per_request"],
                        "text": fmt.fixed(v["expert_loads_per_request"], 1, "/request"),
                    }
                    if timed
                    else {"value": v["expert_loads"], "text": fmt.count(v["expert_loads"])}
                ),
                "bytes": (
                    {
                        "value": v["bytes_read_per_request"],
                        "text": fmt.gib(v["bytes_read_per_request"]) + "/request",
                    }
                    if timed
                    else {"value": v["bytes_read"], "text": fmt.gib(v["bytes_read"])}
                ),
                "swapout": {
                    "value": v["new_swapout_pages"],
                    "text": fmt.count(v["new_swapout_pages"]),
                },
            }
        )
    return {
        "rows": rows,
        "evidence_title": (
            "deterministic per request (timed phases: totals ÷ requests served)"
            if timed
            else "deterministic — drift-proof"
        ),
        "caveat": (
            "With timed phases a faster run serves more requests and reads more in all, so "
            "expert loads and bytes read are shown per request served; hit rate is a ratio."
            if timed
            else ""
        ),
    }


def predicted_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Predicted against measured, from the simulated sibling the analysis found."""
    predicted = analysis.seed_tables.predicted
    if predicted is None:
        return None
    rows = [
        {
            "metric": r.metric,
            "unit": _predicted_unit(r.metric),
            "cell": r.cell,
            "predicted": r.predicted,
            "measured": r.measured,
            "predicted_text": _with_na(
                "never" if r.predicted_never else fmt.num(r.predicted), r.predicted_na
            ),
            "measured_text": _with_na(
                "never" if r.measured_never else fmt.num(r.measured), r.measured_na
            ),
            "error_text": fmt.num(r.error),
            "interval_text": (
                f"[{fmt.num(r.low)}, {fmt.num(r.high) if r.high is not None else '∞'}]"
                if r.low is not None
                else "—"
            ),
            "ratio_text": f"{r.ratio:.3f}" if r.ratio is not None else "—",
            "relative_text": (
                f"{r.relative_ratio:.3f}"
                if r.relative_ratio is not None and r.cell != analysis.card.control
                else "—"
            ),
            "within_text": {True: "yes", False: "no", None: "—"}[r.within],
        }
        for r in predicted.rows
    ]
    orders = [
        {
            "metric": metric,
            "held": "yes" if held else "no",
            "pairs": "{} of {} pairs".format(*predicted.pairs_held.get(metric, (0, 0))),
        }
        for metric, held in predicted.order_held.items()
    ]
    fitted = predicted.fitted_swap
    swap = None
    if fitted is not None:
        size = fitted.get("record_bytes")
        swap = (
            f"The cost model the simulation was priced with (harness fit-cost, from "
            f"{fitted['source']}) charges {fitted['ms']:.3f} ms [{fitted['low']:.3f}, "
            f"{fitted['high']:.3f}] per applied swap"
            + (f" of a {size:,}-byte row" if isinstance(size, int) else "")
            + "; this campaign's own reading of its rings is in the swap-cost table."
        )
    return {
        "dir": predicted.source,
        "provenance": predicted.provenance,
        "rows": rows,
        "png": None,
        "orders": orders,
        "mismatches": list(predicted.mismatches),
        "fitted_swap": swap,
    }


def _with_na(text: str, na: str) -> str:
    return f"{text} ({na})" if na else text


def _predicted_unit(metric: str) -> str:
    """A predicted row's unit; T90 and T2x are each run's worst shift with an excess."""
    if metric in ("t90_s", "t2x_s"):
        return "s, each run's worst shift (median over runs)"
    info = METRICS.get(metric)
    return info.unit if info else ""


def comparison_rows(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Every comparison row, formatted, with its warnings attached to it."""
    out = []
    for item in analysis.comparisons:
        c, state = item.comparison, item.cache_state
        metric = c.metric
        info = METRICS.get(metric)
        unit = info.unit if info else ""
        # The paired blocks' levels, weighted as the ratio is: one control per row.
        control_value, cell_value = fmt.finite(c.control_level), fmt.finite(c.cell_level)
        lo, hi = fmt.finite(c.ci_low), fmt.finite(c.ci_high)
        warnings = [w for w in (*c.warnings, *item.dropped_cycles) if w]
        notes = [c.reason] if c.reason else []
        model = c.model
        per_block = model.trend_pct_per_block if model else None
        if model is not None and per_block is not None and model.trend_p < 0.05:
            per_min = model.trend_pct_per_min
            notes.append(
                f"drift {per_block:+.2f}% per block"
                + (f" ({per_min:+.2f}%/min)" if per_min is not None else "")
                + " removed by the model"
            )
        if c.variance is not None:
            notes.append(f"more {c.variance.advice} would narrow it most")
        needed = c.cycles_needed
        if c.label in (Label.INCONCLUSIVE, Label.CONFOUNDED) and needed and c.needed_text:
            look = analysis.look
            notes.append(
                look.more_cycles(needed, c.cycles_needed_range)
                if look is not None
                else c.needed_text
            )
        if lo is None:
            notes.append("no interval (one cycle)")
        elif c.label == Label.WITHIN_NOISE and lo == hi:
            # An exact count that moved by the same ratio in every cycle has no noise to be
            # within: the label's "within" is the margin's.
            margin = analysis.card.analysis.margin_pct
            notes.append(
                "identical in every cycle: an exact count, no noise"
                if lo == 1.0
                else f"exactly {fmt.delta(lo)} in every cycle: an exact count inside the "
                f"±{margin:g}% margin, not noise"
            )
        flags = [
            f
            for f in analysis.flags
            if f["cell"] == item.cell and f["cache_state"] == state and f["metric"] == metric
        ]
        out.append(
            {
                "cell": item.cell,
                "vs": item.vs,
                "state": state,
                "metric": metric,
                "unit": unit,
                "direction": "higher is better"
                if info and info.higher_is_better
                else "lower is better",
                "deterministic": bool(info and info.deterministic),
                "control_text": fmt.metric(metric, control_value, unit),
                "cell_text": fmt.metric(metric, cell_value, unit),
                "ratio": fmt.finite(c.ratio),
                "ratio_text": fmt.ratio3(c.ratio),
                "ci_low": lo,
                "ci_high": hi,
                "ci_text": fmt.interval_text(c.ci_low, c.ci_high, "none"),
                "label": str(c.label),
                "label_class": LABEL_CLASS.get(c.label, "warn"),
                "n_cycles": c.n_cycles,
                "carry_over": c.carry_over_explains,
                "notes": notes,
                "warnings": warnings,
                "flags": flags,
                "flag_summary": _flag_summary(flags),
            }
        )
    return out


def _flag_summary(flags: list[dict[str, str]]) -> list[str]:
    """ "DRIFT in cycles 0, 1" per flag kind: the detail lines stay one click away."""
    by_kind: dict[str, list[str]] = {}
    for flag in flags:
        cycle = str(flag["detail"]).split(":", 1)[0].removeprefix("cycle ").strip()
        by_kind.setdefault(str(flag["kind"]), []).append(cycle)
    return [
        f"{kind} in cycle{'s' if len(cycles) > 1 else ''} {', '.join(cycles)}"
        for kind, cycles in by_kind.items()
    ]


def looks_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """A sequential design's looks: the schedule, where the analysis stands, and each look."""
    look, design = analysis.look, analysis.sequential_plan
    if look is None or design is None:
        return None
    rows = []
    for r in frame_records(analysis.looks):
        rows.append(
            {
                "look": r.get("look"),
                "cycles": r.get("cycles"),
                "information": fmt.fixed(r.get("information"), 2),
                "nominal": fmt.num(r.get("nominal_alpha")),
                "comparison": f"{r.get('cell', '')}/{r.get('cache_state', '')} "
                f"{r.get('metric', '')}",
                "ratio": fmt.ratio3(r.get("ratio")),
                "ci": fmt.interval_text(r.get("ci_low"), r.get("ci_high"), "none"),
                "label": str(r.get("label", "")),
                "decision": str(r.get("decision", "")),
            }
        )
    return {
        "scheduled": design.scheduled(),
        "max_cycles": design.max_cycles,
        "alpha": design.alpha,
        "look": look.look,
        "cycles": look.cycles,
        "nominal_text": fmt.num(look.nominal_alpha),
        "rows": rows,
    }


def tiers_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Command-driver results per tier (ds4-bench: per context frontier), formatted."""
    frame = analysis.tiers
    if frame.empty:
        return None
    metrics = [c for c in frame.columns if c not in ("cell", "cache_state", "tier", "runs")]
    rows = []
    for row in frame_records(frame):
        rows.append(
            {
                "name": key_name(analysis, str(row["cell"]), str(row["cache_state"])),
                "tier": str(row["tier"]),
                "runs": int(row["runs"]),
                "values": [
                    fmt.metric(m, row.get(m), METRICS[m].unit if m in METRICS else "")
                    for m in metrics
                ],
            }
        )
    return {"metrics": metrics, "rows": rows}


ORACLE_DEFINITION = (
    "Over the whole replayed trace, from each cell's boot state. A rowmap cell (slots a layer): "
    "Belady's MIN with bypass is the fewest expert loads (cold reads plus swaps) any policy could "
    "make with these hot slots, knowing the future and swapping without a budget; the best "
    "frozen set is each layer's most looked-up experts on this very trace. A cache cell (slots "
    "in all, any layer's): MIN admitting every miss, over the lookups in the order the cache "
    "served them, is the fewest loads any eviction order could make from the same preload; the "
    "best frozen set is the cache's size in the trace's most looked-up records, pinned. What the "
    "policy makes beyond them is what any change could still gain."
)


def _slots_text(slots: object, scope: object) -> str:
    """A rowmap's hot slots read "48 a layer", a cache's records "256 in all"."""
    if not isinstance(slots, int):
        return "—"
    return f"{slots:,} in all" if scope == "cache" else f"{slots:,} a layer"


def oracle_rows(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """A simulated campaign's oracle bounds, formatted for the page and record.md."""
    rows = []
    for b in analysis.oracle:
        policy, best = b.get("policy_loads"), b.get("min_loads")
        over = policy / best if isinstance(policy, int) and isinstance(best, int) and best else None
        rows.append(
            {
                "cell": str(b.get("cell", "")),
                "hot_slots": _slots_text(b.get("hot_slots"), b.get("scope", "layer")),
                "policy_loads": f"{policy:,}" if isinstance(policy, int) else "—",
                "min_loads": f"{best:,}" if isinstance(best, int) else "—",
                "over": f"{over:.2f}×" if over is not None else "—",
                "static_share": fmt.pct(b.get("best_static_cold_share")),
                "policy_share": fmt.pct(b.get("policy_cold_share")),
            }
        )
    return rows
