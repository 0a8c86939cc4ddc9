"""Run records → the run tables: one row per planned run (how it ended, where, what washed it,
what the box's probes read, its metrics), and per completed run its shifts, domains, outputs,
prompt logs, logit dumps and tier rows. The first step of :func:`harness.analyze.campaign.
analyze_campaign`; it reads the campaign directory and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.compare import probe_readings
from harness.analyze.logit_parity import LOGITS_DIR, read_logit_dumps
from harness.analyze.metrics import domain_speeds, request_metrics, run_metrics
from harness.analyze.recovery import step_clock
from harness.analyze.saturation import QueueSaturation, queue_saturation
from harness.analyze.tails import tail_samples
from harness.analyze.tiers import tier_table
from harness.card import Card
from harness.catalog import METRICS
from harness.errors import RecordError
from harness.formats.records import (
    CampaignDir,
    read_cohorts,
    read_counters,
    read_json,
    read_parquet,
)
from harness.plan.build import cohort_key

RUN_KEYS = ("run_id", "cell", "cycle", "slot", "repeat", "cache_state", "pattern", "comparison")


def _prompt_logs(requests: pd.DataFrame) -> np.ndarray:
    scored = request_metrics(requests)
    scored = scored[scored["decode_tok_s"] > 0].sort_values("request")
    logs: np.ndarray = np.log(scored["decode_tok_s"].to_numpy(dtype=float))
    return logs


def _row_logs(bench: pd.DataFrame) -> np.ndarray:
    # A command-driver run's result rows stand where prompts do (one decode speed each).
    if "decode_tok_s" not in bench.columns:
        return np.array([], dtype=float)
    values = bench["decode_tok_s"].to_numpy(dtype=float)
    logs: np.ndarray = np.log(values[np.isfinite(values) & (values > 0)])
    return logs


@dataclass
class RunTables:
    """The per-run tables of a campaign, and per-prompt log speeds for the bootstrap."""

    runs: pd.DataFrame
    shifts: pd.DataFrame
    domains: pd.DataFrame
    outputs: pd.DataFrame
    prompt_logs: dict[str, np.ndarray]
    # cell -> key -> values: the model path / ctx-alloc strings its logit dumps embed
    logit_embedded: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    tiers: pd.DataFrame = field(default_factory=pd.DataFrame)  # command-driver rows per tier
    imported_notes: list[str] = field(default_factory=list)
    # Per run with a record: run_id, cell, box and its runtime.box_load (harness.analyze.box_load)
    box_load: list[dict[str, Any]] = field(default_factory=list)
    # Per completed run, the samples behind its tail metrics (harness.analyze.tails), where asked
    tail_samples: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def _washed_by_boot(card: Card, record: Mapping[str, Any]) -> bool:
    """A run on a boot of its own (design.washed_by: boot) whose box-state probes all read at
    every point: the boot cleared the runtime, and what the box kept is read (the analysis
    withholds a label while it has not settled). A probe that did not read leaves the block
    unwashed: state no probe reads is not assumed away."""
    if card.design.washed_by != "boot" or card.design.boot != "per-block":
        return False
    readings, complete = probe_readings((record.get("runtime") or {}).get("box_state"))
    return bool(readings) and complete


def load_runs(campaign: CampaignDir, card: Card, *, tails: bool = False) -> RunTables:
    """Read every run record and compute its metrics; with ``tails``, keep each completed
    run's per-request TPOT and per-token gaps for the tail bounds (a gate judges a tail)."""
    plan = campaign.plan()
    cohorts = read_cohorts(campaign.root)
    acc = _Accumulated(tails=tails)
    for raw in plan["runs"]:
        row: dict[str, Any] = {key: raw[key] for key in RUN_KEYS}
        record = campaign.run_record(raw["run_id"])
        if record is None:
            row.update(
                status="missing", box=raw.get("box"), reason="never ran (resume the campaign)"
            )
        else:
            load = (record.get("runtime") or {}).get("box_load")
            acc.box_load.append(
                {
                    "run_id": raw["run_id"],
                    "cell": raw["cell"],
                    "box": record.get("box", raw.get("box")),
                    "box_load": load,
                }
            )
            if _record_row(row, raw, record, cohorts, card, campaign) and record["status"] == "ok":
                _read_run(acc, row, raw, campaign.run_dir(raw["run_id"]), card)
        acc.rows.append(row)
    return RunTables(
        runs=pd.DataFrame(acc.rows),
        shifts=pd.DataFrame(acc.shift_rows),
        domains=pd.DataFrame(acc.domain_rows),
        outputs=pd.DataFrame(acc.output_rows),
        prompt_logs=acc.logs,
        logit_embedded=acc.embedded,
        tiers=tier_table(acc.bench_frames),
        imported_notes=acc.notes,
        box_load=acc.box_load,
        tail_samples=acc.tail_samples,
    )


