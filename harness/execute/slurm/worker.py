"""A Slurm box in a fleet: its share of the campaign's cohorts as job arrays, retried.

The fleet (:mod:`harness.execute.fleet`) gives a box of ``kind: slurm`` this worker instead of a
runner: it submits one job per cohort not done (:func:`.submit.submit_cohorts`,
capped at ``max_parallel`` running at once), journals the array (its name and job ids) before
waiting, and as each job ends moves its runs home (:func:`.merge.merge_job`) and
journals them ``run_done`` or ``run_failed``. Runs the job took with it (TIMEOUT, PREEMPTED,
NODE_FAIL, CANCELLED, OUT_OF_MEMORY) are resubmitted as a new attempt of their cohort while
``design.retries`` allows; a run that failed on its node was already retried there.

An interrupt cancels every job still queued or running (``wait_for_jobs`` does, and waits for
them), brings home the runs those jobs had finished, records the others failed with the
cancellation, and is raised on. A harness killed
outright leaves its jobs to Slurm: the worker of ``--resume`` first cancels every array the
journal names that it never saw end, merges what those jobs had finished (their folders are
journalled with the array), then submits the rest afresh (attempt numbers go on, so no job
folder is reused).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.boxes.interrupts import describe
from harness.card import LoadedCard
from harness.errors import SlurmError
from harness.execute.cohorts import CohortBook
from harness.execute.guards import cohort_key
from harness.execute.run import CampaignOutcome
from harness.execute.slurm.merge import MergeResult, merge_job
from harness.execute.slurm.states import UNKNOWN, JobState, queued_names, read_states
from harness.execute.slurm.submit import CohortJob, SubmittedJob, cancel_by_name, submit_cohorts
from harness.execute.slurm.wait import JobEnd, job_progress, wait_for_jobs
from harness.formats.records import CampaignDir
from harness.plan.build import Plan, Run
from harness.profiles.box import BoxSpec

ProgressCallback = Callable[[str, Run | None, dict[str, Any]], None]

# Seconds to wait for an earlier session's cancelled jobs to leave the queue before resubmitting.
_CANCELLED_GONE_S = 60.0


class SlurmWorker:
    """Runs one Slurm box's share of a fleet (``run_ids``) as one job per cohort."""

    def __init__(
        self,
        loaded: LoadedCard,
        plan: Plan,
        campaign: CampaignDir,
        progress: ProgressCallback,
        *,
        box_name: str,
        box_spec: BoxSpec,
        run_ids: list[str],
        cohorts: CohortBook,
    ) -> None:
        self.loaded = loaded
        self.plan = plan
        self.campaign = campaign
        self.progress = progress
        self.box_name = box_name
        self.box_spec = box_spec
        self.run_ids = run_ids
        self.book = cohorts
        self.runs = {r.run_id: r for r in plan.runs}

    def run_share(self, outcome: CampaignOutcome) -> None:
        """Run the share's runs not done yet, adding each to ``outcome``."""
        self._cancel_earlier()
        todo: dict[str, list[str]] = {}
        done = self.campaign.done_runs(self.run_ids)
        for run_id in self.run_ids:
            if run_id in done:
                outcome.done.append(run_id)
                self.progress("skip", self.runs[run_id], {})
            else:
                todo.setdefault(cohort_key(self.runs[run_id]), []).append(run_id)
        attempts = self.loaded.card.design.retries + 1
        base = self._attempts_so_far()
        for attempt in range(1, attempts + 1):
            if not todo:
                break
            last = attempt == attempts
            todo = self._one_round(todo, base + attempt, last, outcome)

    def _one_round(
        self, todo: dict[str, list[str]], attempt: int, last: bool, outcome: CampaignOutcome
    ) -> dict[str, list[str]]:
        """Submit the cohorts in ``todo`` once; the runs their jobs lost, by cohort."""
        cohorts = [CohortJob(key, tuple(ids)) for key, ids in todo.items()]
        array = submit_cohorts(
            self.campaign,
            self.loaded.card.campaign,
            self.box_name,
            self.box_spec,
            cohorts,
            attempt=attempt,
        )
        self.campaign.journal.append(
            "slurm_submitted",
            box=self.box_name,
            name=array.name,
            attempt=attempt,
            jobs={job.key: job.job_id for job in array.jobs},
            runs={job.key: list(job.run_ids) for job in array.jobs},
            folders={job.key: str(job.job_dir) for job in array.jobs},
            logs={job.key: str(job.log_path) for job in array.jobs},
        )
        lost: dict[str, list[str]] = {}
        seen: dict[str, str | None] = {}

        def on_poll(states: dict[str, JobState]) -> None:
            for job in array.jobs:
                current = job_progress(job).current
                if current is not None and seen.get(job.job_id) != current:
                    info = {"attempt": attempt, "slurm_job_id": job.job_id}
                    self.progress("start", self.runs[current], info)
                seen[job.job_id] = current

        ended: set[str] = set()

        def on_end(end: JobEnd) -> None:
            ended.add(end.job.job_id)
            self._bring_home(end, outcome, None if last else lost)

        try:
            wait_for_jobs(array, on_end, on_poll=on_poll)
        except KeyboardInterrupt as exc:
            # wait_for_jobs cancelled what was left and waited for it: bring home what those
            # jobs finished before the cancel, the rest recorded with why; nothing is retried
            # now (a --resume does that).
            self.campaign.journal.append("slurm_cancelled", box=self.box_name, name=array.name)
            why = f"slurm job cancelled: the harness was interrupted ({describe(exc)})"
            for job in array.jobs:
                if job.job_id not in ended:
                    cancelled = JobEnd(job, JobState(job.job_id, "CANCELLED"), cut_short=why)
                    self._bring_home(cancelled, outcome, None)
            raise
        self.campaign.journal.append("slurm_array_end", box=self.box_name, name=array.name)
        return lost

    def _bring_home(
        self, end: JobEnd, outcome: CampaignOutcome, retry: dict[str, list[str]] | None
    ) -> None:
        """Merge an ended job and journal its runs; the runs it lost go to ``retry`` (by
        cohort) to be submitted again, or, with None, count as failed now."""
        result = self._merge(end)
        journal = self.campaign.journal
        for run_id in result.done:
            journal.append("run_done", run_id=run_id)
            outcome.done.append(run_id)
            self.progress("end", self.runs[run_id], {"status": "ok", "reason": ""})
        failed = dict(result.failed)
        for run_id, why in result.lost.items():
            if retry is None:
                failed[run_id] = why
            else:
                journal.append("run_failed", run_id=run_id, reason=why)
                retry.setdefault(end.job.key, []).append(run_id)
        for run_id, why in failed.items():
            journal.append("run_failed", run_id=run_id, reason=why)
            outcome.failed.append(run_id)
            self.progress("end", self.runs[run_id], {"status": "failed", "reason": why})

    def _merge(self, end: JobEnd, *, recovered: bool = False) -> MergeResult:
        """Move an ended job's runs home and journal its end (``recovered``: after a kill)."""
        result = merge_job(self.campaign, end, self.book)
        extra = {"recovered": True} if recovered else {}
        self.campaign.journal.append(
            "slurm_job_end",
            box=self.box_name,
            job_id=end.job.job_id,
            cohort=end.job.key,
            state=end.state.state,
            node=result.node,
            reason=end.reason,
            **extra,
        )
        return result

    def _attempts_so_far(self) -> int:
        """Arrays this box submitted in earlier sessions: attempt numbers continue after them."""
        return sum(
            1
            for e in self.campaign.journal.events()
            if e["event"] == "slurm_submitted" and e.get("box") == self.box_name
        )

    def _cancel_earlier(self) -> None:
        """Cancel the arrays a killed harness left queued or running on this box."""
        events = self.campaign.journal.events()
        ended = {
            str(e.get("name"))
            for e in events
            if e["event"] in ("slurm_array_end", "slurm_cancelled")
            and e.get("box") == self.box_name
        }
        left = [
            str(e["name"])
            for e in events
            if e["event"] == "slurm_submitted"
            and e.get("box") == self.box_name
            and str(e.get("name")) not in ended
        ]
        for name in left:
            cancel_by_name(name)
        if left:
            _wait_gone(left)
        for event in events:
            if event["event"] == "slurm_submitted" and str(event.get("name")) in left:
                self._recover(event)
                self.campaign.journal.append(
                    "slurm_cancelled", box=self.box_name, name=str(event["name"])
                )

    def _recover(self, submitted: dict[str, Any]) -> None:
        """Merge what a killed session's array finished, so its done runs are kept.

        Its jobs are gone from the queue now (cancelled, or ended while no harness watched):
        their folders are merged as any ended job's are, with the state Slurm still reports,
        and what they did not finish is journalled failed, to be run again by this session.
        Arrays journalled before folders were recorded are left alone: their runs run again.
        """
        folders = submitted.get("folders")
        if not isinstance(folders, dict):
            return
        jobs: dict[str, str] = submitted.get("jobs", {})
        runs: dict[str, list[str]] = submitted.get("runs", {})
        logs: dict[str, str] = submitted.get("logs", {})
        try:
            states = read_states(list(jobs.values()))
        except SlurmError:
            states = {}
        why = "slurm job cancelled: the harness that submitted it was killed; resumed"
        journal = self.campaign.journal
        for key, job_id in jobs.items():
            job = SubmittedJob(
                key, tuple(runs.get(key, ())), job_id, Path(folders[key]),
                Path(logs.get(key, "")), self.box_name,
            )  # fmt: skip
            state = states.get(job_id, JobState(job_id, UNKNOWN))
            completed = state.ended and not state.failed
            end = JobEnd(job, state, cut_short="" if completed else why)
            result = self._merge(end, recovered=True)
            for run_id in result.done:
                journal.append("run_done", run_id=run_id)
            for run_id, reason in {**result.failed, **result.lost}.items():
                journal.append("run_failed", run_id=run_id, reason=reason)


def _wait_gone(names: list[str]) -> None:
    """Wait (bounded) until the cancelled arrays have left the queue."""
    deadline = time.monotonic() + _CANCELLED_GONE_S
    while time.monotonic() < deadline:
        try:
            if not queued_names(names):
                return
        except SlurmError:
            return  # the controller does not answer: submitting will say so
        time.sleep(1.0)


__all__ = ["SlurmWorker"]
