"""Collect what map fitting needs from a real boot: a route-count dump and the route trace.

``harness collect CARD --cell NAME --split fit -o DIR`` boots one cell on the card's box, sends
the prompts of one split (the fit split by default, so maps are never fitted on what is scored),
then saves the runtime's count dump (its ``dump_http`` endpoint, its ``count_dump`` file, or
SGLang's expert-distribution recorder started before the prompts and dumped after, its ``.pt``
files kept under ``expert-distribution/``) and, when the profile declares one, its route trace.
``harness fit-map DIR/counts.json --top K`` turns the dump into a map.
With ``--as-run`` it sends what one run of the card sends instead, for ``harness simulate``.

Each boot is journalled in ``DIR/collect.journal.jsonl``, so a collection killed with its runtime
still up (SIGKILL, a lost terminal) leaves a runtime the next collection into ``DIR`` stops first:
only one booted in a folder collections into ``DIR`` make (:func:`scratch_prefix` on this machine).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.boxes.async_interrupts import run_async
from harness.boxes.base import Box
from harness.boxes.boxes import open_box
from harness.card import Cell, KnobValue, LoadedCard
from harness.card.phase_length import washout_requests
from harness.drive.canaries import canary_phase
from harness.drive.client import PhasePlan, UntilHook, WorkItem, drive
from harness.drive.response_routes import RouteRows, collect_response_routes
from harness.drive.workload import QUALITY_PHASE, build_phases, run_drive_spec
from harness.errors import BadInput, RuntimeBootError
from harness.execute.recovery_watch import RecoveryWatch
from harness.formats.prompts import Prompt
from harness.formats.records import UNSCORED_STEPS, Journal, write_json_atomic
from harness.formats.safe_write import write_text_atomic
from harness.profiles.telemetry import CountDumpSpec, ExpertRecorderSpec, ResponseRoutesSpec
from harness.runtimes.boot import RunningRuntime, boot, boot_spec, http_json, render
from harness.runtimes.counters import scrape_counters
from harness.runtimes.orphans import BOOT_MARK, journal_boot, stop_orphans
from harness.runtimes.recorder import finish_recording, start_recording
from harness.runtimes.routes import read_route_snapshot, write_route_delta


@dataclass(frozen=True)
class Collected:
    """Files written by a collection run."""

    counts: Path
    trace: Path | None
    requests: int
    tokens: int
    orphans_stopped: tuple[int, ...] = ()  # runtimes an earlier, killed collection left running


COLLECT_JOURNAL = "collect.journal.jsonl"


def scratch_prefix(out_dir: Path) -> str:
    """The name every local boot folder of collections into ``out_dir`` starts with, keyed by
    that folder: in the shared temporary folder, the orphans its journal names can then only be
    runtimes of collections into ``out_dir``."""
    key = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:16]
    return f"harness-collect-{key}-"


def collect_counts(
    loaded: LoadedCard,
    cell_name: str,
    split: str,
    out_dir: Path,
    *,
    passes: int = 1,
    domains: list[str] | None = None,
    max_tokens: int | None = None,
    as_run: bool = False,
    routes_from_responses: bool = False,
    top_k: int | None = None,
    experts: int | None = None,
) -> Collected:
    """Boot ``cell_name``, drive the prompts of ``split``, save the count dump and route trace.

    ``domains`` keeps only prompts of those domains; ``max_tokens`` overrides the card's, since
    a map fitted on decode counts wants more decode steps than a timed run needs. ``as_run``
    sends exactly what one run of the card sends instead (its warmup and washout, then its
    phases, the runtime's phase knob set as the runner sets it and to -1 before the phases), so
    a trace for
    ``harness simulate`` holds the very routing the box will see. ``routes_from_responses``
    takes the routing from the responses themselves (:mod:`harness.drive.response_routes`)
    instead of a count dump, for a runtime whose profile declares ``telemetry.response_routes``;
    ``top_k`` reshapes (SGLang's flat int32) or checks (vLLM's .npy) each response's routing, and
    ``experts`` is the width of its counts (the model's experts per layer; None: the highest id
    seen).
    """
    cell, prompts, sources = _what_to_collect(
        loaded, cell_name, split, as_run, domains, max_tokens, passes, routes_from_responses
    )
    if not routes_from_responses and (top_k is not None or experts is not None):
        raise BadInput(
            "--top-k and --experts shape the routing taken from responses: they need "
            "--routes-from-responses (a count dump has the runtime's own shape)"
        )
    routes = sources.response_routes
    if routes is not None and routes.encoding == "int32-base64" and top_k is None:
        raise BadInput(
            f"runtime {loaded.runtime.name!r} returns routing as flat int32 (SGLang's): give "
            "--top-k, the model's experts per token (num_experts_per_tok in its config.json), "
            "so its rows split into layers"
        )
    phases = _phases(loaded, split, prompts, passes, max_tokens, as_run)
    out_dir.mkdir(parents=True, exist_ok=True)
    box = open_box(loaded.box_name, loaded.box)
    journal = Journal(out_dir / COLLECT_JOURNAL)
    local_scratch: str | None = None
    try:
        card = loaded.card
        if loaded.box.kind == "local":
            within = os.path.join(tempfile.gettempdir(), scratch_prefix(out_dir))
        else:
            remote = f"{box.home_path(loaded.box.workdir)}/collect-{card.campaign}-{cell_name}"
            within = remote + "/"
        # Only marks of the boot folders this collection owns count: a journal line naming any
        # other folder (another collection's runtime) kills nothing.
        orphans = tuple(stop_orphans(journal, box, loaded.box_name, loaded.box_name, within))
        if loaded.box.kind == "local":
            remote = local_scratch = tempfile.mkdtemp(prefix=os.path.basename(within))
        runtime, boot_id, live = _boot(loaded, box, journal, cell, cell_name, remote)
        try:
            runtime.post_live(live)
            got = _drive_and_dump(
                loaded, box, runtime, remote, phases, sources, out_dir, as_run, top_k, experts
            )
        finally:
            if runtime.stop():
                journal.append("boot_stopped", run_id=boot_id, pgid=runtime.pgid)
        return _save(loaded, box, remote, out_dir, got, experts, orphans)
    finally:
        box.close()
        if local_scratch is not None:
            # The boot's folder on this machine (its ring, trace, cache and log: a gigabyte or
            # more): everything kept was copied to out_dir above. Left behind, 147 collections
            # filled this machine's disk.
            shutil.rmtree(local_scratch, ignore_errors=True)


@dataclass(frozen=True)
class _Sources:
    """Where the counts come from: the profile's dump endpoint, dump file or recorder, or
    (``--routes-from-responses``) the responses themselves."""

    dump_path: str | None
    dump_file: CountDumpSpec | None
    recorder: ExpertRecorderSpec | None
    response_routes: ResponseRoutesSpec | None


@dataclass
class _Got:
    """What a collection's drive brought back."""

    tokens: int
    requests: int
    body: object = None  # the dump endpoint's JSON
    from_responses: RouteRows | None = None


def _what_to_collect(
    loaded: LoadedCard,
    cell_name: str,
    split: str,
    as_run: bool,
    domains: list[str] | None,
    max_tokens: int | None,
    passes: int,
    routes_from_responses: bool,
) -> tuple[Cell, list[Prompt], _Sources]:
    """The cell to boot (with the routing switch on where responses carry it), the prompts to
    send and where the counts come from; BadInput for a request the card or runtime refuses."""
    card = loaded.card
    if cell_name not in card.cells:
        raise BadInput(f"{loaded.path}: no cell {cell_name!r}; cells: {', '.join(card.cells)}")
    if as_run and (domains or max_tokens or passes != 1):
        raise BadInput(
            "--as-run sends the card's own workload: drop --domains, --max-tokens and --passes"
        )
    prompts = [p for p in loaded.prompts if p.split == split]
    if domains:
        prompts = [p for p in prompts if p.domain in domains]
    if not prompts and not as_run:
        wanted = f" in domains {', '.join(domains)}" if domains else ""
        raise BadInput(f"{loaded.path}: no prompt has split {split!r}{wanted}")
    profile = loaded.runtime
    telemetry = profile.telemetry
    cell = card.cells[cell_name]
    if not routes_from_responses:
        dumps = telemetry.dump_http is not None or telemetry.count_dump is not None
        recorder = None if dumps else telemetry.expert_recorder  # a dump wins over a recorder
        sources = _Sources(telemetry.dump_http, telemetry.count_dump, recorder, None)
        if sources == _Sources(None, None, None, None):
            raise BadInput(
                f"runtime {profile.name!r} declares none of telemetry.dump_http, "
                "telemetry.count_dump and telemetry.expert_recorder: it cannot dump route counts"
            )
        return cell, prompts, sources
    routes = telemetry.response_routes
    if routes is None:
        raise BadInput(
            f"runtime {profile.name!r} declares no telemetry.response_routes: it "
            "returns no routing in its responses (drop --routes-from-responses)"
        )
    if as_run:
        raise BadInput(
            "--routes-from-responses sends whole (not streamed) requests, one at a time: "
            "it cannot send a run's workload (drop --as-run)"
        )
    # The switch that makes the runtime return routing, on for this boot only.
    cell = cell.model_copy(update={"knobs": {**cell.knobs, routes.knob: "true"}})
    return cell, prompts, _Sources(None, None, None, routes)


def _phases(
    loaded: LoadedCard,
    split: str,
    prompts: list[Prompt],
    passes: int,
    max_tokens: int | None,
    as_run: bool,
) -> list[PhasePlan]:
    """What the collection sends: one run's workload (``as_run``), or the split's prompts."""
    if as_run:
        # A warm run's canaries and warm-up, then its washout (sent and not scored, phase -1
        # like the warm-up), then its phases: the trace replays as the run ran.
        washout = washout_requests(loaded)
        return (
            canary_phase(loaded.card)
            + build_phases(loaded, warmup=True)
            + (build_phases(loaded, True, washout) if washout else [])
            + build_phases(loaded, warmup=False)
        )
    items = tuple(
        WorkItem(
            prompt_id=p.id,
            domain=p.domain,
            phase=split,
            phase_index=0,
            max_tokens=max_tokens or p.max_tokens or loaded.card.workload.max_tokens,
            prompt=p.prompt,
            messages=p.messages,
        )
        for _ in range(passes)
        for p in prompts
    )
    return [PhasePlan(split, 0, items)]


def _boot(
    loaded: LoadedCard, box: Box, journal: Journal, cell: Cell, cell_name: str, remote: str
) -> tuple[RunningRuntime, str, dict[str, KnobValue]]:
    """Upload the cell's files and boot it in ``remote``, journalled and marked so a killed
    collection's runtime is found. Returns it, its boot id and the live settings to post."""
    box.mkdirs(remote)
    uploaded = {}
    for name, relative in cell.files.items():
        local = loaded.resolve(relative)
        uploaded[name] = f"{remote}/files/{name}{local.suffix}"
        box.put_file(local, uploaded[name])
    cache_dir = f"{remote}/cache"
    box.mkdirs(cache_dir)
    spec = boot_spec(
        loaded.runtime,
        cell,
        port=box.free_port(),
        run_dir=remote,
        python=loaded.box.python_path(),
        bind_host=box.bind_host,
        cache_dir=cache_dir,
        uploaded=uploaded,
    )
    boot_id = f"collect-{cell_name}-{time.time_ns()}"
    spec.env[BOOT_MARK] = remote  # found by its mark if killed before its group is journalled
    journal.append("boot_starting", run_id=boot_id, box=loaded.box_name, mark=remote)
    runtime = boot(
        box,
        loaded.runtime,
        spec,
        lambda pgid: journal_boot(journal, box, loaded.box_name, boot_id, pgid),
    )
    return runtime, boot_id, spec.live


def _drive_and_dump(
    loaded: LoadedCard,
    box: Box,
    runtime: RunningRuntime,
    remote: str,
    phases: list[PhasePlan],
    sources: _Sources,
    out_dir: Path,
    as_run: bool,
    top_k: int | None,
    experts: int | None,
) -> _Got:
    """Drive ``phases`` and take the counts: the dump file's difference across the drive, the
    recorder's dump, the dump endpoint's JSON, or the responses' own routing."""
    dump_file = sources.dump_file
    # A dump file holds everything since boot: this collection's counts are the difference of
    # two snapshots (the lane's own way to count per phase).
    snapshot = read_route_snapshot(box, dump_file, remote) if dump_file else None
    recording = None
    if sources.recorder is not None:
        recording = start_recording(runtime, sources.recorder, remote)
    drive_spec = run_drive_spec(loaded, runtime)
    if not as_run:  # counts for a map: one request at a time, greedy
        drive_spec = dataclasses.replace(drive_spec, concurrency=1, temperature=0.0)
    if sources.response_routes is not None:
        whole = [item for phase in phases for item in phase.items]
        rows, tokens = collect_response_routes(
            drive_spec, whole, sources.response_routes, top_k, experts
        )
        return _Got(tokens, len(whole), from_responses=rows)
    phase_knob = loaded.runtime.phase_live_knob

    async def on_phase(phase: PhasePlan) -> None:
        # Warmup rows tagged -1, so a simulation can leave them out of its counters as the
        # runner leaves them out of a run's.
        if as_run and phase_knob and phase.index != QUALITY_PHASE:
            await asyncio.to_thread(runtime.post_live, {phase_knob: phase.index})

    # An as-run trace runs until_recovered extensions as the run will, ended by the same
    # reading of the ring: without them a simulation misses the steady state the run serves
    # after its transient (and so its speed).
    spans: list[list[int]] = []
    until = _recovery_until(loaded, box, remote, phases, runtime, spans) if as_run else None
    results = run_async(drive(drive_spec, phases, on_phase=on_phase, until=until))
    if spans:
        # Which host steps the run would leave out of its counters: the simulator keeps them
        # in the ring (T90, speed) and out of the counted rates.
        write_json_atomic(out_dir / UNSCORED_STEPS, {"schema_version": 1, "host_steps": spans})
    tokens = sum(r.completion_tokens or 0 for r in results)
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeBootError(
            f"{len(failed)} of {len(results)} requests failed while collecting "
            f"counts; first: {failed[0].error}"
        )
    got = _Got(tokens, len(results))
    if sources.dump_path is not None:
        status, body = http_json(
            runtime.base_url + sources.dump_path, {}, headers=runtime.admin_headers
        )
        if status != 200 or not isinstance(body, dict):
            raise RuntimeBootError(f"count dump failed: HTTP {status}: {body}")
        got.body = body
    elif recording is not None:
        finish_recording(runtime, recording, out_dir, counts_name="counts.json")
    elif dump_file is not None:
        after = read_route_snapshot(box, dump_file, remote)
        if not write_route_delta(out_dir / "counts.json", snapshot, after):
            raise RuntimeBootError(
                f"the runtime left no usable route-count dump at {dump_file.path} "
                "(missing, or its counts went backwards: it restarted)"
            )
    return got


def _save(
    loaded: LoadedCard,
    box: Box,
    remote: str,
    out_dir: Path,
    got: _Got,
    experts: int | None,
    orphans: tuple[int, ...],
) -> Collected:
    """Write the counts and fetch the runtime's route trace, where it writes one."""
    counts = out_dir / "counts.json"
    if got.body is not None:
        write_text_atomic(counts, json.dumps(got.body) + "\n")
    trace: Path | None = None
    route_trace = loaded.runtime.telemetry.route_trace
    if route_trace:
        remote_trace = render(route_trace, {"run_dir": remote})
        if box.exists(remote_trace):
            trace = out_dir / "route-trace.jsonl"
            box.get_file(remote_trace, trace)
    if got.from_responses is not None:
        # The runtime's own trace, if it writes one, stays beside (route-trace.jsonl).
        counts, trace = got.from_responses.write(out_dir, experts)
    return Collected(counts, trace, got.requests, got.tokens, orphans)


def _recovery_until(
    loaded: LoadedCard,
    box: Box,
    remote: str,
    phases: list[PhasePlan],
    runtime: RunningRuntime,
    spans: list[list[int]],
) -> UntilHook | None:
    """The hook that ends ``until_recovered`` extensions when the runtime's ring shows the
    recovery measured, as the runner's does, and notes in ``spans`` the host steps each
    extension ran (from the runtime's ``steps`` counter on each side); None without extensions
    or a ring to read."""
    ring = loaded.runtime.telemetry.ring
    if ring is None or not ring.header or not any(p.extension for p in phases):
        return None
    python = loaded.box.python_path()
    path = render(ring.path, {"run_dir": remote, "port": 0, "python": python})
    watch = RecoveryWatch(box, python, path, loaded.card.analysis)

    async def measured(phase: PhasePlan) -> bool:
        return await asyncio.to_thread(watch.measured, phase.index)

    def steps_now() -> int | None:
        telemetry = runtime.profile.telemetry
        found = scrape_counters(runtime.base_url, telemetry.counters_http, telemetry.metrics_http)
        value = (found or {}).get("steps")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    async def begins(phase: PhasePlan) -> None:
        start = await asyncio.to_thread(steps_now)
        spans.append([-1 if start is None else start, -1])

    async def ends(phase: PhasePlan) -> None:
        end = await asyncio.to_thread(steps_now)
        if spans and spans[-1][0] >= 0 and end is not None:
            spans[-1][1] = end
        else:
            del spans[-1:]  # a runtime without a step counter: nothing to say

    return UntilHook(measured, begins, ends)
