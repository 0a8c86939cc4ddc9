"""Route-count dumps a runtime rewrites, read as counters, and the idle wait before a timed run.

A profile's ``telemetry.count_dump`` names a file in the CUDA lane's route-count format
(``{"layers": {"0": [count per expert…]}, "time": …}``, cumulative; :mod:`harness.maps`) that
the runtime rewrites every ``every_s`` seconds: seed 000's hook (``MEGA_COUNT``) or the harness's
vLLM plugin (``HARNESS_VLLM_ROUTES``). The runner reads it before and after the scored workload;
``route_selections`` (every layer's counts summed) joins the run's counters, and the difference
of the two snapshots is kept as the run's ``route-counts.json``, in the same format, so
``harness fit-map`` fits a map from one run's routing.

``telemetry.idle`` makes the runner wait, before it reads the counters and starts the timed
workload, until the named Prometheus gauges (``vllm:num_requests_running`` and ``…_waiting``)
read 0: seed 000 waits so on a shared box, where someone else's requests would be timed too.
"""

from __future__ import annotations

import tempfile
import time
import urllib.error
from pathlib import Path

import numpy as np

from harness.errors import InfrastructureError, MapError
from harness.execute.boxes import Box
from harness.execute.counters import parse_prometheus
from harness.execute.runtimes import http_text, render
from harness.maps import CountDump, read_count_snapshot, write_count_dump
from harness.profiles import CountDumpSpec, IdleSpec

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


def gauge_sum(samples: dict[str, float], name: str) -> float | None:
    """A gauge summed over its label sets; None when the runtime does not serve it."""
    values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return float(sum(values)) if values else None


def wait_idle(base_url: str, metrics_http: str, spec: IdleSpec) -> float:
    """Poll ``/metrics`` until every gauge of ``spec`` reads 0 for ``hold_s``; returns the
    seconds waited. InfrastructureError when a gauge is not served or the wait times out."""
    started = time.monotonic()
    idle_since: float | None = None
    last: dict[str, float | None] = {}
    while True:
        now = time.monotonic()
        try:
            status, text = http_text(base_url + metrics_http, timeout_s=5)
        except (OSError, urllib.error.URLError) as exc:
            raise InfrastructureError(f"idle check: {metrics_http} did not answer: {exc}") from None
        if status != 200:
            raise InfrastructureError(f"idle check: {metrics_http} answered HTTP {status}")
        samples = parse_prometheus(text)
        last = {name: gauge_sum(samples, name) for name in spec.gauges}
        missing = [name for name, value in last.items() if value is None]
        if missing:
            raise InfrastructureError(
                f"idle check: the runtime serves no {', '.join(missing)} at {metrics_http}: "
                "fix `telemetry.idle.gauges` in the profile"
            )
        if all(value == 0 for value in last.values()):
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= spec.hold_s:
                return now - started
        else:
            idle_since = None
        if now - started > spec.timeout_s:
            busy = ", ".join(f"{k}={v:g}" for k, v in last.items() if v)
            raise InfrastructureError(
                f"idle check: the runtime was not idle for {spec.hold_s:g} s within "
                f"{spec.timeout_s:g} s ({busy}): another client is using it"
            )
        time.sleep(0.5)
