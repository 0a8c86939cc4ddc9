"""What a simulation assumed, and where a card about to run (or a campaign that ran) differs.

Seed 000's two predictions both missed because the simulator ran its ladder from the September
static map while the box booted the seed map. ``harness simulate`` records what it replayed in
``simulated_inputs.json`` — each cell's files by SHA-256, its knobs, live knobs and
environment, the workload's phases, and the traces' model shape — and ``validate``, ``plan`` and
the report compare a card with the newest simulation of its campaign and name each difference,
before the boots are spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.card.load import LoadedCard
from harness.errors import HarnessError

# The readers below are imported where used: `validate` with no simulation to compare must not
# load pandas (harness.formats.records) for nothing.

__all__ = [
    "SIMULATED_INPUTS",
    "fingerprint",
    "mismatches",
    "newest_simulation",
    "simulation_warnings",
]

SIMULATED_INPUTS = "simulated_inputs.json"


def _texts(values: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in sorted(values.items())}


def fingerprint(loaded: LoadedCard) -> dict[str, Any]:
    """What of a card a simulation's prediction rests on, in JSON form."""
    from harness.formats.seal import file_sha256

    card = loaded.card
    cells: dict[str, Any] = {}
    for name, cell in card.cells.items():
        files = {}
        for key, relative in sorted(cell.files.items()):
            path = loaded.resolve(relative)
            files[key] = file_sha256(path) if path.is_file() else "missing"
        cells[name] = {
            "files": files,
            "knobs": _texts(dict(cell.knobs)),
            "live": _texts(dict(cell.live)),
            "env": _texts(dict(cell.env)),
        }
    # Phases by what they send, not how much: --scale changes the lengths, not the workload.
    phases = [
        {"name": p.name, "domains": list(p.domains), "shift": p.shift}
        for p in card.workload.phases or []
    ]
    return {
        "runtime": loaded.runtime.name,
        "cells": cells,
        "phases": phases,
        "max_tokens": card.workload.max_tokens,
        "concurrency": card.workload.concurrency,
    }


def newest_simulation(reports: Path, campaign: str) -> Path | None:
    """The newest simulated campaign of ``campaign`` under ``reports`` that recorded its inputs."""
    folder = reports / f"{campaign}-sim"
    if not folder.is_dir():
        return None
    found = sorted(
        (p for p in folder.iterdir() if (p / SIMULATED_INPUTS).is_file()),
        key=lambda p: p.name,
        reverse=True,
    )
    return found[0] if found else None


def _differing(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    keys = sorted(set(ours) | set(theirs))
    return [
        f"{k} {theirs.get(k, 'unset')} -> {ours.get(k, 'unset')}"
        for k in keys
        if ours.get(k) != theirs.get(k)
    ]


def mismatches(loaded: LoadedCard, simulated: dict[str, Any]) -> list[str]:
    """Each way the card differs from what the simulation replayed, one line each."""
    from harness.formats.maps import read_rowmap

    ours = fingerprint(loaded)
    out: list[str] = []
    if simulated.get("runtime") not in (None, ours["runtime"]):
        out.append(f"runtime: simulated {simulated['runtime']}, the card runs {ours['runtime']}")
    sim_cells: dict[str, Any] = simulated.get("cells") or {}
    for name, cell in ours["cells"].items():
        theirs = sim_cells.get(name)
        if theirs is None:
            out.append(f"cells.{name}: not in the simulation (nothing was predicted for it)")
            continue
        for key in sorted(set(cell["files"]) | set(theirs.get("files", {}))):
            mine, sim = cell["files"].get(key), theirs.get("files", {}).get(key)
            if mine != sim:
                what = "boot map" if key in ("rowmap", "hotlist") else "file"
                out.append(
                    f"cells.{name}.files.{key}: the {what} differs from the one simulated "
                    f"({'absent' if sim is None else 'sha256 ' + str(sim)[:12]} simulated, "
                    f"{'absent' if mine is None else 'sha256 ' + str(mine)[:12]} on the card)"
                )
        for part in ("knobs", "live", "env"):
            changed = _differing(cell[part], theirs.get(part, {}))
            if changed:
                out.append(f"cells.{name}.{part}: {'; '.join(changed)} (simulated -> card)")
    if simulated.get("phases") is not None and simulated["phases"] != ours["phases"]:
        out.append(
            "workload.phases differ from the simulation's (its traces stand for other phases: "
            "collect --as-run again and simulate)"
        )
    for key in ("max_tokens", "concurrency"):
        if key in simulated and simulated[key] != ours[key]:
            out.append(f"workload.{key}: simulated {simulated[key]}, the card has {ours[key]}")
    shape = simulated.get("model") or {}
    layers, experts = shape.get("layers"), shape.get("experts")
    if isinstance(layers, int) and isinstance(experts, int):
        for name, cell in loaded.card.cells.items():
            relative = cell.files.get("rowmap")
            if relative is None:
                continue
            try:
                rowmap = read_rowmap(loaded.resolve(relative), experts=experts)
            except HarnessError as problem:
                out.append(f"cells.{name}.files.rowmap: not of the simulated model ({problem})")
                continue
            if len(rowmap.hot) != layers:
                out.append(
                    f"cells.{name}.files.rowmap: {len(rowmap.hot)} layers, the simulated "
                    f"traces {layers}: another model"
                )
    return out


def simulation_warnings(loaded: LoadedCard, reports: Path) -> list[str]:
    """validate's and plan's warnings: how the card differs from its newest simulation."""
    found = newest_simulation(reports, loaded.card.campaign)
    if found is None:
        return []
    from harness.formats.records import read_json

    try:
        simulated = read_json(found / SIMULATED_INPUTS)
    except HarnessError:
        return [f"{found / SIMULATED_INPUTS}: unreadable; simulate the card again"]
    return [
        f"differs from the simulation it would confirm ({found}): {line}"
        for line in mismatches(loaded, simulated)
    ]
