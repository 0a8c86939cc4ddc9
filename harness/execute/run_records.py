"""What a run leaves on disk: its tables, counters, ring, logs and ``run.json``, written last.

:class:`Records` is a part of :class:`~harness.execute.run.CampaignRunner` (the lifecycle):
after the runtime stops it collects the server log, the frontier-logit dumps, the ring (drained
pieces joined to the rest) and the route trace, writes ``requests``/``chunks``/``samples``,
``counters.json`` and ``monitor.json``, and then ``run.json``, so a ``run.json`` on disk means
every other record of the run is there. Only then is ``run_done`` journalled.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.analyze.logit_parity import LOGITS_DIR
from harness.drive.client import RequestResult
from harness.errors import HarnessError, RecordError
from harness.execute.box_load import read_box_load
from harness.execute.frames import chunks_frame, counters_record, numbered, requests_frame
from harness.execute.guards import RunWatch, cohort_key
from harness.execute.resume import (
    CheckpointState,
    earlier_frames,
)
from harness.execute.soak import DrainResult, RingStore, RunMonitor, assemble_ring
from harness.formats.records import (
    RUN_FAILED,
    RUN_OK,
    Journal,
    RunRecord,
    write_json_atomic,
    write_parquet,
)
from harness.formats.ring_read import read_ring, read_ring_since
from harness.formats.route_trace import slice_after_last_reset, write_run_part
from harness.plan.build import Run
from harness.runtimes.applied_policy import (
    add_exit_counters,
    applied_problems,
    exit_specs,
    identity_lines,
)
from harness.runtimes.boot import (
    RunningRuntime,
    render,
    stop_group,
)

if TYPE_CHECKING:
    from harness.execute.guard_steps import Guards
    from harness.execute.scope import RunnerScope

from harness.runtimes.log_counters import (
    log_counter_units,
    missing_log_counters,
)


def failure_reason(exc: Exception) -> tuple[str, str]:
    """A failed run's one-line reason and the runtime's log tail its error carried. A runtime
    that exited says why in its last line (a flag it refused): the reason ends with it, so the
    terminal shows it without opening server.log."""
    message, _, tail = str(exc).partition("; log tail:\n")
    reason = message.strip() or type(exc).__name__
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    if last and "exited" in reason:
        reason += f" (its last line: {last[:200]})"
    return reason, tail


@dataclass
class BootState:
    """One boot of a run: its remote folder, ring store, monitor and checkpoint journal."""

    index: int
    remote_dir: str
    store: RingStore
    pgid: int | None = None  # journalled as soon as the runtime starts, before it is ready
    previous: CheckpointState | None = None  # the boots a resumed run already went through
    journal: Journal | None = None  # the checkpoint journal (checkpointed runs only)
    monitor: RunMonitor | None = None
    watch: RunWatch | None = None  # the guards during the run, when on
    results: list[RequestResult] = field(default_factory=list)
    pending: list[RequestResult] = field(default_factory=list)  # since the last checkpoint
    origin_wall: float = 0.0  # time.time() at t_start_s == 0 (samples count from it too)
    segments_planned: int = 0
    segments_done: int = 0
    keep_runtime: bool = False  # a shared boot the next run uses: not stopped after this run
    boot_run_id: str = ""  # the run whose boot this is (journalled with it), when shared
    # What the counters grew by during until_recovered extensions (left out of the delta);
    # None when no extension sent anything.
    unscored: dict[str, float] | None = None


@dataclass
class SharedBoot:
    """A runtime that several consecutive runs of one boot group use (``design.boot``)."""

    group: str
    runtime: RunningRuntime
    remote_dir: str  # the first run's folder on the box: the boot's log, ring and control file
    boot_id: str
    first_run_id: str  # the run the boot is journalled under
    ring_seq: int = 0  # the last ring record a run on this boot took; the next reads after it
    runs: int = 0


class Records:
    """The record-writing steps of a campaign runner, over the runner's scope."""

    def __init__(self, scope: RunnerScope, guards: Guards) -> None:
        self.scope = scope
        self.guards = guards

    def finish(
        self,
        run: Run,
        record: RunRecord,
        runtime: RunningRuntime | None,
        state: BootState,
        local_dir: Path,
    ) -> None:
        if state.monitor is not None:
            state.monitor.stop()  # before the stop, so no sample sees a half-stopped group
        if state.watch is not None:
            state.watch.stop()
            if state.watch.reason is None:
                state.watch.reason = self.guards.swapped(local_dir)
            if state.watch.reason is not None:
                # A guard stopped the run: that is why it failed, and the cohort is invalid.
                record.status = RUN_FAILED
                record.reason = f"guard: {state.watch.reason}" + (
                    f" (then: {record.reason})" if record.reason else ""
                )
                self.scope.cohorts.invalidate(cohort_key(run), state.watch.reason)
        if runtime is None and state.pgid is not None:
            # Started but never returned from the boot (interrupted while it got ready).
            if stop_group(self.scope.box, self.scope.loaded.runtime, state.pgid):
                self.scope.campaign.journal.append(
                    "boot_stopped", run_id=run.run_id, pgid=state.pgid
                )
            else:
                record.status = RUN_FAILED
                record.reason = (record.reason + "; " if record.reason else "") + (
                    f"process group {state.pgid} survived SIGKILL"
                )
        if runtime is not None:
            if not record.log_tail and record.status != RUN_OK:
                record.log_tail = runtime.log_tail()
            keep = state.keep_runtime and record.status == RUN_OK
            gone = True if keep else runtime.stop()
            if gone and not keep:
                self.scope.campaign.journal.append(
                    "boot_stopped", run_id=state.boot_run_id or run.run_id, pgid=runtime.pgid
                )
                # Counters printed at exit belong to a run only when its boot was its own.
                if not state.boot_run_id:
                    self._read_exit_counters(local_dir, runtime)
            state.keep_runtime = keep
            record.runtime["boot_s"] = round(runtime.boot_s, 3)
            if not gone:
                record.status = RUN_FAILED
                record.reason = (record.reason + "; " if record.reason else "") + (
                    f"process group {runtime.pgid} survived SIGKILL"
                )
        if "box_load" in record.runtime:  # read before the boot: read again, its runtime stopped
            python = self.scope.box_spec.python_path()
            record.runtime["box_load"]["after"] = read_box_load(self.scope.box, python)
        try:
            self._collect(local_dir, state, record)
            self._check_applied(local_dir, record)
            self._keep_identity_lines(local_dir, record)
        except (HarnessError, OSError) as exc:
            if record.status == RUN_OK:
                record.status = RUN_FAILED
                record.reason = f"collecting telemetry failed: {exc}"
            elif runtime is not None:
                # Failed already; say what is missing too, so no reader takes its absence for 0.
                record.reason = (record.reason + "; " if record.reason else "") + (
                    f"telemetry not collected: {exc}"
                )
        frames = [
            (requests_frame(state.results, run.cell, state.index), chunks_frame(state.results))
        ]
        samples = (
            [state.monitor.samples_frame(state.origin_wall)] if state.monitor is not None else []
        )
        if state.previous is not None:
            old_frames, old_samples = earlier_frames(local_dir / "checkpoint", state.previous)
            frames = old_frames + frames
            samples = old_samples + samples
        requests, chunks = numbered(frames)
        write_parquet(requests, local_dir / "requests.parquet")
        write_parquet(chunks, local_dir / "chunks.parquet")
        if samples:
            write_parquet(pd.concat(samples, ignore_index=True), local_dir / "samples.parquet")
        self._write_monitor(local_dir, state)
        record.ended_at = time.time()
        write_json_atomic(local_dir / "run.json", record.to_json())
        if record.status == RUN_OK:
            # Everything is in ring.parquet and requests.parquet now; the segment journal stays.
            shutil.rmtree(local_dir / "ring-chunks", ignore_errors=True)
            for path in (local_dir / "checkpoint").glob("*.parquet"):
                path.unlink()
            self.scope.campaign.journal.append("run_done", run_id=run.run_id)
        else:
            self.scope.campaign.journal.append(
                f"run_{record.status}", run_id=run.run_id, reason=record.reason
            )
        self.scope.progress("attempt", run, {"status": record.status, "reason": record.reason})

    def _write_monitor(self, local_dir: Path, state: BootState) -> None:
        """``monitor.json``: drains, samples, errors, and the boots and segments of the run."""
        monitor = state.monitor
        boots = []
        if state.previous is not None:
            for earlier in state.previous.boots:
                boots.append(
                    {
                        "boot": earlier.boot,
                        "segments": earlier.segments,
                        "ring_seq_kept": earlier.ring_seq,
                        "ring_lost": earlier.ring_lost + earlier.ring_dropped,
                        "span_s": [earlier.t_first_s, earlier.t_last_s],
                        "interrupted": True,
                    }
                )
        boots.append({"boot": state.index, "segments_done": state.segments_done})
        write_json_atomic(
            local_dir / "monitor.json",
            {
                "drain_interval_s": self.scope.monitor_settings.drain_interval_s,
                "sample_interval_s": self.scope.monitor_settings.sample_interval_s,
                "drains": state.store.drains,
                "samples": len(monitor.samples) if monitor is not None else 0,
                "errors": monitor.errors[-20:] if monitor is not None else [],
                "checkpointed": state.journal is not None,
                "segments_planned": state.segments_planned,
                "boots": boots,
            },
        )

    def _read_exit_counters(self, local_dir: Path, runtime: RunningRuntime) -> None:
        """Counters the runtime prints only as it exits, read from its log after the stop."""
        specs = self.scope.loaded.runtime.telemetry.log_counters
        path = local_dir / "counters.json"
        if (
            not exit_specs(specs)
            or not path.is_file()
            or self.scope.loaded.runtime.driver is not None
        ):
            return  # a command's counters are all read after it exited (_run_command)
        text = self.scope.box.read_text(runtime.spec.log_path)
        payload = json.loads(path.read_text(encoding="utf-8"))
        payload = add_exit_counters(payload, specs, text, where=runtime.spec.log_path)
        write_json_atomic(path, payload)

    def _check_applied(self, local_dir: Path, record: RunRecord) -> None:
        """Fail an ok run whose log says the runtime applied something else than its knobs."""
        checks = self.scope.loaded.runtime.telemetry.applied
        log = local_dir / "server.log"
        if not checks or record.status != RUN_OK or not log.is_file():
            return
        text = log.read_text(encoding="utf-8", errors="replace")
        problems = applied_problems(checks, record.knobs, text, where=str(log))
        if problems:
            record.status = RUN_FAILED
            record.reason = "; ".join(problems)

    def _keep_identity_lines(self, local_dir: Path, record: RunRecord) -> None:
        """The log lines that say how the runtime placed itself (llama.cpp's fit plan), in the
        run's runtime identity, so two runs that placed tensors differently are told apart."""
        patterns = self.scope.loaded.runtime.telemetry.identity_lines
        log = local_dir / "server.log"
        if not patterns or not log.is_file():
            return
        text = log.read_text(encoding="utf-8", errors="replace")
        record.runtime["log_identity"] = identity_lines(patterns, text)

    def write_counters(
        self,
        local_dir: Path,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        swap_before: int | None,
        swap_after: int | None,
        previous: CheckpointState | None,
        unscored: dict[str, float] | None = None,
    ) -> None:
        payload = counters_record(before, after, swap_before, swap_after, previous, unscored)
        specs = self.scope.loaded.runtime.telemetry.log_counters
        if specs:
            # Declared but not counted is said, so no reader takes the absence for 0.
            payload["log_counter_units"] = log_counter_units(specs)
            payload["missing"] = missing_log_counters(specs, before, after)
        write_json_atomic(local_dir / "counters.json", payload)

    def _collect(self, local_dir: Path, state: BootState, record: RunRecord) -> None:
        telemetry = self.scope.loaded.runtime.telemetry
        remote_dir = state.remote_dir
        context = {"run_dir": remote_dir, "port": 0, "python": self.scope.box_spec.python_path()}
        log_remote = f"{remote_dir}/server.log"
        if self.scope.box.exists(log_remote):
            self.scope.box.get_file(log_remote, local_dir / "server.log")
        if state.previous is not None:
            for earlier in state.previous.boots:
                old_log = f"{earlier.remote_dir}/server.log"
                with contextlib.suppress(HarnessError, OSError):
                    if self.scope.box.exists(old_log):
                        self.scope.box.get_file(old_log, local_dir / f"server.b{earlier.boot}.log")
        self._collect_logits(local_dir, context)
        if telemetry.ring is None:
            self._collect_trace(local_dir, context)
            return
        ring_remote = render(telemetry.ring.path, context)
        if not self.scope.box.exists(ring_remote):
            # The profile declares a ring: a run without one fails, whatever else happened.
            raise RecordError(f"the runtime wrote no ring at {ring_remote}")
        # A ring on this machine is read where it lies: a copy read every slot of it (75 MB for
        # refbox's), most of them never written.
        ring_local = self.scope.box.local_path(ring_remote)
        copied = ring_local is None
        if ring_local is None:
            ring_local = local_dir / "ring.bin"
            self.scope.box.get_file(ring_remote, ring_local)
        if not telemetry.ring.header:
            ring = read_ring(ring_local, fields=telemetry.ring.fields)
            record.ring_lost = ring.lost
            write_parquet(ring.frame, local_dir / "ring.parquet")
            if copied:
                ring_local.unlink()
            self._collect_trace(local_dir, context)
            return
        # The rest of the ring after the last drain; the drains hold everything before it.
        final = read_ring_since(ring_local, state.store.after_sequence)
        state.store.add(DrainResult(final.frame, final.sequence, True, final.lost, final.dropped))
        state.store.flush()
        caps: dict[int, int] = {}
        lost = state.store.lost + state.store.dropped
        if state.previous is not None:
            for earlier in state.previous.boots:
                # Records after its last checkpoint belong to a segment that was run again.
                caps[earlier.boot] = earlier.ring_seq
                lost += earlier.ring_lost + earlier.ring_dropped
        ring_frame = assemble_ring(state.store.folder, caps)
        if ring_frame.empty:
            ring_frame = final.frame
        record.ring_lost = lost
        write_parquet(ring_frame, local_dir / "ring.parquet")
        if copied:
            ring_local.unlink()
        self._collect_trace(local_dir, context)

    def _collect_logits(self, local_dir: Path, context: dict[str, Any]) -> None:
        """The run's frontier-logit dumps, when the profile declares them (none: the run fails,
        since the exact_outputs gate would otherwise compare nothing)."""
        dumps = self.scope.loaded.runtime.logit_dumps
        if dumps is None:
            return
        remote = render(dumps.path, context)
        if not self.scope.box.exists(remote):
            raise RecordError(f"the runtime wrote no frontier-logit dumps at {remote}")
        self.scope.box.get_dir(remote, local_dir / LOGITS_DIR)
        if not any((local_dir / LOGITS_DIR).rglob(dumps.glob)):
            raise RecordError(f"no {dumps.glob} in the frontier-logit dumps at {remote}")

    def _collect_trace(self, local_dir: Path, context: dict[str, Any]) -> None:
        telemetry = self.scope.loaded.runtime.telemetry
        if telemetry.route_trace:
            trace_remote = render(telemetry.route_trace, context)
            if self.scope.box.exists(trace_remote):
                # On a shared boot the file holds every run so far: keep this run's own part,
                # read where it lies on this machine rather than copying the whole boot first.
                local = local_dir / "route-trace.jsonl"
                lying = self.scope.box.local_path(trace_remote)
                if lying is not None:
                    write_run_part(lying, local)
                else:
                    self.scope.box.get_file(trace_remote, local)
                    slice_after_last_reset(local)
