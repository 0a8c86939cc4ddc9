"""Route-count dumps a runtime rewrites, read as counters before and after each run.

A profile's ``telemetry.count_dump`` names a file in the CUDA lane's route-count format
(``{"layers": {"0": [count per expert…]}, "time": …}``, cumulative; :mod:`harness.formats.maps`)
that the runtime rewrites every ``every_s`` seconds: seed 000's hook (``MEGA_COUNT``) or the
harness's vLLM plugin (``HARNESS_VLLM_ROUTES``). The runner reads it before and after the scored
workload; ``route_selections`` (every layer's counts summed) joins the run's counters, and the
difference of the two snapshots is kept as the run's ``route-counts.json``, in the same format, so
``harness fit-map`` fits a map from one run's routing."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from harness.boxes.base import Box
from harness.errors import InfrastructureError, MapError
from harness.formats.maps import CountDump, read_count_snapshot, write_count_dump
from harness.profiles.telemetry import CountDumpSpec
from harness.runtimes.boot import render

ROUTE_COUNTER = "route_selections"


def read_route_snapshot(box: Box, spec: CountDumpSpec, run_dir: str) -> CountDump | None:
    """The dump as it is now, after waiting for the runtime's next rewrite; None when the
    runtime wrote none (a gate on ``route_selections`` then fails: not recorded)."""
    time.sleep(1.5 * spec.every_s)
    remote = render(spec.path, {"run_dir": run_dir})
    if not box.exists(remote):
        return None
    with tempfile.TemporaryDirectory(prefix="harness-routes-") as tmp:
        local = Path(tmp) / "route-counts.json"
        box.get_file(remote, local)
        try:
            return read_count_snapshot(local)
        except MapError as exc:
            raise InfrastructureError(f"{remote}: the runtime's count dump: {exc}") from None


def route_counters(snapshot: CountDump | None) -> dict[str, float]:
    """The counters a count dump gives: ``route_selections``, every layer summed."""
    if snapshot is None:
        return {}
    return {ROUTE_COUNTER: float(snapshot.counts.sum())}


def write_route_delta(path: Path, before: CountDump | None, after: CountDump | None) -> bool:
    """Write after − before as a count dump (the run's own routing); False when either is
    missing or the shapes differ (a runtime restarted mid-run), so nothing is written."""
    if before is None or after is None or before.counts.shape != after.counts.shape:
        return False
    delta = after.counts - before.counts
    if (delta < 0).any():
        return False  # counts went backwards: the runtime restarted; the delta would lie
    write_count_dump(path, np.asarray(delta), after.time_s)
    return True
