"""A fleet: one campaign on several boxes at once, one worker thread a box.

A box of ``kind: slurm`` (a cluster) is one worker too: it runs its share as Slurm jobs, one a
cohort (:mod:`.slurm.worker`), so a card with one Slurm box goes through here as well.

The unit that moves is a cohort (``plan_cohort_key``: one mirrored cycle of one comparison in
one cache state, its ABBA or BAAB blocks). A cohort runs on one box, in order, so every paired
difference the analysis takes is between runs of one machine; the plan deals cohorts to boxes
(:func:`harness.plan.build.fleet_box`). Before the first run each box is preflighted
(:func:`~harness.execute.preflight.check_box`); one that fails is dropped with its reason,
journalled, and its cohorts are dealt to the others.

The journal stays the single truth: workers append to it under one lock, each line fsynced
(:class:`~harness.formats.records.Journal`), and share one cohort book. Signals reach only the main
thread, which waits on the workers; the first stop signal is forwarded to every worker
(:func:`~harness.boxes.interrupts.interrupt_worker`), so each stops its runtime and records
its run interrupted exactly as a single-box campaign does, and ``--resume`` goes on from there.
A SIGKILL leaves runtimes behind on several boxes: each worker of the resume stops those its
box booted (the boot events name their box).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.boxes.interrupts import describe, exit_code, interrupt_worker
from harness.card import LoadedCard
from harness.errors import HarnessError, InfrastructureError
from harness.execute.cohorts import CohortBook
from harness.execute.guards import cohort_key, guards_enabled
from harness.execute.preflight import check_box
from harness.execute.resume import CHECKPOINT_S
from harness.execute.run import CampaignOutcome, CampaignRunner
from harness.execute.scope import ProgressCallback
from harness.execute.soak import MonitorSettings
from harness.formats.records import CampaignDir
from harness.plan.build import Plan, Run, cohort_lane
from harness.profiles.box import BoxSpec
from harness.stats.layout import fleet_box

# Seconds between the main thread's looks at its workers: how soon a signal is forwarded.
_JOIN_POLL_S = 0.2


@dataclass
class _Worker:
    """One box's worker: its share of the runs, its thread and what it did."""

    name: str
    spec: BoxSpec
    run_ids: list[str]
    outcome: CampaignOutcome
    thread: threading.Thread | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def preflight_fleet(loaded: LoadedCard) -> tuple[list[str], dict[str, str]]:
    """Check every box of the fleet at once: (boxes that passed, reason per box that failed)."""

    def one(name: str, spec: BoxSpec) -> str | None:
        try:
            checks = check_box(name, spec, loaded.runtime)
        except HarnessError as exc:
            return str(exc)
        failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
        return "; ".join(failed) if failed else None

    with ThreadPoolExecutor(max_workers=len(loaded.boxes)) as pool:
        found = pool.map(lambda box: one(*box), loaded.boxes)
        reasons = {name: why for (name, _), why in zip(loaded.boxes, found, strict=True)}
    alive = [name for name, why in reasons.items() if why is None]
    return alive, {name: why for name, why in reasons.items() if why is not None}


