"""The campaign runner: every run of a plan, in order, recorded so nothing is lost or duplicated.

Lifecycle of one run: upload knob files → cache state → boot → ready → live knobs → counters
before → drive → counters after → collect ring/log → stop (verify the process group is gone) →
write the records → journal ``run_done``. A run that fails is recorded with its reason and log tail
and the campaign goes on; Ctrl-C stops the runtime, marks the run interrupted and leaves a campaign
that ``harness run --resume DIR`` continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from harness import __version__
from harness.card import LoadedCard
from harness.errors import HarnessError, InfrastructureError, RecordError
from harness.execute.boxes import Box, open_box, quote_path
from harness.execute.drive import DriveSpec, PhasePlan, RequestResult, WorkItem, drive
from harness.execute.runtimes import (
    RunningRuntime,
    boot,
    boot_spec,
    http_json,
    render,
    runtime_version,
)
from harness.plan import Plan, Run, plan_json_text
from harness.records import (
    RUN_FAILED,
    RUN_INTERRUPTED,
    RUN_OK,
    CampaignDir,
    RunRecord,
    write_json_atomic,
    write_parquet,
)
from harness.telemetry import read_ring

QUALITY_PHASE = -2  # phase index of the quality suite: outputs checked, timings not scored
ProgressCallback = Callable[[str, Run | None, dict[str, Any]], None]


@dataclass
class CampaignOutcome:
    """How many runs completed, failed or were interrupted."""

    directory: Path
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False


def new_campaign_dir(loaded: LoadedCard, plan: Plan, reports_root: Path) -> CampaignDir:
    """Create ``reports/<campaign>/<stamp>/`` with the card as run and the plan."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root = reports_root / loaded.card.campaign / stamp
    suffix = 1
    while root.exists():
        suffix += 1
        root = reports_root / loaded.card.campaign / f"{stamp}-{suffix}"
    root.mkdir(parents=True)
    (root / "card.yaml").write_text(loaded.text, encoding="utf-8")
    (root / "card.path").write_text(str(loaded.path), encoding="utf-8")
    (root / "plan.json").write_text(plan_json_text(plan) + "\n", encoding="utf-8")
    if loaded.quality:
        suite = [
            {"id": p.id, "domain": p.domain, "check": p.check, "max_tokens": p.max_tokens}
            for p in loaded.quality
        ]
        write_json_atomic(root / "quality.json", {"prompts": suite})
    campaign = CampaignDir(root)
    campaign.journal.append("campaign_start", campaign=loaded.card.campaign, runs=len(plan.runs))
    return campaign


def build_phases(loaded: LoadedCard, warmup: bool) -> list[PhasePlan]:
    """The workload of one run as phases of work items (held-out prompts only)."""
    card = loaded.card
    workload = card.workload
    heldout = loaded.split("heldout")

    def item(prompt_index: int, phase: str, index: int, domains: list[str] | None) -> WorkItem:
        pool = [p for p in heldout if domains is None or p.domain in domains]
        prompt = pool[prompt_index % len(pool)]
        return WorkItem(
            prompt_id=prompt.id,
            domain=prompt.domain,
            phase=phase,
            phase_index=index,
            max_tokens=prompt.max_tokens or workload.max_tokens,
            prompt=prompt.prompt,
            messages=prompt.messages,
            warmup=warmup,
        )

    if warmup:
        items = tuple(item(i, "warmup", -1, None) for i in range(workload.warmup_requests))
        return [PhasePlan("warmup", -1, items)] if items else []
    phases = []
    if not workload.phases:
        count = len(heldout) * workload.passes
        phases.append(PhasePlan("main", 0, tuple(item(i, "main", 0, None) for i in range(count))))
    for index, phase in enumerate(workload.phases or []):
        pool_size = len([p for p in heldout if p.domain in phase.domains])
        count = phase.requests or pool_size
        items = tuple(item(i, phase.name, index, phase.domains) for i in range(count))
        phases.append(PhasePlan(phase.name, index, items, phase.duration_s))
    if loaded.quality:
        # The quality suite runs last, so its prompts never disturb the timed phases.
        quality = tuple(
            WorkItem(
                prompt_id=p.id,
                domain=p.domain,
                phase="quality",
                phase_index=QUALITY_PHASE,
                max_tokens=p.max_tokens or workload.max_tokens,
                prompt=p.prompt,
                messages=p.messages,
            )
            for p in loaded.quality
        )
        phases.append(PhasePlan("quality", QUALITY_PHASE, quality))
    return phases


