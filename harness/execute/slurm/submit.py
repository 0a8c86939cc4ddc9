"""Submitting cohorts: one job each, all of them one submitit job array capped by max_parallel.

Each job gets a *job folder* under the box's ``shared_dir``, a self-contained copy of the
campaign directory (card, plan, frozen inputs), so the node reopens the campaign from it as
``--resume`` would (:func:`harness.execute.reopen.reopen_campaign`) and writes its run records,
journal and the runtimes' files there::

    <shared_dir>/<campaign>/<stamp>/
      submitit/                 sbatch scripts, pickles and each job's log (<id>_0_log.out)
      jobs/<cohort>-a<attempt>/ card.yaml plan.json inputs/ … job.json summary.json runs/ box/

Only submission goes through submitit (the array, the pickled call, ``setup``, ``python``);
states are read by :mod:`.states`, never by submitit's watcher, whose ``result()``
waits forever on a job cancelled before it wrote one when the cluster has no ``sacct``.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.boxes.interrupts import deferred
from harness.errors import SlurmError
from harness.formats.records import CampaignDir
from harness.profiles.box import BoxSpec

# What a job folder copies from the campaign directory: all a node needs to reopen it.
_CAMPAIGN_FILES = ("card.yaml", "card.path", "plan.json", "quality.json", "cohorts.json")
# Seconds an sbatch or scancel call may take.
SUBMIT_TIMEOUT_S = 120.0
# A scancel that fails is tried again this many times in all, this many seconds apart.
SCANCEL_ATTEMPTS = 3
SCANCEL_RETRY_S = 2.0


@dataclass(frozen=True)
class CohortJob:
    """One cohort to run as one Slurm job: its key (``plan.cohort_key``) and its run ids."""

    key: str
    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class SubmittedJob:
    """One job of a submitted array: which cohort, its Slurm id and its folders."""

    key: str
    run_ids: tuple[str, ...]
    job_id: str  # "123_4" (an array element), or "123" for an array of one
    job_dir: Path  # the campaign copy the node runs in
    log_path: Path  # the job's stdout and stderr (submitit's <id>_0_log.out)
    box_name: str

    @property
    def summary_path(self) -> Path:
        """What the job writes when its runner returns (:mod:`harness.execute.slurm.job`)."""
        return self.job_dir / "summary.json"

    @property
    def started_path(self) -> Path:
        """What the job writes first on its node: job id, node, start time."""
        return self.job_dir / "job.json"


@dataclass(frozen=True)
class SubmittedArray:
    """Cohort jobs submitted together, under one Slurm job name."""

    name: str  # the job name; ``scancel --name`` reaches jobs whose ids were never read
    jobs: tuple[SubmittedJob, ...]
    submitted_at: float  # time.time() just before sbatch ran

    @property
    def job_ids(self) -> list[str]:
        """Every job's Slurm id."""
        return [job.job_id for job in self.jobs]


def slurm_root(spec: BoxSpec, campaign_name: str, campaign_root: Path) -> Path:
    """The campaign's folder under the box's ``shared_dir``."""
    assert spec.shared_dir is not None  # BoxSpec requires it of a slurm box
    return Path(os.path.expanduser(spec.shared_dir)) / campaign_name / campaign_root.name


