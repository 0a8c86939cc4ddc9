"""Comparisons of each cell against the control, per cache state and metric.

A block (one arm in one slot; each of its repeats is its own boot) is summarised as
y = ln(metric), averaged over the block's repeats; requests are never pooled across boots. Cycles
come from the plan's mirrored sub-cycles; a cycle with a missing or failed run is dropped with a
warning rather than filled in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.catalog import METRICS
from harness.stats.box_state import POINTS, StateReading
from harness.stats.cycles import Cycle, finite
from harness.stats.decision import Comparison, compare_cycles
from harness.stats.sequential import SequentialPlan

# Metrics compared by default for every cell (gates may add others from the catalog).
DEFAULT_METRICS = (
    "decode_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "ttft_ms",
    "hit_rate",
    "expert_loads",
    "bytes_read",
)


@dataclass(frozen=True)
class CellComparison:
    """One comparison: a cell vs the control, in one cache state, on one metric."""

    cell: str
    vs: str
    cache_state: str
    comparison: Comparison
    dropped_cycles: tuple[str, ...]


# Statuses of runs that occupied their box (a failed run left its state there too).
RAN = ("ok", "failed", "interrupted", "invalid")


def runs_before(runs: pd.DataFrame) -> dict[str, str | None]:
    """Each run's id -> the cell of the run that ran on its box right before it (None: first).

    Read from the runs' start times on each box (run.json's ``box`` and ``started_at``), so
    interleaved lanes, fleets and resumes are what they were; runs without start times (an
    import stamps them all at once) keep the plan's order, the order they are mapped in.
    """
    if runs.empty or "box" not in runs.columns:
        return {}
    ran = runs[runs["status"].isin(RAN)].copy()
    ran["_order"] = np.arange(len(ran))
    starts = (
        pd.to_numeric(ran["started_at"], errors="coerce")
        if "started_at" in ran
        else pd.Series(np.nan, index=ran.index)
    )
    timed = starts.notna().all() and starts.nunique() == len(starts) and len(starts) > 1
    if timed and float(starts.max() - starts.min()) < 1.0:
        timed = False  # stamped at import, not when they ran
    ran["_start"] = starts if timed else ran["_order"]
    out: dict[str, str | None] = {}
    for _, on_box in ran.groupby(ran["box"].astype(str), sort=False):
        previous: str | None = None
        for _, row in on_box.sort_values(["_start", "_order"]).iterrows():
            out[str(row["run_id"])] = previous
            previous = str(row["cell"])
    return out


def _washed(block: pd.DataFrame) -> bool:
    """Every run of a block followed a washout of its own cell lasting at least a whole block,
    or nothing could carry into it (load_runs' ``washout_share`` and ``independent`` columns;
    frames without them: unwashed). A washout of part of a block is traffic that clears what it
    clears, not a wash: such blocks are decided as unwashed (harness.stats.design_sim.Layout)."""
    if block.empty:
        return False
    none = pd.Series(False, index=block.index)
    share = "washout_share" in block
    washout = (
        pd.to_numeric(block["washout_share"], errors="coerce").fillna(0) >= 1 if share else none
    )
    alone = block["independent"].fillna(False).astype(bool) if "independent" in block else none
    return bool((washout | alone).all())


def _before(previous: str | None, control: str, cell: str) -> str:
    """What ran before a block, in the crossover model's terms (cycles.BEFORE)."""
    if previous is None:
        return "-"
    return "A" if previous == control else "B" if previous == cell else "X"


