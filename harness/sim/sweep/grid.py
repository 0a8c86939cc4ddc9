"""``harness simulate CARD --traces T… --sweep KNOB=…``: a knob sweep and its predicted ladder.

Every point (the control, then the grid or the sampled points) is the base cell with its
overrides (:mod:`harness.sim.sweep.spec`), resolved as the simulator resolves a card's cells and
replayed on every trace (:mod:`harness.sim.sweep.evaluate`, :mod:`harness.sim.sweep.workers`). The
rows (one per point and trace) reduce to the ladder, one row per point, across traces:

* cold share, hit rate, churn, modelled decode speed and cold share per phase: the mean over
  traces (every trace weighs the same, whatever its length); decode speed is the ring's under
  the cost model or a step fit, or the client's under a per-run fit (:attr:`Sweep.pricing`);
* T90, overall and per shift direction: the worst (largest) over traces; never recovered is inf;
* swaps and expert loads: the sum over traces;

each beside its change against the control row (``Δ%``). The seed's lesson is checked here too:
:func:`map_warnings` names every point whose boot map is none of the maps the card's cells boot.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.recovery import step_clock
from harness.card import LoadedCard
from harness.errors import BadInput
from harness.formats.records import write_parquet
from harness.formats.safe_write import write_bytes_atomic, write_text_atomic
from harness.sim.cost_fit import CostFit
from harness.sim.results import CostModel
from harness.sim.run_cost_fit import RunCostFit
from harness.sim.simulate import CellSettings, cell_settings
from harness.sim.sweep.evaluate import LADDER_METRICS, PointTask
from harness.sim.sweep.spec import FILE_KNOBS, Point, point_cell
from harness.sim.sweep.workers import Progress, run_tasks
from harness.sim.traces import Trace

__all__ = [
    "Sweep",
    "control_name",
    "ladder_frame",
    "ladder_value",
    "map_warnings",
    "run_sweep",
    "sweep_root",
    "write_sweep",
]

_SUMMED = ("swaps", "expert_loads")


@dataclass
class Sweep:
    """A finished sweep: its points, per-(point, trace) rows, ladder and warnings."""

    card: LoadedCard
    base: str
    points: list[Point]
    traces: list[str]
    rows: pd.DataFrame
    ladder: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    settings: dict[str, CellSettings] = field(default_factory=dict)
    pricing: str = ""  # what decode speed and seconds are priced by, said under the table


def control_name(loaded: LoadedCard) -> str:
    """The card's control cell (its first cell when it names none)."""
    return loaded.card.control or next(iter(loaded.card.cells))


def _map_key(settings: CellSettings) -> str:
    """What a boot map is, by content: the hot sets or the hotlist, hashed."""
    if settings.mode == "lru":
        return "lru"  # llama.cpp's expert cache boots empty: no map to differ by
    if settings.mode == "cache":
        text = json.dumps([settings.cache_records, settings.hotlist])
    else:
        text = json.dumps(settings.hot)
    return hashlib.sha256(text.encode()).hexdigest()


def map_warnings(
    loaded: LoadedCard,
    point_settings: dict[str, CellSettings],
    points: list[Point],
    trace: Trace,
    expert_bytes: int | None = None,
) -> list[str]:
    """One warning per boot map of the sweep that no cell of the card boots.

    Seed 000 simulated from the September static map while the box booted the seed map; its
    predictions described a campaign nobody ran. Maps compare by content, so the same map under
    two names is the same map.
    """
    booted: dict[str, list[str]] = {}
    for name in loaded.card.cells:
        settings = cell_settings(loaded, name, trace, expert_bytes=expert_bytes)
        booted.setdefault(_map_key(settings), []).append(f"{name} ({settings.start})")
    strangers: dict[str, list[str]] = {}
    starts: dict[str, str] = {}
    for point in points:
        settings = point_settings[point.id]
        key = _map_key(settings)
        if key not in booted:
            strangers.setdefault(key, []).append(point.id)
            starts[key] = settings.start
    cells = "; ".join(", ".join(v) for v in booted.values())
    out = []
    for key, ids in strangers.items():
        shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
        out.append(
            f"WRONG MAP: {len(ids)} sweep point(s) ({shown}) boot {starts[key]}, which no cell "
            f"of {loaded.path.name} boots (the cells boot: {cells}). Their predictions describe "
            "a box that starts from another map than the campaign's; sweep from the cells' map "
            "(drop --sweep rowmap/hotlist), or pick those points to put the map on the card."
        )
    return out


