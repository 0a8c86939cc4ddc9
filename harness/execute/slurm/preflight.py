"""``harness box check`` on a slurm box: the controller, the partition, the shared folder, a job.

Four checks, each a :class:`~harness.boxes.checks.Check` with its fix: ``sinfo`` answers (an
unreachable controller stops the list there), the partition exists and has nodes up, the
``shared_dir`` is writable, and a trivial job submitted the way cohorts are (same resources,
``setup`` and ``python``) runs within a bounded wait and reports its node, Python and harness.
The job is cancelled if it has not ended by then, and its folder removed once it passed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from harness.boxes.checks import MIN_PYTHON, Check, uses_python
from harness.errors import KnobError, SlurmError
from harness.execute.slurm.states import QUERY_TIMEOUT_S
from harness.execute.slurm.submit import SubmittedArray, SubmittedJob, submit_calls
from harness.execute.slurm.wait import JobEnd, wait_for_jobs
from harness.formats.safe_write import write_text_atomic
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import render
from harness.version import __version__

# Seconds the trivial job may take from sbatch to its end (pending included).
PROBE_TIMEOUT_S = 180.0
# Node states that can take a job (sinfo %T, suffixes stripped); `*` (not responding) cannot.
_USABLE = {"idle", "mixed", "allocated", "completing", "planned", "reserved"}


def _sinfo(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sinfo", *arguments],
        capture_output=True,
        text=True,
        timeout=QUERY_TIMEOUT_S,
        check=False,
        errors="replace",
    )


def _controller() -> tuple[Check, list[list[str]]]:
    """``sinfo`` rows (partition, availability, nodes, state) or why it does not answer."""
    fix = (
        "check that slurmctld runs and that SLURM_CONF (or /etc/slurm/slurm.conf) names it; "
        "run the harness on a host that submits to the cluster (a login node)"
    )
    started = time.monotonic()
    try:
        result = _sinfo(["-h", "-o", "%P|%a|%D|%T"])
    except FileNotFoundError:
        detail = "sinfo is not installed here (the Slurm clients)"
        return Check("slurm controller", False, detail, "install them (Debian: slurm-client)"), []
    except subprocess.TimeoutExpired:
        detail = f"sinfo did not answer within {QUERY_TIMEOUT_S:g} s"
        return Check("slurm controller", False, detail, fix), []
    if result.returncode != 0:
        detail = f"sinfo failed (exit {result.returncode}): {result.stderr.strip()[-400:]}"
        return Check("slurm controller", False, detail, fix), []
    rows = [line.split("|") for line in result.stdout.splitlines() if line.count("|") == 3]
    took_s = time.monotonic() - started
    names = sorted({row[0].rstrip("*") for row in rows})
    detail = f"sinfo answered in {took_s:.2f} s: partitions {', '.join(names) or 'none'}"
    return Check("slurm controller", True, detail), rows


def _usable(state: str) -> bool:
    """A node state that takes jobs: ``idle``, ``mixed``…, or ``idle~`` (powered down, woken on
    demand); not ``down``, ``drained``, nor anything ``*`` (not responding)."""
    return "*" not in state and re.sub(r"[^a-z]", "", state) in _USABLE


def _partition(spec: BoxSpec, rows: list[list[str]]) -> Check:
    default = [row[0].rstrip("*") for row in rows if row[0].endswith("*")]
    name = spec.partition or (default[0] if default else None)
    known = sorted({row[0].rstrip("*") for row in rows})
    if name is None:
        detail = "the box names no partition and the cluster has no default one"
        return Check("partition", False, detail, f"set `partition:` to one of {', '.join(known)}")
    mine = [row for row in rows if row[0].rstrip("*") == name]
    if not mine:
        return Check(
            "partition",
            False,
            f"partition {name} is not on the cluster (it has {', '.join(known) or 'none'})",
            f"set `partition:` to one of {', '.join(known)}" if known else "ask the admins",
        )
    if all(row[1] != "up" for row in mine):
        detail = f"partition {name} is {mine[0][1]}: it starts no job"
        fix = "wait for the admins to bring it up, or set `partition:` to another"
        return Check("partition", False, detail, fix)
    counts: dict[str, int] = {}
    for _, _, nodes, state in mine:
        counts[state] = counts.get(state, 0) + (int(nodes) if nodes.isdigit() else 0)
    up = sum(n for state, n in counts.items() if _usable(state))
    seen = ", ".join(f"{state}: {n}" for state, n in sorted(counts.items()))
    total = sum(counts.values())
    if up == 0:
        return Check(
            "partition",
            False,
            f"partition {name} has no node up ({seen})",
            "wait for its nodes to come back, or set `partition:` to another",
        )
    where = "" if spec.partition else " (the default)"
    return Check("partition", True, f"partition {name}{where}: {up} of {total} nodes up ({seen})")


def _shared_dir(spec: BoxSpec) -> tuple[Check, Path | None]:
    assert spec.shared_dir is not None
    folder = Path(os.path.expanduser(spec.shared_dir))
    probe = folder / f".harness-check-{secrets.token_hex(4)}"
    fix = "point `shared_dir` at a folder this machine can write and every node mounts"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(probe, "harness\n")
        back = probe.read_text(encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        return Check("shared dir", False, f"{folder}: {exc}", fix), None
    if back != "harness\n":
        return Check("shared dir", False, f"{folder}: a file read back changed", fix), None
    return Check("shared dir", True, f"{folder} is writable here"), folder


def _runtime_binary(spec: BoxSpec, profile: RuntimeProfile | None) -> str:
    if profile is None:
        return ""
    try:
        return render(profile.boot.command[0], {"python": spec.python_path()})
    except KnobError:
        return ""


def _trivial_job(
    name: str, spec: BoxSpec, profile: RuntimeProfile | None, folder: Path, timeout_s: float
) -> Check:
    from harness.execute.slurm.job import probe_node

    scratch = folder / ".harness-check" / secrets.token_hex(4)
    out = scratch / "probe.json"
    binary = _runtime_binary(spec, profile)
    job_name = f"harness-check-{name}"
    fix_submit = (
        "check `partition`, `gres`/`gpus`, `account`, `constraint` and `time` against the "
        "cluster (sinfo, sacctmgr show assoc user=$USER)"
    )
    try:
        ids, logs, submitted_at = submit_calls(
            spec, scratch, probe_node, [(str(out), binary)], name=job_name, where=f"box {name}"
        )
    except SlurmError as exc:
        return Check("trivial job", False, str(exc), fix_submit)
    job = SubmittedJob("check", (), ids[0], scratch, logs[0], name)
    ends: list[JobEnd] = []
    array = SubmittedArray(job_name, (job,), submitted_at)
    wait_for_jobs(array, ends.append, timeout_s=timeout_s, poll_s=1.0)
    end = ends[0]
    took_s = time.time() - submitted_at
    log_fix = f"read the job's log {logs[0]}; check `setup` and `python` on the box"
    if end.reason or not out.is_file():
        tail = _tail(logs[0])
        why = end.reason or f"slurm job {ids[0]} ended without its report"
        if end.cut_short:
            return Check(
                "trivial job",
                False,
                why,
                "the partition is busy or the request too large: try again later, or ask for less",
            )
        detail = why + (f"; its log ends: {tail}" if tail else "")
        return Check("trivial job", False, detail, log_fix)
    seen = json.loads(out.read_text(encoding="utf-8"))
    problems = []
    if seen["harness"] != __version__:
        problems.append(f"the node has harness {seen['harness']}, this machine {__version__}")
    version = tuple(int(p) for p in str(seen["python_version"]).split("."))
    if profile is not None and uses_python(profile) and version < MIN_PYTHON:
        problems.append(f"{seen['python']} is {seen['python_version']}, the runtime needs 3.11+")
    if binary and not seen.get("binary"):
        runtime = profile.name if profile is not None else "?"
        problems.append(f"{binary} (boot.command[0] of runtime {runtime}) is not on the node")
    detail = (
        f"slurm job {ids[0]} ran on node {seen['node']} in {took_s:.1f} s: Python "
        f"{seen['python_version']}, harness {seen['harness']}"
        + (f", GPUs {seen['gpus']}" if seen.get("gpus") else "")
    )
    if problems:
        fix = (
            f"install harness {__version__} (and the runtime) on the nodes where `python` and "
            "`setup` point"
        )
        return Check("trivial job", False, detail + "; " + "; ".join(problems), fix)
    shutil.rmtree(scratch, ignore_errors=True)
    return Check("trivial job", True, detail)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def check_slurm_box(
    name: str,
    spec: BoxSpec,
    profile: RuntimeProfile | None = None,
    *,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
) -> list[Check]:
    """Check that slurm box ``name`` can run cohorts (with ``profile``, that runtime's too)."""
    controller, rows = _controller()
    if not controller.ok:
        return [controller]
    partition = _partition(spec, rows)
    shared, folder = _shared_dir(spec)
    checks = [controller, partition, shared]
    if partition.ok and folder is not None:
        checks.append(_trivial_job(name, spec, profile, folder, probe_timeout_s))
    return checks


__all__ = ["PROBE_TIMEOUT_S", "check_slurm_box"]
