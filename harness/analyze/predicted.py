"""A simulated campaign's predictions beside the box's measurements, metric by metric.

``harness simulate`` writes a campaign directory marked ``SIMULATED``; the analysis of the
measured campaign reads the newest such sibling and pairs its cell table with its own here.
Where the simulation priced its ring with a fitted cost model (``simulate --cost``), its
``predicted_speed.json`` gives the speeds with the fit's 95% intervals, and each row says
whether the box's value lies inside; per metric, whether the predicted order of the cells held.

T90 and T2x are read from each side's shifts, not from the cell table's medians (which drop a
run that never recovered as if it had not run): per run the worst shift with an excess, "never"
the slowest of all, and the median over the runs that had one — "never" where at least half of
them never recovered. A box that never recovered is then outside any closed predicted interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from harness.analyze.cell_values import cell_value, finite
from harness.analyze.recovery_stats import median_never_slowest, run_times, shift_excess
from harness.card import Card

# Runtime-side metrics a simulator predicts, shown predicted against measured.
PREDICTED_METRICS = (
    "t90_s",
    "t2x_s",
    "churn_per_min",
    "ring_cold_share",
    "hit_rate",
    "ring_decode_tok_s",
    "ring_itl_p50_ms",
    "ring_itl_p95_ms",
    # The client's side, predicted only from a fitted cost with the campaign's HTTP path: a
    # simulated ring has no requests, so without the fit there is nothing to show.
    "decode_tok_s",
    "tpot_p50_ms",
)
CLIENT_ONLY = frozenset({"decode_tok_s", "tpot_p50_ms"})
RECOVERY_METRICS = ("t90_s", "t2x_s")


@dataclass(frozen=True)
class Prediction:
    """A simulated campaign's prediction of one metric of one cell, and the box's value."""

    metric: str
    cell: str
    predicted: float | None
    measured: float | None
    low: float | None = None  # the prediction's 95% interval, where a fitted cost gave one
    high: float | None = None
    # The cell against the control, each side against its own control: what a decision reads,
    # and what survives the machine running at another speed than when the cost was fitted.
    predicted_vs_control: float | None = None
    measured_vs_control: float | None = None
    # A recovery time whose median run never recovered (its value None above).
    predicted_never: bool = False
    measured_never: bool = False
    # A recovery time's runs without a shift with an excess ("17/18 n/a"): its median is over
    # the rest, and a median of one run in eighteen says so.
    predicted_na: str = ""
    measured_na: str = ""

    @property
    def relative_ratio(self) -> float | None:
        """(predicted cell ÷ control) ÷ (measured cell ÷ control)."""
        if self.predicted_vs_control is None or not self.measured_vs_control:
            return None
        return self.predicted_vs_control / self.measured_vs_control

    @property
    def within(self) -> bool | None:
        """Whether the measured value lies in the predicted interval (None: no interval). A
        recovery time's interval may be open above (some draws never recovered): only that one
        holds a box that never recovered."""
        if self.low is not None and self.measured_never:
            return self.high is None
        if self.low is None or self.measured is None:
            return None
        return self.low <= self.measured and (self.high is None or self.measured <= self.high)

    @property
    def ratio(self) -> float | None:
        """predicted ÷ measured."""
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured

    @property
    def error(self) -> float | None:
        """predicted − measured, in the metric's unit."""
        if self.predicted is None or self.measured is None:
            return None
        return self.predicted - self.measured

    @property
    def relative_error(self) -> float | None:
        """(predicted − measured) ÷ measured."""
        error = self.error
        if error is None or not self.measured:
            return None
        return error / self.measured

    def to_json(self) -> dict[str, Any]:
        """JSON form, with both errors."""
        return {
            **asdict(self),
            "error": self.error,
            "relative_error": self.relative_error,
            "ratio": self.ratio,
            "within": self.within,
            "relative_ratio": self.relative_ratio,
        }


