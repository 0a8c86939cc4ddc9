"""A killed `harness collect` loses nothing that matters and leaves nothing running: its boot is
journalled in the output folder, and the next collection into that folder stops the runtime the
killed one left (on a GPU box it would hold the memory the next boot needs). For real, on the
reference runtime, with a slow boot so the kill lands while it starts. A line naming a runtime
outside the boot folders of collections into that folder stops nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.execute.collect import COLLECT_JOURNAL
from harness.formats.records import Journal
from harness.runtimes.orphans import BOOT_MARK
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # boots the reference runtime twice


def _card(tmp_path: Path, boot_delay_s: int) -> Path:
    """The demo card (its prompts and maps linked beside it), the control booting slowly."""
    folder = tmp_path / "cards"
    folder.mkdir(exist_ok=True)
    for files in ("prompts", "maps"):
        if not (folder / files).exists():
            (folder / files).symlink_to(REPO / "campaigns" / files)
    card = folder / "demo.yaml"
    text = (REPO / "campaigns" / "demo.yaml").read_text(encoding="utf-8")
    knobs = "knobs: {policy: adaptive, drain_every: 128, expert_bytes: 2097152}"
    assert knobs in text
    slow = knobs.replace("}", f", boot_delay_s: {boot_delay_s}}}", 1)
    card.write_text(text.replace(knobs, slow, 1), encoding="utf-8")
    return card


def _alive(pgid: int) -> bool:
    """Any process of the group not a zombie (a stopped runtime's may wait to be reaped)."""
    table = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True).stdout
    return any(
        int(row.split()[0]) == pgid and not row.split()[1].startswith("Z")
        for row in table.splitlines()
        if row.strip()
    )


def test_a_killed_collection_leaves_a_runtime_the_next_one_stops(tmp_path: Path) -> None:
    out = tmp_path / "fit"
    argv = [sys.executable, "-m", "harness", "collect", str(_card(tmp_path, 60)), "-o", str(out)]
    argv += ["--split", "fit", "--domains", "agent", "--max-tokens", "4"]
    harness = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    journal = Journal(out / COLLECT_JOURNAL)
    left = None
    try:
        deadline = time.monotonic() + 60
        while left is None and time.monotonic() < deadline:
            left = next((e["pgid"] for e in journal.events() if e["event"] == "boot"), None)
            time.sleep(0.05)
        assert left is not None, "the collection journalled no boot"
        os.killpg(harness.pid, signal.SIGKILL)  # the harness only: its runtime is in its own group
        harness.wait()
        assert _alive(left), "the runtime died with the harness: nothing to test"

        again = run_cli(
            "collect", str(_card(tmp_path, 0)), "-o", str(out), "--split", "fit",
            "--domains", "agent", "--max-tokens", "4", timeout_s=300,
        )  # fmt: skip
        assert again.code == 0, again.stdout + again.stderr
        assert f"(process group {left})" in again.stdout
        assert not _alive(left)
        events = journal.events()
        assert [e["pgid"] for e in events if e["event"] == "orphan_killed"] == [left]
        # The second boot was stopped and journalled so: a third collection stops nothing.
        boots = [e for e in events if e["event"] == "boot"]
        assert len(boots) == 2 and not _alive(boots[1]["pgid"])
        assert [e["pgid"] for e in events if e["event"] == "boot_stopped"] == [boots[1]["pgid"]]
        counts = json.loads((out / "counts.json").read_text(encoding="utf-8"))
        assert counts, "the second collection saved no counts"
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
        if left is not None and _alive(left):
            os.killpg(left, signal.SIGKILL)


def _sleeper(mark: Path) -> subprocess.Popen[bytes]:
    """A process group of its own marked as a runtime booted in ``mark`` (another collection's)."""
    env = {**os.environ, BOOT_MARK: str(mark)}
    return subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)


def test_a_journal_line_naming_another_collections_folder_kills_nothing(tmp_path: Path) -> None:
    # Any harness-collect-* folder in the temporary directory passed as the collection's own:
    # a planted line naming another collection's boot folder ended that group (exit 0). Only
    # the boot folders a collection into this output folder makes now count.
    out = tmp_path / "fit"
    out.mkdir()
    others = [Path(tempfile.mkdtemp(prefix="harness-collect-")) for _ in range(2)]
    sleepers = [_sleeper(folder) for folder in others]
    try:
        journal = Journal(out / COLLECT_JOURNAL)
        # One boot killed before its group was journalled (found by its mark alone) ...
        journal.append("boot_starting", run_id="planted-mark", mark=str(others[0]))
        # ... and one journalled with its group and identity.
        journal.append("boot_starting", run_id="planted-boot", mark=str(others[1]))
        identity = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(sleepers[1].pid)], capture_output=True, text=True
        ).stdout.strip()
        journal.append("boot", run_id="planted-boot", pgid=sleepers[1].pid, identity=identity)
        done = run_cli(
            "collect", str(_card(tmp_path, 0)), "-o", str(out), "--split", "fit",
            "--domains", "agent", "--max-tokens", "4", timeout_s=300,
        )  # fmt: skip
        assert done.code == 0, done.stdout + done.stderr
        assert all(s.poll() is None for s in sleepers), "another collection's runtime was killed"
        assert not [e for e in journal.events() if e["event"] == "orphan_killed"]
        assert "process group" not in done.stdout
    finally:
        for sleeper in sleepers:
            if sleeper.poll() is None:
                os.kill(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
        for folder in others:
            shutil.rmtree(folder, ignore_errors=True)