def job_dir_name(key: str, attempt: int) -> str:
    """A cohort key as a folder name: ``wide/warm/cycle0`` attempt 2 → ``wide-warm-cycle0-a2``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key).strip("-") + f"-a{attempt}"


def prepare_job_dir(campaign: CampaignDir, job_dir: Path) -> None:
    """Copy what reopens the campaign (card, plan, frozen inputs) into a fresh ``job_dir``."""
    if job_dir.exists():
        shutil.rmtree(job_dir)  # an earlier submission of this attempt that never ran
    job_dir.mkdir(parents=True)
    for name in _CAMPAIGN_FILES:
        if (campaign.root / name).is_file():
            shutil.copy2(campaign.root / name, job_dir / name)
    if (campaign.root / "inputs").is_dir():
        shutil.copytree(campaign.root / "inputs", job_dir / "inputs")


def executor_parameters(
    spec: BoxSpec, name: str, parallel: int, signal_delay_s: int
) -> dict[str, Any]:
    """submitit's sbatch parameters for the box: resources, setup, the array's cap."""
    parameters: dict[str, Any] = {
        "job_name": name,
        "partition": spec.partition,
        "gres": spec.gres,
        "gpus_per_node": spec.gpus,
        "account": spec.account,
        "constraint": spec.constraint,
        # None leaves --time out (submitit writes 5 minutes otherwise): the partition decides.
        "time": spec.time_limit_min(),
        "setup": list(spec.setup),
        "array_parallelism": parallel,
        "signal_delay_s": signal_delay_s,
        "stderr_to_stdout": True,
        "wckey": None,  # submitit's default "submitit" fails where wckeys are enforced
        "nodes": 1,
        "ntasks_per_node": 1,
    }
    return parameters


def _executor(spec: BoxSpec, folder: Path, parameters: dict[str, Any]) -> Any:
    import submitit  # imported here: only slurm boxes need it, and it looks for srun

    try:
        executor = submitit.SlurmExecutor(folder=folder, python=shlex.quote(spec.python_path()))
    except RuntimeError as exc:  # 'Could not detect "srun"'
        raise SlurmError(
            f"cannot submit Slurm jobs from here ({exc}): run the harness on a host with the Slurm "
            "clients (a login node)"
        ) from None
    executor.update_parameters(**{k: v for k, v in parameters.items() if v is not None})
    return executor


def cancel_by_name(name: str) -> None:
    """``scancel --name NAME --user ME``: jobs of a submission whose ids were never read."""
    _scancel(["--name", name, "--user", getpass.getuser()])


def cancel_jobs(job_ids: Sequence[str]) -> None:
    """``scancel`` the jobs (ended ones are ignored by Slurm). Raises SlurmError when scancel
    cannot be run."""
    if job_ids:
        _scancel(list(job_ids))


def _scancel(arguments: list[str]) -> None:
    """Run scancel, again after a failure: it exits 0 for jobs already ended or unknown, so a
    non-zero exit means the request did not reach the controller (a busy slurmctld answers
    ``Socket timed out``), and a cancel that did not happen would leave a job running whose runs
    the caller treats as lost and resubmits."""
    failure = ""
    for attempt in range(SCANCEL_ATTEMPTS):
        if attempt:
            time.sleep(SCANCEL_RETRY_S)
        try:
            done = subprocess.run(
                ["scancel", *arguments],
                capture_output=True,
                text=True,
                timeout=SUBMIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"scancel {' '.join(arguments)} failed: {exc}") from None
        if done.returncode == 0:
            return
        failure = f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
    raise SlurmError(
        f"scancel {' '.join(arguments)} failed {SCANCEL_ATTEMPTS} times ({failure}); the jobs "
        "may still run: check with squeue and cancel them by hand"
    )


def submit_calls(
    spec: BoxSpec,
    folder: Path,
    function: Callable[..., Any],
    calls: Sequence[tuple[Any, ...]],
    *,
    name: str,
    where: str,
    signal_delay_s: int = 120,
) -> tuple[list[str], list[Path], float]:
    """Submit ``function(*call)`` for each call as one job array (one job for one call);
    ``where`` names the box in errors.

    Returns the job ids, their log files and when sbatch was called. An interrupt during the
    submission waits for sbatch to return, then cancels every job of ``name`` and is raised.
    """
    import submitit

    folder.mkdir(parents=True, exist_ok=True)
    parallel = min(spec.max_parallel or len(calls), len(calls))
    executor = _executor(spec, folder, executor_parameters(spec, name, parallel, signal_delay_s))
    columns = [list(column) for column in zip(*calls, strict=True)]
    submitted_at = time.time()
    try:
        with deferred():  # sbatch runs whole; ids the harness never read would run on unseen
            jobs = executor.map_array(function, *columns)
    except KeyboardInterrupt:
        cancel_by_name(name)
        raise
    except (submitit.core.utils.FailedJobError, OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"{where}: sbatch refused the jobs: {str(exc).strip()[-800:]}") from None
    return [job.job_id for job in jobs], [Path(job.paths.stdout) for job in jobs], submitted_at


def submit_cohorts(
    campaign: CampaignDir,
    campaign_name: str,
    box_name: str,
    spec: BoxSpec,
    cohorts: Sequence[CohortJob],
    *,
    attempt: int = 1,
    signal_delay_s: int = 120,
) -> SubmittedArray:
    """Submit each cohort as one job of one array on the slurm box ``box_name``.

    Each job runs :func:`.job.run_cohort_job` on its node, over a fresh job folder
    (:func:`prepare_job_dir`) named after its cohort and ``attempt``. ``signal_delay_s``: how
    long before its time limit a job is told to stop (SIGUSR2), to stop its runtime and write
    its records. Raises SlurmError when sbatch refuses them (an unknown partition, say).
    """
    from harness.execute.slurm.job import run_cohort_job

    if not cohorts:
        raise ValueError("submit_cohorts needs at least one cohort")
    root = slurm_root(spec, campaign_name, campaign.root)
    dirs = []
    for cohort in cohorts:
        job_dir = root / "jobs" / job_dir_name(cohort.key, attempt)
        prepare_job_dir(campaign, job_dir)
        dirs.append(job_dir)
    name = f"harness-{campaign_name}-{secrets.token_hex(3)}"
    spec_json = spec.model_dump(mode="json", exclude_unset=True)
    calls = [
        (str(job_dir), list(cohort.run_ids), box_name, spec_json)
        for job_dir, cohort in zip(dirs, cohorts, strict=True)
    ]
    job_ids, logs, submitted_at = submit_calls(
        spec,
        root / "submitit",
        run_cohort_job,
        calls,
        name=name,
        where=f"box {box_name}",
        signal_delay_s=signal_delay_s,
    )
    jobs = tuple(
        SubmittedJob(cohort.key, cohort.run_ids, job_id, job_dir, log, box_name)
        for cohort, job_id, job_dir, log in zip(cohorts, job_ids, dirs, logs, strict=True)
    )
    return SubmittedArray(name, jobs, submitted_at)


__all__ = [
    "CohortJob",
    "SubmittedArray",
    "SubmittedJob",
    "cancel_by_name",
    "cancel_jobs",
    "executor_parameters",
    "job_dir_name",
    "prepare_job_dir",
    "slurm_root",
    "submit_calls",
    "submit_cohorts",
]
