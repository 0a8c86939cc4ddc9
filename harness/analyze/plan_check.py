"""``plan.json`` held to the plan its frozen card builds, before anything is read from the runs.

The seal vouches that ``plan.json`` is the file the harness wrote; this vouches that it is the
plan the campaign's own card gives: the card copied into ``inputs/`` at the start, planned at
the recorded scale, to the cycles the card asks for or the last extension the journal holds.
A plan grown to 99 cycles, or a run added, dropped or moved, and every digest re-sealed to
match, is then still refused, whether or not a journal head was kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.card import scale_workload
from harness.card.frozen import has_frozen_inputs, load_frozen_card
from harness.errors import HarnessError, VerificationError
from harness.plan.build import build_plan

# What makes a run the run it is; estimates and such may differ between planner versions.
_IDENTITY = ("run_id", "cell", "cycle", "slot", "repeat", "cache_state", "box")


def check_plan(root: Path, on_disk: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """A :class:`VerificationError` naming ``plan.json`` when it is not the plan the frozen card
    builds. Directories without frozen inputs (made before them) and imported ones (planned
    from the files) are not rebuilt."""
    if not has_frozen_inputs(root) or (root / "IMPORTED").is_file():
        return
    path = root / "plan.json"
    extended = [e for e in events if e.get("event") == "campaign_extended"]
    try:
        loaded = load_frozen_card(root).loaded
        scale = float(on_disk.get("scale", 1.0))
        cycles = int(extended[-1]["to"]) if extended else None
        plan = build_plan(scale_workload(loaded, scale), scale=scale, cycles=cycles)
    except (HarnessError, KeyError, TypeError, ValueError) as exc:
        raise VerificationError(
            f"{path}: its frozen card no longer plans (…{str(exc)[-200:]}); the inputs were "
            "changed and re-sealed, or this harness cannot read them"
        ) from None
    built = plan.to_json()
    if on_disk.get("cycles", built["cycles"]) != built["cycles"]:
        extension = "the last extension the journal holds" if extended else "the card"
        raise VerificationError(
            f"{path}: cycles {on_disk.get('cycles')!r:.20}, but {extension} plans "
            f"{built['cycles']}: a plan grown without its extension journalled"
        )
    runs = on_disk.get("runs", [])

    def identity(run: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(run.get(key) for key in _IDENTITY)

    mine = [identity(run) for run in built["runs"]]  # type: ignore[attr-defined]
    theirs = [identity(run) for run in runs if isinstance(run, dict)]
    if mine != theirs:
        first = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
            min(len(mine), len(theirs)),
        )
        raise VerificationError(
            f"{path}: not the plan its frozen card builds ({len(theirs)} runs against "
            f"{len(mine)}; first difference at run {first}): edited and re-sealed, or planned "
            "by another version of the harness (gate it with that version)"
        )


__all__ = ["check_plan"]