def _requests_frame(results: list[RequestResult], cell: str) -> pd.DataFrame:
    rows = []
    for index, r in enumerate(results):
        rows.append(
            {
                "request": index,
                "cell": cell,
                "prompt_id": r.prompt_id,
                "domain": r.domain,
                "phase": r.phase,
                "phase_index": r.phase_index,
                "warmup": r.warmup,
                "ok": r.ok,
                "error": r.error,
                "first_after_boot": r.first_after_boot,
                "t_start_s": r.t_start_s,
                "scheduling_delay_s": r.scheduling_delay_s,
                "ttft_s": r.ttft_s,
                "e2el_s": r.e2el_s,
                "completion_tokens": r.completion_tokens,
                "prompt_tokens": r.prompt_tokens,
                "n_chunks": len(r.chunk_times_s),
                "output_text": r.output_text,
                "output_sha256": r.output_sha256,
            }
        )
    return pd.DataFrame(rows)


def _chunks_frame(results: list[RequestResult]) -> pd.DataFrame:
    rows = [
        {"request": index, "chunk": k, "t_s": t, "chars": chars}
        for index, r in enumerate(results)
        for k, (t, chars) in enumerate(zip(r.chunk_times_s, r.chunk_chars, strict=True))
    ]
    return pd.DataFrame(rows, columns=["request", "chunk", "t_s", "chars"])


def _counters(runtime: RunningRuntime) -> dict[str, Any] | None:
    path = runtime.profile.telemetry.counters_http
    if path is None:
        return None
    try:
        status, body = http_json(runtime.base_url + path, timeout_s=10)
    except OSError:
        return None  # a runtime that died mid-run: its failure is reported from the requests
    return body if status == 200 and isinstance(body, dict) else None


def _delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    out = {}
    for key, value in after.items():
        if isinstance(value, int | float) and isinstance(before.get(key), int | float):
            out[key] = value - before[key]
    return out


