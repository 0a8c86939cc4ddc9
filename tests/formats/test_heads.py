"""A kept journal head is where trust ends (issue 57), through the CLI.

Each test forges a copy of the pinned sealed campaign ``demo-washed`` the way anyone who can
write its directory could, with the harness's own :class:`Journal` (so every line chains and
every digest seals), and checks that ``gate --journal-head HEAD`` never passes it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from harness.errors import EXIT_INFRASTRUCTURE
from harness.execute.reopen import reopen_campaign
from harness.formats.heads import journal_head
from harness.formats.records import Journal
from harness.formats.seal import file_sha256
from tests.conftest import DATA, run_cli

WASHED = DATA / "campaigns" / "demo-washed"
NOT_VERIFIED = "campaign directory does not verify: "


def _copy(tmp_path: Path) -> tuple[Path, str]:
    """A copy of demo-washed at the standard layout, and its head as a CI kept it."""
    root = tmp_path / "reports" / "demo" / "20261204T230934Z"
    shutil.copytree(WASHED, root, ignore=shutil.ignore_patterns("README.md"))
    head = journal_head(root)
    assert head is not None
    return root, head.digest


def _extend_with_copies(root: Path, cycles: int) -> int:
    """Grow the campaign to ``cycles`` as `run --resume --cycles` does, and fill each new run
    with a copy of the run one mirrored pair of cycles earlier, journalled done. Returns the
    runs added."""
    journal = Journal(root / "journal.jsonl")
    before = {run["run_id"] for run in json.loads((root / "plan.json").read_text())["runs"]}
    reopen_campaign(root, cycles=cycles)  # journals campaign_extended, grows plan.json
    grown = json.loads((root / "plan.json").read_text())
    by_place = {(r["cycle"], r["slot"], r["cache_state"]): r for r in grown["runs"]}
    added = [run for run in grown["runs"] if run["run_id"] not in before]
    for run in added:
        # Cycles alternate ABBA/BAAB, so the run at the same place of cycle 0 or 1 has its cell.
        source = by_place[(run["cycle"] % 2, run["slot"], run["cache_state"])]
        assert source["cell"] == run["cell"]
        folder = root / "runs" / run["run_id"]
        shutil.copytree(root / "runs" / source["run_id"], folder)
        record = json.loads((folder / "run.json").read_text())
        record.update({k: v for k, v in run.items() if k in record})
        record["boot_id"] = f"{run['run_id']}-a1"
        (folder / "run.json").write_text(json.dumps(record, indent=2))
        journal.append("run_start", run_id=run["run_id"], attempt=1)
        journal.append("run_done", run_id=run["run_id"])
    return len(added)


def test_runs_and_cycles_appended_after_the_kept_head_are_refused(tmp_path: Path) -> None:
    root, head = _copy(tmp_path)
    added = _extend_with_copies(root, cycles=6)
    assert added == 8
    done = run_cli("gate", str(root), "--journal-head", head)
    assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert done.stderr.startswith(NOT_VERIFIED), done.stderr
    assert "17 event lines follow the head" in done.stderr, done.stderr
    assert "(campaign_extended, 8 run_start, 8 run_done)" in done.stderr
    assert "verdict: PASS" not in done.stdout and not (root / "verdict.json").exists()
    # Without a kept head the extension is gated, and every output says nothing outside the
    # directory vouched for it.
    done = run_cli("gate", str(root), "--quiet")
    assert done.code != EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert "verified against itself only" in done.stdout
    verdict = json.loads((root / "verdict.json").read_text())
    assert verdict["verified"] is False and verdict["head_checked"] == ""
    assert verdict["checked_against"].startswith("verified against itself only")


def _reseal_card_without_better_gates(root: Path) -> dict[str, str]:
    card = root / "card.yaml"
    text = card.read_text()
    kept = [line for line in text.splitlines(keepends=True) if "kind: better" not in line]
    assert len(kept) == len(text.splitlines()) - 2
    card.write_text("".join(kept))
    manifest = root / "inputs" / "manifest.json"
    data = json.loads(manifest.read_text())
    entry = next(e for e in data["files"] if e["copy"] == "card.yaml")
    entry.update(sha256=file_sha256(card), bytes=card.stat().st_size)
    manifest.write_text(json.dumps(data, indent=2))
    return {"card.yaml": file_sha256(card), "inputs/manifest.json": file_sha256(manifest)}


def test_a_card_resealed_after_the_start_is_refused_with_or_without_a_kept_head(
    tmp_path: Path,
) -> None:
    root, head = _copy(tmp_path)
    Journal(root / "journal.jsonl").append("sealed", files=_reseal_card_without_better_gates(root))
    done = run_cli("gate", str(root), "--journal-head", head)
    assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert "1 event line follows the head" in done.stderr and "(sealed)" in done.stderr
    done = run_cli("gate", str(root))
    assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert f"{root / 'card.yaml'}: sealed again by journal line 85 (sealed)" in done.stderr
    assert "verdict: PASS" not in done.stdout and not (root / "verdict.json").exists()


def test_an_input_sealed_by_an_extension_or_a_second_start_is_refused(tmp_path: Path) -> None:
    root, _ = _copy(tmp_path / "extended")
    manifest = root / "inputs" / "manifest.json"
    manifest.write_text(manifest.read_text() + " ")
    digest = file_sha256(manifest)
    # An extension to the cycles already planned, as far as the plan check can tell.
    files = {"plan.json": file_sha256(root / "plan.json"), "inputs/manifest.json": digest}
    Journal(root / "journal.jsonl").append("campaign_extended", **{"from": 4, "to": 4}, files=files)
    done = run_cli("gate", str(root), "--quiet")
    assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert f"{manifest}: sealed again by journal line 85 (campaign_extended)" in done.stderr
    root, _ = _copy(tmp_path / "restarted")
    Journal(root / "journal.jsonl").append("campaign_start", campaign="demo", runs=16)
    done = run_cli("gate", str(root), "--quiet")
    assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert "journal.jsonl: line 85: a second campaign_start" in done.stderr


def test_a_fifo_as_the_heads_store_is_refused_not_waited_on(tmp_path: Path) -> None:
    root, _ = _copy(tmp_path)
    store = tmp_path / "reports" / "history" / "journal-heads.jsonl"
    store.parent.mkdir()
    os.mkfifo(store)
    done = run_cli("gate", str(root), "--quiet", timeout_s=30)
    assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
    assert f"{store}: a FIFO, not a regular file" in done.stderr, done.stderr
    assert not (root / "verdict.json").exists()
    # A link in its place is refused the same way (it could point anywhere).
    store.unlink()
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    store.symlink_to(elsewhere)
    done = run_cli("gate", str(root), "--quiet", timeout_s=30)
    assert done.code == EXIT_INFRASTRUCTURE and f"{store}: a symlink" in done.stderr, done.stderr


def test_the_head_a_resume_printed_passes_and_says_it_was_checked(tmp_path: Path) -> None:
    root, head = _copy(tmp_path)
    done = run_cli("gate", str(root), "--quiet", "--journal-head", head)
    assert done.code == 0, done.stdout + done.stderr
    assert f"verified against the journal head you kept ({head[:16]}…, event 84 of 84)" in (
        done.stdout
    )
    verdict = json.loads((root / "verdict.json").read_text())
    assert verdict["verified"] is True and verdict["head_checked"] == head
    # What a resume appends, then the head it printed: trusted again.
    Journal(root / "journal.jsonl").append("campaign_resume")
    done = run_cli("gate", str(root), "--quiet", "--journal-head", head)
    assert done.code == EXIT_INFRASTRUCTURE and "(campaign_resume)" in done.stderr, done.stderr
    assert "give the head that run printed" in done.stderr
    newer = journal_head(root)
    assert newer is not None
    done = run_cli("gate", str(root), "--quiet", "--journal-head", newer.digest)
    assert done.code == 0, done.stdout + done.stderr


def test_a_kept_head_with_a_damaged_time_still_names_the_rewrite_not_a_harness_bug(
    tmp_path: Path,
) -> None:
    # The store is appended to by every campaign of the tree: a line whose `t` is "soon" once
    # reached the last-resort handler ("a harness bug") instead of saying the journal changed.
    root, _ = _copy(tmp_path)
    store = tmp_path / "reports" / "history" / "journal-heads.jsonl"
    store.parent.mkdir(parents=True)
    entry = {"campaign": "demo/20261204T230934Z", "head": "0" * 64, "events": 3, "t": "soon"}
    store.write_text(json.dumps(entry) + "\n", encoding="utf-8")
    refused = run_cli("gate", str(root))
    assert refused.code == EXIT_INFRASTRUCTURE, refused.stdout + refused.stderr
    assert "rewritten since a time the store does not say" in refused.stderr, refused.stderr
    assert "harness bug" not in refused.stderr and "Traceback" not in refused.stderr
