"""What a card's runs took the last time it ran here: a plan priced from measured run times.

``harness plan`` prices a run from the runtime profile's expected boot time and speeds, which
are one box's guess (the demo's read 1.4x low on a quiet box and 3-6x low on a busy one). When
the results store holds a campaign of the same card on the same box, its runs' wall times are
the better price: the median run (boot, warm-up, washout and scored requests, as they ran),
its boot kept and its drive rescaled from the scale it ran at to the scale planned.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MeasuredRuns", "measured_runs"]

MIN_RUNS = 2  # a median of one run is one boot's luck


@dataclass(frozen=True)
class MeasuredRuns:
    """The median run of the newest finished campaign of a card on the planned boxes."""

    directory: Path
    runs: int  # completed runs the median is over
    ran_at: float  # the --scale it ran at
    run_s: float  # seconds per run, rescaled to the planned scale
    boot_s: float  # the median boot, not rescaled


def measured_runs(
    campaign: str, boxes: set[str], reports: Path, scale: float
) -> MeasuredRuns | None:
    """The newest campaign directory of ``campaign`` under ``reports`` with at least MIN_RUNS
    completed runs on ``boxes``, priced at ``scale``; None when there is none. A directory
    that cannot be read is passed over: an estimate never fails a plan."""
    folder = reports / campaign
    if not folder.is_dir():
        return None
    for directory in sorted((d for d in folder.iterdir() if d.is_dir()), reverse=True):
        found = _runs(directory, boxes)
        if found is None:
            continue
        walls, boots, ran_at = found
        boot = statistics.median(boots)
        drive = max(0.0, statistics.median(walls) - boot)
        return MeasuredRuns(directory, len(walls), ran_at, boot + drive * scale / ran_at, boot)
    return None


def _runs(directory: Path, boxes: set[str]) -> tuple[list[float], list[float], float] | None:
    plan = _json(directory / "plan.json")
    ran_at = _positive(plan.get("scale", 1.0)) if plan is not None else None
    if ran_at is None:
        return None
    walls: list[float] = []
    boots: list[float] = []
    for path in sorted((directory / "runs").glob("*/run.json")):
        record = _json(path)
        if record is None or record.get("status") != "ok" or record.get("box") not in boxes:
            continue
        start, end = _positive(record.get("started_at")), _positive(record.get("ended_at"))
        if start is None or end is None or end <= start:
            continue
        runtime = record.get("runtime")
        boot = _positive(runtime.get("boot_s")) if isinstance(runtime, dict) else None
        walls.append(end - start)
        boots.append(boot if boot is not None and boot < end - start else 0.0)
    return (walls, boots, ran_at) if len(walls) >= MIN_RUNS else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _positive(value: object) -> float | None:
    """``value`` as a finite positive float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None
