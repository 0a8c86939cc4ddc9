"""A killed `harness collect` loses nothing that matters and leaves nothing running: its boot is
journalled in the output folder, and the next collection into that folder stops the runtime the
killed one left (on a GPU box it would hold the memory the next boot needs). For real, on the
reference runtime, with a slow boot so the kill lands while it starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.execute.collect import COLLECT_JOURNAL
from harness.formats.records import Journal
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
