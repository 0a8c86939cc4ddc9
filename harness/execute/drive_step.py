"""A run's drive step: what it sends to a ready runtime, and the counters around it.

The runner (:mod:`.run`) boots, warms and washes; this step drives the scored workload — in one
piece, or for a soak in checkpointed segments (:mod:`.resume`) whose requests, ring and counters
are persisted as each ends — through the streaming client here or on the box (``drive:
on-box``), ending ``until_recovered`` extensions when the ring shows the recovery measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.boxes.async_interrupts import run_async
from harness.boxes.base import Box
from harness.card import LoadedCard
from harness.drive.canaries import canary_phase, canary_record
from harness.drive.client import PhasePlan, RequestResult, UntilHook, drive
from harness.drive.remote import BoxDriver
from harness.drive.workload import QUALITY_PHASE, build_phases, run_drive_spec
from harness.errors import HarnessError
from harness.execute.frames import chunks_frame, counter_delta, requests_frame
from harness.execute.recovery_watch import RecoveryWatch
from harness.execute.resume import (
    CheckpointState,
    earlier_frames,
    samples_path,
    segment_paths,
    split_phases,
)
from harness.execute.run_records import BootState
from harness.execute.scope import ProgressCallback
from harness.formats.records import CANARY_FILE, RunRecord, write_parquet
from harness.formats.safe_write import write_text_atomic
from harness.plan.build import Run
from harness.profiles.box import BoxSpec
from harness.runtimes.applied_policy import live_specs
from harness.runtimes.boot import RunningRuntime, render
from harness.runtimes.counters import scrape_counters
from harness.runtimes.log_counters import log_snapshot, start_snapshot


def counters(runtime: RunningRuntime) -> dict[str, Any] | None:
    # JSON counters and/or Prometheus /metrics; None from a runtime that died mid-run (its
    # failure is reported from the requests).
    telemetry = runtime.profile.telemetry
    return scrape_counters(runtime.base_url, telemetry.counters_http, telemetry.metrics_http)


def with_log(
    counters: dict[str, Any] | None, runtime: RunningRuntime, *, start: bool = False
) -> dict[str, Any] | None:
    # The profile's live log counters, snapshotted from the server log beside the HTTP counters
    # (those printed only at exit are read after the stop: see Records._read_exit_counters).
    specs = live_specs(runtime.profile.telemetry.log_counters)
    if not specs:
        return counters
    text = runtime.box.read_text(runtime.spec.log_path)
    where = f"{runtime.spec.log_path}"
    snapshot = start_snapshot(specs, text, where=where) if start else None
    if snapshot is None:
        snapshot = log_snapshot(text, specs, where=where)
    return {**(counters or {}), **snapshot}


class DriveStep:
    """Drives a campaign's runs on one box: the card's workload, the progress callback, and
    where the drive runs (``box_driver``, set once the box is prepared, for ``drive: on-box``)."""

    def __init__(
        self,
        loaded: LoadedCard,
        box: Box,
        box_spec: BoxSpec,
        progress: ProgressCallback,
        checkpoint_s: float,
    ) -> None:
        self.loaded = loaded
        self.box = box
        self.box_spec = box_spec
        self.progress = progress
        self.checkpoint_s = checkpoint_s
        self.box_driver: BoxDriver | None = None

    def ring_path(self, state: BootState) -> str | None:
        """The runtime's ring file on the box, where it writes one with a header."""
        telemetry = self.loaded.runtime.telemetry
        if telemetry.ring is None or not telemetry.ring.header:
            return None
        context = {"run_dir": state.remote_dir, "port": 0, "python": self.box_spec.python_path()}
        return render(telemetry.ring.path, context)

    def _recovery_until(
        self, runtime: RunningRuntime, phases: list[PhasePlan], state: BootState
    ) -> UntilHook | None:
        """The hook that ends ``until_recovered`` extensions once the ring shows the recovery
        measured, and takes the counters on each side of what an extension sends so the run's
        counters leave it out; None when no phase extends or the runtime writes no ring."""
        ring_path = self.ring_path(state)
        if ring_path is None or not any(p.extension for p in phases):
            return None
        watch = RecoveryWatch(
            self.box, self.box_spec.python_path(), ring_path, self.loaded.card.analysis
        )
        started: dict[int, dict[str, Any] | None] = {}

        def counters_now() -> dict[str, Any] | None:
            try:
                return with_log(counters(runtime), runtime)
            except (OSError, HarnessError):
                return None  # a runtime that died: its counters are taken as lost anyway

        async def measured(phase: PhasePlan) -> bool:
            return await asyncio.to_thread(watch.measured, phase.index)

        async def begins(phase: PhasePlan) -> None:
            started[phase.index] = await asyncio.to_thread(counters_now)

        async def ends(phase: PhasePlan) -> None:
            grew = counter_delta(
                started.pop(phase.index, None), await asyncio.to_thread(counters_now)
            )
            unscored = state.unscored if state.unscored is not None else {}
            for key, value in grew.items():
                unscored[key] = unscored.get(key, 0.0) + value
            state.unscored = unscored

        return UntilHook(measured, begins, ends)

    def drive_scored(
        self,
        runtime: RunningRuntime,
        run: Run,
        state: BootState,
        warmups: list[RequestResult],
        before: dict[str, Any] | None,
        swap_before: int | None,
        record: RunRecord,
    ) -> None:
        """Drive the scored workload: one piece, or checkpointed segments for a soak."""
        phases = build_phases(self.loaded, warmup=False)
        state.results.extend(warmups)
        state.pending.extend(warmups)
        previous = state.previous
        if state.journal is None:
            state.origin_wall = time.time()
            until = self._recovery_until(runtime, phases, state)
            results = self.drive(runtime, phases, run, mark_first=not warmups, until=until)
            state.results.extend(results)
            state.segments_planned = state.segments_done = 1
            return
        checkpoint_s = previous.checkpoint_s if previous else self.checkpoint_s
        origin_wall = previous.origin_wall if previous else time.time()
        state.origin_wall = origin_wall
        if previous is None:
            state.journal.append(
                "plan",
                checkpoint_s=checkpoint_s,
                origin_wall=origin_wall,
                started_at=record.started_at,
            )
        state.journal.append(
            "scored_start", boot=state.index, counters=before, swapout_pages=swap_before
        )
        segments = split_phases(phases, checkpoint_s)
        done = previous.done_segments if previous else set()
        state.segments_planned = len(segments)
        state.segments_done = len(done)
        mark_first = not warmups
        for index, segment in enumerate(segments):
            if index in done:
                continue
            # One time axis across segments and boots: t_start_s counts from the run's origin.
            origin = time.perf_counter() - (time.time() - origin_wall)
            results = self.drive(runtime, [segment], run, origin=origin, mark_first=mark_first)
            mark_first = False
            state.results.extend(results)
            state.pending.extend(results)
            self._checkpoint(runtime, run, state, index)
            state.segments_done += 1
            if not self.box.group_alive(runtime.pgid):
                break  # a dead runtime: do not spin through the remaining hours

    def _checkpoint(self, runtime: RunningRuntime, run: Run, state: BootState, index: int) -> None:
        """Persist one finished segment: its requests, the ring through now, the counters."""
        assert state.journal is not None
        if state.monitor is not None:
            state.monitor.drain_now()
            state.monitor.flush()
        folder = state.journal.path.parent
        requests_path, chunks_path = segment_paths(folder, index)
        write_parquet(requests_frame(state.pending, run.cell, state.index), requests_path)
        write_parquet(chunks_frame(state.pending), chunks_path)
        if state.monitor is not None:
            write_parquet(
                state.monitor.samples_frame(state.origin_wall), samples_path(folder, state.index)
            )
        state.pending = []
        state.journal.append(
            "segment_done",
            boot=state.index,
            segment=index,
            ring_seq=state.store.after_sequence,
            ring_lost=state.store.lost,
            ring_dropped=state.store.dropped,
            counters=with_log(counters(runtime), runtime),
            swapout_pages=self.box.swapout_pages(),
        )

    def previous_failures(self, local_dir: Path, previous: CheckpointState | None) -> int:
        """Failed scored requests in the segments of earlier boots."""
        if previous is None:
            return 0
        frames, _ = earlier_frames(local_dir / "checkpoint", previous)
        return sum(int((~f["ok"] & ~f["warmup"]).sum()) for f, _ in frames)

    def drive(
        self,
        runtime: RunningRuntime,
        phases: list[PhasePlan],
        run: Run,
        *,
        origin: float | None = None,
        mark_first: bool = True,
        until: UntilHook | None = None,
        greedy: bool = False,
    ) -> list[RequestResult]:
        if not phases:
            return []
        spec = run_drive_spec(self.loaded, runtime)
        if greedy:  # one at a time too: a batch can move a float, and a token with it
            spec = dataclasses.replace(spec, temperature=0.0, concurrency=1)
        phase_knob = self.loaded.runtime.phase_live_knob

        def phase_live(phase: PhasePlan) -> dict[str, Any] | None:
            if phase_knob and phase.index >= 0 and phase.index != QUALITY_PHASE:
                return {phase_knob: phase.index}
            return None

        async def on_phase(phase: PhasePlan) -> None:
            if (live := phase_live(phase)) is not None:
                # A dead runtime refuses this; the phase's requests then fail and say why.
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(runtime.post_live, live)

        def on_result(result: RequestResult) -> None:
            self.progress("request", run, {"result": result})

        if self.box_driver is not None:  # `drive: on-box`: the same drive, run on the box
            return self.box_driver.drive(
                runtime,
                spec,
                phases,
                phase_live=phase_live,
                on_result=on_result,
                origin=origin,
                mark_first=mark_first,
            )
        return run_async(
            drive(
                spec,
                phases,
                on_phase=on_phase,
                on_result=on_result,
                origin=origin,
                mark_first=mark_first,
                until=until,
            )
        )

    def failed_because(
        self,
        runtime: RunningRuntime,
        state: BootState,
        local_dir: Path,
        settings: Mapping[str, Any],
    ) -> str:
        """Why a driven run failed, or "" when it did not: failed scored requests (this boot's
        or earlier segments'), settings the runtime reads back as others than the cell's, or
        segments a runtime that exited never ran."""
        failures = [r for r in state.results if not r.ok and not r.warmup]
        failures_before = self.previous_failures(local_dir, state.previous)
        if failures or failures_before:
            died = "" if self.box.group_alive(runtime.pgid) else "runtime exited mid-run; "
            scored = [r for r in state.results if not r.warmup]
            first = (
                f"first ({failures[0].prompt_id}): {failures[0].error}"
                if failures
                else "in segments before the resume"
            )
            return (
                f"{died}{len(failures) + failures_before} of {len(scored)} requests failed; {first}"
            )
        if (changed := runtime.read_back(settings)) is not None:
            return changed
        if state.segments_done < state.segments_planned:
            return (
                f"runtime exited mid-run: {state.segments_done} of "
                f"{state.segments_planned} segments ran"
            )
        return ""

    def canaries(self, runtime: RunningRuntime, run: Run, local_dir: Path) -> int:
        """Send the card's canaries (greedy, unscored) and keep their outputs in the run's
        ``canaries.json``; returns how many were sent (none without warm-up: canary_phase)."""
        results = self.drive(runtime, canary_phase(self.loaded.card), run, greedy=True)
        if results:
            text = json.dumps(canary_record(results), indent=1, ensure_ascii=False)
            write_text_atomic(local_dir / CANARY_FILE, text + "\n")
        return len(results)

    def live_washout(self, runtime: RunningRuntime, run: Run, record: RunRecord) -> None:
        """After a change on a shared boot: the profile's washout requests (sent, not kept)
        and seconds."""
        live = self.loaded.runtime.live
        if live is None:
            return
        if live.washout_requests:
            self.drive(runtime, build_phases(self.loaded, True, live.washout_requests), run)
            record.runtime["washout_requests"] = live.washout_requests
        if live.washout_s:
            time.sleep(live.washout_s)