@dataclass(frozen=True)
class PredictedVsMeasured:
    """Predictions of the newest simulated sibling campaign beside this campaign's values."""

    source: str  # the simulated campaign's directory, relative to the reports folder
    cache_state: str
    rows: tuple[Prediction, ...]
    order_held: dict[str, bool] = field(default_factory=dict)  # metric: cells ranked alike
    pairs_held: dict[str, tuple[int, int]] = field(default_factory=dict)  # metric: (held, pairs)
    # How this campaign differs from what the simulation replayed (its boot maps, knobs,
    # phases, model): a prediction of another campaign, whatever its error says.
    mismatches: tuple[str, ...] = ()
    # The fitted cost's swap term the simulation was priced with (harness fit-cost): ms per
    # applied swap, its interval, the row size it is for and the campaign it was fitted from.
    fitted_swap: dict[str, Any] | None = None
    # When and from what the simulation was made, against this campaign (:func:`provenance`).
    provenance: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "source": self.source,
            "provenance": self.provenance,
            "cache_state": self.cache_state,
            "rows": [r.to_json() for r in self.rows],
            "order_held": dict(self.order_held),
            "pairs_held": {k: list(v) for k, v in self.pairs_held.items()},
            "mismatches": list(self.mismatches),
            "fitted_swap": self.fitted_swap,
        }

    def frame(self) -> pd.DataFrame:
        """One row per (metric, cell) for ``analysis/predicted.parquet``."""
        return pd.DataFrame([{"source": self.source, **r.to_json()} for r in self.rows])


def predicted_vs_measured(
    card: Card,
    measured: pd.DataFrame,
    predicted: pd.DataFrame,
    source: str,
    speed: dict[str, dict[str, dict[str, float]]] | None = None,
    shifts: tuple[pd.DataFrame, pd.DataFrame] | None = None,
    recovery: bool = True,
) -> PredictedVsMeasured | None:
    """Rows for every predicted metric either side has; None when neither has any. ``speed``
    is a fitted cost's prediction per cell and metric (estimate, low, high), which replaces the
    simulated ring's own figure (priced without the box's noise) and brings an interval.
    ``shifts`` (measured, predicted: each campaign's shifts table) gives T90 and T2x with
    "never" counted (:func:`recovery_median`). ``recovery`` False leaves T90 and T2x out: the
    two sides timed recovery on different clocks."""
    state = card.design.cache_states[0]
    rows = []
    for metric in PREDICTED_METRICS:
        if metric in RECOVERY_METRICS and not recovery:
            continue
        for cell in card.cells:
            value = cell_value(measured, cell, state, metric)
            guess = cell_value(predicted, cell, state, metric)
            never = {"measured_never": False, "predicted_never": False}
            na: dict[str, str] = {}
            if shifts is not None and metric in RECOVERY_METRICS:
                value = recovery_median(shifts[0], cell, state, metric)
                guess = recovery_median(shifts[1], cell, state, metric)
                never = {"measured_never": value == math.inf, "predicted_never": guess == math.inf}
                value, guess = (None if v == math.inf else v for v in (value, guess))
                na = {
                    "measured_na": recovery_na(shifts[0], cell, state),
                    "predicted_na": recovery_na(shifts[1], cell, state),
                }
            band = (speed or {}).get(cell, {}).get(metric)
            low = high = None
            if band is not None:
                guess, low, high = (finite(band.get(k)) for k in ("estimate", "low", "high"))
                never["predicted_never"] = False  # the fit's estimate recovered, or gave none
            seen = value is not None or guess is not None or any(never.values())
            if not seen or (metric in CLIENT_ONLY and band is None):
                continue
            rows.append(
                Prediction(
                    metric,
                    cell,
                    guess,
                    value,
                    low,
                    high,
                    predicted_never=never["predicted_never"],
                    measured_never=never["measured_never"],
                    predicted_na=na.get("predicted_na", ""),
                    measured_na=na.get("measured_na", ""),
                )
            )
    if not rows:
        return None
    rows = _against_control(rows, card.control)
    orders, pairs = _orders(rows)
    return PredictedVsMeasured(source, state, tuple(rows), orders, pairs)


