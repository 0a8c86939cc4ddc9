"""Long runs: ring draining without loss, RSS sampling, and checkpointed soaks that resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analyze.metrics import RSS_MIN_SAMPLES, rss_growth_pct, rss_metrics, run_metrics
from harness.boxes.local import LocalBox
from harness.card import load_card
from harness.drive.client import PhasePlan
from harness.execute.campaign import new_campaign_dir
from harness.execute.resume import split_phases
from harness.execute.run import CampaignRunner
from harness.execute.soak import (
    DrainResult,
    MonitorSettings,
    RingStore,
    assemble_ring,
    drain_local,
    drain_remote,
)
from harness.formats.records import CampaignDir, Journal, read_json
from harness.formats.ring import RingGeometry, RingWriter
from harness.formats.ring_read import read_ring_since
from harness.plan.build import build_plan
from harness.profiles.box import BoxSpec
from tests.conftest import DATA, REPO

GEOMETRY = RingGeometry(2, 8, 2, 4)

CARD = f"""
campaign: soaktest
box: local
runtime: refbox
prompts:
  pools: [{DATA}/pools/small.jsonl]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 32
  warmup_requests: 1
  request_timeout_s: 60
  phases:
    - PHASE
cells:
  candidate:
    args: ["--ring-capacity", "CAPACITY"]
    env:
      REFBOX_LAYERS: "8"
      REFBOX_EXPERTS: "64"
      REFBOX_HOT_SLOTS: "32"
      REFBOX_EXPERT_BYTES: "4096"
# retries: 1 rides over a rare boot race outside this feature (a group probed before setsid).
design: {{order: sequential, cycles: 1, repeats: 1, cache_states: [warm], retries: 1, washout: 0}}
gates:
  - {{kind: soak, min_duration_s: 1, max_lost_records: 0, rss_growth_pct_max: 50}}
