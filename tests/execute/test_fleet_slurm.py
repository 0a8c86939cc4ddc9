"""Slurm boxes through ``harness run``: the fleet's Slurm worker on the one-node test cluster.

A fleet of the local box and a Slurm box end to end with its per-box report; a job scancelled
mid-run and retried by the campaign; and a harness SIGKILLed with jobs queued and running,
whose ``--resume`` cancels them, keeps what they finished, and finishes the campaign without a
run lost or made twice.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.formats.records import Journal
from tests.conftest import DATA, REPO, CliResult, run_cli, start_campaign
from tests.slurm import PARTITION, LocalCluster, slurm_cluster  # noqa: F401

pytestmark = pytest.mark.slow
TINY = DATA / "cards" / "e2e" / "tiny.yaml"
LONG_RUNS = {
    "max_tokens: 8": "max_tokens: 32",
    "requests: 2}": "requests: 8}",
    "requests: 2, shift: true}": "requests: 8, shift: true}",
}


def _slurm_box(tmp_path: Path) -> str:
    return (
        f"{{kind: slurm, name: cluster, partition: {PARTITION}, "
        f"shared_dir: {tmp_path / 'shared'}, python: {sys.executable}, "
        f"setup: ['export PYTHONPATH={REPO}']}}"
    )


def _card(tmp_path: Path, boxes: str, cycles: int, extra: dict[str, str] | None = None) -> Path:
    text = TINY.read_text(encoding="utf-8").replace("box: local", boxes)
    text = text.replace("campaign: tiny", "campaign: slurm-fleet")
    for old, new in {"cycles: 1": f"cycles: {cycles}", **(extra or {})}.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "card.yaml"
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _harness(*args: str) -> CliResult:
    return run_cli(*args, timeout_s=900)


def _records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/run.json"))]


def _events(root: Path) -> list[dict[str, Any]]:
    return Journal(root / "journal.jsonl").events()


def _wait(reports: Path, ready: Any, timeout_s: float = 240) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for journal in reports.glob("*/*/journal.jsonl"):
            if ready(journal.parent):
                return journal.parent
        time.sleep(0.2)
    raise AssertionError("the campaign made no progress on the cluster")


def _job_booted(root: Path) -> tuple[str, str] | None:
    """(job id, job folder) of a job whose runtime has booted, once one has."""
    jobs = root.parent.parent.parent / "shared" / root.parent.name / root.name / "jobs"
    for job_dir in sorted(jobs.glob("*")):
        journal = Journal(job_dir / "journal.jsonl")
        if any(e["event"] == "boot" for e in journal.events()) and (job_dir / "job.json").is_file():
            info = json.loads((job_dir / "job.json").read_text())
            return str(info["job_id"]), str(job_dir)
    return None


def _job_with_a_run_done(root: Path) -> tuple[str, str] | None:
    """(job id, a run id) of a job that has finished a run in its folder, once one has."""
    jobs = root.parent.parent.parent / "shared" / root.parent.name / root.name / "jobs"
    for job_dir in sorted(jobs.glob("*")):
        done = [e for e in Journal(job_dir / "journal.jsonl").events() if e["event"] == "run_done"]
        if done and (job_dir / "job.json").is_file():
            info = json.loads((job_dir / "job.json").read_text())
            return str(info["job_id"]), str(done[0]["run_id"])
    return None


def _queue(cluster: LocalCluster) -> list[str]:
    listed = cluster.run("squeue", "--noheader", "--format=%i %j %T")
    return [line for line in listed.stdout.splitlines() if "harness-slurm-fleet" in line]


def test_a_fleet_of_the_local_box_and_a_slurm_box(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    card = _card(tmp_path, f"boxes: [{{name: a}}, {_slurm_box(tmp_path)}]", cycles=4)
    reports = tmp_path / "reports"
    result = _harness("run", str(card), "--reports", str(reports), "--quiet")
    assert result.code == 0, result.stdout + result.stderr
    root = next(reports.glob("slurm-fleet/*"))
    records = _records(root)
    assert Counter(r["box"] for r in records) == {"a": 8, "cluster": 8}
    assert all(r["status"] == "ok" for r in records)
    on_cluster = [r for r in records if r["box"] == "cluster"]
    assert all(r["node"] == slurm_cluster.node and r["slurm_job_id"] for r in on_cluster)
    assert len({r["slurm_job_id"] for r in on_cluster}) == 2  # one job a cohort
    assert all(r["slurm_job_id"] is None for r in records if r["box"] == "a")
    events = _events(root)
    done = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert len(done) == len(set(done)) == 16
    ends = [e for e in events if e["event"] == "slurm_job_end"]
    assert len(ends) == 2 and {e["state"] for e in ends} == {"COMPLETED"}
    summary = json.loads(_harness("analyze", str(root), "--json").stdout)
    assert {r["box"] for r in summary["fleet"]["boxes"]} == {"a", "cluster"}
    assert 'id="per-box"' in (root / "report.html").read_text(encoding="utf-8")
    assert (root / "boxes" / "cluster.json").is_file() and (root / "boxes" / "a.json").is_file()
    assert not _queue(slurm_cluster)


def test_cold_runs_on_a_slurm_box_prime_their_fresh_job_folder(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Each job starts from an empty cache folder; its first cold run boots once to write the
    # refbox's slow tier, then every run evicts it and runs cold.
    extra = {"cache_states: [warm]": "cache_states: [cold]"}
    card = _card(tmp_path, f"box: {_slurm_box(tmp_path)}", cycles=1, extra=extra)
    result = _harness("run", str(card), "--reports", str(tmp_path / "reports"), "--quiet")
    assert result.code == 0, result.stdout + result.stderr
    root = next((tmp_path / "reports").glob("slurm-fleet/*"))
    records = _records(root)
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    assert all(r["runtime"]["evicted"] and r["cache_state"] == "cold" for r in records)
    assert not _queue(slurm_cluster)


def test_a_job_scancelled_mid_run_fails_its_runs_and_the_campaign_retries_them(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    extra = {**LONG_RUNS, "retries: 0": "retries: 1"}
    card = _card(tmp_path, f"box: {_slurm_box(tmp_path)}", cycles=2, extra=extra)
    reports = tmp_path / "reports"
    process = start_campaign(card, reports)
    try:
        root = _wait(reports, _job_booted)
        victim = _job_booted(root)
        assert victim is not None
        slurm_cluster.run("scancel", victim[0])
        assert process.wait(timeout=600) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    events = _events(root)
    ends = {e["job_id"]: e for e in events if e["event"] == "slurm_job_end"}
    assert ends[victim[0]]["state"] == "CANCELLED"
    failed = [e for e in events if e["event"] == "run_failed"]
    assert failed and all(f"slurm job {victim[0]} CANCELLED" in e["reason"] for e in failed)
    submitted = [e for e in events if e["event"] == "slurm_submitted"]
    assert [e["attempt"] for e in submitted] == [1, 2]  # the lost cohort, once more
    assert len(submitted[1]["jobs"]) == 1
    records = _records(root)
    assert len(records) == 8 and all(r["status"] == "ok" for r in records)
    retried = {e["run_id"] for e in failed}
    assert all(r["slurm_job_id"] != victim[0] for r in records if r["run_id"] in retried)
    assert not _queue(slurm_cluster)


def test_sigkill_with_jobs_on_the_cluster_resumes_without_loss_or_duplicates(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    card = _card(tmp_path, f"box: {_slurm_box(tmp_path)}", cycles=2, extra=LONG_RUNS)
    reports = tmp_path / "reports"
    process = start_campaign(card, reports)
    root = _wait(reports, _job_with_a_run_done)
    os.killpg(process.pid, signal.SIGKILL)  # the harness; its jobs stay with Slurm
    process.wait()
    finished = _job_with_a_run_done(root)
    assert finished is not None
    names = [e["name"] for e in _events(root) if e["event"] == "slurm_submitted"]
    assert names and _queue(slurm_cluster)  # the killed harness's jobs are still there
    resumed = _harness("run", "--resume", str(root), "--quiet")
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    events = _events(root)
    cancelled = [e["name"] for e in events if e["event"] == "slurm_cancelled"]
    assert names[0] in cancelled
    done = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert len(done) == len(set(done)) == 8
    records = _records(root)
    assert len(records) == 8 and all(r["status"] == "ok" for r in records)
    # What the killed session's job finished is merged, not run again.
    job_id, run_id = finished
    (kept,) = [r for r in records if r["run_id"] == run_id]
    assert kept["slurm_job_id"] == job_id
    recovered = [e for e in events if e["event"] == "slurm_job_end" and e.get("recovered")]
    assert job_id in {e["job_id"] for e in recovered}
    assert not _queue(slurm_cluster)
