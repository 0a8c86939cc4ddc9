"""The journal's head kept outside the campaign directory, and checked against it.

The journal is a hash chain (:meth:`harness.formats.records.Journal.append`): each event
carries the SHA-256 of the line before it. A chain can be recomputed by anyone who can write
the directory, so the seal alone only proves that nothing changed *by accident*. The head —
the digest of the last line — is therefore also kept where an edit of the directory does not
reach it:

- the results store beside the campaign (``reports/history/journal-heads.jsonl``), written
  when the campaign starts (which anchors the card, plan and inputs) and each time it is gated;
- the verdict's output, printed for a CI job to keep and give back with
  ``harness gate DIR --journal-head HEX``.

A head in the store is a position in the chain: the journal grows past it (the runs after the
start, a resume), but the line it names must still be there, at the same place, with the same
bytes. A head the user gives back is where trust ends: it was printed as the campaign's last
line, so a line after it is one that head never vouched for (the campaign extended, runs or
seals appended by anyone who can write the directory) and the directory is refused; a later
``run --resume`` prints the newer head to give instead. The store itself must be a regular
file: a FIFO there would block every reader and writer, and skipping it would turn the check
off.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.formats.records import CAMPAIGN_JOURNAL, Journal, line_digest

HEADS_FILE = "journal-heads.jsonl"
HISTORY_DIR = "history"  # the results store's folder (harness.history.store), beside campaigns


# Opened without following a link (the store is ours, never a pointer elsewhere) and without
# blocking (a FIFO in its place must be refused, not waited on).
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFLNK: "a symlink", stat.S_IFDIR: "a folder"}


@dataclass(frozen=True)
class Head:
    """A journal's head: the digest of its last event line and how many events lead to it."""

    digest: str
    events: int


def store_dir(root: Path) -> Path | None:
    """``reports/history`` for a campaign at ``reports/<campaign>/<stamp>``, else None.

    Only the standard layout has a store, so a copied or test folder elsewhere records into
    no one's history.
    """
    resolved = root.resolve()
    if resolved.parent.parent.name != "reports":
        return None
    return resolved.parent.parent / HISTORY_DIR


def _key(root: Path) -> str:
    """The campaign's name in its store: ``<campaign>/<stamp>``."""
    resolved = root.resolve()
    return f"{resolved.parent.name}/{resolved.name}"


def journal_head(root: Path) -> Head | None:
    """The head of ``root``'s journal (None when it holds no event)."""
    lines = Journal(root / CAMPAIGN_JOURNAL).event_lines()
    if not lines:
        return None
    return Head(line_digest(lines[-1][1]), len(lines))


def record_head(root: Path, when: str) -> Head | None:
    """Append the journal's head to the store beside ``root`` (none outside the standard
    layout); returns the head. ``when``: what the campaign had just done (start, gate)."""
    head = journal_head(root)
    folder = store_dir(root)
    if head is None or folder is None:
        return head
    folder.mkdir(parents=True, exist_ok=True)
    entry = {
        "campaign": _key(root),
        "head": head.digest,
        "events": head.events,
        "when": when,
        "t": time.time(),
    }
    path = folder / HEADS_FILE
    _check_store(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _OPEN_FLAGS, 0o644)
    try:
        _check_store(path, os.fstat(descriptor).st_mode)
        os.write(descriptor, (json.dumps(entry) + "\n").encode("utf-8"))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return head


def recorded_heads(root: Path) -> list[dict[str, Any]]:
    """Every head the store beside ``root`` keeps for it, oldest first (lines that are not a
    head entry are skipped: the store is appended to by every campaign of the tree)."""
    folder = store_dir(root)
    path = None if folder is None else folder / HEADS_FILE
    if path is None or not _check_store(path):
        return []
    descriptor = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    try:
        _check_store(path, os.fstat(descriptor).st_mode)  # swapped since the first look
        with os.fdopen(descriptor, "rb") as handle:
            descriptor = -1
            data = handle.read()
    finally:
        if descriptor >= 0:
            os.close(descriptor)
    key = _key(root)
    found = []
    for line in data.split(b"\n"):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and entry.get("campaign") == key
            and isinstance(entry.get("head"), str)
            and isinstance(entry.get("events"), int)
        ):
            found.append(entry)
    return found


