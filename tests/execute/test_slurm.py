"""Slurm boxes for real: a one-node cluster on this machine (tests/slurm.py) runs the jobs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.boxes.interrupts import Interrupted, interrupt_worker
from harness.boxes.local import LocalBox
from harness.card import LoadedCard, load_boxes_file, load_card
from harness.errors import SlurmError
from harness.execute.campaign import new_campaign_dir
from harness.execute.cohorts import CohortBook
from harness.execute.slurm import (
    CohortJob,
    JobEnd,
    JobProgress,
    JobState,
    MergeResult,
    SubmittedArray,
    SubmittedJob,
    cancel_jobs,
    job_progress,
    merge_job,
    read_states,
    submit_cohorts,
    wait_for_jobs,
)
from harness.execute.slurm import submit as slurm_submit
from harness.execute.slurm.job import probe_node
from harness.execute.slurm.latency import measure_overhead
from harness.execute.slurm.states import parse_sacct, parse_squeue
from harness.execute.slurm.submit import executor_parameters, job_dir_name, submit_calls
from harness.formats.records import RUN_FAILED, RUN_OK, CampaignDir, Journal, read_json
from harness.plan.build import build_plan, cohort_key
from harness.profiles.box import BoxSpec
from harness.profiles.slurm_fields import slurm_minutes
from tests.conftest import DATA, REPO, run_cli
from tests.slurm import PARTITION, LocalCluster, local_cluster, slurm_cluster  # noqa: F401

pytestmark = pytest.mark.slow

# A batch script that starts a "runtime" the way every box does (setsid, double fork), writes
# its PID, and waits.
_ORPHAN_JOB = """#!/bin/bash
echo "node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"
bash -c 'setsid nohup sh -c "exec sleep 600" </dev/null >/dev/null 2>&1 & echo $! >{pid}.tmp'
mv {pid}.tmp {pid}
sleep 600
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _orphan_after_scancel(cluster: LocalCluster, folder: Path) -> tuple[int, bool, str]:
    """Submit the orphan job with a fake GPU, scancel it once running; (pid, alive, log)."""
    pid_file = folder / "orphan.pid"
    script = folder / "orphan.sh"
    script.write_text(_ORPHAN_JOB.format(pid=pid_file))
    out = folder / "orphan.out"
    sbatch = cluster.run("sbatch", "--parsable", "--gres=gpu:1", "-o", str(out), str(script))
    assert sbatch.returncode == 0, sbatch.stderr
    job_id = sbatch.stdout.strip()
    assert _wait_for(pid_file, 30), cluster.log_tail()
    pid = int(pid_file.read_text())
    assert _alive(pid)
    cluster.run("scancel", job_id)
    # Once Slurm has the job CANCELLED (no longer COMPLETING) it has signalled all it tracks.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = cluster.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout
        if state.strip() == "CANCELLED":
            break
        time.sleep(0.1)
    deadline = time.monotonic() + 2
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)  # ours to stop: the test started it
    return pid, alive, out.read_text()


