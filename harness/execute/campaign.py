"""A campaign as a whole: its directory made, its runs executed, the outcome for the caller.

``harness run`` and the library's ``harness.run_campaign`` make these calls through the spine
(:func:`harness.spine.run_campaign`), which then gates the directory.
"""

from __future__ import annotations

import errno
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from harness.card import LoadedCard
from harness.card.frozen import freeze_inputs
from harness.execute.run import CampaignOutcome
from harness.formats.heads import record_head
from harness.formats.records import CampaignDir, write_json_atomic, write_text_atomic
from harness.plan.build import Plan, plan_json_text

__all__ = ["CampaignOutcome", "execute_campaign", "new_campaign_dir"]


def new_campaign_dir(loaded: LoadedCard, plan: Plan, reports_root: Path) -> CampaignDir:
    """Create ``reports/<campaign>/<stamp>/`` with the card as run, its inputs and the plan.

    The directory is made whole under a hidden name and renamed into place once
    ``campaign_start`` is journalled, so a kill or a full disk part-way leaves no campaign
    that resume would run and gate would refuse forever, only a ``.<stamp>-<pid>.partial``
    folder no command reads. Its journal head is then kept in the results store."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = reports_root / loaded.card.campaign
    folder.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder)
    partial = folder / f".{stamp}-{os.getpid()}.partial"
    partial.mkdir()
    try:
        _fill(loaded, plan, partial)
        root = _place(partial, folder, stamp)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    record_head(root, "start")
    return CampaignDir(root)


def _remove_abandoned(folder: Path) -> None:
    """Remove the ``.partial`` folders of harnesses killed before their rename (inputs copied
    whole, read by no command): one whose process is gone is never finished by anyone."""
    for partial in folder.glob(".*-*.partial"):
        pid_text = partial.name.removesuffix(".partial").rsplit("-", 1)[-1]
        if not pid_text.isdigit() or partial.is_symlink() or not partial.is_dir():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue  # alive under another user, or no pid at all: not ours to judge


def _place(partial: Path, folder: Path, stamp: str) -> Path:
    """Rename the finished ``partial`` to the first free ``<stamp>[-N]`` in ``folder``."""
    suffix = 1
    while True:
        root = folder / (stamp if suffix == 1 else f"{stamp}-{suffix}")
        if not root.exists():
            try:
                partial.rename(root)  # a folder of the same name made meanwhile is never empty
                return root
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        suffix += 1


def _fill(loaded: LoadedCard, plan: Plan, root: Path) -> None:
    """Everything a campaign starts with, ``campaign_start`` journalled last."""
    write_text_atomic(root / "card.yaml", loaded.text)
    write_text_atomic(root / "card.path", str(loaded.path))
    # The directory keeps everything the card names, so a resume needs nothing outside it.
    freeze_inputs(loaded, root)
    write_text_atomic(root / "plan.json", plan_json_text(plan) + "\n")
    if loaded.quality:
        suite = [
            {"id": p.id, "domain": p.domain, "check": p.check, "max_tokens": p.max_tokens}
            for p in loaded.quality
        ]
        write_json_atomic(root / "quality.json", {"prompts": suite})
    CampaignDir(root).journal.append(
        "campaign_start", campaign=loaded.card.campaign, runs=len(plan.runs)
    )


def execute_campaign(
    loaded: LoadedCard, plan: Plan, campaign: CampaignDir, *, quiet: bool, out: TextIO
) -> CampaignOutcome:
    """Run the plan's runs not yet done in ``campaign`` (the caller holds its lock): in order on
    each box of the fleet, or look by look for a sequential design. Gives back the runtime cache
    folder of a campaign that was not interrupted."""
    from harness.boxes.cache import release_cache
    from harness.execute.fleet import FleetRunner
    from harness.execute.progress import make_progress
    from harness.execute.sequential import run_sequential

    if loaded.card.design.sequential:
        outcome = run_sequential(
            loaded, plan, campaign, lambda p: make_progress(p, quiet=quiet, out=out), out
        )
    else:
        with make_progress(plan, quiet=quiet, out=out) as progress:
            outcome = FleetRunner(loaded, plan, campaign, progress).execute()
    if not outcome.interrupted:
        release_cache(loaded, campaign.root)
    return outcome