def plan_tasks(
    loaded: LoadedCard,
    traces: list[Trace],
    points: list[Point],
    base: str,
    cost: CostModel,
    expert_bytes: int | None = None,
    cost_fit: CostFit | RunCostFit | None = None,
) -> tuple[list[PointTask], dict[str, CellSettings]]:
    """Every (point, trace) task, in point then trace order, and each point's settings on the
    first trace (for the map check and the report). With a step fit (``--cost``) each point's
    ring is priced by the fitted model, its cold and swap terms scaled to the point's rows; with
    a per-run fit each point's client decode speed comes from its loads per token."""
    if base not in loaded.card.cells:
        raise BadInput(f"--base {base!r}: not a cell of the card ({', '.join(loaded.card.cells)})")
    cell = loaded.card.cells[base]
    analysis = loaded.card.analysis
    phases = tuple(p.name for p in loaded.card.workload.phases or [])
    tasks = []
    first: dict[str, CellSettings] = {}
    step_fit = cost_fit if isinstance(cost_fit, CostFit) else None
    run_cost = cost_fit if isinstance(cost_fit, RunCostFit) else None
    for point in points:
        swept = point_cell(cell, point)
        for index, trace in enumerate(traces):
            settings = cell_settings(loaded, base, trace, cell=swept, expert_bytes=expert_bytes)
            first.setdefault(point.id, settings)
            priced = step_fit.model(settings.record_bytes) if step_fit else cost
            tasks.append(
                PointTask(
                    point.id,
                    index,
                    settings,
                    priced,
                    analysis.window_s,
                    analysis.converged_span_s,
                    analysis.hold_s,
                    phases,
                    run_cost=run_cost,
                    steps=step_clock(analysis),
                )
            )
    return tasks, first


def ladder_frame(rows: pd.DataFrame, points: list[Point]) -> pd.DataFrame:
    """One row per point across traces (see the module docstring), with ``Δ%`` columns against
    the control for every metric, and the point's knobs."""
    metrics = [c for c in rows.columns if c not in ("point", "trace")]
    agg: dict[str, str] = {}
    for column in metrics:
        if column in _SUMMED:
            agg[column] = "sum"
        elif column.startswith("t90_s"):
            agg[column] = "max"
        else:
            agg[column] = "mean"
    numeric = rows[["point", *metrics]].copy()
    for column in metrics:
        numeric[column] = pd.to_numeric(numeric[column], errors="coerce").astype(float)
    grouped = numeric.groupby("point", sort=False).agg(agg)
    order = [p.id for p in points]
    grouped = grouped.reindex(order)
    control = grouped.loc["control"]
    out = pd.DataFrame({"point": order, "label": [p.label() for p in points]})
    knobs = sorted({k for p in points for k, _ in p.overrides})
    for knob in knobs:
        values = [dict(p.overrides).get(knob) for p in points]
        out[knob] = [Path(str(v)).name if knob in FILE_KNOBS and v else v for v in values]
    ordered = [m for m in LADDER_METRICS if m in metrics]
    ordered += sorted(m for m in metrics if m not in ordered)
    for column in ordered:
        measured = grouped[column].to_numpy(dtype=float)
        out[column] = measured
        base = float(control.to_dict()[column])
        delta = np.full(len(measured), np.nan)
        if base and np.isfinite(base):
            with np.errstate(invalid="ignore"):
                delta = (measured - base) / abs(base) * 100.0
        out[f"{column} Δ%"] = delta
    return out