def test_local_cluster_runs_a_gpu_job_and_scancel_stops_a_setsid_runtime(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    if slurm_cluster.proctrack != "proctrack/cgroup":
        pytest.skip("no writable cgroup v1 freezer here: the cluster runs proctrack/linuxproc")
    assert slurm_cluster.start_s < 30
    pid, alive, log = _orphan_after_scancel(slurm_cluster, tmp_path)
    assert "node=n1 gpus=0" in log
    assert not alive, f"process {pid} (setsid, double fork) survived scancel under cgroup"


def test_linuxproc_lets_a_setsid_runtime_escape_scancel(tmp_path: Path) -> None:
    """Why a job must stop its own runtime: under linuxproc scancel misses a setsid'd child."""
    with local_cluster(tmp_path / "cluster", node="n2", proctrack="proctrack/linuxproc") as c:
        _, alive, _ = _orphan_after_scancel(c, tmp_path)
    assert alive


# ---- cohorts as jobs -------------------------------------------------------------------------

TINY = DATA / "cards" / "e2e" / "tiny.yaml"
# Runs long enough that a scancel sent once the runtime listens lands mid-run.
LONG_RUNS = {
    "max_tokens: 8": "max_tokens: 32",
    "requests: 2}": "requests: 8}",
    "requests: 2, shift: true}": "requests: 8, shift: true}",
}


def _slurm_card(tmp_path: Path, replace: dict[str, str] | None = None) -> Path:
    """The tiny refbox card, two cycles (two cohorts), on an inline slurm box named cluster."""
    box = (
        f"box: {{kind: slurm, name: cluster, partition: {PARTITION}, "
        f"shared_dir: {tmp_path / 'shared'}, python: {sys.executable}, "
        f"setup: ['export PYTHONPATH={REPO}']}}"
    )
    text = TINY.read_text(encoding="utf-8").replace("box: local", box)
    for old, new in {"cycles: 1": "cycles: 2", **(replace or {})}.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "card.yaml"
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _campaign(card: Path, reports: Path) -> tuple[LoadedCard, CampaignDir, list[CohortJob]]:
    loaded = load_card(card)
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, reports)
    cohorts: dict[str, list[str]] = {}
    for run in plan.runs:
        cohorts.setdefault(cohort_key(run.comparison, run.cache_state, run.cycle), []).append(
            run.run_id
        )
    return loaded, campaign, [CohortJob(key, tuple(ids)) for key, ids in cohorts.items()]


def _submit(
    loaded: LoadedCard, campaign: CampaignDir, cohorts: list[CohortJob], attempt: int = 1
) -> SubmittedArray:
    return submit_cohorts(
        campaign, loaded.card.campaign, loaded.box_name, loaded.box, cohorts, attempt=attempt
    )


def _merge_all(campaign: CampaignDir, array: SubmittedArray) -> dict[str, MergeResult]:
    merged: dict[str, MergeResult] = {}
    wait_for_jobs(
        array,
        lambda end: merged.__setitem__(end.job.key, merge_job(campaign, end)),
        timeout_s=300,
        poll_s=0.5,
    )
    return merged


