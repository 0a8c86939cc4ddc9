"""What Slurm says about a job: its state, node and pending reason, read with bounded calls.

``squeue --states=all`` lists a job from submission until ``MinJobAge`` after it ended (300 s by
default), which covers a harness polling every few seconds, with or without accounting; a job it
no longer lists is asked of ``sacct``, which only a cluster with slurmdbd answers. A job neither
knows is ``UNKNOWN``: the waiter (:mod:`.wait`) counts it as ended once it stays
unknown, so no wait hangs on a job Slurm forgot (submitit's own ``result()`` would).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.errors import SlurmError

# States of a job that is still queued or running (Slurm's job_state_string names).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
COMPLETED = "COMPLETED"
UNKNOWN = "UNKNOWN"
# Seconds a squeue or sacct call may take before the controller counts as unreachable.
QUERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class JobState:
    """One job (an array element is ``<array>_<index>``) as Slurm reports it."""

    job_id: str
    state: str  # RUNNING, COMPLETED, CANCELLED, TIMEOUT… or UNKNOWN (Slurm no longer knows it)
    node: str = ""  # empty until it runs
    reason: str = ""  # why it is pending (Resources, Priority…); "" when none

    @property
    def ended(self) -> bool:
        """True once the job left the queue, whatever the outcome."""
        return self.state not in ACTIVE_STATES

    @property
    def failed(self) -> bool:
        """True when it ended in anything but COMPLETED (TIMEOUT, CANCELLED, NODE_FAIL…)."""
        return self.ended and self.state != COMPLETED

    def describe(self) -> str:
        """``slurm job 123_4 CANCELLED on node n1``: how a failed run's reason names it."""
        where = f" on node {self.node}" if self.node else ""
        if self.state == UNKNOWN:
            return (
                f"slurm job {self.job_id}{where} left the queue and the cluster keeps no "
                "accounting (sacct) to say how it ended"
            )
        return f"slurm job {self.job_id} {self.state}{where}"


def base_id(job_id: str) -> str:
    """The job (or array) id a query names: ``123`` of ``123_4``."""
    return job_id.split("_", 1)[0]


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, errors="replace"
        )
    except FileNotFoundError:
        raise SlurmError(
            f"{argv[0]} is not installed here: a slurm box submits from a host with the Slurm "
            "clients (a login node); install them (Debian: slurm-client)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`{' '.join(argv)}` did not answer within {timeout_s:g} s: the Slurm controller is "
            "unreachable or overloaded"
        ) from None


def _expand(job_id: str) -> list[str]:
    """``123_[2-4,7%2]`` → ``123_2 123_3 123_4 123_7``; other ids unchanged."""
    match = re.fullmatch(r"(\d+)_\[([0-9,\-]+)(?:%\d+)?\]", job_id)
    if match is None:
        return [job_id]
    ids: list[str] = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        ids.extend(f"{match.group(1)}_{i}" for i in range(int(low), int(high or low) + 1))
    return ids


def parse_squeue(text: str) -> dict[str, JobState]:
    """Lines of ``squeue -h -r -o %i|%T|%N|%r`` by job id."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not fields[0]:
            continue
        job_id, state, node, reason = fields
        reason = "" if reason in ("None", "(null)") else reason
        for one in _expand(job_id):
            states[one] = JobState(one, state.strip(), node.strip(), reason.strip())
    return states


def parse_sacct(text: str) -> dict[str, JobState]:
    """Lines of ``sacct -n -P -X -o JobID,State,NodeList`` by job id (``CANCELLED by 0`` is
    CANCELLED; ``None assigned`` is no node)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[0] or "." in fields[0]:
            continue  # a step (123.batch), not the job
        job_id, state, node = fields
        state = state.split()[0] if state.strip() else UNKNOWN
        node = "" if node.startswith("None") else node.strip()
        for one in _expand(job_id):
            states[one] = JobState(one, state, node)
    return states


def read_states(
    job_ids: Sequence[str], *, timeout_s: float = QUERY_TIMEOUT_S
) -> dict[str, JobState]:
    """The state of every job in ``job_ids``: from squeue, else sacct, else ``UNKNOWN``.

    Raises SlurmError when squeue itself cannot be run or does not answer (the controller is
    down): a caller that polls decides how long to tolerate that.
    """
    if not job_ids:
        return {}
    bases = ",".join(sorted({base_id(j) for j in job_ids}))
    queue = _run(["squeue", "-h", "-r", "-t", "all", "-j", bases, "-o", "%i|%T|%N|%r"], timeout_s)
    # squeue exits 1 with "Invalid job id specified" when none of the ids is known any more.
    if queue.returncode != 0 and "Invalid job id" not in queue.stderr:
        raise SlurmError(f"squeue failed (exit {queue.returncode}): {queue.stderr.strip()[-500:]}")
    found = parse_squeue(queue.stdout) if queue.returncode == 0 else {}
    missing = [j for j in job_ids if j not in found]
    if missing:
        found.update(_from_sacct(missing, timeout_s))
    return {j: found.get(j, JobState(j, UNKNOWN)) for j in job_ids}


def _from_sacct(job_ids: Iterable[str], timeout_s: float) -> dict[str, JobState]:
    bases = ",".join(sorted({base_id(j) for j in job_ids}))
    try:
        result = _run(
            ["sacct", "-n", "-P", "-X", "-j", bases, "-o", "JobID,State,NodeList"], timeout_s
        )
    except SlurmError:
        return {}  # no sacct here, or it hangs: the job stays UNKNOWN
    return parse_sacct(result.stdout) if result.returncode == 0 else {}


def queued_names(names: Iterable[str], timeout_s: float = QUERY_TIMEOUT_S) -> list[str]:
    """The names among ``names`` that jobs in the queue (pending or running) still carry."""
    argv = ["squeue", "--noheader", "--format=%j", "--name", ",".join(names)]
    return _run(argv, timeout_s).stdout.split()


__all__ = [
    "ACTIVE_STATES",
    "COMPLETED",
    "UNKNOWN",
    "JobState",
    "base_id",
    "parse_sacct",
    "parse_squeue",
    "queued_names",
    "read_states",
]
