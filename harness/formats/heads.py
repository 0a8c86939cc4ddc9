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

A head is a position in the chain: the journal may grow past it (a resume, a later gate), but
the line it names must still be there, at the same place, with the same bytes. Anything else
means some line up to it was rewritten.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.formats.records import CAMPAIGN_JOURNAL, Journal, line_digest

HEADS_FILE = "journal-heads.jsonl"
HISTORY_DIR = "history"  # the results store's folder (harness.history.store), beside campaigns


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
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
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
    if path is None or not path.is_file():
        return []
    key = _key(root)
    found = []
    for line in path.read_bytes().split(b"\n"):
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


def check_heads(root: Path, digests: list[str], expected: str | None = None) -> None:
    """Every head recorded for ``root`` (and ``expected``, a head given back by the user) must
    name a line of the chain whose event lines have ``digests``; a :class:`VerificationError`
    naming the journal if not."""
    journal = root / CAMPAIGN_JOURNAL
    for entry in recorded_heads(root):
        at = int(entry["events"])
        if at < 1 or at > len(digests) or digests[at - 1] != entry["head"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(entry.get("t", 0))))
            raise VerificationError(
                f"{journal}: rewritten since {when}, when its head {entry['head'][:16]}… "
                f"(event {at}, at the campaign's {entry.get('when', 'record')}) was kept in "
                f"{store_dir(root)}/{HEADS_FILE}; a line up to there was edited, inserted or "
                "removed, so no record of this directory can be trusted"
            )
    if expected is not None and expected not in digests:
        raise VerificationError(
            f"{journal}: no event line has the head {expected[:16]}… you gave; the journal "
            "was rewritten since that head was printed (or the head is another campaign's)"
        )


__all__ = [
    "HEADS_FILE",
    "HISTORY_DIR",
    "Head",
    "check_heads",
    "journal_head",
    "record_head",
    "recorded_heads",
    "store_dir",
]
