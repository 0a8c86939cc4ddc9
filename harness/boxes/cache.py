"""Where a campaign lives on its box, and giving back the cache folder its runtimes kept.

A runtime may keep files between boots in the campaign's cache folder (the reference runtime's
slow tier: about 1 GB for the demo), so that a ``cold`` run has a file to evict. They are
rebuilt by the first boot that needs them, so once a campaign's runs are over they are only
disk a user would have to find and delete by hand.
"""

from __future__ import annotations

from pathlib import Path

from harness.boxes.base import Box, quote_path
from harness.boxes.boxes import open_box
from harness.card import LoadedCard
from harness.errors import BoxError


def campaign_root_on_box(loaded: LoadedCard, box: Box, campaign_root: Path) -> str:
    """The folder of this campaign on its box (beside the records for the local box).

    Boxes of a fleet after the first get a folder named after them: two boxes may share a
    disk (the local box twice, two SSH boxes on one host) and must not share files.
    """
    fleet = box.name != loaded.box_name
    spec = box.spec
    if spec.kind == "local":
        return str(campaign_root.resolve() / (f"box-{box.name}" if fleet else "box"))
    base = box.home_path(spec.workdir)
    folder = f"{base}/{loaded.card.campaign}/{campaign_root.name}"
    return f"{folder}/{box.name}" if fleet else folder


def cache_dir_on_box(root_on_box: str) -> str:
    """Folder on the box shared by all runs, for files a runtime keeps between boots."""
    return f"{root_on_box}/cache"


def release_cache(loaded: LoadedCard, campaign_root: Path) -> None:
    """Delete the campaign's cache folder on each of its boxes; a resume's first boot rebuilds
    it. A box that cannot be reached keeps its folder (the campaign's result stands)."""
    for name, spec in loaded.boxes:
        if spec.kind == "slurm":
            continue  # each job removes its own cache folder when it ends (slurm/job.py)
        box = open_box(name, spec)
        try:
            cache = cache_dir_on_box(campaign_root_on_box(loaded, box, campaign_root))
            box.sh(f"rm -rf {quote_path(cache)}", timeout_s=120, check=False)
        except BoxError:
            continue
        finally:
            box.close()
