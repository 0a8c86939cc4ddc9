"""Faults fail fast and leave nothing running: a hung runtime, on the real reference runtime."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.card import load_card
from harness.execute.run import CampaignRunner, new_campaign_dir
from harness.plan import build_plan
from harness.records import Journal
from tests.conftest import DATA

TINY = DATA / "cards" / "e2e" / "tiny.yaml"
pytestmark = pytest.mark.slow
WIDE = 'wide:\n    env: {REFBOX_LAYERS: "2"'


def _card_with(tmp_path: Path, replace: dict[str, str]) -> Path:
    text = TINY.read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "card.yaml"
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _events(root: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    events = Journal(root / "journal.jsonl").events()
    return [e for e in events if run_id is None or e.get("run_id") == run_id]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _assert_gone(events: list[dict[str, Any]], root: Path) -> None:
    """Every runtime group the journal booted is gone, and no process names the campaign."""
    boots = [e for e in events if e["event"] == "boot"]
    assert boots
    for boot in boots:
        # A stopped runtime is a zombie until init reaps it, which here takes a second or two.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(boot["pgid"], 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        with pytest.raises(ProcessLookupError):
            os.killpg(boot["pgid"], 0)
    for proc in Path("/proc").glob("[0-9]*"):
        cmdline = _cmdline(int(proc.name))
        assert str(root) not in cmdline, cmdline


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_hung_runtime_fails_its_run_within_one_request_timeout(
    tmp_path: Path, concurrency: int
) -> None:
    # The warmup (32 tokens) and the first scored request (32) complete; the second scored
    # request streams 3 tokens and the runtime hangs for good. With two in flight, the third
    # was sent when the first ended (the reference runtime serves one request at a time), so
    # its timeout would come a whole request later than the hung one's.
    timeout_s = 5
    card = _card_with(
        tmp_path,
        {
            WIDE: 'wide:\n    env: {REFBOX_HANG_AFTER_TOKENS: "67", REFBOX_LAYERS: "2"',
            "max_tokens: 8": "max_tokens: 32",
            "request_timeout_s: 20": (
                f"request_timeout_s: {timeout_s}\n  concurrency: {concurrency}"
            ),
            "requests: 2}": "requests: 4}",
            "requests: 2, shift: true}": "requests: 4, shift: true}",
            "retries: 0": "retries: 1",
        },
    )
    loaded = load_card(card)
    full = build_plan(loaded)
    hung = next(r for r in full.runs if r.cell == "wide")
    plan = dataclasses.replace(full, runs=(hung,))
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    outcome = CampaignRunner(loaded, plan, campaign).execute()
    assert outcome.failed == [hung.run_id]

    folder = campaign.run_dir(hung.run_id)
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "failed" and record["attempt"] == 2
    reason = record["reason"]
    assert reason.startswith("runtime hung: request "), reason
    assert f"timed out after {timeout_s} s with no token from any request" in reason
    # Eight scored requests: one completed, one hung, and with two in flight a third waited.
    cancelled = concurrency - 1
    assert f"stopped sending ({cancelled} request" in reason
    assert f"cancelled, {8 - 2 - cancelled} not sent)" in reason
    assert "raise workload.request_timeout_s" in reason
    assert "--hang-after-tokens 67 reached; hanging" in record["log_tail"]

    requests = pd.read_parquet(folder / "requests.parquet")
    scored = requests[~requests["warmup"]]
    assert len(scored) == 2 + cancelled  # nothing was sent once the runtime was judged hung
    assert scored["ok"].sum() == 1
    timed_out = scored[scored["error"].str.startswith("timed out")]
    assert len(timed_out) == 1
    assert (scored["error"].str.startswith("cancelled: the runtime was judged hung")).sum() == (
        cancelled
    )
    # No request started after the hung one timed out.
    hung_row = timed_out.iloc[0]
    assert (scored["t_start_s"] < hung_row["t_start_s"] + timeout_s).all()
    # One request timeout and the stop, not one timeout per remaining request (about 30 s).
    busy_s = record["ended_at"] - record["started_at"] - record["runtime"]["boot_s"]
    assert busy_s < 2 * timeout_s + 10, busy_s

    # The retry booted a fresh runtime, after the hung one was stopped.
    events = _events(campaign.root, hung.run_id)
    kinds = [e["event"] for e in events]
    assert kinds.count("run_start") == 2 and kinds.count("run_failed") == 2
    boots = [e["pgid"] for e in events if e["event"] == "boot"]
    stopped = [e["pgid"] for e in events if e["event"] == "boot_stopped"]
    assert len(set(boots)) == 2 and stopped == boots
    assert kinds.index("boot_stopped") < kinds.index("run_start", 1)
    _assert_gone(events, campaign.root)