def cell_cycles(
    runs: pd.DataFrame,
    prompt_logs: dict[str, np.ndarray],
    cell: str,
    state: str,
    metric: str,
    *,
    control: str | None = None,
    before: dict[str, str | None] | None = None,
) -> tuple[list[Cycle], list[str]]:
    """The complete cycles of one comparison on one metric, and why the others were dropped.

    With ``control`` and ``before`` (:func:`runs_before`), each cycle names what ran on the box
    before each of its blocks, and whether every block followed a washout of its own arm.
    """
    cycles: list[Cycle] = []
    dropped: list[str] = []
    subset = runs[(runs["comparison"] == cell) & (runs["cache_state"] == state)]
    fleet = "box" in runs.columns and runs["box"].dropna().nunique() > 1
    for cycle, group in subset.groupby("cycle"):
        pattern = str(group["pattern"].iloc[0])
        on = sorted({str(b) for b in group["box"].dropna()}) if "box" in group else []
        if fleet and len(on) > 1:
            # A resume moved a dropped box's unfinished cohort: its blocks are not one box's
            # paired difference (the per-box rows leave it out too).
            dropped.append(f"cycle {cycle}: its runs ran on boxes {', '.join(on)}")
            continue
        blocks: list[float] = []
        logs: list[np.ndarray] = []
        boots: list[set[str]] = []
        came_before: list[str] = []
        readings: list[dict[str, StateReading]] = []
        own: list[float] = []
        washed = True
        missing = ""
        for slot in range(4):
            block = group[group["slot"] == slot]
            ordered = block.sort_values("repeat") if "repeat" in block else block
            first = ordered["run_id"].iloc[0] if len(block) else None
            if before is not None and control is not None and first is not None:
                came_before.append(_before(before.get(str(first)), control, cell))
            if len(block):
                probed = _box_state(ordered.iloc[0])
                readings.append(probed[0])
                own.append(probed[1])
            washed = washed and _washed(block)
            if "boot_id" in block:
                boots.append({str(b) for b in block["boot_id"].dropna() if str(b)})
            values = block[metric].to_numpy(dtype=float) if metric in block else np.array([])
            ok = block["status"].eq("ok").all() and len(block) > 0
            if not ok or not np.all(np.isfinite(values)) or np.any(values <= 0):
                missing = f"slot {slot}" + ("" if ok else " (failed or missing run)")
                break
            blocks.append(float(np.mean(np.log(values))))
            if metric == "decode_tok_s":
                logs.append(np.concatenate([prompt_logs[r] for r in block["run_id"]]))
        if missing:
            dropped.append(f"cycle {cycle}: {missing}")
            continue
        # Blocks without per-prompt values (an imported summary-only file) keep their means.
        aligned = len(logs) == 4 and len({len(x) for x in logs}) == 1 and len(logs[0]) > 0
        if aligned:
            # Replace block means by the prompt-level means so the two agree exactly.
            blocks = [float(np.mean(x)) for x in logs]
        cycles.append(
            Cycle(
                index=int(str(cycle)),
                order=pattern,
                y=(blocks[0], blocks[1], blocks[2], blocks[3]),
                prompt_logs=tuple(logs) if aligned else None,
                prompts_aligned=aligned,
                shared_boot=_shares_a_boot(boots),
                before=(
                    (came_before[0], came_before[1], came_before[2], came_before[3])
                    if len(came_before) == 4
                    else None
                ),
                washed=washed,
                box=on[0] if fleet and on else None,
                box_state=tuple(readings) if any(readings) else None,
                own_traffic=(own[0], own[1], own[2], own[3]) if any(readings) else None,
            )
        )
    return cycles, dropped


def probe_readings(raw: object) -> tuple[dict[str, StateReading], bool]:
    """A run record's ``runtime.box_state``: the probes read at all three points, and whether
    every probe it names was (a probe that missed a point is no reading)."""
    if not isinstance(raw, dict):
        return {}, False
    readings: dict[str, StateReading] = {}
    for name, points in raw.items():
        values = [finite(points.get(p)) if isinstance(points, dict) else None for p in POINTS]
        if all(v is not None for v in values):
            start, scored, end = (float(v) for v in values if v is not None)
            tolerance = finite(points.get("tolerance")) if isinstance(points, dict) else None
            readings[str(name)] = StateReading(start, scored, end, max(tolerance or 0.0, 0.0))
    return readings, len(readings) == len(raw)


def _box_state(run: pd.Series) -> tuple[dict[str, StateReading], float]:
    """A block's probe readings (those read at all three points) and its own traffic before it
    scored, in blocks of its scored requests; ({}, 0) where it has none."""
    readings, _ = probe_readings(run.get("box_state"))
    if not readings:
        return {}, 0.0
    own, scored_n = finite(run.get("own_requests")), finite(run.get("scored_requests"))
    share = own / scored_n if own is not None and scored_n else 0.0
    return readings, share


def _shares_a_boot(boots: Sequence[set[str]]) -> bool:
    """Whether two slots of a cycle ran on one boot (their runs carry the same boot id)."""
    seen: set[str] = set()
    for slot in boots:
        if slot & seen:
            return True
        seen |= slot
    return False


def compare_cells(
    runs: pd.DataFrame,
    prompt_logs: dict[str, np.ndarray],
    *,
    control: str,
    cells: Sequence[str],
    cache_states: Sequence[str],
    metrics: Sequence[str],
    margin_pct: float,
    alpha: float,
    seed: int = 0,
    gated: Sequence[str] = (),
    remedy: str | None = None,
    sequential: SequentialPlan | None = None,
    boxes: str = "fixed",
) -> list[CellComparison]:
    """Every cell × cache state × metric comparison.

    No multiplicity correction over the gate set: the verdict needs every gated comparison to
    pass (an intersection–union test), so each at α keeps the verdict's false-pass rate at α.
    ``gated`` is kept for callers; it no longer changes a label.
    """
    del gated
    out: list[CellComparison] = []
    before = runs_before(runs)
    for cell in cells:
        for state in cache_states:
            for metric in metrics:
                if metric not in runs.columns or runs[metric].isna().all():
                    continue
                cycles, dropped = cell_cycles(
                    runs, prompt_logs, cell, state, metric, control=control, before=before
                )
                if not cycles:
                    continue
                info = METRICS[metric]
                comparison = compare_cycles(
                    cycles,
                    metric=metric,
                    margin_pct=margin_pct,
                    alpha=alpha,
                    higher_is_better=info.higher_is_better,
                    seed=seed,
                    drift_sensitive=not info.deterministic,
                    remedy=remedy,
                    block_minutes=block_minutes(runs, cell, state),
                    sequential=sequential,
                    boxes=boxes,
                )
                out.append(CellComparison(cell, control, state, comparison, tuple(dropped)))
    return out


