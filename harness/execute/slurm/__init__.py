"""Slurm boxes: each cohort of a campaign one Slurm job, submitted from this machine.

A box of ``kind: slurm`` runs its cohorts as one submitit job array (:mod:`.submit`), each job a
copy of the campaign directory under the box's ``shared_dir`` that the node runs with the
ordinary runner (:mod:`.job`). The harness polls the jobs' states with bounded calls
(:mod:`.states`, :mod:`.wait`), cancels them on an interrupt, and moves each ended job's runs into
the campaign (:mod:`.merge`). :mod:`.preflight` is ``harness box check`` for such a box, and
:mod:`.latency` measures the scheduling overhead per cohort (submit to the job's first line).
"""

from harness.execute.slurm.merge import MergeResult, merge_job
from harness.execute.slurm.states import JobState, read_states
from harness.execute.slurm.submit import (
    CohortJob,
    SubmittedArray,
    SubmittedJob,
    cancel_by_name,
    cancel_jobs,
    submit_cohorts,
)
from harness.execute.slurm.wait import JobEnd, JobProgress, job_progress, wait_for_jobs

__all__ = [
    "CohortJob",
    "JobEnd",
    "JobProgress",
    "JobState",
    "MergeResult",
    "SubmittedArray",
    "SubmittedJob",
    "cancel_by_name",
    "cancel_jobs",
    "job_progress",
    "merge_job",
    "read_states",
    "submit_cohorts",
    "wait_for_jobs",
]
