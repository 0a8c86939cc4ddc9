"""The seal of a campaign directory: SHA-256 of what it holds, journalled as it is written.

``campaign_start`` carries ``seal`` (its version) and the digests of the files the campaign
starts with (card, plan, frozen inputs); ``campaign_extended`` the grown plan's; ``run_done``
every file of the run's folder; ``sealed`` a top-level record written later (a box's
environment, ``cohorts.json``, an import's sources). :mod:`.verify` checks a directory
against these before anything is read from it. :class:`harness.formats.records.Journal` adds the
digests itself, so every writer of those events (runner, fleet, Slurm merge, import, simulate)
seals alike.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# 2: every event of the journal carries ``prev``, the digest of the line before it.
SEAL_VERSION = 2
# What a campaign starts with; a later top-level record is sealed by its own ``sealed`` event.
START_FILES = ("card.yaml", "card.path", "plan.json", "quality.json")
START_FOLDERS = ("inputs",)
# A run folder's scratch: temp files of atomic writes, and folders emptied once a run is done.
_SCRATCH_PREFIX = "."


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (symlinks included, scratch left out), in a stable order."""
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(_SCRATCH_PREFIX) for part in relative.parts):
            continue
        if path.is_symlink() or not path.is_dir():
            found.append(path)
    return found


def digests(root: Path, paths: list[Path]) -> dict[str, str]:
    """``{path relative to root: sha256}`` of regular files (a symlink is never sealed)."""
    return {
        path.relative_to(root).as_posix(): file_sha256(path)
        for path in paths
        if path.is_file() and not path.is_symlink()
    }


def start_seal(root: Path) -> dict[str, object]:
    """The fields ``campaign_start`` carries: the seal's version and the starting files."""
    paths = [root / name for name in START_FILES]
    for name in START_FOLDERS:
        if (root / name).is_dir():
            paths.extend(folder_files(root / name))
    return {"seal": SEAL_VERSION, "files": digests(root, paths)}


def run_seal(run_dir: Path) -> dict[str, str]:
    """The digests ``run_done`` carries: every file of the run's folder, relative to it."""
    return digests(run_dir, folder_files(run_dir)) if run_dir.is_dir() else {}


__all__ = [
    "SEAL_VERSION",
    "START_FILES",
    "digests",
    "file_sha256",
    "folder_files",
    "run_seal",
    "start_seal",
]
