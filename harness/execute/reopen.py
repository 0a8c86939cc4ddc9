"""Reopening a campaign directory to resume it.

The card comes from the directory's frozen inputs (:mod:`harness.card.frozen`), not from where
it once lay; a directory made before inputs were frozen loads it from ``card.path`` as it always
did, with a note. Either way the plan rebuilt from the card must be the plan on disk, so runs
already made keep their meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.card import LoadedCard, load_card, scale_workload
from harness.card.frozen import has_frozen_inputs, load_frozen_card
from harness.errors import BadInput, RecordError
from harness.plan import Plan, build_plan
from harness.records import CampaignDir, open_campaign


@dataclass(frozen=True)
class Reopened:
    """A campaign directory ready to execute again."""

    campaign: CampaignDir
    loaded: LoadedCard
    plan: Plan
    notes: tuple[str, ...]  # one line per thing the user should know (changed originals, …)


def reopen_campaign(root: Path) -> Reopened:
    """The campaign in ``root`` with its card and plan.

    Raises BadInput (exit 2) when the card no longer gives the plan on disk; RecordError when
    the directory or its frozen inputs are damaged.
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
        source = pointer.read_text(encoding="utf-8").strip()
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
    return Reopened(campaign, loaded, plan, tuple(notes))


__all__ = ["Reopened", "reopen_campaign"]
