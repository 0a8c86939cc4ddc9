"""The swap queue at its budget after a shift (seed 000 Fig. 3: "31–40 of 40 layers pinned at
that budget for about ten seconds" on the September map; "never saturates" on the seed map).

A runtime whose route trace logs its drains (the reference runtime: ``{"kind": "drain", "step",
"swaps", "saturated"}``, ``saturated`` the layers with more promotions due than the budget lets
through) says, per shift: the most layers at budget in any drain of the phase after it, and
how long the queue stayed saturated — the seconds from the shift to the first drain with fewer
than half the layers at budget (0 when the first drain after it already had fewer; the phase's
length when none did). A drain's time is its step's in the ring (``seq`` is the step), on the
same clock as the cold-share windows: seconds since the ring's first step. A run without drain
lines, or without a ring that numbers its steps, measures neither: None, "not measured".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["QueueSaturation", "queue_saturation"]

NS_PER_S = 1e9


@dataclass(frozen=True)
class QueueSaturation:
    """One shift's queue: the most layers at budget and the seconds it stayed saturated."""

    peak_layers: int
    layers: int
    saturated_s: float


def _drains(trace: Path) -> tuple[int, list[tuple[int, int]]] | None:
    """The trace's layer count and its drains (step, layers at budget); None without them."""
    layers: int | None = None
    found: list[tuple[int, int]] = []
    try:
        with trace.open("rb") as lines:
            for line in lines:
                if layers is None and b'"header"' in line:
                    header = json.loads(line)
                    layers = int(header["layers"]) if isinstance(header, dict) else None
                elif b'"drain"' in line:
                    drain = json.loads(line)
                    found.append((int(drain["step"]), int(drain.get("saturated", 0))))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (layers, found) if layers and found else None


def queue_saturation(
    trace: Path, ring: pd.DataFrame | None, spans: list[tuple[float, float]]
) -> list[QueueSaturation | None]:
    """For each shift's span (its start and end, seconds since the ring's first step), the
    queue's saturation in it; None for every span where nothing says (module docstring)."""
    drains = _drains(trace) if trace.is_file() else None
    if drains is None or ring is None or ring.empty or "seq" not in ring.columns:
        return [None] * len(spans)
    layers, steps = drains
    seq = ring["seq"].to_numpy(dtype=np.int64)
    t_ns = ring["t_ns"].to_numpy(dtype=np.int64)
    order = np.argsort(seq)
    seq, t_ns = seq[order], t_ns[order]
    origin = int(t_ns.min())
    step = np.array([s for s, _ in steps], dtype=np.int64)
    at = np.searchsorted(seq, step)
    known = (at < seq.size) & (seq[np.minimum(at, seq.size - 1)] == step)
    times = (t_ns[np.minimum(at, seq.size - 1)] - origin) / NS_PER_S
    pinned = np.array([n for _, n in steps], dtype=np.int64)
    out: list[QueueSaturation | None] = []
    for start, end in spans:
        inside = known & (times >= start) & (times < end)
        if not inside.any():
            out.append(None)
            continue
        t, n = times[inside], pinned[inside]
        below = np.flatnonzero(n * 2 < layers)
        saturated = float(t[below[0]] - start) if below.size else float(end - start)
        if below.size and below[0] == 0:
            saturated = 0.0
        out.append(QueueSaturation(int(n.max()), layers, saturated))
    return out
