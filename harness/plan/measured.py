"""What a card's runs took the last time it ran here: a plan priced from measured run times.

``harness plan`` prices a run from the runtime profile's expected boot time and speeds, which
are one box's guess (the demo's read 1.4x low on a quiet box and 3-6x low on a busy one). When
the results store holds a campaign of the same card on the same box, its runs' wall times are
the better price: the median run (boot, warm-up, washout and scored requests, as they ran),
its boot kept and its drive rescaled from the scale it ran at to the scale planned.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.stats.cycles import finite

__all__ = ["MeasuredRuns", "measured_runs", "run_times"]

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
        blocks, boots, ran_at = found
        boot = statistics.median(boots) if boots else 0.0
        drive = statistics.median(blocks)
        return MeasuredRuns(directory, len(blocks), ran_at, boot + drive * scale / ran_at, boot)
    return None


def run_times(records: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """The boots' seconds and the blocks' seconds of completed runs' records (``run.json``,
    in plan order): a run that booted spent ``runtime.boot_s`` of its span (start to end)
    booting, once per boot (a run on a shared boot measured, and washed out, for all of it).
    Records without a positive span are passed over."""
    boots: list[float] = []
    blocks: list[float] = []
    seen: set[str] = set()
    for record in records:
        start, end = finite(record.get("started_at")), finite(record.get("ended_at"))
        boot_id = str(record.get("boot_id") or record.get("run_id"))
        booted = boot_id not in seen
        seen.add(boot_id)
        runtime = record.get("runtime")
        boot = finite(runtime.get("boot_s")) if isinstance(runtime, dict) and booted else None
        boot = boot if boot is not None and boot > 0 else 0.0
        if boot > 0:
            boots.append(boot)
        if start is not None and end is not None and end > start:
            blocks.append(max(0.0, end - start - boot))
    return boots, blocks


def _runs(directory: Path, boxes: set[str]) -> tuple[list[float], list[float], float] | None:
    plan = _json(directory / "plan.json")
    ran_at = finite(plan.get("scale", 1.0)) if plan is not None else None
    if ran_at is None or ran_at <= 0:
        return None
    records = [_json(path) for path in sorted((directory / "runs").glob("*/run.json"))]
    mine = [r for r in records if r and r.get("status") == "ok" and r.get("box") in boxes]
    boots, blocks = run_times(mine)
    return (blocks, boots, ran_at) if len(blocks) >= MIN_RUNS else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