class CampaignRunner:
    """Executes the runs of one campaign directory on its box."""

    def __init__(
        self,
        loaded: LoadedCard,
        plan: Plan,
        campaign: CampaignDir,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.loaded = loaded
        self.plan = plan
        self.campaign = campaign
        self.progress = progress or (lambda event, run, info: None)
        self.box: Box = open_box(loaded.box_name, loaded.box)
        self.remote_root = ""

    @property
    def cache_dir(self) -> str:
        """Folder on the box shared by all runs, for files a runtime keeps between boots."""
        return f"{self.remote_root}/cache"

    def execute(self) -> CampaignOutcome:
        """Run every run that is not done yet."""
        outcome = CampaignOutcome(self.campaign.root)
        done = {r.run_id for r in self.plan.runs if self.campaign.is_done(r.run_id)}
        outcome.done.extend(sorted(done))
        try:
            self._prepare_box()
            for run in self.plan.runs:
                if run.run_id in done:
                    self.progress("skip", run, {})
                    continue
                status = self._run_with_retries(run)
                (outcome.done if status == RUN_OK else outcome.failed).append(run.run_id)
        except KeyboardInterrupt:
            outcome.interrupted = True
            self.campaign.journal.append("campaign_interrupted")
        finally:
            self.box.close()
        if not outcome.interrupted:
            self.campaign.journal.append(
                "campaign_end", done=len(outcome.done), failed=len(outcome.failed)
            )
        return outcome

    def _prepare_box(self) -> None:
        spec = self.loaded.box
        if spec.kind == "local":
            self.remote_root = str(self.campaign.root.resolve() / "box")
        else:
            base = self.box.home_path(spec.workdir)
            self.remote_root = f"{base}/{self.loaded.card.campaign}/{self.campaign.root.name}"
        self.box.mkdirs(self.remote_root)
        self.box.mkdirs(self.cache_dir)
        env_path = self.campaign.root / "boxes" / f"{self.loaded.box_name}.json"
        if not env_path.is_file():
            write_json_atomic(env_path, capture_environment(self.box, self.loaded))

    def _run_with_retries(self, run: Run) -> str:
        attempts = self.loaded.card.design.retries + 1
        status = RUN_FAILED
        for attempt in range(1, attempts + 1):
            status = self._run_once(run, attempt)
            if status == RUN_OK:
                break
        record = self.campaign.run_record(run.run_id) or {}
        self.progress("end", run, {"status": status, "reason": record.get("reason", "")})
        return status

    def _run_once(self, run: Run, attempt: int) -> str:
        card = self.loaded.card
        cell = card.cells[run.cell]
        local_dir = self.campaign.run_dir(run.run_id)
        if local_dir.exists():
            shutil.rmtree(local_dir)  # an incomplete earlier attempt: redo it whole
        local_dir.mkdir(parents=True)
        remote_dir = f"{self.remote_root}/{run.run_id}"
        record = RunRecord(
            run_id=run.run_id,
            status=RUN_FAILED,
            cell=run.cell,
            cycle=run.cycle,
            slot=run.slot,
            repeat=run.repeat,
            cache_state=run.cache_state,
            pattern=run.pattern,
            comparison=run.comparison,
            block=run.block,
            box=self.loaded.box_name,
            boot_id=f"{run.run_id}-a{attempt}",
            started_at=time.time(),
            attempt=attempt,
        )
        self.campaign.journal.append("run_start", run_id=run.run_id, attempt=attempt)
        self.progress("start", run, {"attempt": attempt})
        runtime: RunningRuntime | None = None
        results: list[RequestResult] = []
        try:
            uploaded = self._upload_files(cell.files, remote_dir)
            port = self.box.free_port()
            spec = boot_spec(
                self.loaded.runtime,
                cell,
                port=port,
                run_dir=remote_dir,
                python=self.loaded.box.python_path(),
                bind_host=self.box.bind_host,
                cache_dir=self.cache_dir,
                uploaded=uploaded,
            )
            record.knobs = spec.knobs
            self.box.mkdirs(remote_dir)
            if run.cache_state == "cold":
                self._evict(spec.run_dir, spec.knobs)
            swap_before = self.box.swapout_pages()
            runtime = boot(self.box, self.loaded.runtime, spec)
            runtime.post_live(spec.live)
            warmups: list[RequestResult] = []
            if run.cache_state == "warm":
                warmups = self._drive(runtime, build_phases(self.loaded, warmup=True), run)
            before = _counters(runtime)
            results = self._drive(runtime, build_phases(self.loaded, warmup=False), run)
            if warmups:
                for result in results:
                    result.first_after_boot = False  # the warm-up request came first
            results = warmups + results
            after = _counters(runtime)
            swap_after = self.box.swapout_pages()
            self._write_counters(local_dir, before, after, swap_before, swap_after)
            failures = [r for r in results if not r.ok and not r.warmup]
            if failures:
                first = failures[0]
                died = "" if self.box.group_alive(runtime.pgid) else "runtime exited mid-run; "
                scored = [r for r in results if not r.warmup]
                record.reason = (
                    f"{died}{len(failures)} of {len(scored)} requests failed; first "
                    f"({first.prompt_id}): {first.error}"
                )
            else:
                record.status = RUN_OK
        except KeyboardInterrupt:
            record.status = RUN_INTERRUPTED
            record.reason = "interrupted (Ctrl-C); resume with harness run --resume"
            raise
        except (HarnessError, OSError) as exc:
            message, _, tail = str(exc).partition("; log tail:\n")
            record.reason = message.strip() or type(exc).__name__
            if isinstance(exc, InfrastructureError) and tail:
                record.log_tail = tail
        finally:
            self._finish(run, record, runtime, results, local_dir, remote_dir)
        return record.status

    def _finish(
        self,
        run: Run,
        record: RunRecord,
        runtime: RunningRuntime | None,
        results: list[RequestResult],
        local_dir: Path,
        remote_dir: str,
    ) -> None:
        if runtime is not None:
            if not record.log_tail and record.status != RUN_OK:
                record.log_tail = runtime.log_tail()
            gone = runtime.stop()
            record.runtime["boot_s"] = round(runtime.boot_s, 3)
            if not gone:
                record.status = RUN_FAILED
                record.reason = (record.reason + "; " if record.reason else "") + (
                    f"process group {runtime.pgid} survived SIGKILL"
                )
        try:
            self._collect(local_dir, remote_dir, record)
        except (HarnessError, OSError) as exc:
            if record.status == RUN_OK:
                record.status = RUN_FAILED
                record.reason = f"collecting telemetry failed: {exc}"
        write_parquet(_requests_frame(results, run.cell), local_dir / "requests.parquet")
        write_parquet(_chunks_frame(results), local_dir / "chunks.parquet")
        record.ended_at = time.time()
        write_json_atomic(local_dir / "run.json", record.to_json())
        if record.status == RUN_OK:
            self.campaign.journal.append("run_done", run_id=run.run_id)
        else:
            self.campaign.journal.append(
                f"run_{record.status}", run_id=run.run_id, reason=record.reason
            )
        self.progress("attempt", run, {"status": record.status, "reason": record.reason})

    def _upload_files(self, files: dict[str, str], remote_dir: str) -> dict[str, str]:
        uploaded = {}
        for name, relative in files.items():
            local = self.loaded.resolve(relative)
            remote = f"{remote_dir}/files/{name}{local.suffix}"
            self.box.put_file(local, remote)
            uploaded[name] = remote
        return uploaded

    def _evict(self, run_dir: str, knobs: dict[str, str]) -> None:
        profile = self.loaded.runtime
        context = {
            "run_dir": run_dir,
            "python": self.loaded.box.python_path(),
            "cache_dir": self.cache_dir,
            "port": 0,
            "bind_host": self.box.bind_host,
        }
        patterns = [render(p, context) for p in profile.cache_files]
        files = self.box.glob(patterns)
        if files and not self.box.evict_from_page_cache(files):
            raise InfrastructureError(
                f"box {self.box.name}: cannot drop {len(files)} runtime files from the page cache "
                "(cold state); on macOS allow `sudo -n purge`"
            )

    def _drive(
        self, runtime: RunningRuntime, phases: list[PhasePlan], run: Run
    ) -> list[RequestResult]:
        if not phases:
            return []
        api = self.loaded.runtime.api
        workload = self.loaded.card.workload
        spec = DriveSpec(
            base_url=runtime.base_url,
            flavour=api.flavour,
            model=api.model,
            concurrency=workload.concurrency,
            timeout_s=workload.request_timeout_s,
            temperature=workload.temperature,
            extra_body=dict(api.extra_body),
        )
        phase_knob = self.loaded.runtime.phase_live_knob

        async def on_phase(phase: PhasePlan) -> None:
            if phase_knob and phase.index >= 0 and phase.index != QUALITY_PHASE:
                # A dead runtime refuses this; the phase's requests then fail and say why.
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(runtime.post_live, {phase_knob: phase.index})

        def on_result(result: RequestResult) -> None:
            self.progress("request", run, {"result": result})

        return asyncio.run(drive(spec, phases, on_phase=on_phase, on_result=on_result))

    def _write_counters(
        self,
        local_dir: Path,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        swap_before: int | None,
        swap_after: int | None,
    ) -> None:
        delta = _delta(before, after)
        if swap_before is not None and swap_after is not None:
            delta["new_swapout_pages"] = swap_after - swap_before
        write_json_atomic(
            local_dir / "counters.json", {"before": before, "after": after, "delta": delta}
        )

    def _collect(self, local_dir: Path, remote_dir: str, record: RunRecord) -> None:
        telemetry = self.loaded.runtime.telemetry
        context = {"run_dir": remote_dir, "port": 0, "python": self.loaded.box.python_path()}
        log_remote = f"{remote_dir}/server.log"
        if self.box.exists(log_remote):
            self.box.get_file(log_remote, local_dir / "server.log")
        if telemetry.ring is None:
            return
        ring_remote = render(telemetry.ring.path, context)
        if not self.box.exists(ring_remote):
            if record.status == RUN_OK:
                raise RecordError(f"the runtime wrote no ring at {ring_remote}")
            return
        ring_local = local_dir / "ring.bin"
        self.box.get_file(ring_remote, ring_local)
        fields = None if telemetry.ring.header else telemetry.ring.fields
        ring = read_ring(ring_local, fields=fields)
        record.ring_lost = ring.lost
        write_parquet(ring.frame, local_dir / "ring.parquet")
        ring_local.unlink()
        if telemetry.route_trace:
            trace_remote = render(telemetry.route_trace, context)
            if self.box.exists(trace_remote):
                self.box.get_file(trace_remote, local_dir / "route-trace.jsonl")


def capture_environment(box: Box, loaded: LoadedCard) -> dict[str, Any]:
    """Host, OS, CPU, memory, GPU, runtime version and the swap-out counter, once per campaign."""

    def text(command: str) -> str:
        return box.sh(command + " 2>/dev/null", check=False, timeout_s=60).stdout.strip()

    return {
        "box": box.name,
        "kind": loaded.box.kind,
        "platform": loaded.box.platform,
        "host": text("uname -a"),
        "os": text("cat /etc/os-release || sw_vers"),
        "cpu": text("lscpu || sysctl -n machdep.cpu.brand_string"),
        "cpus": text("nproc || sysctl -n hw.ncpu"),
        "memory": text("grep MemTotal /proc/meminfo || sysctl -n hw.memsize"),
        "gpu": text(
            "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv "
            "|| system_profiler SPDisplaysDataType"
        ),
        "python": text(f"{quote_path(loaded.box.python_path())} --version"),
        "harness_version": __version__,
        "runtime": runtime_version(box, loaded.runtime, loaded.box.python_path()),
        "swapout_pages_at_start": box.swapout_pages(),
        "captured_at": time.time(),
    }
