"""The runner's guard steps (:mod:`.guards` applied to a campaign), beside :mod:`.run`.

:class:`Guards` is a part of :class:`~harness.execute.run.CampaignRunner`: checking a cohort
before its first run, recording the runs of an invalid one, watching a run, waiting for an idle
runtime, and reading a swap-out the watch missed. Kept apart so the lifecycle in ``run.py``
reads as one job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.boxes.base import Box
from harness.boxes.boxes import open_box
from harness.errors import InfrastructureError
from harness.execute.guards import RunWatch, cohort_checks, cohort_key, wait_idle
from harness.formats.records import (
    RUN_FAILED,
    RunRecord,
    read_counters,
    write_json_atomic,
)
from harness.plan.build import Run
from harness.runtimes.boot import RunningRuntime, runtime_version

if TYPE_CHECKING:
    from harness.execute.scope import RunnerScope


class Guards:
    """The guard steps of a campaign runner, over the runner's scope."""

    def __init__(self, scope: RunnerScope) -> None:
        self.scope = scope

    def cohort_invalid(self, run: Run) -> str | None:
        """Why the run's cohort is invalid (checking it first, before its first run), or None."""
        if not self.scope.cohorts.enabled:
            return None
        key = cohort_key(run)
        if not self.scope.cohorts.checked(key):
            patterns = self.scope.loaded.runtime.competing
            checks = cohort_checks(self.scope.box, self.scope.loaded.card.guards, patterns)
            self.scope.cohorts.record_checks(key, checks)
            self.scope.campaign.journal.append(
                "cohort_checked",
                cohort=key,
                passed=all(c.passed for c in checks),
                checks=[c.to_json() for c in checks],
            )
        return self.scope.cohorts.invalid_reason(key)

    def record_invalid(self, run: Run, reason: str) -> None:
        """A run of an invalid cohort: recorded failed, never run."""
        local_dir = self.scope.campaign.run_dir(run.run_id)
        local_dir.mkdir(parents=True, exist_ok=True)
        record = RunRecord(
            **run.identity(),
            status=RUN_FAILED,
            box=self.scope.box_name,
            boot_id="",
            started_at=time.time(),
            attempt=0,
        )
        record.reason = f"cohort {cohort_key(run)} invalid, not run: {reason}"
        record.ended_at = record.started_at
        write_json_atomic(local_dir / "run.json", record.to_json())
        self.scope.campaign.journal.append("run_failed", run_id=run.run_id, reason=record.reason)
        self.scope.progress("end", run, {"status": RUN_FAILED, "reason": record.reason})

    def check_binary(self, run: Run, record: RunRecord) -> None:
        """Note the runtime binary the run uses; one that differs from its cohort's first run's
        invalidates the cohort and fails the run. Taken before anything is measured (for a
        command driver, before the command starts: a command that ends before a fingerprint
        taken beside it could change the binary first, and the version command would compete
        with the measured one)."""
        if not self.scope.cohorts.enabled:
            return
        key = cohort_key(run)
        version = runtime_version(
            self.scope.box, self.scope.loaded.runtime, self.scope.box_spec.python_path()
        )
        record.runtime["binary_sha256"] = version.get("binary_sha256")
        changed = self.scope.cohorts.binary(key, version.get("binary_sha256"))
        if changed is not None:
            self.scope.cohorts.invalidate(key, changed)
            raise InfrastructureError(f"guard: {changed}")

    def start_watch(self, run: Run, pgid: int) -> RunWatch | None:
        """Guards during the run: a broken rule stops the runtime and invalidates the cohort."""
        if not self.scope.cohorts.enabled:
            return None
        signal = self.scope.loaded.runtime.stop.signal

        def abort(box: Box, reason: str) -> None:
            box.signal_group(pgid, signal)

        watch = RunWatch(
            open_box=lambda: open_box(self.scope.box_name, self.scope.box_spec),
            guards=self.scope.loaded.card.guards,
            on_abort=abort,
        )
        watch.start()
        return watch

    def check_idle(self, run: Run, runtime: RunningRuntime) -> None:
        """Before any request: the profile's running/waiting metrics at 0 for a while."""
        idle = self.scope.loaded.runtime.idle
        metrics_http = self.scope.loaded.runtime.telemetry.metrics_http
        if not self.scope.cohorts.enabled or idle is None or metrics_http is None:
            return
        check = wait_idle(runtime.base_url, metrics_http, idle)
        self.scope.campaign.journal.append("idle_checked", run_id=run.run_id, **check.to_json())
        if not check.passed:
            self.scope.cohorts.invalidate(cohort_key(run), f"idle: {check.reason}")
            raise InfrastructureError(f"guard: {check.reason}")

    def swapped(self, local_dir: Path) -> str | None:
        """Swap-out the watch's last sample missed: the run's own before/after delta."""
        path = local_dir / "counters.json"
        if not self.scope.loaded.card.guards.swapout or not path.is_file():
            return None
        delta = (read_counters(path).get("delta") or {}).get("new_swapout_pages")
        if isinstance(delta, int | float) and delta > 0:
            return f"new swap-out during the run: {delta:g} pages (before/after counters)"
        return None
