"""One sweep task: one point's settings replayed on one trace, measured as the analysis measures.

A task carries everything it needs (settings, cost model, analysis windows, phase names) and a
trace, and returns one flat row of predicted metrics. It imports nothing from the CLI, so a
process pool or a Dask worker can run it from this module alone. Every figure comes from the
analysis stage's own functions on the replay's synthetic ring and counters
(:func:`~harness.analyze.metrics.counter_metrics`,
:func:`~harness.analyze.ring_figures.ring_summary`,
:func:`~harness.analyze.recovery.phase_recovery`), so a sweep's cold share or T90 is the number
``harness simulate`` + ``harness analyze`` would report for the same cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.analyze.metrics import counter_metrics
from harness.analyze.recovery import StepClock, phase_recovery
from harness.analyze.ring_figures import ring_summary
from harness.sim.results import CostModel, ReplayResult
from harness.sim.run_cost_fit import RunCostFit, predict_run_speed
from harness.sim.simulate import CellSettings, replay_settings
from harness.sim.traces import Trace

__all__ = ["PointTask", "evaluate", "replay_point"]

# The ladder's metric columns, in the order tables print them (T90 per direction and cold share
# per phase follow as ``t90_s[a->b]`` and ``cold_share[phase]``).
LADDER_METRICS = (
    "cold_share",
    "t90_s",
    "churn_per_min",
    "swaps",
    "hit_rate",
    "decode_tok_s",
)


@dataclass(frozen=True)
class PointTask:
    """One point on one trace: what to replay and how to measure it."""

    point: str
    trace_index: int
    settings: CellSettings
    cost: CostModel
    window_s: float
    converged_span_s: float
    hold_s: float
    phase_names: tuple[str, ...]
    threads: int | None = None  # replay threads; 1 where points run in parallel processes
    # A per-run fit (``fit-cost --per-run``): decode speed is the client's, from the point's
    # loads per token, not the ring's (which stays priced by ``cost``).
    run_cost: RunCostFit | None = None
    # The card's step clock: T90 timed as its runs time it (in seconds of the priced ring).
    steps: StepClock | None = None


def replay_point(task: PointTask, trace: Trace) -> ReplayResult:
    """The replay of the task's settings over the trace (fast rowmap replay, or the cache)."""
    return replay_settings(task.settings, trace, threads=task.threads)


def _phase_name(names: tuple[str, ...], index: int) -> str:
    if index < 0:
        return "warmup"
    return names[index] if index < len(names) else f"phase{index}"


def evaluate(task: PointTask, trace: Trace) -> dict[str, Any]:
    """The task's row: point, trace, the ladder's metrics, T90 per shift and cold share per
    phase (None where undefined, e.g. T90 of a trace without a shift)."""
    result = replay_point(task, trace)
    record_bytes = task.settings.record_bytes
    run_counters = result.run_counters(record_bytes)
    counters = counter_metrics(run_counters)
    ring = result.ring_frame(task.cost, record_bytes)
    summary = ring_summary(
        ring, task.window_s, converged_span_s=task.converged_span_s, steps=task.steps
    )
    row: dict[str, Any] = {
        "point": task.point,
        "trace": task.trace_index,
        "cold_share": counters["cold_share"],
        "t90_s": None,
        "churn_per_min": summary["churn_per_min"],
        "swaps": counters["swaps"],
        "hit_rate": counters["hit_rate"],
        "decode_tok_s": summary["decode_tok_s"],
        "expert_loads": counters["expert_loads"],
    }
    if task.run_cost is not None:
        speed = predict_run_speed(task.run_cost, run_counters["delta"]).get("decode_tok_s", {})
        row["decode_tok_s"] = speed.get("estimate")
        row["decode_extrapolated"] = speed.get("extrapolated", 0.0) if speed else None
    shifts = phase_recovery(
        ring,
        task.window_s,
        converged_span_s=task.converged_span_s,
        hold_s=task.hold_s,
        steps=task.steps,
    )
    worst: float | None = None
    for shift in shifts:
        if shift.from_phase < 0:
            continue  # the warmup ending is not a domain shift of the card
        a, b = (
            _phase_name(task.phase_names, shift.from_phase),
            _phase_name(task.phase_names, shift.to_phase),
        )
        if not shift.excess:
            row[f"t90_s[{a}->{b}]"] = None  # no excess to clear: T90 n/a, not never
            continue
        # Never recovered reads as infinitely slow, not as missing: it must lose every race.
        value = float("inf") if shift.t90_s is None else shift.t90_s
        row[f"t90_s[{a}->{b}]"] = value
        worst = value if worst is None else max(worst, value)
    row["t90_s"] = worst
    measured = result.phase >= 0
    lookups = result.lookups
    for phase in np.unique(result.phase[measured]).tolist():
        chosen = result.phase == phase
        total = int(lookups[chosen].sum())
        cold = int(result.cold_lookups[chosen].sum())
        row[f"cold_share[{_phase_name(task.phase_names, int(phase))}]"] = (
            cold / total if total else None
        )
    return row
