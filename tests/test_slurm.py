"""Slurm boxes for real: a one-node cluster on this machine (tests/slurm.py) runs the jobs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.slurm import LocalCluster, local_cluster, slurm_cluster  # noqa: F401 - fixture

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