def block_minutes(runs: pd.DataFrame, cell: str, state: str) -> float | None:
    """Median minutes from one block's start to the next within a cycle, or None untimed.

    ``started_at`` is epoch seconds (run.json); the trend per minute is the trend per block
    over this.
    """
    if "started_at" not in runs.columns:
        return None
    subset = runs[(runs["comparison"] == cell) & (runs["cache_state"] == state)]
    gaps: list[float] = []
    for _, group in subset.groupby("cycle"):
        starts = pd.to_numeric(group.groupby("slot")["started_at"].min(), errors="coerce")
        seconds = starts.sort_index().diff().dropna()
        gaps.extend(float(v) for v in seconds if math.isfinite(v) and v > 0)
    if not gaps or float(np.median(gaps)) < 1.0:
        return None  # blocks under a second apart: stamped at import, not when they ran
    return float(np.median(gaps)) / 60.0


def comparison_rows(comparisons: Sequence[CellComparison]) -> list[dict[str, object]]:
    """Flat rows for the parquet table and ``--json``."""
    rows: list[dict[str, object]] = []
    for item in comparisons:
        c = item.comparison
        rows.append(
            {
                "cell": item.cell,
                "vs": item.vs,
                "cache_state": item.cache_state,
                "metric": c.metric,
                "ratio": _finite(c.ratio),
                "control_level": _finite(c.control_level),
                "cell_level": _finite(c.cell_level),
                "ci_low": _finite(c.ci_low),
                "ci_high": _finite(c.ci_high),
                "p_value": _finite(c.p_value),
                "label": c.label,
                "raw_label": c.raw_label,
                "confounded": c.confounded,
                "n_cycles": c.n_cycles,
                "pair_ratio": _finite(c.pair_ratio),
                "bootstrap_low": _finite(c.bootstrap_ci[0]) if c.bootstrap_ci else None,
                "bootstrap_high": _finite(c.bootstrap_ci[1]) if c.bootstrap_ci else None,
                "cycles_needed": c.cycles_needed,
                "cycles_needed_low": c.cycles_needed_range[0] if c.cycles_needed_range else None,
                "cycles_needed_high": c.cycles_needed_range[1] if c.cycles_needed_range else None,
                "warnings": " | ".join(c.warnings + tuple(item.dropped_cycles)),
                "deterministic": METRICS[c.metric].deterministic,
                "carry_over": c.carry_over_explains,
                "washed": c.washed,
                # What the box-state probes saw (None where the runtime declares none).
                "box_state": "; ".join(s.words() for s in c.box_state) or None,
                **model_columns(c),
            }
        )
    return rows


def model_columns(c: Comparison) -> dict[str, object]:
    """The crossover model's columns: ratios for effects, percent for the trend, log² variances."""
    model, var = c.model, c.variance

    # A log value beyond ±700 (a trend per minute over blocks milliseconds apart, say) has no
    # finite ratio; it is shown as missing rather than overflowing.
    def ratio(value: float | None) -> float | None:
        return None if value is None or abs(value) > 700 else _finite(math.exp(value))

    def pct(value: float | None) -> float | None:
        return None if value is None or abs(value) > 700 else _finite(math.expm1(value) * 100.0)

    def interval(ci: tuple[float, float] | None) -> tuple[float | None, float | None]:
        return (None, None) if ci is None else (ratio(ci[0]), ratio(ci[1]))

    adj = interval(model.adjusted_ci if model else None)
    dep = interval(model.deployed_ci if model else None)
    ctl = interval(model.control_ci if model else None)
    cand = interval(model.candidate_ci if model else None)
    return {
        "model_df": model.df if model else None,
        "adjusted_ratio": ratio(model.adjusted if model else None),
        "adjusted_low": adj[0],
        "adjusted_high": adj[1],
        "deployed_ratio": ratio(model.deployed if model else None),
        "deployed_low": dep[0],
        "deployed_high": dep[1],
        "carry_control_ratio": ratio(model.control if model else None),
        "carry_control_low": ctl[0],
        "carry_control_high": ctl[1],
        "carry_candidate_ratio": ratio(model.candidate if model else None),
        "carry_candidate_low": cand[0],
        "carry_candidate_high": cand[1],
        "trend_pct_per_block": pct(model.trend if model else None),
        "trend_pct_per_min": pct(model.trend_per_min if model else None),
        "trend_p": _finite(model.trend_p) if model else None,
        "var_prompt": _finite(var.prompt) if var and var.prompt is not None else None,
        "var_block": _finite(var.block) if var else None,
        "var_cycle": _finite(var.cycle) if var and var.cycle is not None else None,
        "more_buys_most": var.advice if var else None,
    }


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)
