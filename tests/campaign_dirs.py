"""One small finished campaign, made by ``harness run`` as a user would, for the tests that
change a campaign directory (verification, locking, output faults)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.conftest import run_cli
from tests.report.test_report import CARD, POOL

GATES = (
    "gates:\n"
    "  - {kind: exact_outputs, min_match: all}\n"
    "  - {kind: counter, counter: new_swapout_pages, max: 0}\n"
)


def tiny_card(folder: Path, *, gates: str = GATES) -> Path:
    """The report tests' two-cell card (2 runs of 4 requests on the reference runtime)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pool.jsonl").write_text("\n".join(json.dumps(p) for p in POOL) + "\n")
    text = CARD.replace("campaign: tiny-report", "campaign: trust").split("gates:\n")[0] + gates
    # Queue drains every 2 decode steps, so the adaptive cell's residency moves within its 32
    # tokens: engaged (its hit rate leaves the control's), and the campaign passes.
    text = text.replace('"4096"}', '"4096", "REFBOX_DRAIN_EVERY": "2"}')
    card = folder / "trust.yaml"
    card.write_text(text)
    return card


def run_tiny(base: Path) -> Path:
    """Run the tiny card with ``harness run``; the campaign directory it printed."""
    card = tiny_card(base / "cards")
    done = run_cli("run", str(card), "--reports", str(base / "reports"), "--quiet")
    assert done.code == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("campaign directory: "))
    return Path(line.removeprefix("campaign directory: "))


def copy_campaign(root: Path, dest: Path) -> Path:
    """A copy of a campaign directory, at the same depth (reports/<campaign>/<stamp>), without
    ``box/``: the runtime's side of a local box (sparse 75 MB rings), which no reader opens."""
    target = dest / "reports" / root.parent.name / root.name
    shutil.copytree(root, target, symlinks=True, ignore=shutil.ignore_patterns("box"))
    return target


def strip_seal(root: Path) -> None:
    """The adversary's edit: ``seal``, ``files`` and the chain's ``prev`` removed from every
    journal event, so a sealed directory reads as one made before sealing."""
    journal = root / "journal.jsonl"
    events = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    stripped = [{k: v for k, v in e.items() if k not in ("seal", "files", "prev")} for e in events]
    journal.write_text("".join(json.dumps(e) + "\n" for e in stripped), encoding="utf-8")


def stripped_copy(source: Path, root: Path) -> Path:
    """A copy of the campaign ``source`` at ``root`` with its seal stripped (:func:`strip_seal`)."""
    shutil.copytree(source, root)
    strip_seal(root)
    return root


def rechain_journal(journal: Path, change: Callable[[list[dict]], None] | None = None) -> None:  # type: ignore[type-arg]
    """Rewrite a journal's events (after ``change``) with every ``prev`` recomputed, as the
    harness would have chained them: a test that writes another history than the one run, or
    a forger who can write the directory."""
    events = [json.loads(x) for x in journal.read_text(encoding="utf-8").splitlines() if x]
    if change is not None:
        change(events)
    lines, prev = [], ""
    for event in events:
        event["prev"] = prev
        line = json.dumps(event)
        lines.append(line)
        prev = hashlib.sha256(line.encode("utf-8")).hexdigest()
    journal.write_text("\n".join(lines) + "\n", encoding="utf-8")


def start_with(root: Path, name: str, payload: dict) -> None:  # type: ignore[type-arg]
    """Make ``root`` a campaign that started with ``payload`` as its top-level ``name`` (a
    ``quality.json`` the card cannot produce: written by an older harness, or damaged before
    the start sealed it). The file, its digest in ``campaign_start``, the chain after it and
    the results store's heads of this campaign are all rewritten, as the start would have left
    them; a ``sealed`` event afterwards is refused (what a campaign starts with is sealed once)."""
    from harness.formats.heads import HEADS_FILE, store_dir
    from harness.formats.records import line_digest
    from harness.formats.seal import file_sha256

    path = root / name
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    digest = file_sha256(path)

    def reseal(events: list[dict]) -> None:  # type: ignore[type-arg]
        start = next(e for e in events if e["event"] == "campaign_start")
        start["files"][name] = digest

    journal = root / "journal.jsonl"
    rechain_journal(journal, reseal)
    lines = journal.read_text(encoding="utf-8").splitlines()
    store = store_dir(root)
    heads = None if store is None else store / HEADS_FILE
    if heads is None or not heads.is_file():
        return
    key = f"{root.resolve().parent.name}/{root.resolve().name}"
    entries = [json.loads(line) for line in heads.read_text(encoding="utf-8").splitlines()]
    for entry in entries:
        if entry.get("campaign") == key:
            line = lines[entry["events"] - 1]
            entry["head"] = line_digest(line.encode("utf-8"))
    heads.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
