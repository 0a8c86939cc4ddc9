"""What runs on the node: one cohort's runs with the ordinary runner, in the job's folder.

The job folder is a copy of the campaign directory (:func:`.submit.prepare_job_dir`),
so the node reopens it as ``--resume`` does and runs the cohort's run ids with
:class:`~harness.execute.run.CampaignRunner` on a local box made from the slurm box's settings
(its python, platform and env): it boots the runtime on the node, drives it from the node and
writes run records and its own journal into the folder. The harness moves them into the campaign
once the job ends (:mod:`harness.execute.slurm.merge`).

Stopping: ``scancel``, preemption and the end of the time limit reach the job as SIGTERM (and
SIGUSR2 ``signal_delay_s`` before the limit). Both raise :class:`Interrupted` here, replacing the
handlers submitit installs (it ignores SIGTERM), so the runner stops its runtime's process group
and records the run interrupted before Slurm's SIGKILL: under ``proctrack/linuxproc`` a runtime
started with ``setsid`` is not one of the job's processes, and nothing else would stop it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from harness.boxes.interrupts import STOP_SIGNALS, describe, stop_signals
from harness.formats.records import write_json_atomic
from harness.plan.build import Run
from harness.profiles.box import BoxSpec
from harness.version import __version__

# SIGUSR2 is how Slurm (through submitit's --signal) warns a job its time is nearly up.
JOB_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGUSR2)


def job_identity() -> tuple[str, str]:
    """This job's Slurm id (``123_4`` for an array element) and node, from its environment."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array}_{index}" if array and index else os.environ.get("SLURM_JOB_ID", "")
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return job_id, node


def node_box_spec(spec: BoxSpec) -> BoxSpec:
    """The local box a job runs its runtimes on: the slurm box's python, platform and env."""
    return BoxSpec(kind="local", python=spec.python, platform=spec.platform, env=dict(spec.env))


def _say(text: str) -> None:
    # The job's log is what a user tails; a line per run says where the cohort is.
    with contextlib.suppress(OSError):
        print(f"harness: {text}", flush=True)


def _progress(event: str, run: Run | None, info: dict[str, Any]) -> None:
    if run is None:
        return
    if event == "start":
        _say(f"{run.run_id} started (attempt {info.get('attempt', 1)})")
    elif event == "end":
        reason = f": {info['reason']}" if info.get("reason") else ""
        _say(f"{run.run_id} {info.get('status', '?')}{reason}")


def run_cohort_job(
    job_dir: str, run_ids: list[str], box_name: str, spec: dict[str, Any]
) -> dict[str, Any]:
    """Run ``run_ids`` of the campaign copied into ``job_dir`` on this node; the summary.

    The summary (also ``summary.json`` in the folder): job id, node, start and end, the runs
    done and failed (with reasons), whether a signal stopped it and which, and the error when
    the job itself failed (then it is raised too, so Slurm records the job FAILED).
    """
    from harness.execute.reopen import reopen_campaign
    from harness.execute.run import CampaignRunner

    started_at = time.time()
    job_id, node = job_identity()
    folder = Path(job_dir)
    _say(f"slurm job {job_id} on node {node}: {len(run_ids)} runs of {folder}")
    identity = {"job_id": job_id, "node": node, "started_at": started_at, "pid": os.getpid()}
    write_json_atomic(folder / "job.json", identity)
    summary: dict[str, Any] = {**identity, "box": box_name, "run_ids": list(run_ids)}
    summary.update(done=[], failed={}, interrupted=False, stopped_by="", error="")
    try:
        with stop_signals(JOB_STOP_SIGNALS):
            reopened = reopen_campaign(folder)
            runner = CampaignRunner(
                reopened.loaded,
                reopened.plan,
                reopened.campaign,
                _progress,
                box_name=box_name,
                box_spec=node_box_spec(BoxSpec.model_validate(spec)),
                run_ids=run_ids,
            )
            try:
                outcome = runner.execute()
            finally:
                if runner.remote_root:
                    # The runtimes' files between boots (GBs on shared storage); a retry's
                    # first boot makes them again.
                    shutil.rmtree(runner.cache_dir, ignore_errors=True)
        summary["done"] = outcome.done
        summary["failed"] = {
            run_id: str((reopened.campaign.run_record(run_id) or {}).get("reason", ""))
            for run_id in outcome.failed
        }
        summary["interrupted"] = outcome.interrupted
        summary["stopped_by"] = outcome.interrupted_by
    except KeyboardInterrupt as exc:  # before the runner started, or after it returned
        summary["interrupted"] = True
        summary["stopped_by"] = describe(exc)
    except BaseException as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        summary["ended_at"] = time.time()
        write_json_atomic(folder / "summary.json", summary)
        _say(
            f"slurm job {job_id} done: {len(summary['done'])} ok, {len(summary['failed'])} failed"
            + (f", stopped by {summary['stopped_by']}" if summary["interrupted"] else "")
        )
    return summary


def probe_node(out: str, binary: str = "") -> dict[str, Any]:
    """The trivial job of ``harness box check``: where it ran, with which Python and harness,
    and where ``binary`` (the runtime's) is on the node; written to ``out`` as JSON too."""
    started_at = time.time()
    job_id, node = job_identity()
    _say(f"slurm job {job_id} on node {node}: probe")
    seen = {
        "job_id": job_id,
        "node": node,
        "started_at": started_at,
        "python": sys.executable,
        "python_version": ".".join(str(part) for part in sys.version_info[:3]),
        "harness": __version__,
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "binary": shutil.which(binary) if binary else None,
    }
    write_json_atomic(Path(out), seen)
    return seen


__all__ = ["JOB_STOP_SIGNALS", "job_identity", "node_box_spec", "probe_node", "run_cohort_job"]
