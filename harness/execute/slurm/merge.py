"""Bringing an ended job's runs home: its run folders moved into the campaign directory.

After a cohort's job ends (:class:`.wait.JobEnd`), :func:`merge_job` moves each of
its runs' folders from the job folder to ``runs/<id>/`` of the campaign, with ``slurm_job_id``
and ``node`` stamped into ``run.json``, and sorts the runs three ways:

- **done**: ``run.json`` says ok.
- **failed**: the runner on the node recorded a failure while the job itself ended normally
  (the runtime crashed or hung): the runner already retried it per ``design.retries``.
- **lost**: the job ended before the run did (TIMEOUT, PREEMPTED, NODE_FAIL, CANCELLED,
  OUT_OF_MEMORY, FAILED, or stopped by a signal), so nothing about the run itself is known to be
  wrong: its record says failed with the job's end (``slurm job 123_4 CANCELLED on node n1``)
  as the reason, and the caller resubmits it per ``design.retries``.

It journals nothing: the caller (the fleet) journals ``run_done`` / ``run_failed`` once, under
its lock. The move runs as a critical section (:func:`~harness.boxes.interrupts.deferred`), so
an interrupt never leaves a run half in the job folder and half in the campaign.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.boxes.interrupts import deferred
from harness.errors import RecordError
from harness.execute.cohorts import COHORTS_FILE, CohortBook
from harness.execute.slurm.wait import JobEnd
from harness.formats.records import (
    RUN_FAILED,
    RUN_OK,
    CampaignDir,
    RunRecord,
    check_run_record,
    read_json,
    write_json_atomic,
)
from harness.formats.safe_write import copy_file_atomic


@dataclass
class MergeResult:
    """What one ended job brought back."""

    job_id: str
    node: str
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # run id -> reason (retried on the node)
    lost: dict[str, str] = field(default_factory=dict)  # run id -> reason: resubmit these


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except RecordError:
        return None  # torn by the job's death: as if never written


def _job_reason(end: JobEnd, summary: dict[str, Any] | None, node: str) -> str:
    """Why the job did not finish its cohort ('' when it did), with the job's own error."""
    job_id = end.job.job_id
    error = str(summary.get("error", "")) if summary is not None else ""
    if end.reason:
        return end.reason + (f": {error}" if error else "")
    if summary is None:
        return (
            f"slurm job {job_id} COMPLETED on node {node or '?'} without writing its summary; "
            f"see its log {end.job.log_path}"
        )
    if error:
        return f"slurm job {job_id} on node {node} failed: {error}"
    if summary.get("interrupted"):
        how = summary.get("stopped_by") or "a signal"
        near = " (its time limit was near)" if how == "SIGUSR2" else ""
        return f"slurm job {job_id} on node {node} was stopped by {how}{near}"
    return ""


def merge_job(campaign: CampaignDir, end: JobEnd, book: CohortBook | None = None) -> MergeResult:
    """Move the ended job's runs into ``campaign``; which are done, failed and lost (with why).

    A run folder already in the campaign (an earlier attempt) is replaced. A lost run without a
    folder gets one with just its ``run.json``, so the campaign shows why it is missing. With
    ``book`` (the campaign's cohort book), what the guards recorded of the cohort on the node
    (its checks, an invalidation) is taken into it.
    """
    job = end.job
    summary = _read(job.summary_path)
    started = _read(job.started_path) or {}
    node = end.state.node or str(started.get("node", ""))
    result = MergeResult(job.job_id, node)
    why = _job_reason(end, summary, node)
    plan = {run["run_id"]: run for run in campaign.plan()["runs"]}
    with deferred():
        for run_id in job.run_ids:
            source = job.job_dir / "runs" / run_id
            record = _read(source / "run.json")
            if record is not None:
                check_run_record(record, source / "run.json")
            status = record.get("status") if record is not None else None
            if status == RUN_OK:
                result.done.append(run_id)
            elif status == RUN_FAILED and not why:
                result.failed[run_id] = str(record.get("reason", "")) if record else ""
            else:
                earlier = str(record.get("reason", "")) if record else ""
                lost = why or (
                    f"slurm job {job.job_id} ended without finishing this run; see its log "
                    f"{job.log_path}"
                )
                result.lost[run_id] = lost + (f" (the run: {earlier})" if earlier else "")
                record = _lost_record(record, plan.get(run_id, {"run_id": run_id}), job.box_name)
                record["status"] = RUN_FAILED
                record["reason"] = result.lost[run_id]
            assert record is not None
            record["slurm_job_id"] = job.job_id
            record["node"] = node or None
            _move(campaign, source, run_id, record)
        _keep_environment(campaign, job.job_dir, job.box_name)
        if book is not None:
            _adopt_cohort(book, job.job_dir, job.key)
    return result


def _adopt_cohort(book: CohortBook, job_dir: Path, key: str) -> None:
    recorded = _read(job_dir / COHORTS_FILE)
    entry = (recorded or {}).get("cohorts", {}).get(key)
    if isinstance(entry, dict):
        book.adopt(key, entry)


def _lost_record(
    record: dict[str, Any] | None, planned: dict[str, Any], box: str
) -> dict[str, Any]:
    if record is not None:
        return dict(record)
    identity = {k: planned[k] for k in RunRecord.__dataclass_fields__ if k in planned}
    return RunRecord(
        **{**identity, "status": RUN_FAILED, "box": box, "ended_at": time.time()}
    ).to_json()


def _move(campaign: CampaignDir, source: Path, run_id: str, record: dict[str, Any]) -> None:
    """Replace ``runs/<id>/`` with the job's folder (or a folder of just the record)."""
    target = campaign.run_dir(run_id)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.move(str(source), str(target))
    else:
        target.mkdir()
    record.pop("schema_version", None)
    write_json_atomic(target / "run.json", record)


def _keep_environment(campaign: CampaignDir, job_dir: Path, box: str) -> None:
    """The box's environment as its first job's node captured it (``boxes/<box>.json``)."""
    captured = job_dir / "boxes" / f"{box}.json"
    kept = campaign.root / "boxes" / f"{box}.json"
    if captured.is_file() and not kept.exists():
        copy_file_atomic(captured, kept)
        campaign.journal.seal_file(kept)


__all__ = ["MergeResult", "merge_job"]
