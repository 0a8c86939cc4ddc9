"""``--pick K``: the cells worth a boot, written as a card that validates and runs.

Objectives are the card's gated metrics the sweep predicts (``better``/``survives`` gates), each
in its catalog direction; ``counter`` gates on a predicted counter (swaps, expert loads) are
constraints every trace's row must meet. The Pareto front: the feasible points no other feasible
point matches or beats on every objective and beats on one. A point missing an objective cannot
be judged and is left out (fail closed). The card gets the control plus up to K-1 front points
other than the control, spread evenly along the first objective when the front is larger.

The written card is the source card with its cells replaced (control first, unchanged), the
campaign renamed ``<campaign>-pick``, and gates that named a dropped cell (``cells``, ``vs``)
applying to every cell again. Each picked cell says its point in ``description`` and its
prediction in YAML comments above it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from harness.card import BetterGate, CounterGate, SurvivesGate
from harness.catalog import METRICS
from harness.errors import BadInput
from harness.formats.safe_write import write_text_atomic
from harness.sim.sweep.grid import Sweep, control_name, ladder_value
from harness.sim.sweep.spec import FILE_KNOBS, point_cell

__all__ = ["Objective", "Pick", "objectives", "pareto_front", "pick_points", "write_picked_card"]

# Gate metrics the sweep predicts, and the ladder column that predicts each.
PREDICTS = {
    "decode_tok_s": "decode_tok_s",
    "c1_tok_s": "decode_tok_s",
    "hit_rate": "hit_rate",
    "cold_share": "cold_share",
    "ring_cold_share": "cold_share",
    "t90_s": "t90_s",
    "churn_per_min": "churn_per_min",
}
COUNTERS = {"swaps": "swaps", "expert_loads": "expert_loads"}
# With no predicted gate metric, the front is drawn on the simulator's own two figures.
FALLBACK = ("cold_share", "t90_s")


@dataclass(frozen=True)
class Objective:
    """A ladder column to optimise, and whether higher is better."""

    column: str
    higher_is_better: bool
    gate_metric: str


@dataclass
class Pick:
    """The picked points (control first), the front and what the choice rested on."""

    chosen: list[str]
    front: list[str]
    objectives: list[Objective]
    excluded: dict[str, str]  # point -> why it could not be picked
    notes: list[str]


def objectives(sweep: Sweep) -> tuple[list[Objective], list[str]]:
    """The card's gated metrics the sweep predicts (catalog direction), or the fallback."""
    found: list[Objective] = []
    notes = []
    for gate in sweep.card.card.gates:
        names: list[str] = []
        if isinstance(gate, BetterGate):
            names = [gate.metric]
        elif isinstance(gate, SurvivesGate):
            names = list(gate.metrics or [])
        for metric in names:
            column = PREDICTS.get(metric)
            if column is None:
                notes.append(f"gate metric {metric} is not predicted by the simulator; not used")
                continue
            if any(o.column == column for o in found):
                continue
            info = METRICS.get(metric)
            higher = info.higher_is_better if info is not None else True
            found.append(Objective(column, higher, metric))
    if not found:
        notes.append(f"no gated metric is predicted; the front is on {' and '.join(FALLBACK)}")
        found = [Objective(c, False, c) for c in FALLBACK]
    return found, notes


def _constraints(sweep: Sweep) -> dict[str, str]:
    """point -> the counter gate its predicted counters break, for every trace's row."""
    broken: dict[str, str] = {}
    for gate in sweep.card.card.gates:
        if not isinstance(gate, CounterGate) or gate.counter not in COUNTERS:
            continue
        column = COUNTERS[gate.counter]
        for row in sweep.rows.itertuples():
            value = float(getattr(row, column))
            if (gate.max is not None and value > gate.max) or (
                gate.min is not None and value < gate.min
            ):
                broken.setdefault(str(row.point), f"counter gate {gate.counter}: {value:g}")
    return broken


def pareto_front(values: np.ndarray) -> list[int]:
    """Indices of the non-dominated rows of ``values`` (every column: higher is better)."""
    front = []
    for i in range(len(values)):
        dominated = np.all(values >= values[i], axis=1) & np.any(values > values[i], axis=1)
        if not dominated.any():
            front.append(i)
    return front


def pick_points(sweep: Sweep, k: int) -> Pick:
    """The control plus up to ``k - 1`` front points (see the module docstring)."""
    if k < 2:
        raise BadInput(f"--pick {k}: pick at least 2 (the control and one cell worth booting)")
    wanted, notes = objectives(sweep)
    ladder = sweep.ladder
    excluded = _constraints(sweep)
    points = [p.id for p in sweep.points]
    for point in points:
        missing = [
            o.column for o in wanted if not math.isfinite(ladder_value(ladder, point, o.column))
        ]
        if missing and point not in excluded:
            excluded[point] = f"no finite prediction of {', '.join(missing)}"
    control = sweep.settings.get("control")
    for point in points:
        if point != "control" and sweep.settings.get(point) == control:
            excluded.setdefault(point, "the control's own settings")
    candidates = [p for p in points if p not in excluded]
    oriented = np.array(
        [[(1 if o.higher_is_better else -1) * ladder_value(ladder, p, o.column) for o in wanted]
         for p in candidates]
    ).reshape(len(candidates), len(wanted))  # fmt: skip
    front = [candidates[i] for i in pareto_front(oriented)] if candidates else []
    others = [p for p in front if p != "control"]
    first = wanted[0]
    others.sort(key=lambda p: ladder_value(ladder, p, first.column), reverse=first.higher_is_better)
    if len(others) > k - 1:
        spots = np.unique(np.linspace(0, len(others) - 1, k - 1).round().astype(int))
        others = [others[i] for i in spots]
        notes.append(f"the front has {len(front)} points; {k - 1} spread along {first.column}")
    elif len(others) < k - 1:
        notes.append(f"the front has only {len(others)} point(s) besides the control")
    return Pick(["control", *others], front, wanted, excluded, notes)


