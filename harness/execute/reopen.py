"""Reopening a campaign directory to resume it, or to grow it by whole cycles.

The card comes from the directory's frozen inputs (:mod:`harness.card.frozen`), not from where
it once lay; a directory made before inputs were frozen loads it from ``card.path`` as it always
did, with a note. Either way the plan rebuilt from the card must be the plan on disk, so runs
already made keep their meaning. Growing (:func:`extend_campaign`) rewrites ``plan.json``
atomically and journals ``campaign_extended``; the runner then runs only what is not done.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.card import LoadedCard, load_card, scale_workload
from harness.card.frozen import has_frozen_inputs, load_frozen_card
from harness.errors import BadInput, PlanError, RecordError
from harness.formats.records import NEXT_PLAN, CampaignDir, open_campaign, write_text_atomic
from harness.formats.seal import file_sha256
from harness.formats.textfile import read_text
from harness.plan.build import Plan, build_plan, extend_plan, plan_json_text


@dataclass(frozen=True)
class Reopened:
    """A campaign directory ready to execute again."""

    campaign: CampaignDir
    loaded: LoadedCard
    plan: Plan
    notes: tuple[str, ...]  # one line per thing the user should know (changed originals, …)
    extended_from: int | None = None  # the cycles planned before this call grew the campaign


def reopen_campaign(root: Path, *, cycles: int | None = None) -> Reopened:
    """The campaign in ``root`` with its card and plan, grown to ``cycles`` when given.

    Raises BadInput (exit 2) when the card no longer gives the plan on disk, or ``cycles`` is
    fewer than planned; RecordError when the directory or its frozen inputs are damaged.
    """
    campaign = open_campaign(root)
    on_disk = campaign.plan()
    scale = float(on_disk.get("scale", 1.0))
    frozen = has_frozen_inputs(root)
    if frozen:
        loaded_card = load_frozen_card(root)
        loaded, notes = loaded_card.loaded, list(loaded_card.notes)
        source = str(root / "card.yaml")
    else:
        pointer = root / "card.path"
        if not pointer.is_file():
            raise RecordError(
                f"{root}: neither inputs/manifest.json nor card.path; the campaign cannot say "
                "which card it ran, so start a new campaign"
            )
        source = read_text(pointer, RecordError, "card path").strip()
        notes = [
            f"note: {root} keeps no copy of its inputs (made before campaign directories did); "
            f"loading the card from {source}, as before"
        ]
        loaded = load_card(Path(source))
    loaded = scale_workload(loaded, scale)
    planned = int(on_disk.get("cycles", loaded.card.design.cycles))
    plan = build_plan(loaded, scale=scale, cycles=planned)
    on_disk.setdefault("cycles", planned)  # plans written before plans recorded their cycles
    if plan.to_json() != on_disk:
        if frozen:
            raise BadInput(
                f"{root / 'plan.json'}: the frozen card {source} no longer gives this plan (the "
                "harness plans differently from the one that started the campaign); resume "
                "with that version of the harness, or start a new campaign"
            )
        raise BadInput(
            f"{source}: the card changed since {root} was planned; resume needs the same plan "
            "(restore the card, or start a new campaign)"
        )
    if cycles is None or cycles == plan.cycles:
        if cycles is not None:
            notes.append(f"note: {root} already has {_cycles(cycles)} planned; resuming as planned")
        return Reopened(campaign, loaded, plan, tuple(notes))
    _check_growth(root, loaded, plan, cycles)
    if cycles < plan.cycles:
        raise PlanError(
            f"--cycles {cycles}: {root} already has {_cycles(plan.cycles)} planned "
            f"({len(plan.runs)} runs) and a campaign only grows; give --cycles {plan.cycles} "
            "or more, or leave --cycles out to resume as planned"
        )
    grown = extend_campaign(campaign, plan, cycles)
    return Reopened(campaign, loaded, grown, tuple(notes), extended_from=plan.cycles)


# The most mirrored cycles a campaign may grow to: as many as a card may plan (design.cycles).
MAX_CYCLES = 1000


def _check_growth(root: Path, loaded: LoadedCard, plan: Plan, cycles: int) -> None:
    """Every reason to refuse ``--cycles``, checked before anything is written."""
    if not 0 < cycles <= MAX_CYCLES:
        raise PlanError(
            f"--cycles {cycles}: a campaign has 1 to {MAX_CYCLES} mirrored cycles, as a card's "
            "design.cycles"
        )
    design = loaded.card.design
    if design.sequential and design.max_cycles is not None and cycles > design.max_cycles:
        raise PlanError(
            f"--cycles {cycles}: {root}'s sequential design ends at max_cycles "
            f"{design.max_cycles}; its α is spent there, so it cannot grow. Start a new "
            f"campaign with max_cycles >= {cycles} (nothing was changed here)"
        )


def extend_campaign(campaign: CampaignDir, plan: Plan, cycles: int) -> Plan:
    """Grow the campaign's plan to ``cycles`` in all. Returns the grown plan (the same one when
    nothing grew).

    The grown plan is staged (``.plan.json.next``), journalled with its digest
    (``campaign_extended``), then renamed over ``plan.json``: a kill before the journal line
    leaves the old campaign as it was, a kill after it leaves what
    :func:`finish_extension` completes on the next resume."""
    grown = extend_plan(plan, cycles)
    if grown is plan:
        return plan
    staged = campaign.root / NEXT_PLAN
    write_text_atomic(staged, plan_json_text(grown) + "\n")
    campaign.journal.append(
        "campaign_extended",
        **{"from": plan.cycles, "to": grown.cycles},
        runs_before=len(plan.runs),
        runs_after=len(grown.runs),
        files={"plan.json": file_sha256(staged)},
    )
    os.replace(staged, campaign.root / "plan.json")
    return grown


def finish_extension(root: Path) -> str | None:
    """Complete an extension a kill cut off between journalling the grown plan and renaming it
    into place; drop a staged plan that was never journalled. Returns a note when it did
    either. Only a staged file whose digest is the one the journal last sealed for
    ``plan.json`` is put in place; the directory is verified after this either way."""
    staged = root / NEXT_PLAN
    if staged.is_symlink() or not staged.is_file():
        return None
    sealed = [
        str(event["files"]["plan.json"])
        for event in CampaignDir(root).journal.events()
        if isinstance(event.get("files"), dict) and "plan.json" in event["files"]
    ]
    digest = file_sha256(staged)
    if sealed and sealed[-1] == digest:
        if file_sha256(root / "plan.json") == digest:
            staged.unlink()
            return None
        os.replace(staged, root / "plan.json")
        return f"note: finished the extension a stop cut off in {root} (plan.json put in place)"
    staged.unlink()
    return (
        f"note: removed the grown plan of an extension a stop cut off before {root}'s journal "
        "held it; the campaign is as planned before it"
    )


def _cycles(n: int) -> str:
    return f"{n} cycle" if n == 1 else f"{n} cycles"


__all__ = ["Reopened", "extend_campaign", "finish_extension", "reopen_campaign"]
