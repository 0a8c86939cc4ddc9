"""The campaign runner: every run of a plan, in order, recorded so nothing is lost or duplicated.

Lifecycle of one run: upload knob files → cache state → boot → ready → live knobs → counters
before → drive → counters after → collect ring/log → stop (verify the process group is gone) →
write the records → journal ``run_done``. A run that fails is recorded with its reason and log tail
and the campaign goes on; a hung runtime fails its run after one request timeout
(:class:`~harness.drive.client.RuntimeHung`), and a retry boots afresh. Ctrl-C, SIGTERM or SIGHUP
(:mod:`harness.boxes.interrupts`) stops the runtime, marks the run interrupted and leaves a
campaign that ``harness run --resume DIR`` continues.

Read top to bottom, a run is ``_run_once``: ``_begin_attempt`` (its folders, record and boot
state), ``_boot_and_measure`` (files, cache state, then a command driver's command, or a boot of
its own or a shared one, watched by the guards, washed), ``_measure`` (warm-up, washout, the
box's probes, counters, the drive, counters again) and, whatever happened, the records finished
and the runtime stopped. The runner is composed, not inherited: its
:class:`~.scope.RunnerScope` (card, directory, box, cohorts), :class:`~.guard_steps.Guards`,
:class:`~.run_records.Records` (what a run writes) and :class:`~.drive_step.DriveStep` (what it
sends: the scored workload in one piece or in a soak's checkpointed segments) each hold one step;
a boot's state (:class:`~.run_records.BootState`) is handed from step to step. What a run
sends is :mod:`harness.drive.workload`'s, its checkpoints :mod:`.resume`'s.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.boxes.base import Box
from harness.boxes.boxes import open_box
from harness.boxes.cache import cache_dir_on_box, campaign_root_on_box
from harness.boxes.interrupts import deferred, describe, exit_code
from harness.card import Cell, LoadedCard
from harness.card.phase_length import washout_requests
from harness.drive.client import RequestResult, RuntimeHung
from harness.drive.remote import prepare_drive
from harness.drive.workload import build_phases
from harness.errors import HarnessError, InfrastructureError
from harness.execute.box_load import read_box_load
from harness.execute.box_state import BoxStateReader
from harness.execute.cohorts import CohortBook
from harness.execute.drive_step import DriveStep, counters, with_log
from harness.execute.guard_steps import Guards
from harness.execute.guards import cohort_key, guards_enabled
from harness.execute.resume import (
    CHECKPOINT_S,
    continues_from,
)
from harness.execute.run_records import BootState, Records, SharedBoot, failure_reason
from harness.execute.scope import ProgressCallback, RunnerScope
from harness.execute.soak import MonitorSettings, RingStore, RunMonitor
from harness.formats.maps import CountDump
from harness.formats.records import (
    RUN_FAILED,
    RUN_INTERRUPTED,
    RUN_OK,
    CampaignDir,
    Journal,
    RunRecord,
    write_sealed_json,
)
from harness.plan.build import Plan, Run, boot_group
from harness.profiles.box import BoxSpec
from harness.runtimes.boot import (
    BootSpec,
    RunningRuntime,
    boot,
    boot_spec,
    live_settings,
)
from harness.runtimes.cold import BOOT_MARK, evict_for_cold_run
from harness.runtimes.command import collect_result, start_command, wait_command
from harness.runtimes.environment import capture_environment
from harness.runtimes.log_counters import (
    log_snapshot,
    start_snapshot,
)
from harness.runtimes.orphans import journal_boot, stop_orphans
from harness.runtimes.recorder import Recording, finish_recording, start_recording
from harness.runtimes.routes import read_route_snapshot, route_counters, write_route_delta


@dataclass
class CampaignOutcome:
    """How many runs completed, failed or were interrupted."""

    directory: Path
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False
    interrupted_by: str = ""  # "SIGTERM", "SIGHUP", "SIGINT, Ctrl-C" or "Ctrl-C"
    exit_code: int = 0  # when interrupted: 128 + the signal number (130, 143, 129)


@dataclass
class _Attempt:
    """One attempt at a run, as its steps share it."""

    attempt: int
    local_dir: Path
    remote_dir: str  # the boot's folder on the box (a resumed run's next boot: its own)
    group: str | None  # the boot group it shares a boot with, if any
    shared: SharedBoot | None  # the live boot it joins, if any
    record: RunRecord
    state: BootState
    runtime: RunningRuntime | None = None  # set as soon as it runs: whatever fails, it stops


class CampaignRunner:
    """Executes the runs of one campaign directory on its box.

    A run whose workload has a timed phase (a soak) is checkpointed: its timed phases are cut
    into segments of ``checkpoint_s`` and each finished segment is journalled under
    ``runs/<id>/checkpoint/`` with its requests, the ring drained through its end, and the
    counters at that moment. ``harness run --resume`` continues such a run from its last
    checkpoint on a fresh boot instead of redoing it (a run that *failed* is still redone whole,
    so a crash is never hidden by a resume).
    """

    def __init__(
        self,
        loaded: LoadedCard,
        plan: Plan,
        campaign: CampaignDir,
        progress: ProgressCallback | None = None,
        *,
        monitor: MonitorSettings | None = None,
        checkpoint_s: float = CHECKPOINT_S,
        box_name: str | None = None,
        box_spec: BoxSpec | None = None,
        run_ids: Collection[str] | None = None,
        cohorts: CohortBook | None = None,
    ) -> None:
        self.loaded = loaded
        self.plan = plan
        self.campaign = campaign
        self.progress = progress or (lambda event, run, info: None)
        # A fleet runs one runner per box, each over its share of the plan (``run_ids``).
        self.box_name = box_name or loaded.box_name
        self.box_spec = box_spec or loaded.box
        self.run_ids = set(run_ids) if run_ids is not None else None
        self.box: Box = open_box(self.box_name, self.box_spec)
        self.remote_root = ""
        self.monitor_settings = monitor or MonitorSettings()
        self.checkpoint_s = checkpoint_s
        if cohorts is None:  # a fleet's runners share one book (one cohorts.json)
            enabled, why = guards_enabled(loaded.card.guards, loaded.runtime.name)
            cohorts = CohortBook.open(campaign.root, enabled, why)
        self.cohorts = cohorts
        scope = RunnerScope(
            loaded, campaign, self.box, self.box_name, self.box_spec, cohorts, self.progress,
            self.monitor_settings,
        )  # fmt: skip
        self.guards = Guards(scope)
        self.driving = DriveStep(loaded, self.box, self.box_spec, self.progress, checkpoint_s)
        self.records = Records(scope, self.guards)
        self.shared: SharedBoot | None = None  # the boot the runs of one boot group share

    @property
    def cache_dir(self) -> str:
        """Folder on the box shared by all runs, for files a runtime keeps between boots."""
        return cache_dir_on_box(self.remote_root)

    @property
    def checkpointed(self) -> bool:
        """True when the workload has a timed phase, so runs are checkpointed."""
        return any(p.duration_s is not None for p in self.loaded.card.workload.phases or [])

    def execute(self) -> CampaignOutcome:
        """Run every run that is not done yet."""
        outcome = CampaignOutcome(self.campaign.root)
        try:
            self.run_share(outcome)
        except KeyboardInterrupt as exc:
            outcome.interrupted = True
            outcome.interrupted_by = describe(exc)
            outcome.exit_code = exit_code(exc)
            self.campaign.journal.append("campaign_interrupted", signal=outcome.interrupted_by)
        if not outcome.interrupted:
            self.campaign.journal.append(
                "campaign_end", done=len(outcome.done), failed=len(outcome.failed)
            )
        return outcome

    def run_share(self, outcome: CampaignOutcome) -> None:
        """Run this runner's runs (all the plan's, or its ``run_ids``) that are not done yet,
        adding each to ``outcome``; an interrupt is raised once the run it cut is recorded."""
        mine = [r for r in self.plan.runs if self.run_ids is None or r.run_id in self.run_ids]
        done = self.campaign.done_runs(r.run_id for r in mine)
        outcome.done.extend(sorted(done))
        try:
            self._prepare_box()
            self._stop_orphans()
            for run in mine:
                if run.run_id in done:
                    self.progress("skip", run, {})
                    continue
                invalid = self.guards.cohort_invalid(run)
                if invalid is not None:
                    self.guards.record_invalid(run, invalid)
                    outcome.failed.append(run.run_id)
                    continue
                status = self._run_with_retries(run)
                (outcome.done if status == RUN_OK else outcome.failed).append(run.run_id)
        finally:
            with deferred():
                self._end_shared()
            self.box.close()

    def _end_shared(self, why: str = "") -> None:
        """Stop the boot the last runs shared, if any (its group ended, or it is not to be
        trusted: a run on it failed, or it died)."""
        shared, self.shared = self.shared, None
        if shared is None:
            return
        runtime = shared.runtime
        if runtime.stop():
            self.campaign.journal.append(
                "boot_stopped",
                run_id=shared.first_run_id,
                pgid=runtime.pgid,
                boot_id=shared.boot_id,
                runs=shared.runs,
                **({"why": why} if why else {}),
            )

    def _shared_boot(self, run: Run) -> SharedBoot | None:
        """The live boot ``run`` joins, or None when it boots its own (ending a boot of another
        group, or one that died: the runs it carried that were not done boot afresh)."""
        group = boot_group(run, self.loaded.card.design.boot)
        shared = self.shared
        if shared is None:
            return None
        if group != shared.group:
            self._end_shared()
            return None
        if not self.box.group_alive(shared.runtime.pgid):
            self._end_shared("the shared runtime exited")
            return None
        return shared

    def _prepare_box(self) -> None:
        self.remote_root = campaign_root_on_box(self.loaded, self.box, self.campaign.root)
        self.box.mkdirs(self.remote_root)
        self.box.mkdirs(self.cache_dir)
        self.driving.box_driver = prepare_drive(self.box, self.loaded.runtime, self.remote_root)
        env_path = self.campaign.root / "boxes" / f"{self.box_name}.json"
        if not env_path.is_file():
            environment = capture_environment(self.box, self.loaded)
            write_sealed_json(self.campaign.root, env_path, environment)

    def _run_with_retries(self, run: Run) -> str:
        attempts = self.loaded.card.design.retries + 1
        status = RUN_FAILED
        for attempt in range(1, attempts + 1):
            status = self._run_once(run, attempt)
            if status == RUN_OK or self.cohorts.invalid_reason(cohort_key(run)) is not None:
                break  # an invalid cohort is not retried into validity
        record = self.campaign.run_record(run.run_id) or {}
        self.progress("end", run, {"status": status, "reason": record.get("reason", "")})
        return status

    def _run_once(self, run: Run, attempt: int) -> str:
        """One attempt at a run: set up its records, boot (or join a shared boot) and measure,
        and whatever happens, finish its records and stop what must stop."""
        at = self._begin_attempt(run, attempt)
        record, state = at.record, at.state
        try:
            self._boot_and_measure(run, at)
        except KeyboardInterrupt as exc:
            record.status = RUN_INTERRUPTED
            record.reason = (
                f"interrupted ({describe(exc)}); resume with harness run --resume "
                f"{self.campaign.root}"
            )
            raise
        except RuntimeHung as exc:
            state.results.extend(exc.results)  # what was sent, for the records
            record.reason = exc.message
        except (HarnessError, OSError) as exc:
            record.reason, tail = failure_reason(exc)
            if isinstance(exc, InfrastructureError) and tail:
                record.log_tail = tail
        finally:
            # The shutdown of a run is not cut in two by a stop signal: it is raised after.
            with deferred():
                runtime = at.runtime
                self.records.finish(run, record, runtime, state, at.local_dir)
                if self.shared is not None and self.shared.runtime is runtime:
                    if state.keep_runtime:
                        self.shared.ring_seq = state.store.after_sequence
                    else:  # stopped by _finish: a run on it failed or was interrupted
                        self.shared = None
        return record.status

    def _begin_attempt(self, run: Run, attempt: int) -> _Attempt:
        """The attempt's folders, record and boot state: a fresh run folder, or the one a
        checkpointed run continues from (its next boot gets a folder of its own on the box)."""
        card = self.loaded.card
        local_dir = self.campaign.run_dir(run.run_id)
        previous = continues_from(self.campaign, run.run_id, local_dir, attempt, self.checkpointed)
        if previous is None:
            if local_dir.exists():
                shutil.rmtree(local_dir)  # an incomplete earlier attempt: redo it whole
            local_dir.mkdir(parents=True)
        boot_index = len(previous.boots) if previous else 0
        suffix = f"-b{boot_index}" if boot_index else ""
        remote_dir = f"{self.remote_root}/{run.run_id}{suffix}"
        group = boot_group(run, card.design.boot)
        shared = self._shared_boot(run) if group is not None else None
        record = RunRecord(
            **run.identity(),
            status=RUN_FAILED,
            box=self.box_name,
            boot_id=shared.boot_id if shared else f"{run.run_id}-a{attempt}{suffix}",
            started_at=time.time(),
            attempt=attempt,
        )
        state = BootState(
            boot_index,
            shared.remote_dir if shared else remote_dir,
            RingStore(local_dir / "ring-chunks", boot_index),
        )
        state.previous = previous
        if group is not None:
            state.keep_runtime = True
            state.boot_run_id = shared.first_run_id if shared else run.run_id
        if shared is not None:
            state.store.after_sequence = shared.ring_seq  # the ring since the last run's end
        if self.checkpointed:
            (local_dir / "checkpoint").mkdir(exist_ok=True)
            state.journal = Journal(local_dir / "checkpoint" / "segments.jsonl")
        return _Attempt(attempt, local_dir, remote_dir, group, shared, record, state)

    def _boot_and_measure(self, run: Run, at: _Attempt) -> None:
        """Journal the start, upload the cell's files, set the cache state, then run the
        command, or measure on a shared boot or on a boot of the run's own."""
        cell = self.loaded.card.cells[run.cell]
        record, state, previous = at.record, at.state, at.state.previous
        if previous is not None:
            record.started_at = previous.started_at
            self.campaign.journal.append(
                "run_resume",
                run_id=run.run_id,
                boot=state.index,
                segments_done=len(previous.done_segments),
            )
        self.campaign.journal.append(
            "run_start", run_id=run.run_id, attempt=at.attempt, boot_id=record.boot_id
        )
        self.progress("start", run, {"attempt": at.attempt})
        # The box before the boot (its load is other tenants'); Records.finish reads it after.
        load = read_box_load(self.box, self.box_spec.python_path())
        record.runtime["box_load"] = {"before": load}
        uploaded = self._upload_files(cell.files, at.remote_dir)
        spec = self._boot_spec(cell, self.box.free_port(), at.remote_dir, uploaded)
        record.knobs = spec.knobs
        self.box.mkdirs(at.remote_dir)
        record.runtime["evicted"] = []
        if run.cache_state == "cold":
            record.runtime["evicted"] = evict_for_cold_run(
                self.box,
                self.loaded.runtime,
                at.remote_dir,
                lambda port, folder: self._boot_spec(cell, port, folder, uploaded),
                cache_dir=self.cache_dir,
                python=self.box_spec.python_path(),
                journal=self.campaign.journal,
                run_id=run.run_id,
                box_name=self.box_name,
            )
        swap_before = self.box.swapout_pages()
        settings = live_settings(self.loaded.runtime, cell, uploaded)
        if self.loaded.runtime.driver is not None:
            self._run_command(run, spec, at, swap_before)
            record.status = RUN_OK
            return
        if at.shared is not None:
            runtime = at.runtime = at.shared.runtime
            at.shared.runs += 1
            record.runtime["boot_shared"] = True
            self._watch(run, runtime, state, record)
            # The next cell on the same boot: back to the boot state, its live settings, then
            # the washout, so it is not measured on the previous cell's state.
            runtime.reset_live(settings)
            self.driving.live_washout(runtime, run, record)
        else:
            # Marked, and journalled before it starts: a harness killed between the start and
            # the journalled group leaves a runtime the resume can still find by its mark.
            spec.env[BOOT_MARK] = at.remote_dir
            self.campaign.journal.append(
                "boot_starting", run_id=run.run_id, box=self.box_name, mark=at.remote_dir
            )
            runtime = at.runtime = boot(
                self.box,
                self.loaded.runtime,
                spec,
                lambda pgid: self._journal_boot(run, pgid, state),
            )
            if at.group is not None:
                self.shared = SharedBoot(
                    at.group, runtime, at.remote_dir, record.boot_id, run.run_id, runs=1
                )
                record.runtime["boot_shared"] = True
            self._watch(run, runtime, state, record)
            runtime.post_live(spec.live)
            if at.group is not None:
                # The first run of a shared boot gets the washout too: every run of the group
                # then starts alike, not the first one less adapted than the rest.
                self.driving.live_washout(runtime, run, record)
        self._measure(runtime, run, state, at.local_dir, swap_before, record, settings)

    def _watch(
        self, run: Run, runtime: RunningRuntime, state: BootState, record: RunRecord
    ) -> None:
        """Start the ring monitor and the guards' watch on a ready runtime; refuse one that is
        not the binary the cohort ran, or not idle."""
        self._start_monitor(runtime, state)
        self.guards.check_binary(run, record)
        state.watch = self.guards.start_watch(run, runtime.pgid)
        self.guards.check_idle(run, runtime)

    def _measure(
        self,
        runtime: RunningRuntime,
        run: Run,
        state: BootState,
        local_dir: Path,
        swap_before: int | None,
        record: RunRecord,
        settings: Mapping[str, Any],
    ) -> None:
        """Warm up, take the counters, drive, take them again: the measured part of a run on a
        ready runtime (its own boot or a shared one). ``settings``: the cell's live settings,
        read back from the runtime at the end (the run fails when it ran with others)."""
        previous = state.previous
        warmups: list[RequestResult] = []
        probes = BoxStateReader(
            self.box, self.loaded.runtime, record.knobs, {"cache_dir": self.cache_dir}
        )
        probes.read("start")
        own = 0
        if run.sends_warmup:
            # Canaries first, where a fresh boot warms up anyway (a cold run starts cold).
            own += self.driving.canaries(runtime, run, local_dir) if previous is None else 0
            warmups = self.driving.drive(runtime, build_phases(self.loaded, warmup=True), run)
            own += len(warmups)
            # The design's washout (a warm block's own requests, sent and not scored): the
            # block then follows its own arm whatever ran on the box before it. Sent once per
            # run, not again on a resumed run's later segments.
            washout = washout_requests(self.loaded)
            if washout and previous is None:
                own += len(
                    self.driving.drive(runtime, build_phases(self.loaded, True, washout), run)
                )
                # The share of a block it lasts: a part of a block does not wash it.
                record.runtime["washout_share"] = self.loaded.card.design.washout
            record.runtime["washout_requests"] = record.runtime.get("washout_requests", 0) + washout
        probes.read("scored")
        if state.monitor is not None:
            state.monitor.scored = True
        routes_before = self._route_snapshot(state.remote_dir)
        recording = self._start_recorder(runtime, state.remote_dir)
        before = with_log(counters(runtime), runtime, start=True)
        if before is not None:
            before.update(route_counters(routes_before))
        self.driving.drive_scored(runtime, run, state, warmups, before, swap_before, record)
        probes.read("end")
        if previous is None:  # a resumed run's readings would straddle the cut: none kept
            probes.record(record.runtime, own)
        routes_after = self._route_snapshot(state.remote_dir)
        after = with_log(counters(runtime), runtime)
        if after is not None:
            after.update(route_counters(routes_after))
        write_route_delta(local_dir / "route-counts.json", routes_before, routes_after)
        if recording is not None and self.box.group_alive(runtime.pgid):
            # The record starts with the scored workload: its counts are the run's own, so
            # they read 0 before it (and replace a runtime's own counters of the same name).
            recorded = finish_recording(runtime, recording, local_dir)
            before = {**(before or {}), **dict.fromkeys(recorded, 0.0)}
            after = {**(after or {}), **recorded}
        swap_after = self.box.swapout_pages()
        self.records.write_counters(
            local_dir, before, after, swap_before, swap_after, previous, state.unscored
        )
        reason = self.driving.failed_because(runtime, state, local_dir, settings)
        if reason:
            record.reason = reason
        else:
            record.status = RUN_OK

    def _run_command(self, run: Run, spec: BootSpec, at: _Attempt, swap_before: int | None) -> None:
        """A command-driver run: the command is the run, its result rows the run record.

        Its log counters start at 0 (the process starts with the run) and end at the log's
        last snapshot; raises (the run fails) on a crash, a time limit or an unmapped column.
        """
        profile, record, state = self.loaded.runtime, at.record, at.state
        assert profile.driver is not None
        self.guards.check_binary(run, record)
        # The command is the whole block, scored from its first request: the box's state is
        # read as it starts and as it ends (no washout of the harness's own comes between).
        probes = BoxStateReader(self.box, profile, record.knobs, {"cache_dir": self.cache_dir})
        probes.read("start")
        probes.same_as("scored", "start")
        command = start_command(
            self.box, profile, spec, lambda pgid: self._journal_boot(run, pgid, state)
        )
        state.origin_wall = time.time()
        self._start_monitor(command.runtime, state)
        state.watch = self.guards.start_watch(run, command.runtime.pgid)
        if state.monitor is not None:
            state.monitor.scored = True
        try:
            wait_command(command, profile.driver.timeout_s)
        except BaseException:
            command.runtime.stop()
            raise
        probes.read("end")
        probes.record(record.runtime, 0)
        swap_after = self.box.swapout_pages()
        specs = profile.telemetry.log_counters
        before = start_snapshot(specs, None) if specs else None
        after = None
        if specs:
            text = self.box.read_text(spec.log_path)
            after = log_snapshot(text, specs, where=spec.log_path)
        self.records.write_counters(at.local_dir, before, after, swap_before, swap_after, None)
        collect_result(command, at.local_dir)
        state.segments_planned = state.segments_done = 1
        at.runtime = command.runtime  # ran to its end: the records stop and read it

    def _start_recorder(self, runtime: RunningRuntime, remote_dir: str) -> Recording | None:
        """Start the runtime's expert-distribution recorder, when its profile declares one."""
        spec = self.loaded.runtime.telemetry.expert_recorder
        return start_recording(runtime, spec, remote_dir) if spec is not None else None

    def _route_snapshot(self, remote_dir: str) -> CountDump | None:
        spec = self.loaded.runtime.telemetry.count_dump
        return read_route_snapshot(self.box, spec, remote_dir) if spec is not None else None

    def _boot_spec(self, cell: Cell, port: int, run_dir: str, uploaded: dict[str, str]) -> BootSpec:
        return boot_spec(
            self.loaded.runtime,
            cell,
            port=port,
            run_dir=run_dir,
            python=self.box_spec.python_path(),
            bind_host=self.box.bind_host,
            cache_dir=self.cache_dir,
            uploaded=uploaded,
        )

    def _journal_boot(self, run: Run, pgid: int, state: BootState) -> None:
        """Journal a boot's process group, so a resume can stop it if this harness is killed."""
        state.pgid = pgid  # and so this run stops it, if interrupted before the boot returns
        journal_boot(self.campaign.journal, self.box, self.box_name, run.run_id, pgid)

    def _stop_orphans(self) -> None:
        """Stop runtimes a killed harness left running (on a GPU box one would hold the memory
        the next boot needs)."""
        stop_orphans(
            self.campaign.journal,
            self.box,
            self.box_name,
            self.loaded.box_name,
            within=self.remote_root + "/",
        )

    def _start_monitor(self, runtime: RunningRuntime, state: BootState) -> None:
        """Start draining the ring and sampling memory; journal the boot for a later resume."""
        ring_path = self.driving.ring_path(state)
        if state.journal is not None:
            state.journal.append(
                "boot", boot=state.index, pgid=runtime.pgid, remote_dir=state.remote_dir
            )
        state.monitor = RunMonitor(
            open_box=lambda: open_box(self.box_name, self.box_spec),
            pgid=runtime.pgid,
            store=state.store,
            ring_path=ring_path,
            python=self.box_spec.python_path(),
            settings=self.monitor_settings,
        )
        state.monitor.start()

    def _upload_files(self, files: dict[str, str], remote_dir: str) -> dict[str, str]:
        uploaded = {}
        for name, relative in files.items():
            local = self.loaded.resolve(relative)
            remote = f"{remote_dir}/files/{name}{local.suffix}"
            self.box.put_file(local, remote)
            uploaded[name] = remote
        return uploaded
