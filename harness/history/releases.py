"""Release marks in the results store: ``reports/history/releases/<campaign>--<name>.json``.

A release engineer marks the promoted campaign that measured a released build
(``harness history release DIR --name v1.2``); a ``regression`` gate with ``against: release``
then compares later campaigns of the card with that release's stored values, so a chain of
builds each within the margin of the one before cannot creep past it unseen. A mark names a
campaign already in the store, of that card, whose gates passed (it is refused otherwise); it
holds no values of its own, only the campaign's place, so the values compared are the ones
the store kept when the campaign was gated. One file per mark, written whole and renamed into
place like the store's; withdrawing a mark is deleting its file. The newest release is the one
marked last: marking declares what was released, in the order it was.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from harness.card import LoadedCard, RegressionGate
from harness.card.checks import Problems
from harness.card.schema import RELEASE_NAME
from harness.errors import BadInput, CardError, RecordError
from harness.formats.records import read_json, write_json_atomic
from harness.formats.yamlfile import load_yaml
from harness.history.store import history_dir, read_history

__all__ = ["RELEASES_DIR", "Release", "check_named_releases", "mark_release", "read_releases"]

RELEASES_DIR = "releases"  # under the store's folder: read_history globs only its *.parquet


@dataclass(frozen=True)
class Release:
    """One marked release: the campaign that measured it, in the store beside it."""

    name: str
    campaign: str
    stamp: str
    dir: str
    box: str
    marked_at: float

    def text(self) -> str:
        """How a verdict names it: name, stamp and directory."""
        return f"release {self.name} ({self.stamp}, {self.dir})"


def _release_file(path: Path) -> Release:
    """One mark, refused naming the file and field when it is not one."""
    data = read_json(path)
    fields: dict[str, str] = {}
    for key in ("name", "campaign", "stamp", "dir", "box"):
        value = data.get(key)
        if not isinstance(value, str) or not value:
            raise RecordError(
                f"{path}: {key}: missing or not a string; remove the file or mark "
                "the release again (harness history release DIR --name NAME)"
            )
        fields[key] = value
    marked = data.get("marked_at")
    if not isinstance(marked, int | float) or isinstance(marked, bool):
        raise RecordError(f"{path}: marked_at: missing or not a number")
    return Release(marked_at=float(marked), **fields)


def read_releases(store: Path) -> list[Release]:
    """Every release marked in the store at ``store`` (``reports/history``), oldest mark first."""
    folder = store / RELEASES_DIR
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    marks = [_release_file(p) for p in paths]
    return sorted(marks, key=lambda r: (r.marked_at, r.name))


def mark_release(root: Path, name: str | None) -> tuple[Release, Path]:
    """Mark the campaign at ``root`` as a release named ``name`` (default: its stamp); returns
    the mark and its file. Refused (BadInput) unless the campaign is in its store, promoted."""
    if not root.is_dir():
        raise BadInput(f"{root}: no such campaign directory")
    store = history_dir(root)
    if store is None:
        raise BadInput(
            f"{root}: not under reports/<campaign>/<stamp>, so it has no results "
            "store to mark a release in"
        )
    resolved = root.resolve()
    name = name if name is not None else resolved.name
    if not re.match(RELEASE_NAME, name):
        raise BadInput(
            f"--name: {name!r} is not a release name (letters, digits, '.', '_', "
            "'+', '-'; at most 100, starting with a letter or digit)"
        )
    table = read_history(store)
    rows: pd.DataFrame = table[table["dir"] == str(resolved)]
    if rows.empty:
        raise BadInput(
            f"{root}: not in the results store {store}: gate it first (harness gate "
            f"{root}); only a promoted campaign can be a release"
        )
    if not rows["passed"].astype(bool).all():
        raise BadInput(
            f"{root}: passed: false in the results store (its gates failed), so it "
            "is not promoted and cannot be a release; mark the campaign that "
            "passed"
        )
    first = rows.iloc[0]
    mark = Release(
        name,
        str(first["campaign"]),
        str(first["stamp"]),
        str(resolved),
        str(first["box"]),
        time.time(),
    )
    path = store / RELEASES_DIR / f"{mark.campaign}--{name}.json"
    for other in read_releases(store):
        if (other.campaign, other.name) == (mark.campaign, name) and other.dir != mark.dir:
            raise BadInput(
                f"--name: release {name} of {mark.campaign!r} already marks "
                f"{other.dir}; choose another name, or delete {path} to withdraw "
                "that mark"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, asdict(mark))
    return mark, path


def check_named_releases(loaded: LoadedCard, store: Path) -> None:
    """Before a campaign boots anything: every release a ``regression`` gate names must be
    marked in ``store`` for this card and box, or the gate could only fail once every run was
    spent. CardError at the gate's ``release`` line (a gate naming none is judged at gate
    time: the campaign may be the first to be released)."""
    card = loaded.card
    box = card.box if isinstance(card.box, str) else (card.box.host or card.box.kind)
    named = [
        (index, gate)
        for index, gate in enumerate(card.gates)
        if isinstance(gate, RegressionGate) and gate.release is not None
    ]
    if not named:
        return
    marks = [r for r in read_releases(store) if r.campaign == card.campaign]
    problems = Problems(load_yaml(loaded.path))
    for index, gate in named:
        if not any(r.name == gate.release and r.box == box for r in marks):
            known = ", ".join(f"{r.name} (box {r.box})" for r in marks) or "none"
            problems.add(
                ("gates", index, "release"),
                f"no release {gate.release!r} of {card.campaign!r} on box {box!r} in {store} "
                f"(marked: {known}); mark it with harness history release DIR --name "
                f"{gate.release}, or name a marked one",
            )
    if problems.lines:
        raise CardError(problems.lines[0], problems.lines)
