"""The scheduling overhead per cohort on a slurm box: from sbatch to the job's first log line.

:func:`measure_overhead` submits ``jobs`` trivial jobs as one array, the way cohorts are
submitted (same resources, ``setup``, ``python``, submitit's pickled call), and reads per job:

- ``first_line_s``: sbatch to the first line of the job's log (submitit's ``Starting with …``,
  timestamped to the millisecond on the node): Slurm's queueing, allocation and launch, and the
  node's Python start;
- ``harness_s``: sbatch to the harness's own first line on the node (the job function running:
  the call unpickled, the harness imported): what a cohort waits before its first boot.

Both subtract this machine's clock from the node's, so on a cluster they include the skew
between the two (``harness box check`` checks neither clock; NTP keeps it to milliseconds).
"""

from __future__ import annotations

import re
import secrets
import shutil
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harness.errors import SlurmError
from harness.execute.slurm.submit import SubmittedArray, SubmittedJob, submit_calls
from harness.execute.slurm.wait import JobEnd, wait_for_jobs
from harness.formats.records import read_json
from harness.profiles.box import BoxSpec

# submitit's log lines: "submitit INFO (2026-12-01 17:39:44,417) - Starting with …", local time.
_STAMP = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\)")


@dataclass(frozen=True)
class SlurmOverhead:
    """Per job of one array: seconds from sbatch to its first log line and to the harness."""

    first_line_s: tuple[float, ...]
    harness_s: tuple[float, ...]
    nodes: tuple[str, ...]

    @property
    def median_first_line_s(self) -> float:
        """The median of ``first_line_s``."""
        return statistics.median(self.first_line_s)

    @property
    def median_harness_s(self) -> float:
        """The median of ``harness_s``."""
        return statistics.median(self.harness_s)


def first_line_time(log: Path) -> float | None:
    """time.time() of the first timestamped line of a job's log (None when there is none)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _STAMP.search(text)
    if match is None:
        return None
    moment = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    return moment.timestamp() + int(match.group(2)) / 1000


def measure_overhead(
    name: str, spec: BoxSpec, *, jobs: int = 4, timeout_s: float = 600.0
) -> SlurmOverhead:
    """Submit ``jobs`` trivial jobs as one array on slurm box ``name``; their overheads.

    Raises SlurmError when a job does not complete (its reason named) or its log lacks a line.
    """
    from harness.execute.slurm.job import probe_node

    assert spec.shared_dir is not None
    scratch = Path(spec.shared_dir).expanduser() / ".harness-bench" / secrets.token_hex(4)
    outs = [scratch / f"probe-{i}.json" for i in range(jobs)]
    array_name = f"harness-bench-{name}"
    ids, logs, submitted_at = submit_calls(
        spec,
        scratch,
        probe_node,
        [(str(out), "") for out in outs],
        name=array_name,
        where=f"box {name}",
    )
    submitted = tuple(
        SubmittedJob(f"bench-{i}", (), job_id, scratch, log, name)
        for i, (job_id, log) in enumerate(zip(ids, logs, strict=True))
    )
    ends: list[JobEnd] = []
    array = SubmittedArray(array_name, submitted, submitted_at)
    wait_for_jobs(array, ends.append, timeout_s=timeout_s)
    failed = [end.reason for end in ends if end.reason]
    if failed:
        raise SlurmError(f"box {name}: the overhead jobs did not complete: {'; '.join(failed)}")
    first, harness, nodes = [], [], []
    for job_id, log, out in zip(ids, logs, outs, strict=True):
        stamp = first_line_time(log)
        if stamp is None or not out.is_file():
            raise SlurmError(f"box {name}: slurm job {job_id} left no log line in {log}")
        seen = read_json(out)
        first.append(stamp - submitted_at)
        harness.append(float(seen["started_at"]) - submitted_at)
        nodes.append(str(seen["node"]))
    shutil.rmtree(scratch, ignore_errors=True)
    return SlurmOverhead(tuple(first), tuple(harness), tuple(nodes))


__all__ = ["SlurmOverhead", "first_line_time", "measure_overhead"]