def run_sweep(
    loaded: LoadedCard,
    traces: list[Trace],
    points: list[Point],
    *,
    base: str | None = None,
    cost: CostModel | None = None,
    jobs: int = 1,
    scheduler: str | None = None,
    progress: Progress | None = None,
    on_result: Any = None,
    expert_bytes: int | None = None,
    cost_fit: CostFit | RunCostFit | None = None,
) -> Sweep:
    """Replay every point on every trace (locally in ``jobs`` processes, or on Dask)."""
    base = base or control_name(loaded)
    tasks, settings = plan_tasks(
        loaded, traces, points, base, cost or CostModel(), expert_bytes, cost_fit
    )
    warnings = map_warnings(loaded, settings, points, traces[0], expert_bytes)
    found = run_tasks(
        tasks, traces, jobs=jobs, scheduler=scheduler, progress=progress, on_result=on_result
    )
    rows = pd.DataFrame(found)
    rows.insert(1, "label", rows["point"].map({p.id: p.label() for p in points}))
    ladder = ladder_frame(rows.drop(columns=["label"]), points)
    return Sweep(
        loaded, base, points, [t.path for t in traces], rows, ladder, warnings, settings,
        pricing=_pricing(cost_fit),
    )  # fmt: skip


def _pricing(cost_fit: CostFit | RunCostFit | None) -> str:
    """What the ladder's decode speed and seconds are priced by, in a line."""
    if isinstance(cost_fit, RunCostFit):
        low, high = cost_fit.load_range
        return (
            f"tok/s: the client's decode speed from each point's expert loads a token, priced by "
            f"the per-run fit of {cost_fit.source} ({cost_fit.runs} runs, loads {low:.3g}-"
            f"{high:.3g} a token; † outside them, an extrapolation); T90 and churn in the "
            "default cost model's seconds (a per-run fit prices no step)"
        )
    if isinstance(cost_fit, CostFit):
        return f"tok/s, T90 and churn priced by the step fit of {cost_fit.source}"
    return (
        "tok/s, T90 and churn priced by the default cost model (not the box's; fit-cost a "
        "finished campaign and pass --cost for the box's)"
    )


def ladder_value(ladder: pd.DataFrame, point: str, column: str) -> float:
    """One figure of the ladder as a float (NaN where the column is missing)."""
    if column not in ladder.columns:
        return float("nan")
    found = np.asarray(ladder.loc[ladder["point"] == point, column], dtype=float)
    return float(found[0]) if len(found) else float("nan")


def sweep_root(loaded: LoadedCard, reports: Path, out: Path | None) -> Path:
    """``--out``, else ``reports/<campaign>-sweep/<stamp>/`` (a fresh one)."""
    if out is not None:
        if (out / "ladder.parquet").exists():
            raise BadInput(f"{out}: already holds a sweep; pick an empty --out folder")
        return out
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root = reports / f"{loaded.card.campaign}-sweep" / stamp
    suffix = 1
    while root.exists():
        suffix += 1
        root = reports / f"{loaded.card.campaign}-sweep" / f"{stamp}-{suffix}"
    return root


def write_sweep(sweep: Sweep, root: Path, text: str, figure: bytes | None) -> None:
    """``rows.parquet`` (point × trace), ``ladder.parquet``, ``sweep.json`` (points, traces,
    warnings), ``sweep.md`` (the printed table, warnings first) and ``sweep.png``."""
    root.mkdir(parents=True, exist_ok=True)
    write_parquet(sweep.rows, root / "rows.parquet")
    write_parquet(sweep.ladder, root / "ladder.parquet")
    meta = {
        "card": str(sweep.card.path),
        "campaign": sweep.card.card.campaign,
        "base": sweep.base,
        "traces": sweep.traces,
        "points": [
            {"id": p.id, "label": p.label(), "overrides": dict(p.overrides),
             "start": sweep.settings[p.id].start}
            for p in sweep.points
        ],
        "warnings": sweep.warnings,
        "pricing": sweep.pricing,
    }  # fmt: skip
    write_text_atomic(root / "sweep.json", json.dumps(meta, indent=2) + "\n")
    write_text_atomic(root / "sweep.md", text)
    if figure is not None:
        write_bytes_atomic(root / "sweep.png", figure)
