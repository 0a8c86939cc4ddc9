"""``harness simulate CARD --traces FILE...``: a campaign directory predicted from traces.

For every cell of the card the simulator resolves the reference runtime's policy settings the
way a boot would (profile knobs and ``REFBOX_*`` env, then ``live`` knobs; ``files.rowmap`` or
``files.hotlist``; otherwise the runtime's defaults), replays the traces through the policy and
writes the same layout as ``harness run``: ``card.yaml``, ``plan.json`` (``build_plan``), per run
``run.json`` (status ok), ``ring.parquet``, ``counters.json`` (before/after/delta) and empty
``requests.parquet``/``chunks.parquet``, plus a ``SIMULATED`` marker. ``harness analyze`` and
``harness gate`` then read it unchanged; client-side timings stay empty (no requests were sent).

Phases: the traces are replayed one after another, as one stream. Every row keeps the phase tag
its trace recorded (a reference-runtime trace from a campaign run carries the card's phase
indices, because the runner posts them as the live ``phase`` knob). A trace without phase tags
(``.npy``, Megatron JSONL without ``phase``) is tagged with its position in ``--traces``, so give
one such trace per card phase, in phase order.

The simulation is deterministic, so every planned run of a cell gets the same records; the
statistics see zero spread and deterministic evidence (cold share, swaps, loads) is what counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from harness.analyze.recovery import step_clock
from harness.card import Cell, LoadedCard
from harness.card.simulation_match import SIMULATED_INPUTS, fingerprint
from harness.errors import KnobError, MapError
from harness.formats.maps import read_hotlist, read_rowmap
from harness.formats.records import RUN_OK, CampaignDir, RunRecord, write_json_atomic, write_parquet
from harness.formats.safe_write import write_text_atomic
from harness.plan.build import Plan, build_plan, plan_json_text
from harness.policy.lru import GlobalLruCache
from harness.policy.residency import PolicyKnobs, parse_priority
from harness.sim.cost_fit import CostFit, predict_recovery, predict_speed, write_cost
from harness.sim.oracle import OracleBound, cache_oracle_bound, oracle_bound
from harness.sim.replay import replay_cache, replay_fast, replay_lru, replay_reference
from harness.sim.results import DEFAULT_RECORD_BYTES, CostModel, ReplayResult
from harness.sim.run_cost_fit import RunCostFit, predict_run_speed
from harness.sim.traces import Trace, concat_traces, trace_from_arrays

__all__ = ["CellSettings", "SimulatedCell", "cell_settings", "simulate_card"]

_DEFAULT_HOT_SLOTS = 48  # the reference runtime's --hot-slots default
_INT_KNOBS = ("drain_every", "swaps_per_layer", "hot_slots", "cache_records", "expert_bytes",
              "n_cpu_moe")  # fmt: skip
_FLOAT_KNOBS = ("decay_half_life_steps", "promote_threshold", "hysteresis")
# llama.cpp's knobs that put experts in host memory (and cache them): a cell setting any of them
# replays llama.cpp's expert cache (an empty budget without moe_cache_mib).
_LLAMA_PLACEMENT = frozenset({"moe_cache_mib", "n_cpu_moe", "cpu_moe"})
REQUEST_COLUMNS = {
    "request": "int64",
    "cell": "object",
    "prompt_id": "object",
    "domain": "object",
    "phase": "object",
    "phase_index": "int64",
    "warmup": "bool",
    "ok": "bool",
    "error": "object",
    "first_after_boot": "bool",
    "t_start_s": "float64",
    "scheduling_delay_s": "float64",
    "ttft_s": "float64",
    "e2el_s": "float64",
    "completion_tokens": "int64",
    "prompt_tokens": "int64",
    "n_chunks": "int64",
    "output_text": "object",
    "output_sha256": "object",
}
CHUNK_COLUMNS = {"request": "int64", "chunk": "int64", "t_s": "float64", "chars": "int64"}


@dataclass(frozen=True)
class CellSettings:
    """What a cell boots the reference runtime with, as far as the policy is concerned."""

    mode: Literal["rowmap", "cache", "lru"]
    knobs: PolicyKnobs
    hot: list[list[int]] = field(default_factory=list)
    hotlist: list[tuple[int, int]] = field(default_factory=list)
    cache_records: int = 0
    priority: Literal["legacy", "adaptive"] | int = "adaptive"
    record_bytes: int = DEFAULT_RECORD_BYTES
    start: str = "runtime default map"
    cache_bytes: int = 0  # lru: llama.cpp's --moe-cache-mib in bytes
    cached_layers: tuple[int, ...] | None = None  # lru: host-resident layers (None: all)

    def describe(self) -> dict[str, Any]:
        """JSON-ready settings for run.json."""
        out: dict[str, Any] = {"mode": self.mode, "record_bytes": self.record_bytes}
        out["start"] = self.start
        if self.mode == "rowmap":
            out.update(self.knobs.__dict__)
            out["hot_slots"] = len(self.hot[0]) if self.hot else 0
        elif self.mode == "lru":
            out.update(cache_bytes=self.cache_bytes, expert_bytes=self.record_bytes)
            layers = self.cached_layers
            out["cached_layers"] = "all" if layers is None else list(layers)
        else:
            out.update(cache_records=self.cache_records, priority=self.priority)
            out["hotlist_entries"] = len(self.hotlist)
        return out


def _cell_values(loaded: LoadedCard, cell: Cell) -> dict[str, str]:
    """Knob name -> text, boot knobs first, then raw env, then live knobs (which win)."""
    values: dict[str, str] = {}

    def text(value: object) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        return str(value)

    for name, value in cell.knobs.items():
        spec = loaded.runtime.knobs.get(name)
        env = spec.env if spec is not None else None
        key = env[len("REFBOX_") :].lower() if env and env.startswith("REFBOX_") else name
        values[key] = text(value)
    for var, value in cell.env.items():
        if var.startswith("REFBOX_"):
            values[var[len("REFBOX_") :].lower()] = text(value)
    for name, value in cell.live.items():
        values[name] = text(value)
    return values


def cell_settings(
    loaded: LoadedCard,
    name: str,
    trace: Trace,
    start: Literal["card", "empty"] = "card",
    cell: Cell | None = None,
    *,
    expert_bytes: int | None = None,
) -> CellSettings:
    """Resolve one cell's policy settings (raises KnobError/MapError naming the cell).

    ``cell`` replaces the card's cell of that name (a sweep point: the base cell with knobs or
    files changed); its relative file paths resolve beside the card as the card's own do.
    A cell setting llama.cpp's ``moe_cache_mib``, ``n_cpu_moe`` or ``cpu_moe`` replays its
    expert cache (a global LRU; no budget without ``moe_cache_mib``), with one expert of
    ``expert_bytes`` (``--expert-bytes``; else the cell's ``expert_bytes`` knob).
    """
    cell = cell if cell is not None else loaded.card.cells[name]
    values = _cell_values(loaded, cell)
    where = f"cells.{name}"
    typed: dict[str, Any] = {}
    for key, raw in values.items():
        try:
            if key in _INT_KNOBS:
                typed[key] = int(raw)
            elif key in _FLOAT_KNOBS:
                typed[key] = float(raw)
            else:
                typed[key] = raw
        except ValueError:
            raise KnobError(f"{where}: {key}={raw!r} is not a number") from None
    knob_fields = {k: typed[k] for k in PolicyKnobs.__dataclass_fields__ if k in typed}
    knobs = PolicyKnobs(**knob_fields)
    try:
        knobs.validate()
    except KnobError as exc:
        raise KnobError(f"{where}: {exc.message}") from None
    if _LLAMA_PLACEMENT & set(typed):
        return _lru_settings(typed, trace, where, knobs, expert_bytes)
    record_bytes = max(int(typed.get("expert_bytes", DEFAULT_RECORD_BYTES)), 0)
    experts = trace.experts_count
    cache_records = int(typed.get("cache_records", 0))
    if cache_records > 0:
        hotlist: list[tuple[int, int]] = []
        note = "empty cache"
        if start == "card" and "hotlist" in cell.files:
            path = loaded.resolve(cell.files["hotlist"])
            hotlist = [(e[0], e[1]) for e in read_hotlist(path).entries]
            note = f"hotlist {path.name}"
        priority = parse_priority(str(typed.get("hotlist_priority", "adaptive")))
        return CellSettings(
            "cache", knobs, [], hotlist, cache_records, priority, record_bytes, note
        )
    recorded_slots = (trace.header or {}).get("hot_slots")
    hot_slots = int(typed.get("hot_slots", recorded_slots or _DEFAULT_HOT_SLOTS))
    if start == "card" and "rowmap" in cell.files:
        path = loaded.resolve(cell.files["rowmap"])
        rowmap = read_rowmap(path, experts=experts)
        if len(rowmap.hot) != trace.layers:
            raise MapError(f"{path}: {len(rowmap.hot)} layers, the traces have {trace.layers}")
        return CellSettings(
            "rowmap", knobs, [sorted(h) for h in rowmap.hot], [], 0, "adaptive", record_bytes,
            f"rowmap {path.name}",
        )  # fmt: skip
    if not 0 <= hot_slots <= experts:
        raise KnobError(
            f"{where}: hot_slots {hot_slots} is not in 0..{experts} (the traces' experts)"
        )
    hot = [list(range(hot_slots))] * trace.layers
    return CellSettings(
        "rowmap", knobs, hot, [], 0, "adaptive", record_bytes, "runtime default map"
    )


def _lru_settings(
    typed: dict[str, Any],
    trace: Trace,
    where: str,
    knobs: PolicyKnobs,
    expert_bytes: int | None,
) -> CellSettings:
    """llama.cpp's expert cache: budget from moe_cache_mib, layers from n_cpu_moe/cpu_moe."""
    raw = str(typed.get("moe_cache_mib", "0"))  # no cache: every host-resident lookup misses
    if not raw.isdigit():
        raise KnobError(
            f"{where}: moe_cache_mib={raw!r}: must be a whole number of MiB (llama.cpp parses "
            "--moe-cache-mib as an integer)"
        )
    size = expert_bytes if expert_bytes is not None else typed.get("expert_bytes")
    if size is None or int(size) < 1:
        raise KnobError(
            f"{where}: llama.cpp's expert placement (moe_cache_mib, n_cpu_moe, cpu_moe) needs "
            "the size of one expert in bytes (its gate, up and down matrices: a GGUF's "
            "ffn_*_exps tensor bytes / experts); give --expert-bytes N"
        )
    cached: tuple[int, ...] | None = None
    cpu_moe = str(typed.get("cpu_moe", "")).lower()
    if cpu_moe in ("1", "true"):
        note = "every layer's experts in host memory (cpu_moe)"
    elif "n_cpu_moe" in typed:
        count = int(typed["n_cpu_moe"])
        if count < 0:
            raise KnobError(f"{where}: n_cpu_moe={count}: must not be negative")
        cached = tuple(range(min(count, trace.layers)))
        note = f"the experts of the first {len(cached)} layers in host memory (n_cpu_moe)"
    elif cpu_moe in ("0", "false"):
        cached = ()
        note = "no experts in host memory (cpu_moe 0, no n_cpu_moe): nothing to cache"
    else:
        note = "every layer's experts taken to be in host memory (no placement knob set)"
    return CellSettings(
        "lru", knobs, record_bytes=int(size), start=note, cache_bytes=int(raw) * 2**20,
        cached_layers=cached,
    )  # fmt: skip


def replay_settings(settings: CellSettings, trace: Trace, *, fast: bool = True,
                    threads: int | None = None,
                    trail: list[int] | None = None) -> ReplayResult:  # fmt: skip
    """The replay a cell's settings ask for: the rowmap policy, ds4's cache or llama.cpp's
    (``trail``: the keys llama.cpp's cache served, in order, for its oracle bound)."""
    if settings.mode == "cache":
        return replay_cache(trace, settings.cache_records, settings.hotlist, settings.priority)
    if settings.mode == "lru":
        cached = settings.cached_layers
        return replay_lru(trace, settings.cache_bytes, settings.record_bytes, cached, trail)
    if fast:
        return replay_fast(trace, settings.knobs, settings.hot, changes=[], threads=threads)
    return replay_reference(trace, settings.knobs, settings.hot, changes=[])


@dataclass
class SimulatedCell:
    """One cell's replay and its settings."""

    name: str
    settings: CellSettings
    result: ReplayResult
    oracle: OracleBound | None = None  # MIN's loads on the same lookups and slots
    speed: dict[str, dict[str, float]] = field(default_factory=dict)  # with a fitted cost
    # T90/T2x in seconds with a fitted cost's interval (an open end is None: some draws never
    # recovered).
    recovery: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Cold share, swaps and loads, for the command's table; beside them the oracle's loads
        over the whole replay (warmup included, as MIN's start is the boot map) and the
        policy's loads over the same span."""
        counters = self.result.run_counters(self.settings.record_bytes)["delta"]
        lookups = counters["lookups"] or 1
        out: dict[str, Any] = {
            "cell": self.name,
            "mode": self.settings.mode,
            "start": self.settings.start,
            "cold_share": counters["cold_lookups"] / lookups,
            "swaps": counters["swaps"],
            "expert_loads": counters["expert_loads"],
        }
        if self.oracle is not None:
            whole = self.result.counters(self.settings.record_bytes)
            out.update(
                replay_loads=whole["expert_loads"],
                oracle_loads=self.oracle.loads,
                oracle_hot_slots=self.oracle.hot_slots,
                oracle_scope=self.oracle.scope,
                best_static_cold_share=self.oracle.static_share,
                replay_cold_share=whole["cold_lookups"] / (whole["lookups"] or 1),
                loads_over_oracle=(
                    whole["expert_loads"] / self.oracle.loads if self.oracle.loads else None
                ),
            )
        return out


def simulate_cells(
    loaded: LoadedCard,
    trace: Trace,
    start: Literal["card", "empty"] = "card",
    *,
    fast: bool = True,
    expert_bytes: int | None = None,
) -> list[SimulatedCell]:
    """Replay the (joined) trace under every cell's settings."""
    cells = []
    for name in loaded.card.cells:
        settings = cell_settings(loaded, name, trace, start, expert_bytes=expert_bytes)
        result, oracle = _replay_with_bound(settings, trace, fast)
        result.unscored = trace.unscored
        cells.append(SimulatedCell(name, settings, result, oracle))
    return cells


def _replay_with_bound(
    settings: CellSettings, trace: Trace, fast: bool
) -> tuple[ReplayResult, OracleBound | None]:
    """A cell's replay and its oracle bound, on the lookups in the order its policy served them."""
    keys_count = trace.layers * trace.experts_count
    trail: list[int] = []
    result = replay_settings(settings, trace, fast=fast, trail=trail)
    if settings.mode == "lru":
        capacity = GlobalLruCache.slots_for(settings.cache_bytes, settings.record_bytes)
        bound = cache_oracle_bound(trail, [], capacity, keys_count) if capacity else None
        return result, bound
    if settings.mode == "cache":  # token by token, layer by layer, as the runtime fetches
        offsets = (np.arange(trace.layers, dtype=np.int64) * trace.experts_count)[:, None]
        keys = np.where(trace.experts >= 0, trace.experts + offsets, -1)
        start = [layer * trace.experts_count + expert for layer, expert in settings.hotlist]
        return result, cache_oracle_bound(keys, start, settings.cache_records, keys_count)
    return result, oracle_bound(trace, settings.hot)


def _without_warmup(trace: Trace) -> Trace:
    """The trace less its warmup rows (phase -1, from ``harness collect --as-run``)."""
    keep = trace.phase >= 0
    if keep.all() or not keep.any():
        return trace
    kept = trace_from_arrays(
        trace.experts[keep],
        prefill=trace.prefill[keep],
        phase=trace.phase[keep],
        steps=trace.steps[keep],
        experts_count=trace.experts_count,
        path=trace.path,
        fmt=trace.format,
    )
    kept.unscored = trace.unscored  # host-step numbers, kept as they were: still unscored
    return kept


def _scored(result: ReplayResult) -> np.ndarray:
    """Host steps of requests a client times: not warm-up, not an unscored extension."""
    scored = np.asarray(result.phase >= 0, dtype=bool).copy()
    for first, last in result.unscored_positions():
        scored[first:last] = False
    return scored


def _priced_ring(cell: SimulatedCell, cost: CostModel) -> pd.DataFrame:
    """The cell's replay as its ring, each host step priced by ``cost``."""
    frame = cell.result.ring_frame(cost, cell.settings.record_bytes)
    # The runtime's ring tags warm-up and washout steps with the phase it booted with (0): the
    # runner posts the phase knob only for scored phases. The trace's -1 tag is for the
    # counters; in the ring it would read as a shift of its own, never recovered, and hide
    # every cell's T90.
    frame["phase"] = frame["phase"].clip(lower=0)
    return frame


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({k: pd.Series([], dtype=v) for k, v in columns.items()})


def simulate_card(
    loaded: LoadedCard,
    traces: list[Trace],
    *,
    reports: Path = Path("reports"),
    out: Path | None = None,
    start: Literal["card", "empty"] = "card",
    cost: CostModel | None = None,
    fast: bool = True,
    expert_bytes: int | None = None,
    cost_fit: CostFit | RunCostFit | None = None,
) -> tuple[Path, list[SimulatedCell]]:
    """Write a simulated campaign directory; returns it and the per-cell replays.

    With ``cost_fit`` (``--cost``) the ring is priced by the fitted model, and every cell's
    decode speed and inter-token percentiles are predicted with the fit's intervals
    (``predicted_speed.json``, beside a copy of the fit as ``cost.json``). A per-run fit
    (``fit-cost --per-run``) leaves the ring at ``cost`` and predicts each cell's client speed
    from its replayed loads per token."""
    step_fit = cost_fit if isinstance(cost_fit, CostFit) else None
    cost = step_fit.model() if step_fit is not None else (cost or CostModel())
    trace = concat_traces(traces)
    plan = build_plan(loaded)
    root = _new_directory(loaded, reports, out)
    _write_inputs(root, loaded, plan, traces, trace, start, cost)
    campaign = CampaignDir(root)
    campaign.journal.append("campaign_start", campaign=loaded.card.campaign, runs=len(plan.runs))
    replays = _replays(loaded, plan, trace, start, fast, expert_bytes)
    _write_runs(campaign, plan, replays, traces, step_fit, cost)
    cells = replays.get(True) or replays[False]
    _write_oracle(root, cells)
    if cost_fit is not None:
        _predict(root, loaded, cells, cost_fit)
    campaign.journal.append("campaign_end", done=len(plan.runs), failed=0)
    return root, list(cells.values())


def _new_directory(loaded: LoadedCard, reports: Path, out: Path | None) -> Path:
    """``out``, or a new time-stamped folder under ``reports``; never one holding a campaign."""
    if out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        root = reports / f"{loaded.card.campaign}-sim" / stamp
        suffix = 1
        while root.exists():
            suffix += 1
            root = reports / f"{loaded.card.campaign}-sim" / f"{stamp}-{suffix}"
    else:
        root = out
    if (root / "plan.json").exists():
        raise KnobError(f"{root}: already holds a campaign; pick an empty --out folder")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _write_inputs(
    root: Path,
    loaded: LoadedCard,
    plan: Plan,
    traces: list[Trace],
    trace: Trace,
    start: Literal["card", "empty"],
    cost: CostModel,
) -> None:
    """The card, its plan and what the prediction rests on, as a campaign directory holds them."""
    write_text_atomic(root / "card.yaml", loaded.text)
    write_text_atomic(root / "card.path", str(loaded.path))
    write_text_atomic(root / "plan.json", plan_json_text(plan) + "\n")
    write_text_atomic(
        root / "SIMULATED",
        "simulated by harness simulate: no runtime was booted\n"
        f"traces: {', '.join(t.path for t in traces)}\n"
        f"start: {start}\ncost model (ns): {cost}\n",
    )
    # What this prediction rests on, for validate, plan and the report to hold a card against.
    write_json_atomic(
        root / SIMULATED_INPUTS,
        {
            "schema_version": 1,
            **fingerprint(loaded),
            "model": {"layers": trace.layers, "experts": trace.experts_count},
            "traces": [t.path for t in traces],
            "start": start,
        },
    )


def _replays(
    loaded: LoadedCard,
    plan: Plan,
    trace: Trace,
    start: Literal["card", "empty"],
    fast: bool,
    expert_bytes: int | None,
) -> dict[bool, dict[str, SimulatedCell]]:
    """Each cell replayed, by whether its runs send a warm-up."""
    # A run that sends no warmup replays the trace without its warmup rows; one that does
    # replays them and leaves them out of its counters. Without warmup rows both are one replay.
    unwarmed = _without_warmup(trace)
    replays: dict[bool, dict[str, SimulatedCell]] = {}
    for warms in sorted({run.sends_warmup for run in plan.runs}, reverse=True):
        if not warms and unwarmed is trace and True in replays:
            replays[False] = replays[True]
            continue
        replayed = simulate_cells(
            loaded, trace if warms else unwarmed, start, fast=fast, expert_bytes=expert_bytes
        )
        replays[warms] = {c.name: c for c in replayed}
    return replays


def _write_runs(
    campaign: CampaignDir,
    plan: Plan,
    replays: dict[bool, dict[str, SimulatedCell]],
    traces: list[Trace],
    step_fit: CostFit | None,
    cost: CostModel,
) -> None:
    """Every run of the plan as the runner would have recorded it, its ring priced."""
    frames: dict[int, pd.DataFrame] = {}  # one ring per replay, by its result's identity
    for run in plan.runs:
        cell = replays[run.sends_warmup][run.cell]
        run_dir = campaign.run_dir(run.run_id)
        now = time.time()
        frame = frames.get(id(cell.result))
        if frame is None:
            priced = step_fit.model(cell.settings.record_bytes) if step_fit else cost
            frame = _priced_ring(cell, priced)
            frames[id(cell.result)] = frame
        write_parquet(frame, run_dir / "ring.parquet")
        write_parquet(_empty(REQUEST_COLUMNS), run_dir / "requests.parquet")
        write_parquet(_empty(CHUNK_COLUMNS), run_dir / "chunks.parquet")
        write_json_atomic(
            run_dir / "counters.json", cell.result.run_counters(cell.settings.record_bytes)
        )
        record = RunRecord(
            **run.identity(),
            status=RUN_OK,
            reason="simulated",
            box="simulator",
            boot_id=f"{run.run_id}-sim",
            knobs=cell.settings.describe(),
            runtime={"simulated": True, "traces": [t.path for t in traces]},
            started_at=now,
            ended_at=now,
        )
        write_json_atomic(run_dir / "run.json", record.to_json())
        campaign.journal.append("run_done", run_id=run.run_id)


def _write_oracle(root: Path, cells: dict[str, SimulatedCell]) -> None:
    """The best any residency could do on the trace, beside what the policy did."""
    bounds = [c.summary() for c in cells.values() if c.oracle is not None]
    if bounds:
        write_json_atomic(
            root / "oracle.json",
            {
                "schema_version": 1,
                "cells": [
                    {
                        "cell": b["cell"],
                        "hot_slots": b["oracle_hot_slots"],
                        "scope": b["oracle_scope"],
                        "policy_loads": b["replay_loads"],
                        "min_loads": b["oracle_loads"],
                        "best_static_cold_share": b["best_static_cold_share"],
                        "policy_cold_share": b["replay_cold_share"],
                    }
                    for b in bounds
                ],
            },
        )


def _predict(
    root: Path, loaded: LoadedCard, cells: dict[str, SimulatedCell], cost_fit: CostFit | RunCostFit
) -> None:
    """Each cell's predicted speed (and, from a per-step fit, its recovery), written beside."""
    per_run = cost_fit if isinstance(cost_fit, RunCostFit) else None
    step_fit = cost_fit if isinstance(cost_fit, CostFit) else None
    if per_run is not None:
        write_json_atomic(root / "cost.json", per_run.to_json())
        for cell in cells.values():
            delta = cell.result.run_counters(cell.settings.record_bytes)["delta"]
            cell.speed = predict_run_speed(per_run, delta)
    if step_fit is not None:
        write_cost(step_fit, root / "cost.json")
        for cell in cells.values():
            result = cell.result
            tokens = np.where(result.prefill, 0, result.tokens)  # prefill steps never decode
            cell.speed = predict_speed(
                step_fit, tokens, result.cold_lookups, result.step_swaps,
                cell.settings.record_bytes, prefill=result.prefill, scored=_scored(result),
            )  # fmt: skip
            analysis = loaded.card.analysis
            cell.recovery = predict_recovery(
                step_fit,
                partial(_priced_ring, cell),
                cell.settings.record_bytes,
                window_s=analysis.window_s,
                converged_span_s=analysis.converged_span_s,
                hold_s=analysis.hold_s,
                steps=step_clock(analysis),
            )
    if cost_fit is not None:
        write_json_atomic(
            root / "predicted_speed.json",
            {
                "schema_version": 1,
                "cost": cost_fit.source,
                "cells": {name: {**cell.speed, **cell.recovery} for name, cell in cells.items()},
            },
        )