@dataclass
class _Accumulated:
    """The run tables as load_runs gathers them, run by run."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    shift_rows: list[dict[str, Any]] = field(default_factory=list)
    domain_rows: list[dict[str, Any]] = field(default_factory=list)
    output_rows: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, np.ndarray] = field(default_factory=dict)
    embedded: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    bench_frames: list[tuple[str, str, pd.DataFrame]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    box_load: list[dict[str, Any]] = field(default_factory=list)
    tails: bool = False  # keep the tail samples (only a gate on a tail metric reads them)
    tail_samples: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def _record_row(
    row: dict[str, Any],
    raw: Mapping[str, Any],
    record: Mapping[str, Any],
    cohorts: Mapping[str, Any],
    card: Card,
    campaign: CampaignDir,
) -> bool:
    """Fill ``row`` from a run's record: how it ended, where, what washed it and what the box's
    probes read. False when a guard broke in its cohort (every run of it is invalid)."""
    run_id = raw["run_id"]
    cohort = cohort_key(raw["comparison"], raw["cache_state"], int(raw["cycle"]))
    entry = cohorts.get(cohort, {})
    if not entry.get("valid", True):
        # A guard broke in its cohort: every run of it is invalid, however it ended.
        reasons = "; ".join(str(r) for r in entry.get("reasons") or []) or "invalid"
        row.update(status="invalid", reason=f"cohort {cohort} invalid: {reasons}")
        return False
    # Records lost counts only beside a ring: run.json says 0 for a run with none.
    has_ring = (campaign.run_dir(run_id) / "ring.parquet").is_file()
    row.update(
        status=record["status"],
        box=record.get("box", raw.get("box")),  # where it ran: a fleet may have moved it
        reason=record.get("reason", ""),
        ring_lost=record.get("ring_lost") if has_ring else None,
        started_at=record.get("started_at"),
        ended_at=record.get("ended_at"),
        boot_id=record.get("boot_id") or None,  # which runs shared a runtime
        # Requests of its own cell sent before it was measured (design.washout). A cold run
        # boots after its files left the page cache (that eviction is its washout) and a
        # simulated one starts from its boot state: nothing carries into either.
        washout=int((record.get("runtime") or {}).get("washout_requests") or 0),
        # The share of a block the washout lasted (the card's design.washout); records
        # without it (imports, older runs) get washout ÷ scored requests below.
        washout_share=(record.get("runtime") or {}).get("washout_share"),
        independent=bool((record.get("runtime") or {}).get("simulated"))
        or raw.get("cache_state") == "cold"
        or _washed_by_boot(card, record),
        # The box's state as its profile's probes read it (harness.execute.box_state).
        box_state=(record.get("runtime") or {}).get("box_state"),
        own_requests=(record.get("runtime") or {}).get("own_requests"),
    )
    return True


def _read_run(
    acc: _Accumulated, row: dict[str, Any], raw: Mapping[str, Any], run_dir: Path, card: Card
) -> None:
    """A completed run's files: its metrics into ``row``, its shifts, domains, outputs, prompt
    logs, logit dumps and tier rows into ``acc``."""
    run_id = raw["run_id"]
    requests = read_parquet(run_dir / "requests.parquet")
    chunks = read_parquet(run_dir / "chunks.parquet")
    counters = read_counters(run_dir / "counters.json")
    ring_path = run_dir / "ring.parquet"
    ring = read_parquet(ring_path) if ring_path.is_file() else None
    samples_path = run_dir / "samples.parquet"
    samples = read_parquet(samples_path) if samples_path.is_file() else None
    bench_path = run_dir / "bench.parquet"  # a command-driver run's result rows
    bench = read_parquet(bench_path) if bench_path.is_file() else None
    metrics, shifts = run_metrics(
        requests,
        chunks,
        counters,
        ring,
        samples=samples,
        bench=bench,
        concurrency=card.workload.concurrency,
        window_s=card.analysis.window_s,
        converged_span_s=card.analysis.converged_span_s,
        hold_s=card.analysis.hold_s,
        steps=step_clock(card.analysis),
    )
    row.update(metrics)
    row["scored_requests"] = int((~requests["warmup"].astype(bool)).sum())
    if row.get("washout_share") is None and row["scored_requests"]:
        row["washout_share"] = row["washout"] / row["scored_requests"]
    for note in _imported_metrics(run_dir, row):
        if note not in acc.notes:
            acc.notes.append(note)
    acc.logs[run_id] = _prompt_logs(requests) if bench is None else _row_logs(bench)
    if acc.tails:
        acc.tail_samples[run_id] = tail_samples(requests, chunks)
    if bench is not None:
        acc.bench_frames.append((str(raw["cell"]), str(raw["cache_state"]), bench))
    names = {i: p.name for i, p in enumerate(card.workload.phases or [])}
    queue = _queue(run_dir, ring, [shift.shift_t_s for shift in shifts])
    for shift, saturation in zip(shifts, queue, strict=True):
        acc.shift_rows.append(
            {
                "run_id": run_id,
                "cell": raw["cell"],
                "cache_state": raw["cache_state"],
                "from_phase": names.get(shift.from_phase, str(shift.from_phase)),
                "to_phase": names.get(shift.to_phase, str(shift.to_phase)),
                "shift_t_s": shift.shift_t_s,
                "peak": shift.peak,
                "converged": shift.converged,
                "t90_s": shift.t90_s,
                "t2x_s": shift.t2x_s,
                "excess": shift.excess,
                "speed_recovery_s": shift.speed_recovery_s,
                "t90_steps": shift.t90_steps,
                "t2x_steps": shift.t2x_steps,
                "speed_recovery_steps": shift.speed_recovery_steps,
                "converged_tok_s": shift.converged_tok_s,
                "notes": "; ".join(shift.notes),
                "peak_at_budget": saturation.peak_layers if saturation else None,
                "layers": saturation.layers if saturation else None,
                "saturated_s": saturation.saturated_s if saturation else None,
            }
        )
    for domain, speed in domain_speeds(requests).items():
        acc.domain_rows.append(
            {
                "run_id": run_id,
                "cell": raw["cell"],
                "cache_state": raw["cache_state"],
                "comparison": raw["comparison"],
                "domain": domain,
                "decode_tok_s": speed,
            }
        )
    scored = requests[~requests["warmup"]]
    for _, request in scored.iterrows():
        acc.output_rows.append(
            {
                "run_id": run_id,
                "cell": raw["cell"],
                "cache_state": raw["cache_state"],
                "prompt_id": request["prompt_id"],
                "phase": request["phase"],
                "ok": bool(request["ok"]),
                "output_sha256": request["output_sha256"],
                "output_text": request["output_text"],
                # Per-token log-probabilities (JSON), where the workload asked for them.
                "logprobs": _text_or_none(request.get("logprobs")),
            }
        )
    if (run_dir / LOGITS_DIR).is_dir():
        # Logit parity: each frontier dump is an output the exact_outputs gate compares.
        dumps = read_logit_dumps(run_dir / LOGITS_DIR)
        row["logit_sha256"] = dumps.combined_sha256
        for key, values in dumps.embedded.items():
            acc.embedded.setdefault(raw["cell"], {}).setdefault(key, set()).update(values)
        for name, sha in dumps.hashes.items():
            acc.output_rows.append(
                {
                    "run_id": run_id,
                    "cell": raw["cell"],
                    "cache_state": raw["cache_state"],
                    "prompt_id": name,
                    "phase": "logits",
                    "ok": True,
                    "output_sha256": sha,
                    "output_text": "",
                }
            )


def _imported_metrics(run_dir: Path, row: dict[str, Any]) -> list[str]:
    """Fill the metrics an imported block's tool reported and its records cannot give.

    ``harness import`` writes ``imported.json`` beside a run's records: the tool's own figures
    by catalog name. A metric computed from the run's requests always wins; the tool's figure
    only fills one the records leave empty (a summary-only file). Returns the block's notes on
    what differs from the harness's own definitions.
    """
    path = run_dir / "imported.json"
    if not path.is_file():
        return []
    source = read_json(path)
    values = source.get("metrics")
    if not isinstance(values, dict):
        raise RecordError(f"{path}: metrics: must be an object of numbers")
    for name, value in values.items():
        if name not in METRICS:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{path}: metrics.{name}: must be a number, got {value!r:.40}")
        current = row.get(name)
        if current is None or (isinstance(current, float) and math.isnan(current)):
            row[name] = float(value)
    notes = source.get("notes") or []
    label = f"imported from {source.get('format', '?')}"
    return [f"{label}: {n}" for n in notes if isinstance(n, str)]


def _queue(
    run_dir: Path, ring: pd.DataFrame | None, starts: list[float]
) -> list[QueueSaturation | None]:
    """Each shift's swap queue at its budget (analyze/saturation.py), its span up to the next
    shift or the ring's last step."""
    if not starts or ring is None or ring.empty:
        return [None] * len(starts)
    t_ns = ring["t_ns"]
    last = float(t_ns.max() - t_ns.min()) / 1e9
    spans = list(zip(starts, [*starts[1:], last], strict=True))
    return queue_saturation(run_dir / "route-trace.jsonl", ring, spans)


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
