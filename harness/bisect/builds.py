"""The builds a bisect walks: commits of a repository, built once each, or folders given.

Commits: ``git rev-list --first-parent --reverse GOOD..BAD`` after GOOD, so the history is
the mainline between them. Each commit is exported (``git archive``) into the harness's cache
(``$HARNESS_CACHE/bisect/<repo>-<commit>``) and the profile's ``build.command`` runs there
once; a finished build carries a ``.harness-built`` marker, so a second bisect (or a resumed
one) reuses it. Folders (``--builds``) are taken as built, in the order given.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput
from harness.formats.safe_write import write_text_atomic
from harness.profiles.schema import BuildRecipe
from harness.runtimes.build_script import cache_root

BUILT_MARKER = ".harness-built"


@dataclass(frozen=True)
class Build:
    """One build of the history: its name, where it came from, and its folder once built."""

    name: str  # a commit's short hash, or a folder's name
    source: str  # the full commit hash, or the folder given
    folder: str  # the built tree the arm's build knob points at ("" until built)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BadInput(f"--repo {repo}: git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def commits_between(repo: Path, good: str, bad: str) -> list[Build]:
    """GOOD, then every mainline commit up to BAD, oldest first (folders not built yet)."""
    if not (repo / ".git").exists() and not repo.joinpath("HEAD").is_file():
        raise BadInput(f"--repo {repo}: not a git repository")
    resolved = []
    for flag, rev in (("--good", good), ("--bad", bad)):
        done = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BadInput(f"{flag} {rev}: no such commit in {repo}")
        resolved.append(done.stdout.strip())
    first, last = resolved
    ancestor = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", first, last], check=False
    )
    if ancestor.returncode != 0 or first == last:
        raise BadInput(f"--good {good} must be an ancestor of --bad {bad} (and not the same)")
    later = _git(repo, "rev-list", "--first-parent", "--reverse", f"{first}..{last}").split()
    return [Build(sha[:12], sha, "") for sha in (first, *later)]


def given_folders(folders: list[str]) -> list[Build]:
    """Builds given as folders, in history order."""
    if len(folders) < 2:
        raise BadInput("--builds needs at least two folders: the good build first, the bad last")
    builds = []
    for text in folders:
        folder = Path(text).expanduser().resolve()
        if not folder.is_dir():
            raise BadInput(f"--builds {text}: not a folder")
        builds.append(Build(folder.name, str(folder), str(folder)))
    names = [b.name for b in builds]
    if len(set(names)) != len(names):
        raise BadInput("--builds: two folders share a name; give folders with distinct names")
    return builds


def build_commit(repo: Path, build: Build, recipe: BuildRecipe) -> Build:
    """The commit exported and built in the cache (reused when already built)."""
    folder = cache_root() / "bisect" / f"{repo.resolve().name}-{build.source}"
    if (folder / BUILT_MARKER).is_file():
        return Build(build.name, build.source, str(folder))
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", build.source],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
        argv = [sys.executable if word == "{python}" else word for word in recipe.command]
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
            raise BuildFailed(f"build of {build.name} failed (exit {done.returncode}):\n{tail}")
        write_text_atomic(work / BUILT_MARKER, build.source + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        work.rename(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Build(build.name, build.source, str(folder))


class BuildFailed(Exception):
    """A commit that does not build: the bisect skips it."""


__all__ = ["Build", "BuildFailed", "build_commit", "commits_between", "given_folders"]