def _check_store(path: Path, mode: int | None = None) -> bool:
    """Whether the store file exists (``mode``: of the file already opened); a
    :class:`VerificationError` when it is anything but a regular file."""
    if mode is None:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
    if stat.S_ISREG(mode):
        return True
    kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
    raise VerificationError(
        f"{path}: {kind}, not a regular file, so the journal heads kept there cannot be read "
        "and no campaign they vouch for can be checked; put the store's file back (or move "
        "this aside to start an empty store)"
    )


# What a verdict says when no head was given back: the chain holds, but only by its own word.
SELF_ONLY = (
    "verified against itself only: no journal head was given back (`--journal-head HEX`); the "
    "results store's heads, where kept, vouch only for the lines up to them"
)


@dataclass(frozen=True)
class HeadCheck:
    """What a head kept outside the directory vouched for, as every output says it."""

    head: str  # the head given back, which is the journal's last line ("" when none was)
    text: str  # which head was checked, or "verified against itself only"


def _lines(n: int) -> str:
    return "1 event line follows" if n == 1 else f"{n} event lines follow"


def _tally(kinds: list[str]) -> str:
    """``campaign_extended, 16 run_start, 16 run_done`` (in the order first seen)."""
    counts = Counter(kinds)
    return ", ".join(kind if n == 1 else f"{n} {kind}" for kind, n in counts.items())


def _kept_at(stamp: Any) -> str:
    """When a head was kept, from its entry's ``t`` (any value the store holds: the store is
    written by every campaign of the tree, and a damaged ``t`` must not hide the rewrite)."""
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        return "a time the store does not say"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(stamp)))
    except (OverflowError, OSError, ValueError):
        return "a time the store does not say"


def check_heads(
    root: Path, digests: list[str], kinds: list[str], expected: str | None = None
) -> HeadCheck:
    """Every head recorded for ``root`` (and ``expected``, a head given back by the user) must
    name a line of the chain whose event lines have ``digests`` (their events ``kinds``);
    ``expected`` must name its last line. A :class:`VerificationError` naming the journal if
    not; else whether a head given back vouches for the whole journal."""
    journal = root / CAMPAIGN_JOURNAL
    for entry in recorded_heads(root):
        at = int(entry["events"])
        if at < 1 or at > len(digests) or digests[at - 1] != entry["head"]:
            when = _kept_at(entry.get("t"))
            raise VerificationError(
                f"{journal}: rewritten since {when}, when its head {entry['head'][:16]}… "
                f"(event {at}, at the campaign's {entry.get('when', 'record')}) was kept in "
                f"{store_dir(root)}/{HEADS_FILE}; a line up to there was edited, inserted or "
                "removed, so no record of this directory can be trusted"
            )
    total = len(digests)
    if expected is not None:
        if expected not in digests:
            raise VerificationError(
                f"{journal}: no event line has the head {expected[:16]}… you gave; the journal "
                "was rewritten since that head was printed (or the head is another campaign's)"
            )
        at = digests.index(expected) + 1
        if at < total:
            raise VerificationError(
                f"{journal}: {_lines(total - at)} the head {expected[:16]}… you gave "
                f"({_tally(kinds[at:])}); a kept head is where trust ends, so what follows it "
                "is refused, never counted. If this harness wrote them (a `harness run "
                "--resume` since that head was printed), give the head that run printed; else "
                "someone who can write the directory added them"
            )
        return HeadCheck(
            expected,
            f"verified against the journal head you kept ({expected[:16]}…, "
            f"event {total} of {total})",
        )
    # The store's heads are not claimed here: a gate records the head of the directory it was
    # given, so the next gate would read back its own word (and verdicts would differ by store).
    return HeadCheck("", SELF_ONLY)


__all__ = [
    "HEADS_FILE",
    "HISTORY_DIR",
    "SELF_ONLY",
    "Head",
    "HeadCheck",
    "check_heads",
    "journal_head",
    "record_head",
    "recorded_heads",
    "store_dir",
]