def deal_shares(
    plan: Plan, alive: list[str], ran_on: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """Run ids per box, in plan order: each cohort on its planned box while that box is alive.

    A cohort whose runs already ran on some box (``ran_on``: run id → box, from an earlier
    session) stays there if it can. The cohorts of a dropped box are dealt over the boxes alive
    by the plan's own rule (:func:`~harness.plan.build.fleet_box`).
    """
    ran_on = ran_on or {}
    cohorts: dict[str, list[Run]] = {}
    for run in plan.runs:
        cohorts.setdefault(cohort_key(run), []).append(run)
    shares: dict[str, list[str]] = {name: [] for name in alive}
    for runs in cohorts.values():
        first = runs[0]
        earlier = [ran_on[r.run_id] for r in runs if ran_on.get(r.run_id) in shares]
        box = earlier[0] if earlier else first.box
        if box not in shares:
            lane = cohort_lane(plan.card, first.comparison, first.cache_state)
            box = fleet_box(alive, first.cycle, lane)
        shares[box].extend(r.run_id for r in runs)
    order = {r.run_id: r.index for r in plan.runs}
    return {name: sorted(ids, key=order.__getitem__) for name, ids in shares.items()}


class _ShareRunner(Protocol):
    """What runs one box's share: a :class:`CampaignRunner`, or a Slurm box's job arrays."""

    def run_share(self, outcome: CampaignOutcome) -> None: ...


def _running(worker: _Worker) -> bool:
    thread = worker.thread
    return thread is not None and not worker.finished.is_set() and thread.is_alive()


class FleetRunner:
    """Runs a campaign on every box of its card: one box directly, several in parallel."""

    def __init__(
        self,
        loaded: LoadedCard,
        plan: Plan,
        campaign: CampaignDir,
        progress: ProgressCallback | None = None,
        *,
        monitor: MonitorSettings | None = None,
        checkpoint_s: float = CHECKPOINT_S,
    ) -> None:
        self.loaded = loaded
        self.plan = plan
        self.campaign = campaign
        self.progress = progress or (lambda event, run, info: None)
        self.monitor = monitor
        self.checkpoint_s = checkpoint_s

    def execute(self) -> CampaignOutcome:
        """Run every run not done yet; several boxes at once for a fleet."""
        if not self.loaded.fleet and self.loaded.box.kind != "slurm":
            return CampaignRunner(
                self.loaded,
                self.plan,
                self.campaign,
                self.progress,
                monitor=self.monitor,
                checkpoint_s=self.checkpoint_s,
            ).execute()
        workers = self._workers()
        return self._run(workers)

    def _workers(self) -> list[_Worker]:
        journal = self.campaign.journal
        alive, dropped = preflight_fleet(self.loaded)
        for name, why in dropped.items():
            journal.append("box_dropped", box=name, reason=why)
        if not alive:
            reasons = "; ".join(f"{name}: {why}" for name, why in dropped.items())
            raise InfrastructureError(
                f"every box of the fleet failed its preflight ({reasons}); "
                "run `harness box check NAME` on each for the fix"
            )
        shares = deal_shares(self.plan, alive, self._ran_on())
        counts = {name: len(ids) for name, ids in shares.items()}
        journal.append("fleet", boxes=alive, runs=counts)
        self.progress("fleet", None, {"shares": counts, "dropped": dropped})
        specs = dict(self.loaded.boxes)
        return [
            _Worker(name, specs[name], ids, CampaignOutcome(self.campaign.root))
            for name, ids in shares.items()
        ]

    def _ran_on(self) -> dict[str, str]:
        """Where each run with a record ran (an earlier session of a resumed campaign)."""
        found = {}
        for run in self.plan.runs:
            record = self.campaign.run_record(run.run_id)
            if record and isinstance(record.get("box"), str):
                found[run.run_id] = record["box"]
        return found

    def _run(self, workers: list[_Worker]) -> CampaignOutcome:
        enabled, why = guards_enabled(self.loaded.card.guards, self.loaded.runtime.name)
        book = CohortBook.open(self.campaign.root, enabled, why)
        for worker in workers:
            runner: _ShareRunner
            if worker.spec.kind == "slurm":
                from harness.execute.slurm.worker import SlurmWorker

                runner = SlurmWorker(
                    self.loaded,
                    self.plan,
                    self.campaign,
                    self._box_progress(worker.name),
                    box_name=worker.name,
                    box_spec=worker.spec,
                    run_ids=worker.run_ids,
                    cohorts=book,
                )
            else:
                runner = CampaignRunner(
                    self.loaded,
                    self.plan,
                    self.campaign,
                    self._box_progress(worker.name),
                    monitor=self.monitor,
                    checkpoint_s=self.checkpoint_s,
                    box_name=worker.name,
                    box_spec=worker.spec,
                    run_ids=worker.run_ids,
                    cohorts=book,
                )
            worker.thread = threading.Thread(
                target=self._work, args=(worker, runner), name=f"box-{worker.name}", daemon=True
            )
        outcome = CampaignOutcome(self.campaign.root)
        try:
            for worker in workers:
                assert worker.thread is not None
                worker.thread.start()
            self._wait(workers)
        except KeyboardInterrupt as exc:
            outcome.interrupted = True
            outcome.interrupted_by = describe(exc)
            outcome.exit_code = exit_code(exc)
            signum = getattr(exc, "signum", 2)
            for worker in workers:
                if worker.thread is not None and not worker.finished.is_set():
                    interrupt_worker(worker.thread, signum)
            self._wait(workers)  # each records its run; later signals are ignored meanwhile
            self.campaign.journal.append("campaign_interrupted", signal=outcome.interrupted_by)
        for worker in workers:
            outcome.done.extend(worker.outcome.done)
            outcome.failed.extend(worker.outcome.failed)
        errors = [w for w in workers if w.error is not None]
        for worker in errors:
            self.campaign.journal.append("box_failed", box=worker.name, reason=str(worker.error))
        if not outcome.interrupted and not errors:
            self.campaign.journal.append(
                "campaign_end", done=len(outcome.done), failed=len(outcome.failed)
            )
        if errors and not outcome.interrupted:
            first = errors[0].error
            assert first is not None
            if not isinstance(first, HarnessError):
                raise first  # not the box: a bug, with its traceback
            reasons = "; ".join(f"box {w.name}: {w.error}" for w in errors)
            raise InfrastructureError(
                f"{reasons}; the other boxes finished their runs; resume with "
                f"harness run --resume {self.campaign.root}"
            ) from first
        return outcome

    def _work(self, worker: _Worker, runner: _ShareRunner) -> None:
        try:
            runner.run_share(worker.outcome)
        except KeyboardInterrupt:
            pass  # the forwarded stop: the worker recorded its run; the main thread reports it
        except BaseException as exc:  # kept for the main thread to raise
            worker.error = exc
        finally:
            worker.finished.set()

    def _wait(self, workers: list[_Worker]) -> None:
        # Not Thread.join: a signal that interrupts join() marks the thread stopped while it
        # still runs (CPython's bpo-45274 handling), and the forwarded interrupt would then
        # skip it. A plain sleep is cut by the signal and changes nothing.
        # is_alive stays true to life without join(), and covers a worker whose forwarded
        # interrupt landed in its last lines, before it could say it finished.
        while any(_running(worker) for worker in workers):
            time.sleep(_JOIN_POLL_S)

    def _box_progress(self, name: str) -> ProgressCallback:
        def report(event: str, run: Run | None, info: dict[str, Any]) -> None:
            self.progress(event, run, {**info, "box": name})

        return report


__all__ = ["FleetRunner", "deal_shares", "preflight_fleet"]
