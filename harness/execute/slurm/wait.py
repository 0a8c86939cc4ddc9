"""Waiting for submitted cohort jobs: states polled, every wait bounded, Ctrl-C cancels them.

:func:`wait_for_jobs` polls :func:`.states.read_states` every ``poll_s`` and hands
each job to ``on_end`` as it ends, so a caller merges (and resubmits) cohorts as they finish, not
when the last one does. Nothing here blocks on Slurm without a deadline:

- a squeue or sacct call is bounded (``QUERY_TIMEOUT_S``), and a controller that stays
  unreachable for ``unreachable_s`` is an error, not a hang;
- a job Slurm no longer knows (``UNKNOWN``: aged out of squeue, no accounting) counts as ended
  after ``unknown_polls`` polls in a row;
- the whole wait ends at ``timeout_s``: the jobs still pending or running are cancelled and
  handed to ``on_end`` with that as their reason.

An interrupt (Ctrl-C, SIGTERM, or the one a fleet forwards to its worker thread) or an error in
``on_end`` cancels every job not ended yet, waits up to ``cancel_wait_s`` for Slurm to end them
(so their runtimes are stopped and their records written), and is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.errors import SlurmError
from harness.execute.slurm.states import UNKNOWN, JobState, read_states
from harness.execute.slurm.submit import SubmittedArray, SubmittedJob, cancel_by_name, cancel_jobs
from harness.formats.records import Journal

# A day and a half: longer than any cohort's job should pend and run; callers pass their own.
DEFAULT_WAIT_S = 36 * 3600.0
POLL_S = 2.0
UNKNOWN_POLLS = 3
UNREACHABLE_S = 300.0
CANCEL_WAIT_S = 60.0


@dataclass(frozen=True)
class JobEnd:
    """A job that ended: its last state, and why its cohort did not finish when it did not."""

    job: SubmittedJob
    state: JobState
    cut_short: str = ""  # set when the harness cancelled it (timeout); else Slurm's end state

    @property
    def reason(self) -> str:
        """'' for a job that COMPLETED; else ``slurm job 123_4 CANCELLED on node n1`` (…)."""
        if self.cut_short:
            return self.cut_short
        return self.state.describe() if self.state.failed else ""


@dataclass(frozen=True)
class JobProgress:
    """Where a running job is in its cohort, from the journal in its folder."""

    done: int
    failed: int
    current: str | None  # the run started and not ended yet


def job_progress(job: SubmittedJob) -> JobProgress:
    """How far ``job`` got (runs done, failed, the one running): for a progress display."""
    done = failed = 0
    current: str | None = None
    for event in Journal(job.job_dir / "journal.jsonl").events():
        kind = event["event"]
        if kind == "run_start":
            current = str(event.get("run_id"))
        elif kind in ("run_done", "run_failed", "run_interrupted"):
            done += kind == "run_done"
            failed += kind == "run_failed"
            current = None
    return JobProgress(done, failed, current)


def _poll(
    job_ids: list[str], unreachable_since: float | None, unreachable_s: float
) -> tuple[dict[str, JobState], float | None]:
    """States, or {} while the controller does not answer (an error after ``unreachable_s``)."""
    try:
        return read_states(job_ids), None
    except SlurmError:
        now = time.monotonic()
        since = unreachable_since if unreachable_since is not None else now
        if now - since > unreachable_s:
            raise
        return {}, since


def wait_for_jobs(
    array: SubmittedArray,
    on_end: Callable[[JobEnd], None],
    *,
    timeout_s: float = DEFAULT_WAIT_S,
    poll_s: float = POLL_S,
    on_poll: Callable[[dict[str, JobState]], None] | None = None,
    unknown_polls: int = UNKNOWN_POLLS,
    unreachable_s: float = UNREACHABLE_S,
    cancel_wait_s: float = CANCEL_WAIT_S,
) -> list[JobEnd]:
    """Wait until every job of ``array`` ended, calling ``on_end`` for each as it does.

    ``on_poll`` sees every poll's states (a progress display). Returns the ends in the order
    the jobs ended. Raises SlurmError when the controller stays unreachable for
    ``unreachable_s``, after cancelling the jobs.
    """
    by_id = {job.job_id: job for job in array.jobs}
    pending = list(by_id)
    last: dict[str, JobState] = {}
    unknown: dict[str, int] = {}
    ends: list[JobEnd] = []
    deadline = time.monotonic() + timeout_s
    unreachable_since: float | None = None
    try:
        while pending:
            states, unreachable_since = _poll(pending, unreachable_since, unreachable_s)
            if on_poll is not None and states:
                on_poll(states)
            for job_id, state in states.items():
                if state.state == UNKNOWN:
                    unknown[job_id] = unknown.get(job_id, 0) + 1
                    if unknown[job_id] < unknown_polls:
                        continue
                    seen = last.get(job_id)  # keep the node it was last seen on
                    state = JobState(job_id, UNKNOWN, seen.node if seen else "")
                else:
                    unknown.pop(job_id, None)
                    last[job_id] = state
                if state.ended:
                    pending.remove(job_id)
                    end = JobEnd(by_id[job_id], state)
                    ends.append(end)
                    on_end(end)
            if pending and time.monotonic() >= deadline:
                ends.extend(_give_up(array, pending, last, timeout_s, on_end))
                pending = []
            if pending:
                time.sleep(poll_s)
    except BaseException:
        _cancel_and_wait(array, pending, cancel_wait_s)
        raise
    return ends


def _give_up(
    array: SubmittedArray,
    pending: list[str],
    last: dict[str, JobState],
    timeout_s: float,
    on_end: Callable[[JobEnd], None],
) -> list[JobEnd]:
    """Cancel the jobs still queued or running at the deadline; their ends, with why."""
    cancel_jobs(pending)
    ends = []
    by_id = {job.job_id: job for job in array.jobs}
    for job_id in pending:
        state = last.get(job_id, JobState(job_id, UNKNOWN))
        detail = f" ({state.reason})" if state.reason else ""
        why = (
            f"slurm job {job_id} still {state.state}{detail} after {timeout_s:g} s: cancelled by "
            "the harness"
        )
        end = JobEnd(by_id[job_id], state, cut_short=why)
        ends.append(end)
        on_end(end)
    return ends


def _cancel_and_wait(array: SubmittedArray, pending: list[str], cancel_wait_s: float) -> None:
    """Cancel what is not ended and give Slurm ``cancel_wait_s`` to end it; never raises (the
    exception being handled is the one the caller should see)."""
    if not pending:
        return
    try:
        cancel_jobs(pending)
    except SlurmError:
        try:
            cancel_by_name(array.name)
        except SlurmError:
            return
    deadline = time.monotonic() + cancel_wait_s
    while time.monotonic() < deadline:
        try:
            states = read_states(pending)
        except SlurmError:
            return
        if all(state.ended for state in states.values()):
            return
        time.sleep(0.5)


__all__ = [
    "CANCEL_WAIT_S",
    "DEFAULT_WAIT_S",
    "JobEnd",
    "JobProgress",
    "job_progress",
    "wait_for_jobs",
]