def recovery_median(shifts: pd.DataFrame, cell: str, state: str, metric: str) -> float | None:
    """A cell's T90 or T2x over its runs with "never" counted: per run, the worst shift with an
    excess (never: inf); the median over runs that had one (inf when at least half never
    recovered); None when no run had a shift with an excess."""
    if shifts.empty or metric not in shifts.columns:
        return None
    mine = shifts[(shifts["cell"] == cell) & (shifts["cache_state"] == state)]
    worst = []
    for _, run in mine.groupby("run_id"):
        times, _ = run_times(run[metric], shift_excess(run))
        if times:
            worst.append(max(times))
    return median_never_slowest(worst)


def recovery_na(shifts: pd.DataFrame, cell: str, state: str) -> str:
    """ "k/n n/a": of a cell's n runs with a shift, the k with no excess at any shift (no T90
    to take); "" when every run had one."""
    if shifts.empty:
        return ""
    mine = shifts[(shifts["cell"] == cell) & (shifts["cache_state"] == state)]
    runs = [bool(shift_excess(run).any()) for _, run in mine.groupby("run_id")]
    missing = runs.count(False)
    return f"{missing}/{len(runs)} n/a" if missing else ""


def _against_control(rows: list[Prediction], control: str | None) -> list[Prediction]:
    """Each row with its cell ÷ the control, on each side (the control's own rows stay 1)."""
    base = {r.metric: r for r in rows if r.cell == control}
    out = []
    for r in rows:
        ref = base.get(r.metric)
        if ref is None:
            out.append(r)
            continue
        out.append(
            replace(
                r,
                predicted_vs_control=_divide(r.predicted, ref.predicted),
                measured_vs_control=_divide(r.measured, ref.measured),
            )
        )
    return out


def _divide(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _orders(rows: list[Prediction]) -> tuple[dict[str, bool], dict[str, tuple[int, int]]]:
    """Per metric with two cells or more on both sides: whether ranking the cells by the
    prediction gives the box's ranking (ties broken by name on both sides alike), and of the
    pairs of cells, how many the prediction ordered as the box did (a tie on either side
    counts as held only when both sides tie) — one swapped pair of cells within the box's
    noise fails the whole order, so the pairs say how far it held."""
    orders: dict[str, bool] = {}
    pairs: dict[str, tuple[int, int]] = {}
    for metric in dict.fromkeys(r.metric for r in rows):
        both = [r for r in rows if r.metric == metric and r.predicted is not None
                and r.measured is not None]  # fmt: skip
        if len(both) < 2:
            continue
        by_guess = [r.cell for r in sorted(both, key=lambda r: (r.predicted, r.cell))]
        by_value = [r.cell for r in sorted(both, key=lambda r: (r.measured, r.cell))]
        orders[metric] = by_guess == by_value
        held = total = 0
        for i, a in enumerate(both):
            for b in both[i + 1 :]:
                total += 1
                guess = _sign(a.predicted, b.predicted)
                held += guess == _sign(a.measured, b.measured)
        pairs[metric] = (held, total)
    return orders, pairs


def _sign(a: float | None, b: float | None) -> int:
    if a is None or b is None:
        return 0
    return (a > b) - (a < b)


def provenance(
    measured_root: str, traces: list[str], measured_started: float | None, simulated: float | None
) -> str:
    """Whether a simulation predicted this campaign or replayed it: its traces taken from this
    campaign's own runs (``measured_root``'s ``runs/``) make it a replay after the fact, whose
    small errors show the simulator's fidelity to runs it saw, not a prediction made first; else
    it is a prediction, made before the campaign started or after (from other traces)."""
    # A path as given to `simulate` (absolute, or relative to where it ran): the campaign's
    # own <campaign>/<stamp>/runs/ in it, or a path from inside the campaign directory.
    parts = measured_root.rstrip("/").split("/")
    own = "/".join(parts[-2:]) + "/runs/"
    if any(own in trace or trace.startswith("runs/") for trace in traces):
        return (
            "replayed after this campaign ran, from its own route traces: how faithfully the "
            "simulator replays runs it saw, not a prediction made first"
        )
    if measured_started is None or simulated is None:
        return "a prediction from other traces; when it was made is not recorded"
    if simulated < measured_started:
        return "simulated before this campaign started, from other traces: a prediction made first"
    return "simulated after this campaign started, from other traces: a prediction made later"