def _ready_boot(job: SubmittedJob, timeout_s: float = 120) -> int:
    """The process group of the job's first runtime, once it listens (so a cancel is mid-run)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        boots = [e for e in Journal(job.job_dir / "journal.jsonl").events() if e["event"] == "boot"]
        if boots:
            log = job.job_dir / "box" / boots[0]["run_id"] / "server.log"
            if log.is_file() and "listening on" in log.read_text(errors="replace"):
                return int(boots[0]["pgid"])
        time.sleep(0.1)
    raise AssertionError(f"job {job.job_id} booted no runtime in {timeout_s} s: {job.log_path}")


def _group_gone(pgid: int, timeout_s: float = 20) -> bool:
    box = LocalBox("check", BoxSpec())
    return box.wait_group_gone(pgid, timeout_s)


def _cancel_one_mid_run(
    loaded: LoadedCard, campaign: CampaignDir, cohorts: list[CohortJob]
) -> tuple[SubmittedArray, dict[str, MergeResult], int]:
    """Both cohorts as an array; the second scancelled once its first runtime listens."""
    array = _submit(loaded, campaign, cohorts)
    victim = array.jobs[1]
    pgid = _ready_boot(victim)
    cancel_jobs([victim.job_id])
    return array, _merge_all(campaign, array), pgid


def test_cohorts_run_as_a_job_array_and_a_cancelled_job_is_retried(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    loaded, campaign, cohorts = _campaign(_slurm_card(tmp_path, LONG_RUNS), tmp_path / "reports")
    assert [len(c.run_ids) for c in cohorts] == [4, 4]
    array, merged, pgid = _cancel_one_mid_run(loaded, campaign, cohorts)
    first, second = (merged[c.key] for c in cohorts)
    kept, cancelled = array.jobs

    # The job left alone: its four runs landed in the campaign with their job and node.
    assert first.done == list(cohorts[0].run_ids) and not first.lost and not first.failed
    for run_id in first.done:
        record = read_json(campaign.run_dir(run_id) / "run.json")
        assert record["status"] == RUN_OK and record["box"] == "cluster"
        assert record["slurm_job_id"] == kept.job_id and record["node"] == slurm_cluster.node
        assert (campaign.run_dir(run_id) / "requests.parquet").is_file()
    assert re.fullmatch(r"\d+_0", kept.job_id) and cancelled.job_id.endswith("_1")
    assert job_progress(kept) == JobProgress(done=4, failed=0, current=None)
    assert (campaign.root / "boxes" / "cluster.json").is_file()

    # The cancelled one: every run of it failed with the Slurm end state, and its runtime is gone.
    why = f"slurm job {cancelled.job_id} CANCELLED on node {slurm_cluster.node}"
    assert not second.done and set(second.lost) == set(cohorts[1].run_ids)
    assert all(reason.startswith(why) for reason in second.lost.values()), second.lost
    for run_id in second.lost:
        record = read_json(campaign.run_dir(run_id) / "run.json")
        assert record["status"] == RUN_FAILED and record["reason"].startswith(why)
        assert record["slurm_job_id"] == cancelled.job_id
    assert _group_gone(pgid), f"runtime group {pgid} survived scancel"

    # Retried as the fleet would: the lost runs again, as attempt 2 of their cohort.
    retry = _submit(loaded, campaign, [CohortJob(cohorts[1].key, tuple(second.lost))], attempt=2)
    again = _merge_all(campaign, retry)[cohorts[1].key]
    assert sorted(again.done) == sorted(second.lost) and not again.lost
    assert all(campaign.is_done(run_id) for c in cohorts for run_id in c.run_ids)
    assert retry.jobs[0].job_dir.name.endswith("-a2")


def test_a_job_stops_its_own_runtime_where_slurm_cannot(tmp_path: Path) -> None:
    """Under proctrack/linuxproc scancel misses the setsid'd runtime: the job's SIGTERM handler
    must stop it, and record why."""
    with local_cluster(tmp_path / "cluster", node="n3", proctrack="proctrack/linuxproc"):
        loaded, campaign, cohorts = _campaign(
            _slurm_card(tmp_path, LONG_RUNS), tmp_path / "reports"
        )
        _, merged, pgid = _cancel_one_mid_run(loaded, campaign, cohorts)
        assert _group_gone(pgid), f"runtime group {pgid} survived scancel under linuxproc"
    lost = merged[cohorts[1].key].lost
    assert set(lost) == set(cohorts[1].run_ids), merged[cohorts[1].key]
    # The run the signal cut was recorded by the runner on the node before Slurm's SIGKILL.
    cut = [reason for reason in lost.values() if "(the run: interrupted (SIGTERM)" in reason]
    assert len(cut) == 1, lost


# ---- box check, overhead, bounded waits ------------------------------------------------------


def _boxes_file(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    setup = f"setup: ['export PYTHONPATH={REPO}']"
    (tmp_path / "boxes.yaml").write_text(
        f"cluster: {{kind: slurm, partition: {PARTITION}, gres: 'gpu:1', shared_dir: {shared}, "
        f"python: {sys.executable}, {setup}}}\n"
        f"no-such-partition: {{kind: slurm, partition: nope, shared_dir: {shared}}}\n",
        encoding="utf-8",
    )
    return tmp_path / "boxes.yaml"


def test_box_check_runs_a_trivial_job_on_the_partition(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _boxes_file(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the CLI runs from tmp_path
    good = run_cli("box", "check", "cluster", cwd=tmp_path)
    assert good.code == 0, good.stdout + good.stderr
    lines = good.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == [
        "ok   slurm controller",
        "ok   partition",
        "ok   shared dir",
        "ok   trivial job",
    ]
    assert f"partition {PARTITION}: 1 of 1 nodes up (idle: 1)" in lines[1]
    assert re.search(rf"ran on node {slurm_cluster.node} in [\d.]+ s: Python 3\.", lines[3])
    assert "GPUs 0" in lines[3]  # the fake GPU of gres.conf, asked for with gres: gpu:1
    assert lines[-1] == "box cluster: 4 of 4 checks passed"
    assert not (tmp_path / "shared" / ".harness-check").exists() or not any(
        (tmp_path / "shared" / ".harness-check").iterdir()
    )

    bad = run_cli("box", "check", "no-such-partition", cwd=tmp_path)
    assert bad.code == 3, bad.stdout + bad.stderr
    assert (
        f"FAIL partition: partition nope is not on the cluster (it has {PARTITION})" in bad.stdout
    )
    assert f"fix: set `partition:` to one of {PARTITION}" in bad.stdout
    assert "trivial job" not in bad.stdout  # not submitted to a partition that is not there


def test_scheduling_overhead_per_cohort(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    spec = BoxSpec(kind="slurm", partition=PARTITION, shared_dir=str(tmp_path / "shared"))
    overhead = measure_overhead("cluster", spec, jobs=2)
    assert len(overhead.first_line_s) == 2 and set(overhead.nodes) == {slurm_cluster.node}
    for first, harness in zip(overhead.first_line_s, overhead.harness_s, strict=True):
        assert 0 < first <= harness < 120
    print(
        f"slurm overhead per cohort: sbatch to first log line {overhead.median_first_line_s:.2f} s,"
        f" to the harness on the node {overhead.median_harness_s:.2f} s (median of 2)"
    )


def _held_probe(tmp_path: Path, name: str) -> SubmittedArray:
    """A trivial job put on hold right after sbatch: it pends until released or cancelled."""
    spec = BoxSpec(kind="slurm", partition=PARTITION, shared_dir=str(tmp_path / "shared"))
    folder = tmp_path / "shared" / name
    ids, logs, at = submit_calls(
        spec, folder, probe_node, [(str(folder / "probe.json"), "")], name=name, where="test"
    )
    subprocess.run(["scontrol", "hold", ids[0]], check=True, capture_output=True)
    job = SubmittedJob(name, (), ids[0], folder, logs[0], "cluster")
    return SubmittedArray(name, (job,), at)


def test_a_wait_is_bounded_and_cancels_what_is_left(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    array = _held_probe(tmp_path, "held")
    ends: list[JobEnd] = []
    started = time.monotonic()
    wait_for_jobs(array, ends.append, timeout_s=3, poll_s=0.5)
    assert time.monotonic() - started < 30
    job_id = array.jobs[0].job_id
    held = rf"slurm job {job_id} still PENDING \(JobHeld\w+\) after 3 s: cancelled by the harness"
    assert re.fullmatch(held, ends[0].reason), ends[0].reason
    assert read_states([job_id])[job_id].state == "CANCELLED"


def test_an_interrupt_in_a_worker_thread_cancels_its_jobs(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    array = _held_probe(tmp_path, "interrupted")
    caught: list[BaseException] = []

    def worker() -> None:
        try:
            wait_for_jobs(array, lambda end: None, poll_s=0.2)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(1.0)
    interrupt_worker(thread, signal.SIGTERM)  # as the fleet forwards a stop signal
    thread.join(60)
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], Interrupted), caught
    job_id = array.jobs[0].job_id
    assert read_states([job_id])[job_id].state == "CANCELLED"


def test_a_cancel_the_controller_never_got_is_an_error_not_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scancel exits 0 for ended and unknown jobs, so its failure means the cancel did not
    happen: a job left running whose runs would be resubmitted. A controller that refuses the
    connection (nothing listens on its port) must surface, after the retries."""
    if shutil.which("scancel") is None:
        pytest.skip("scancel not installed (make sysdeps)")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=2\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=n1 Default=YES\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(slurm_submit, "SCANCEL_RETRY_S", 0.1)
    with pytest.raises(SlurmError, match=r"scancel 12_1 failed 3 times \(exit \d+: .*contact"):
        cancel_jobs(["12_1"])