def _fmt(column: str, value: float) -> str:
    if not math.isfinite(value):
        return "never" if value > 0 and column.startswith("t90") else "n/a"
    if "share" in column or column == "hit_rate":
        return f"{100 * value:.2f}%"
    if column.startswith("t90"):
        return f"{value:.2f} s"
    if column in ("swaps", "expert_loads"):
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def prediction_lines(sweep: Sweep, point: str) -> list[str]:
    """The point's predicted ladder, one ``metric: value (Δ vs control)`` per line."""
    ladder = sweep.ladder
    lines = []
    for column in ladder.columns:
        if f"{column} Δ%" not in ladder.columns:
            continue
        value = ladder_value(ladder, point, column)
        delta = ladder_value(ladder, point, f"{column} Δ%")
        change = ""
        if point != "control" and math.isfinite(delta):
            change = f" ({delta:+.1f}% vs control)"
        lines.append(f"{column}: {_fmt(column, value)}{change}")
    return lines


def _relative(path: str, folder: Path) -> str:
    """A swept map's path as the card should hold it: beside the card when it is under its
    folder, else absolute."""
    resolved = Path(path).resolve()
    try:
        return (
            os.path.relpath(resolved, folder.resolve())
            if resolved.is_relative_to(folder.resolve())
            else str(resolved)
        )
    except ValueError:
        return str(resolved)


def _gates(raw: list[Any], cells: set[str]) -> list[Any]:
    out = []
    for gate in raw:
        gate = dict(gate)
        if isinstance(gate.get("cells"), list) and not set(gate["cells"]) <= cells:
            gate.pop("cells")
        if gate.get("vs") is not None and gate["vs"] not in cells:
            gate.pop("vs")
        out.append(gate)
    return out


def _dump(key: str, value: Any) -> str:
    return yaml.safe_dump({key: value}, sort_keys=False, allow_unicode=True, width=100)


def write_picked_card(sweep: Sweep, pick: Pick, path: Path) -> Path:
    """Write the picked card to ``path``, beside the source card (its runtimes, boxes, maps and
    prompts are found from the card's folder)."""
    loaded = sweep.card
    folder = loaded.directory
    if path.resolve().parent != folder.resolve():
        raise BadInput(
            f"--pick-out {path}: write the picked card beside {loaded.path} "
            "(its runtime profiles, boxes and relative paths are found from that folder)"
        )
    source = yaml.safe_load(loaded.text)
    control = control_name(loaded)
    base = loaded.card.cells[sweep.base]
    by_id = {p.id: p for p in sweep.points}
    control_notes = ["the control, unchanged", *prediction_lines(sweep, "control")]
    cells: list[tuple[str, dict[str, Any], list[str]]] = [
        (control, source["cells"][control], control_notes)
    ]
    for point_id in pick.chosen[1:]:
        point = by_id[point_id]
        cell = point_cell(base, point, f"sweep point {point.label()} (from {sweep.base})")
        data = cell.model_dump(exclude_defaults=True)
        for knob in FILE_KNOBS:
            if knob in data.get("files", {}) and any(k == knob for k, _ in point.overrides):
                data["files"][knob] = _relative(data["files"][knob], folder)
        notes = [f"sweep point {point.label()}", *prediction_lines(sweep, point_id)]
        cells.append((point_id, data, notes))
    names = {name for name, _, _ in cells}
    header = [
        f"# Picked by `harness simulate {loaded.path.name} --pick {len(pick.chosen)}` from "
        f"{len(sweep.points)} sweep points over {len(sweep.traces)} trace(s):",
        *[f"#   {t}" for t in sweep.traces],
        "# Objectives (the card's gated metrics the simulator predicts): "
        + ", ".join(f"{o.column} ({'higher' if o.higher_is_better else 'lower'} is better)"
                    for o in pick.objectives),
        f"# Pareto front: {', '.join(pick.front) or 'empty'}.",
        *[f"# Note: {n}" for n in pick.notes],
        *[f"# {w}" for w in sweep.warnings],
    ]  # fmt: skip
    parts = ["\n".join(header) + "\n"]
    for key, value in source.items():
        if key == "campaign":
            parts.append(_dump(key, f"{loaded.card.campaign}-pick"))
        elif key == "cells":
            lines = ["cells:"]
            for name, data, notes in cells:
                lines += [f"  # {n}" for n in notes]
                lines += ["  " + line for line in _dump(name, data).rstrip("\n").splitlines()]
            parts.append("\n".join(lines) + "\n")
        elif key == "control":
            parts.append(_dump(key, control))
        elif key == "gates":
            parts.append(_dump(key, _gates(value or [], names)))
        else:
            parts.append(_dump(key, value))
    if "control" not in source:
        parts.append(_dump("control", control))
    write_text_atomic(path, "".join(parts))
    return path


def picked_frame(sweep: Sweep, pick: Pick) -> pd.DataFrame:
    """The ladder rows of the picked points, in card order."""
    ladder = sweep.ladder.set_index("point")
    return ladder.loc[pick.chosen].reset_index()