"""


def _card(tmp_path: Path, phase: str, capacity: int = 64) -> Path:
    text = CARD.replace("PHASE", phase).replace("CAPACITY", str(capacity))
    path = tmp_path / "soak.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _records(count: int, start: int = 0) -> np.ndarray:
    rows = np.arange(start, start + count, dtype=np.int64)
    return np.stack([rows * 10, rows, rows % 3, rows, rows % 2, rows % 5, rows * 7, rows % 4], 1)


# ---- draining: local and box-side readers agree ------------------------------------------------


# Few examples: every box-side drain starts a Python on the box (here, locally).
@settings(max_examples=6, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=40),
    batches=st.lists(st.integers(min_value=0, max_value=90), min_size=1, max_size=4),
)
def test_draining_in_batches_keeps_every_record_or_counts_it_lost(
    tmp_path_factory: pytest.TempPathFactory, capacity: int, batches: list[int]
) -> None:
    folder = tmp_path_factory.mktemp("drain")
    path = folder / "ring.bin"
    box = LocalBox("local", BoxSpec())
    store = RingStore(folder / "chunks", boot=0)
    after_remote = 0
    written = 0
    with RingWriter(path, capacity, GEOMETRY) as writer:
        for batch in batches:
            writer.extend(_records(batch, written))
            written += batch
            local = drain_local(str(path), store.after_sequence)
            remote = drain_remote(box, sys.executable, str(path), after_remote, limit=25)
            # The box-side reader, even in 25-record pieces, returns what the library reads.
            pieces = [remote.frame]
            while not remote.caught_up:
                remote = drain_remote(box, sys.executable, str(path), remote.after_sequence, 25)
                pieces.append(remote.frame)
            after_remote = remote.after_sequence
            got = pd.concat(pieces, ignore_index=True)
            pd.testing.assert_frame_equal(got, local.frame.reset_index(drop=True))
            # With the writer idle, the library's reader is exact: all three agree.
            library = read_ring_since(path, store.after_sequence)
            pd.testing.assert_frame_equal(local.frame, library.frame.reset_index(drop=True))
            assert (local.lost, local.after_sequence) == (library.lost, library.sequence)
            store.add(local)
    store.flush()
    ring = assemble_ring(folder / "chunks")
    kept = len(ring)
    assert kept + store.lost == written  # every record is either kept or counted lost
    if kept:
        assert ring["seq"].is_monotonic_increasing and ring["seq"].is_unique
        expected = _records(written)[ring["seq"].to_numpy() - 1]
        assert (ring[["t_ns"]].to_numpy()[:, 0] == expected[:, 0]).all()


def test_assemble_dedups_and_trims_an_interrupted_boot(tmp_path: Path) -> None:
    store = RingStore(tmp_path, boot=0)
    frame = pd.DataFrame({"seq": np.arange(1, 11), "t_ns": np.arange(10)}).astype("int64")
    store.add(DrainResult(frame.iloc[:6], 6, True, 0, 0))
    store.flush()
    store.add(DrainResult(frame.iloc[4:], 10, True, 0, 0))  # overlaps: seq 5 and 6 twice
    store.flush()
    second = RingStore(tmp_path, boot=1)
    second.add(DrainResult(frame.iloc[:3], 3, True, 0, 0))
    second.flush()
    ring = assemble_ring(tmp_path, caps={0: 8})
    assert list(zip(ring["boot"], ring["seq"], strict=True)) == [
        *((0, s) for s in range(1, 9)),
        *((1, s) for s in range(1, 4)),
    ]


@settings(max_examples=100, deadline=None)
@given(
    durations=st.lists(
        st.one_of(st.none(), st.floats(min_value=0.5, max_value=500)), min_size=1, max_size=5
    ),
    checkpoint_s=st.floats(min_value=1, max_value=100),
)
def test_split_phases_covers_each_phase_in_pieces_no_longer_than_a_checkpoint(
    durations: list[float | None], checkpoint_s: float
) -> None:
    phases = [PhasePlan(f"p{i}", i, (), d) for i, d in enumerate(durations)]
    pieces = split_phases(phases, checkpoint_s)
    for phase in phases:
        mine = [p for p in pieces if p.name == phase.name]
        if phase.duration_s is None:
            assert mine == [phase]
            continue
        assert sum(p.duration_s or 0 for p in mine) == pytest.approx(phase.duration_s)
        assert all(0 < (p.duration_s or 0) <= checkpoint_s + 1e-9 for p in mine)
    assert [p.index for p in pieces] == sorted(p.index for p in pieces)


# ---- RSS growth ----------------------------------------------------------------------------------


def test_rss_growth_is_the_last_quarter_median_over_the_first() -> None:
    rng = np.random.default_rng(4)
    t = np.sort(rng.uniform(0, 100, 200))
    rss = 1e9 * (1 + 0.002 * t) + rng.normal(0, 1e6, t.size)
    warm = np.arange(t.size) < 10  # the warm-up's samples are left out
    rss[warm] = 5e9
    samples = pd.DataFrame(
        {"t_s": t, "boot": 0, "scored": ~warm, "rss_bytes": rss, "swapout_pages": 3.0}
    )
    scored_t, scored_rss = t[~warm], rss[~warm]
    span = scored_t.max() - scored_t.min()
    first = np.median(scored_rss[scored_t <= scored_t.min() + span / 4])
    last = np.median(scored_rss[scored_t >= scored_t.max() - span / 4])
    assert rss_growth_pct(samples) == pytest.approx(100 * (last / first - 1), rel=1e-12)
    assert 10 < (rss_growth_pct(samples) or 0) < 20
    metrics = rss_metrics(samples)
    assert metrics["rss_peak_bytes"] == pytest.approx(5e9)
    assert metrics["sampled_swapout_pages"] == 0
    # Too few samples: no figure, so a soak gate fails closed instead of passing.
    assert rss_growth_pct(samples.iloc[: 10 + RSS_MIN_SAMPLES - 1]) is None
    # Two boots: memory restarts at a boot, so the worst boot is reported.
    flat = samples.assign(boot=1, rss_bytes=2e9)
    both = pd.concat([samples, flat], ignore_index=True)
    assert rss_growth_pct(both) == pytest.approx(rss_growth_pct(samples))


# ---- end to end on the reference runtime -----------------------------------------------------


def _run(card: Path, reports: Path, monitor: MonitorSettings) -> tuple[CampaignDir, str]:
    loaded = load_card(card)
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, reports)
    outcome = CampaignRunner(loaded, plan, campaign, monitor=monitor).execute()
    assert outcome.failed == [], campaign.run_record(outcome.failed[0])
    return campaign, outcome.done[0]


@pytest.mark.slow
def test_a_tiny_ring_drained_often_keeps_every_step_and_one_never_drained_loses(
    tmp_path: Path,
) -> None:
    # 128 slots drained every 10 ms: a drain may come ~120 ms late (a loaded two-core machine
    # once starved the drainer for 22 steps of a 64-slot ring) and still lose nothing.
    card = _card(tmp_path, "{name: main, domains: [en-prose, python], requests: 24}", 128)
    fast = MonitorSettings(drain_interval_s=0.01, sample_interval_s=0.05)
    campaign, run_id = _run(card, tmp_path / "fast", fast)
    folder = campaign.run_dir(run_id)
    record = read_json(folder / "run.json")
    ring = pd.read_parquet(folder / "ring.parquet")
    requests = pd.read_parquet(folder / "requests.parquet")
    steps = int(requests["completion_tokens"].sum())  # one ring record per generated token
    assert steps == 25 * 32 and steps > 6 * 128  # the 128-slot ring wrapped six times
    canaries = read_json(folder / "canaries.json")["canaries"]
    steps += sum(len(c["pieces"]) for c in canaries)  # the boot's canaries ran first
    assert steps == 25 * 32 + 3 * 16
    assert ring["seq"].tolist() == list(range(1, steps + 1))
    assert record["ring_lost"] == 0
    monitor = read_json(folder / "monitor.json")
    assert monitor["drains"] > 10 and monitor["errors"] == []
    samples = pd.read_parquet(folder / "samples.parquet")
    assert len(samples) >= RSS_MIN_SAMPLES
    alive = samples["rss_bytes"].dropna()
    assert (alive > 10 * 2**20).all()  # a Python runtime is well over 10 MiB resident
    assert samples["scored"].any() and samples["t_s"].is_monotonic_increasing
    metrics, _ = run_metrics(
        requests,
        pd.read_parquet(folder / "chunks.parquet"),
        read_json(folder / "counters.json"),
        ring,
        concurrency=1,
        window_s=0.5,
        converged_span_s=1,
        hold_s=0,
        samples=samples,
    )
    assert metrics["rss_growth_pct"] is not None

    slow = MonitorSettings(drain_interval_s=3600, sample_interval_s=3600)
    campaign, run_id = _run(card, tmp_path / "slow", slow)
    folder = campaign.run_dir(run_id)
    ring = pd.read_parquet(folder / "ring.parquet")
    assert len(ring) == 128
    assert read_json(folder / "run.json")["ring_lost"] == steps - 128  # loss is reported


_HARNESS = """
import sys
from pathlib import Path
from harness.card import load_card
from harness.execute.campaign import new_campaign_dir
from harness.execute.run import CampaignRunner
from harness.execute.soak import MonitorSettings
from harness.plan.build import build_plan
loaded = load_card(Path(sys.argv[1]))
plan = build_plan(loaded)
campaign = new_campaign_dir(loaded, plan, Path(sys.argv[2]))
monitor = MonitorSettings(drain_interval_s=0.05, sample_interval_s=0.1)
CampaignRunner(loaded, plan, campaign, monitor=monitor, checkpoint_s=1.0).execute()
"""


def _alive(pgid: int) -> bool:
    return LocalBox("local", BoxSpec()).group_alive(pgid)


@pytest.mark.slow
def test_a_soak_killed_mid_way_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    card = _card(tmp_path, "{name: soak, domains: [en-prose, python], duration_s: 5}", 4096)
    reports = tmp_path / "reports"
    harness = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, str(card), str(reports)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    segments_path = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and segments_path is None:
        for path in reports.glob("soaktest/*/runs/*/checkpoint/segments.jsonl"):
            if sum('"segment_done"' in line for line in path.read_text().splitlines()) >= 2:
                segments_path = path
        time.sleep(0.05)
    assert segments_path is not None, "the soak journalled no checkpoint"
    os.killpg(harness.pid, signal.SIGKILL)  # the harness dies; its runtime (own session) lives
    harness.wait()
    events = Journal(segments_path).events()
    first_boot = next(e for e in events if e["event"] == "boot")
    kept_segments = [e["segment"] for e in events if e["event"] == "segment_done"]
    kept_seq = [e["ring_seq"] for e in events if e["event"] == "segment_done"][-1]
    assert _alive(first_boot["pgid"])
    run_dir = segments_path.parent.parent
    before = pd.concat(
        [pd.read_parquet(p) for p in sorted(segments_path.parent.glob("seg-*.requests.parquet"))]
    )
    root = run_dir.parent.parent

    loaded = load_card(card)
    outcome = CampaignRunner(
        loaded,
        build_plan(loaded),
        CampaignDir(root),
        monitor=MonitorSettings(drain_interval_s=0.05, sample_interval_s=0.1),
    ).execute()
    assert outcome.failed == [] and outcome.done == [run_dir.name]
    assert not _alive(first_boot["pgid"])  # the orphaned runtime was stopped, not leaked
    journal = [e["event"] for e in Journal(root / "journal.jsonl").events()]
    assert "orphan_killed" in journal and "run_resume" in journal

    record = read_json(run_dir / "run.json")
    assert record["status"] == "ok" and record["ring_lost"] == 0
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert set(requests["boot"]) == {0, 1}
    # The first boot's requests survive exactly as they were checkpointed.
    old = requests[requests["boot"] == 0].drop(columns=["request"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(old, before.drop(columns=["request"]).reset_index(drop=True))
    assert requests["request"].tolist() == list(range(len(requests)))
    assert requests["ok"].all() and requests["first_after_boot"].sum() == 2
    assert requests.loc[requests["boot"] == 1, "warmup"].iloc[0]  # a fresh boot warms up again
    ring = pd.read_parquet(run_dir / "ring.parquet")
    boot0 = ring[ring["boot"] == 0]["seq"].tolist()
    boot1 = ring[ring["boot"] == 1]["seq"].tolist()
    assert boot0 == list(range(1, kept_seq + 1))  # through the last checkpoint, nothing after
    assert boot1 == list(range(1, len(boot1) + 1)) and boot1
    monitor = read_json(run_dir / "monitor.json")
    assert monitor["boots"][0]["segments"] == kept_segments
    assert monitor["segments_planned"] == 5
    samples = pd.read_parquet(run_dir / "samples.parquet")
    assert set(samples["boot"]) == {0, 1}
    counters = json.loads((run_dir / "counters.json").read_text())
    assert counters["earlier_boots"][0]["delta"]["decode_tokens"] > 0
    assert not list((run_dir / "checkpoint").glob("*.parquet"))  # folded into the run's files