# ---- what Slurm's tools print ----------------------------------------------------------------


def test_squeue_and_sacct_lines_are_read_per_array_element() -> None:
    squeue = "7_[2-3%1]|PENDING||JobArrayTaskLimit\n7_1|RUNNING|n1|None\n7_0|CANCELLED|n1|None\n"
    states = parse_squeue(squeue)
    assert sorted(states) == ["7_0", "7_1", "7_2", "7_3"]
    assert states["7_2"].reason == "JobArrayTaskLimit" and not states["7_2"].ended
    assert states["7_1"].reason == "" and states["7_1"].node == "n1"
    assert states["7_0"].failed and states["7_0"].describe() == "slurm job 7_0 CANCELLED on node n1"
    sacct = "8_0|TIMEOUT|n2\n8_0.batch|CANCELLED|n2\n8_1|CANCELLED by 0|None assigned\n"
    found = parse_sacct(sacct)
    assert found["8_0"].describe() == "slurm job 8_0 TIMEOUT on node n2"
    assert found["8_1"].state == "CANCELLED" and found["8_1"].node == ""
    for state in ("PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "FAILED", "BOOT_FAIL"):
        assert JobState("9_0", state, "n1").failed
    assert not JobState("9_0", "COMPLETED").failed and JobState("9_0", "COMPLETED").ended
    assert "keeps no accounting" in JobState("9_0", "UNKNOWN", "n1").describe()


def test_slurm_time_limits_and_job_folder_names() -> None:
    assert [slurm_minutes(t) for t in (90, "90", "1:30", "01:30:00", "1-00", "1-2:3:4")] == [
        90,
        90,
        2,
        90,
        1440,
        1564,
    ]
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        slurm_minutes("2h")
    assert job_dir_name("wide/warm/cycle0", 2) == "wide-warm-cycle0-a2"
    spec = BoxSpec(kind="slurm", shared_dir="/s", gpus=2, time="00:30:00", max_parallel=3)
    parameters = executor_parameters(spec, "harness-x", 3, 120)
    assert parameters["gpus_per_node"] == 2 and parameters["time"] == 30
    assert parameters["array_parallelism"] == 3 and parameters["wckey"] is None


def test_a_job_that_fails_on_its_node_says_why(
    slurm_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    loaded, campaign, cohorts = _campaign(_slurm_card(tmp_path), tmp_path / "reports")
    # A frozen input that no longer matches its hash: the node refuses to reopen the campaign.
    pool = next((campaign.root / "inputs").rglob("small.jsonl"))
    pool.write_text(pool.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    merged = _merge_all(campaign, _submit(loaded, campaign, cohorts[:1]))[cohorts[0].key]
    assert not merged.done and set(merged.lost) == set(cohorts[0].run_ids)
    reason = next(iter(merged.lost.values()))
    assert re.match(rf"slurm job \d+ FAILED on node {slurm_cluster.node}: RecordError: ", reason)
    assert "small.jsonl" in reason, reason


def test_a_cohort_invalidated_on_a_node_stays_invalid_in_the_campaign(tmp_path: Path) -> None:
    node = CohortBook.open(tmp_path / "job", True, "")
    (tmp_path / "job").mkdir()
    node.invalidate("wide/warm/cycle0", "swapout: 12 pages swapped out")
    campaign = CohortBook.open(tmp_path, True, "")
    campaign.adopt("wide/warm/cycle0", node.cohorts["wide/warm/cycle0"])
    again = CohortBook.open(tmp_path, True, "")
    assert again.invalid_reason("wide/warm/cycle0") == "swapout: 12 pages swapped out"
    again.adopt("wide/warm/cycle0", {"valid": True, "reasons": []})
    assert again.invalid_reason("wide/warm/cycle0") is not None  # invalid is final


def test_a_time_limit_in_yaml_is_read_as_written(tmp_path: Path) -> None:
    # YAML 1.1 reads an unquoted 1:30:00 as 5400 (base 60): 5400 minutes would be 90 hours.
    path = tmp_path / "boxes.yaml"
    path.write_text("gpu: {kind: slurm, shared_dir: /shared, time: 1:30:00}\n", encoding="utf-8")
    assert load_boxes_file(path)["gpu"].time_limit_min() == 90
