"""Same-boot cells end to end on the reference runtime (``design.boot: per-cycle``): one boot
per cycle counted from the journal, each run its own slice of the ring and counters, a live
knob the runtime refuses failing its block, and a SIGKILL mid-boot that ``--resume`` repairs
without losing or repeating a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.formats.records import Journal
from harness.sim.decisions import lockstep
from harness.sim.trace_files import load_trace
from tests.conftest import DATA, REPO, run_cli, start_campaign
from tests.execute.test_execute_local import _card_with, _run, _stop_leftovers

pytestmark = pytest.mark.slow
CARD = DATA / "cards" / "e2e" / "same-boot.yaml"


def _card(tmp_path: Path, replace: dict[str, str] | None = None) -> Path:
    return _card_with(tmp_path, "same-boot.yaml", replace or {}, source=CARD)


def test_a_per_cycle_campaign_boots_once_per_cycle_and_slices_each_run(tmp_path: Path) -> None:
    campaign, done, failed = _run(_card(tmp_path), tmp_path / "reports")
    assert failed == [] and len(done) == 8
    events = Journal(campaign.root / "journal.jsonl").events()
    boots = [e for e in events if e["event"] == "boot"]
    assert len(boots) == 2  # two cycles, one boot each
    stopped = {(e["run_id"], e["pgid"]) for e in events if e["event"] == "boot_stopped"}
    assert {(e["run_id"], e["pgid"]) for e in boots} == stopped
    plan = json.loads((campaign.root / "plan.json").read_text())
    by_cycle: dict[int, set[str]] = {}
    last_seq = {}
    for run in plan["runs"]:
        folder = campaign.run_dir(run["run_id"])
        record = json.loads((folder / "run.json").read_text())
        assert record["status"] == "ok" and record["runtime"]["boot_shared"] is True
        by_cycle.setdefault(run["cycle"], set()).add(record["boot_id"])
        starts = [e for e in events if e["event"] == "run_start" and e["run_id"] == run["run_id"]]
        assert [e["boot_id"] for e in starts] == [record["boot_id"]]
        # Each run's ring is its own: the records after the previous run's on the same boot.
        ring = pd.read_parquet(folder / "ring.parquet")
        assert len(ring) > 0 and record["ring_lost"] == 0
        first = int(ring["seq"].min())
        assert first == last_seq.get(record["boot_id"], 0) + 1
        last_seq[record["boot_id"]] = int(ring["seq"].max())
        # Counters are the run's own: the reset cleared them, every run decodes the same.
        counters = json.loads((folder / "counters.json").read_text())
        assert counters["delta"]["decode_tokens"] == 28
        # The run's own trace, its cell's knobs live on the shared runtime: it replays alone.
        trace = load_trace(folder / "route-trace.jsonl")
        knobs = trace.knob_changes[-1].knobs if trace.knob_changes else trace.knobs
        assert knobs.drain_every == int(record["knobs"]["drain_every"])
        assert len(trace.steps) == int(ring["tokens"].sum())
        assert lockstep(trace).divergent == 0
        first_of_boot = record["run_id"] in {e["run_id"] for e in boots}
        assert ("after_reset_step" in trace.header) is not first_of_boot
    assert [len(ids) for ids in by_cycle.values()] == [1, 1]
    assert len(set().union(*by_cycle.values())) == 2
    # The report's order strip frames the blocks that shared a boot: one frame per cycle.
    report = run_cli("report", str(campaign.root))
    assert report.code == 0, report.stderr
    html = (campaign.root / "report.html").read_text(encoding="utf-8")
    assert html.count('<div class="boot" title="boot ') == 2
    assert "boot per-cycle: a frame holds the blocks that ran on one boot" in html
    # Every run on the shared boot followed its reset and a washout of its own cell: the
    # blocks read as washed, so a decided label stands on D̄ (the deployed effect), and two
    # cycles say so rather than fail closed (the unwashed case is pinned in
    # tests/analyze/test_crossover.py and tests/gate/test_better.py).
    analyzed = run_cli("analyze", str(campaign.root))
    assert analyzed.code == 0, analyzed.stderr
    table = pd.read_parquet(campaign.root / "analysis" / "comparisons.parquet")
    assert table["washed"].all(), table[["metric", "washed"]]
    decided = table[table["raw_label"].isin(["better", "worse"])]
    assert (decided["label"].isin([*decided["raw_label"], "confounded"])).all()
    counters = decided[decided["deterministic"]]
    assert len(counters) > 0 and (counters["label"] == counters["raw_label"]).all()
    assert counters["warnings"].str.contains("every block followed a washout").all()


def test_a_live_knob_the_runtime_refuses_fails_its_block_with_the_log_tail(
    tmp_path: Path,
) -> None:
    # A profile copied beside the card that takes a decay of 0 (the shipped one refuses it, as
    # the runtime does): the runtime refuses the live change at the reset.
    shipped = REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml"
    (tmp_path / "runtimes").mkdir()
    strict = r'"[0-9]*[1-9][0-9]*(\\.[0-9]+)?|[0-9]+\\.[0-9]*[1-9][0-9]*|inf"'
    text = shipped.read_text(encoding="utf-8")
    assert strict in text
    loose = text.replace(strict, r'"[0-9]+(\\.[0-9]+)?|inf"')
    (tmp_path / "runtimes" / "refbox.yaml").write_text(loose, encoding="utf-8")
    card = _card(
        tmp_path,
        {
            "control: control\n": "",
            "order: abba, cycles: 2": "order: sequential, cycles: 1",
            "drain_every: 64}": "drain_every: 64, decay_half_life_steps: 256}",
            "drain_every: 2}": "drain_every: 2, decay_half_life_steps: 0}",
            "{kind: exact_outputs, min_match: all}": "{kind: exact_outputs, vs: control}",
        },
    )
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert len(done) == 1 and len(failed) == 1
    record = json.loads((campaign.run_dir(failed[0]) / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["reason"].startswith("reset {")
    assert "rejected: HTTP 400" in record["reason"] and "decay_half_life_steps" in record["reason"]
    assert "refbox: listening on" in record["log_tail"]
    events = Journal(campaign.root / "journal.jsonl").events()
    # The refused change stopped the boot it would have run on.
    assert len([e for e in events if e["event"] == "boot"]) == 1
    assert len([e for e in events if e["event"] == "boot_stopped"]) == 1


def test_sigkill_mid_boot_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    # One boot for the whole campaign (design.boot: per-campaign, the other shared design).
    reports = tmp_path / "reports"
    try:
        card = _card(tmp_path, {"boot: per-cycle": "boot: per-campaign"})
        _killed_mid_boot_resumes(card, reports)
    finally:
        _stop_leftovers(reports)


def _killed_mid_boot_resumes(card: Path, reports: Path) -> None:
    process = start_campaign(card, reports)
    journal_path = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = list(reports.glob("same-boot/*/journal.jsonl"))
        # Two runs of cycle 0 done: its boot is carrying the third.
        if found and sum('"run_done"' in line for line in found[0].read_text().splitlines()) >= 2:
            journal_path = found[0]
            break
        time.sleep(0.1)
    assert journal_path is not None, "campaign made no progress"
    os.killpg(process.pid, signal.SIGKILL)  # the harness and the shared runtime
    process.wait()
    done_before = Journal(journal_path).done_runs()
    assert 2 <= len(done_before) < 4
    resumed = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(journal_path.parent), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = Journal(journal_path).events()
    done = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert len(done) == len(set(done)) == 8  # every run once, none twice
    for run_id in done_before:
        assert [e["event"] for e in events if e.get("run_id") == run_id].count("run_start") == 1
    # Per campaign: the killed boot carried the first runs, one new boot carried all the rest.
    boots = [e for e in events if e["event"] == "boot"]
    assert len(boots) == 2
    starts = [e for e in events if e["event"] == "run_start"]
    (killed_boot,) = {e["boot_id"] for e in starts if e["run_id"] in done_before}
    after = {e["boot_id"] for e in starts if e["run_id"] not in done_before} - {killed_boot}
    assert len(after) == 1
    # The shared boot the killed harness left was stopped by the resume.
    assert any(e["event"] == "orphan_killed" for e in events)
    for boot in (e for e in events if e["event"] == "boot"):
        with pytest.raises(ProcessLookupError):
            os.killpg(boot["pgid"], 0)
    # Cycle 0's runs not done went on a new boot of their own; cycle 1 had one.
    boot_ids = {}
    for run_id in done:
        record = json.loads((journal_path.parent / "runs" / run_id / "run.json").read_text())
        boot_ids[run_id] = record["boot_id"]
    cycle0 = sorted(r for r in done if "-c0-" in r)
    assert len({boot_ids[r] for r in cycle0}) == 2
    assert len({boot_ids[r] for r in done if "-c1-" in r}) == 1
