"""Analysis of a whole campaign directory: run table, cell table, comparisons and flags.

Pure over the records it reads: no network, no boxes. Writes ``analysis/*.parquet`` and
``analysis/summary.json``; the same numbers feed the gates and the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from harness.analyze.cell_values import cell_value
from harness.analyze.compare import (
    DEFAULT_METRICS,
    CellComparison,
    compare_cells,
    comparison_rows,
    probe_readings,
)
from harness.analyze.fleet import FleetTables, fleet_tables
from harness.analyze.logit_parity import LOGITS_DIR, embedded_mismatch, read_logit_dumps
from harness.analyze.looks import (
    LookState,
    design_plan,
    extension_warnings,
    look_state,
    looks_frame,
    planned_cycles,
    undecided,
)
from harness.analyze.metrics import domain_speeds, request_metrics, run_metrics
from harness.analyze.predicted import PredictedVsMeasured, predicted_vs_measured
from harness.analyze.runtime_tables import RuntimeTables, build_runtime_tables
from harness.analyze.seed_tables import SeedTables, build_seed_tables
from harness.analyze.tiers import tier_table
from harness.card import BetterGate, Card, SurvivesGate, read_card_schema
from harness.catalog import METRICS
from harness.errors import HarnessError, RecordError
from harness.formats.records import (
    CampaignDir,
    read_cohorts,
    read_counters,
    read_json,
    read_parquet,
    write_json_atomic,
    write_parquet,
)
from harness.plan.build import cohort_key

if TYPE_CHECKING:
    from harness.analyze.series import FigureSeries
    from harness.stats.sequential import SequentialPlan

RUN_KEYS = ("run_id", "cell", "cycle", "slot", "repeat", "cache_state", "pattern", "comparison")


@dataclass
class CampaignAnalysis:
    """Everything computed from a campaign directory."""

    campaign: CampaignDir
    card: Card
    runs: pd.DataFrame  # one row per planned run, status and metrics
    shifts: pd.DataFrame  # one row per run × phase shift
    domains: pd.DataFrame  # one row per run × domain: decode tok/s
    outputs: pd.DataFrame  # one row per run × prompt: output hash and text
    cells: pd.DataFrame  # one row per cell × cache state: medians over ok runs
    comparisons: list[CellComparison]
    seed_tables: SeedTables
    look: LookState | None = None  # where a sequential design stands; None for a fixed one
    looks: pd.DataFrame = field(default_factory=pd.DataFrame)  # the looks taken so far
    flags: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    simulated: bool = False
    tiers: pd.DataFrame = field(default_factory=pd.DataFrame)  # cell × state × tier medians
    runtime: RuntimeTables | None = None  # the runtime's own counters and routing, per cell
    fleet: FleetTables | None = None  # per-box effects and the interaction; None on one box
    sealed: bool = True  # False: an older directory, its earlier records read unverified
    journal_head: str = ""  # the digest of the journal's last event line as verified
    # A simulated campaign's oracle bounds per cell (oracle.json, written by harness simulate).
    oracle: list[dict[str, Any]] = field(default_factory=list)

    def cell_value(self, cell: str, state: str, column: str) -> float | None:
        """One finite value of the cell table (a metric's median over the cell's ok runs)."""
        return cell_value(self.cells, cell, state, column)

    @cached_property
    def sequential_plan(self) -> SequentialPlan | None:
        """The card's sequential design; None for a fixed one."""
        return design_plan(self.card)

    @cached_property
    def prompt_domains(self) -> dict[str, str]:
        """prompt id → domain, from the requests of the first completed run that has them."""
        from harness.analyze.series import prompt_domains

        return prompt_domains(self)

    @cached_property
    def series(self) -> FigureSeries:
        """What the report's figures draw (harness.analyze.series), read when first asked."""
        from harness.analyze.series import figure_series

        return figure_series(self)

    def comparison_table(self) -> pd.DataFrame:
        """Comparisons as rows."""
        return pd.DataFrame(comparison_rows(self.comparisons))

    def to_json(self) -> dict[str, Any]:
        """The ``harness analyze --json`` payload."""
        cells: dict[str, dict[str, Any]] = {}
        for row in self.cells.to_dict("records"):
            key = (
                row["cell"]
                if len(self.card.design.cache_states) == 1
                else (f"{row['cell']}/{row['cache_state']}")
            )
            cells[str(key)] = {str(k): _clean(v) for k, v in row.items() if k != "cell"}
        comparisons = [
            {k: _clean(v) for k, v in row.items()} for row in comparison_rows(self.comparisons)
        ]
        out: dict[str, Any] = {
            "campaign": self.card.campaign,
            "simulated": self.simulated,
            "cells": cells,
            "comparisons": comparisons,
            "flags": self.flags,
            "warnings": self.warnings,
            "seed_tables": self.seed_tables.to_json(),
            "sequential": self.look.to_json() if self.look else None,
            "tiers": [{k: _clean(v) for k, v in r.items()} for r in self.tiers.to_dict("records")],
        }
        if self.runtime:  # only where a runtime recorded them: other summaries are unchanged
            out["runtime"] = self.runtime.to_json()
        if self.fleet is not None:  # only for a campaign that ran on several boxes
            out["fleet"] = self.fleet.to_json()
        if self.oracle:  # only for a simulated campaign whose replay wrote its bounds
            out["oracle"] = self.oracle
        return out

    def undecided(self) -> list[str]:
        """The gated comparisons this look has not decided (empty: the campaign may stop)."""
        rows = [{str(k): v for k, v in r.items()} for r in comparison_rows(self.comparisons)]
        return undecided(rows, gated_metrics(self.card))


def _clean(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


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


def _washed_by_boot(card: Card, record: Mapping[str, Any]) -> bool:
    """A run on a boot of its own (design.washed_by: boot) whose box-state probes all read at
    every point: the boot cleared the runtime, and what the box kept is read (the analysis
    withholds a label while it has not settled). A probe that did not read leaves the block
    unwashed: state no probe reads is not assumed away."""
    if card.design.washed_by != "boot" or card.design.boot != "per-block":
        return False
    readings, complete = probe_readings((record.get("runtime") or {}).get("box_state"))
    return bool(readings) and complete


def load_runs(campaign: CampaignDir, card: Card) -> RunTables:
    """Read every run record and compute its metrics."""
    plan = campaign.plan()
    cohorts = read_cohorts(campaign.root)
    acc = _Accumulated()
    for raw in plan["runs"]:
        row: dict[str, Any] = {key: raw[key] for key in RUN_KEYS}
        record = campaign.run_record(raw["run_id"])
        if record is None:
            row.update(
                status="missing", box=raw.get("box"), reason="never ran (resume the campaign)"
            )
        elif _record_row(row, raw, record, cohorts, card, campaign) and record["status"] == "ok":
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
    )
    row.update(metrics)
    row["scored_requests"] = int((~requests["warmup"].astype(bool)).sum())
    if row.get("washout_share") is None and row["scored_requests"]:
        row["washout_share"] = row["washout"] / row["scored_requests"]
    for note in _imported_metrics(run_dir, row):
        if note not in acc.notes:
            acc.notes.append(note)
    acc.logs[run_id] = _prompt_logs(requests) if bench is None else _row_logs(bench)
    if bench is not None:
        acc.bench_frames.append((str(raw["cell"]), str(raw["cache_state"]), bench))
    names = {i: p.name for i, p in enumerate(card.workload.phases or [])}
    for shift in shifts:
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
                "converged_tok_s": shift.converged_tok_s,
                "notes": "; ".join(shift.notes),
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


def _cell_table(runs: pd.DataFrame, card: Card) -> pd.DataFrame:
    ok = runs[runs["status"] == "ok"]
    numeric = [c for c in ok.columns if c not in RUN_KEYS and ok[c].dtype.kind in "fi"]
    numeric = [c for c in numeric if c not in ("started_at", "ended_at")]
    rows = []
    for cell in card.cells:
        for state in card.design.cache_states:
            group = ok[(ok["cell"] == cell) & (ok["cache_state"] == state)]
            total = runs[(runs["cell"] == cell) & (runs["cache_state"] == state)]
            row: dict[str, Any] = {
                "cell": cell,
                "cache_state": state,
                "runs_ok": len(group),
                "runs_planned": len(total),
            }
            for column in numeric:
                values = group[column].dropna()
                row[column] = float(values.median()) if len(values) else None
            rows.append(row)
    return pd.DataFrame(rows)


def gated_metrics(card: Card) -> list[str]:
    """The gate set: metrics that better and survives gates decide on."""
    gated: list[str] = []
    for gate in card.gates:
        if isinstance(gate, BetterGate) and gate.metric not in gated:
            gated.append(gate.metric)
        if isinstance(gate, SurvivesGate):
            gated.extend(m for m in gate.metrics or [] if m not in gated)
    return gated


def _metrics_to_compare(card: Card, imported: pd.DataFrame | None = None) -> list[str]:
    """The default metrics and the gated ones; for imported runs, every metric they hold
    (a tool's own figures, such as llama-bench's prefill speed, are what there is to compare)."""
    metrics = list(DEFAULT_METRICS)
    if imported is not None:
        metrics += [m for m in METRICS if m in imported.columns and m not in metrics]
    for gate in card.gates:
        extra = [gate.metric] if isinstance(gate, BetterGate) else []
        if isinstance(gate, SurvivesGate):
            extra = list(gate.metrics or [])
        for metric in extra:
            if metric not in metrics:
                metrics.append(metric)
    return metrics


def simulated_siblings(root: Path, campaign: str) -> list[Path]:
    """Simulated campaigns of the same card, newest first.

    ``harness simulate`` writes ``reports/<campaign>-sim/<stamp>/``; a simulated campaign may also
    sit beside the measured one (``reports/<campaign>/<stamp>/`` marked ``SIMULATED``).
    """
    folders = [root.parent, root.parent.parent / f"{campaign}-sim"]
    found = [
        p
        for folder in folders
        if folder.is_dir()
        for p in folder.iterdir()
        if p.resolve() != root.resolve() and (p / "SIMULATED").is_file()
    ]
    return sorted(found, key=lambda p: p.name, reverse=True)


def _predicted_speed(sibling: Path) -> dict[str, dict[str, dict[str, float]]] | None:
    """A simulation's speeds priced by a fitted cost (``simulate --cost``), or None."""
    path = sibling / "predicted_speed.json"
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except HarnessError:
        return None  # unreadable: the simulated ring's own figures stand, without intervals
    cells = data.get("cells") if isinstance(data, dict) else None
    return cells if isinstance(cells, dict) else None


def _fitted_swap(sibling: Path) -> dict[str, Any] | None:
    """The swap term of the cost a simulation was priced with (its cost.json), or None."""
    path = sibling / "cost.json"
    if not path.is_file():
        return None
    try:
        data = read_json(path)
        term = data["terms"]["swap_ns"]
        return {
            "ms": float(term["estimate"]) / 1e6,
            "low": float(term["ci"][0]) / 1e6,
            "high": float(term["ci"][1]) / 1e6,
            "record_bytes": data.get("record_bytes"),
            "source": str(data.get("source", "")),
        }
    except (HarnessError, KeyError, TypeError, ValueError, IndexError):
        return None


def _simulation_mismatches(root: Path, sibling: Path) -> list[str]:
    """How the campaign's frozen card differs from what the simulation replayed; nothing to
    say where either side did not record it (a campaign or simulation from before)."""
    from harness.card.frozen import has_frozen_inputs, load_frozen_card
    from harness.card.simulation_match import SIMULATED_INPUTS, mismatches

    path = sibling / SIMULATED_INPUTS
    if not path.is_file() or not has_frozen_inputs(root):
        return []
    try:
        return mismatches(load_frozen_card(root).loaded, read_json(path))
    except HarnessError as problem:
        return [f"could not compare the card with the simulation: {problem}"]


def _predictions(
    root: Path, card: Card, cells: pd.DataFrame, shifts: pd.DataFrame
) -> PredictedVsMeasured | None:
    """Predicted against measured from the newest simulated sibling of the same campaign."""
    for sibling in simulated_siblings(root, card.campaign):
        try:
            predicted = analyze_campaign(sibling, predictions=False)
        except HarnessError:
            continue  # an unreadable sibling predicts nothing; the next one may
        if predicted.card.campaign != card.campaign:
            continue
        source = f"{sibling.parent.name}/{sibling.name}"
        found = predicted_vs_measured(
            card, cells, predicted.cells, source, _predicted_speed(sibling),
            shifts=(shifts, predicted.shifts),
        )  # fmt: skip
        if found is not None:
            return replace(
                found,
                mismatches=tuple(_simulation_mismatches(root, sibling)),
                fitted_swap=_fitted_swap(sibling),
            )
    return None


def analyze_campaign(
    root: Path, *, predictions: bool = True, journal_head: str | None = None
) -> CampaignAnalysis:
    """Compute every table of a campaign directory (reads records, writes nothing).

    With ``predictions``, a measured campaign also reads its newest simulated sibling for the
    predicted-against-measured table. ``journal_head``: a head of the journal the user kept,
    checked to lie on its chain (:mod:`harness.formats.heads`).
    """
    from harness.analyze.plan_check import check_plan
    from harness.formats.records import open_campaign
    from harness.formats.verify import verify_campaign

    campaign = open_campaign(root)
    # Nothing is read from a directory that does not hold what its journal sealed.
    verification = verify_campaign(root, journal_head=journal_head)
    planned = campaign.plan()
    events = campaign.journal.events()
    check_plan(root, planned, events)
    card = read_card_schema(campaign.card_path())
    tables = load_runs(campaign, card)
    runs = tables.runs
    warnings: list[str] = []
    bad = runs[runs["status"] != "ok"]
    for _, row in bad.iterrows():
        warnings.append(f"run {row['run_id']} {row['status']}: {row.get('reason', '')}")
    warnings.extend(tables.imported_notes)
    warnings.extend(extension_warnings(card, events))
    mismatch = embedded_mismatch(tables.logit_embedded)
    if mismatch is not None:
        warnings.append(mismatch)
    look = look_state(card, planned_cycles(planned), events)
    comparisons: list[CellComparison] = []
    imported = (root / "IMPORTED").is_file()
    if card.control is not None and card.design.order != "sequential":
        comparisons = compare_cells(
            runs,
            tables.prompt_logs,
            control=card.control,
            cells=card.treatments,
            cache_states=card.design.cache_states,
            metrics=_metrics_to_compare(card, runs if imported else None),
            gated=gated_metrics(card),
            margin_pct=card.analysis.margin_pct,
            alpha=look.nominal_alpha if look else card.analysis.alpha,
            seed=card.design.seed,
            remedy=look.remedy() if look else None,
            sequential=design_plan(card),
            boxes=card.analysis.boxes,
        )
    flags = []
    for item in comparisons:
        for flag in item.comparison.flags:
            flags.append(
                {
                    "kind": flag.kind,
                    "cell": item.cell,
                    "cache_state": item.cache_state,
                    "metric": item.comparison.metric,
                    "detail": f"cycle {flag.cycle}: {flag.detail}",
                }
            )
    fleet = fleet_tables(
        runs,
        tables.prompt_logs,
        comparisons,
        margin_pct=card.analysis.margin_pct,
        alpha=look.nominal_alpha if look else card.analysis.alpha,
        seed=card.design.seed,
        gated=gated_metrics(card),
    )
    if fleet is not None:
        flags.extend(fleet.flags)
    simulated = (root / "SIMULATED").is_file()
    cells = _cell_table(runs, card)
    predicted = (
        _predictions(root, card, cells, tables.shifts) if predictions and not simulated else None
    )
    seed_tables = build_seed_tables(
        card, cells, tables.shifts, tables.domains, pd.DataFrame(comparison_rows(comparisons)),
        predicted, runs,
    )  # fmt: skip
    return CampaignAnalysis(
        campaign=campaign,
        card=card,
        runs=runs,
        shifts=tables.shifts,
        domains=tables.domains,
        outputs=tables.outputs,
        cells=cells,
        comparisons=comparisons,
        seed_tables=seed_tables,
        look=look,
        looks=looks_frame(events),
        flags=flags,
        warnings=warnings,
        simulated=simulated,
        tiers=tables.tiers,
        runtime=build_runtime_tables(campaign, card, runs, cells),
        fleet=fleet,
        sealed=verification.sealed,
        journal_head=verification.journal_head,
        oracle=_oracle(root) if simulated else [],
    )


def _oracle(root: Path) -> list[dict[str, Any]]:
    """The oracle bounds a simulation wrote, one dict per cell; none when absent."""
    path = root / "oracle.json"
    if not path.is_file():
        return []
    try:
        cells = read_json(path).get("cells")
    except HarnessError:
        return []
    return [dict(c) for c in cells if isinstance(c, dict)] if isinstance(cells, list) else []


def write_analysis(analysis: CampaignAnalysis) -> Path:
    """Write the tables under ``analysis/`` and return that folder."""
    folder = analysis.campaign.analysis_dir
    write_parquet(analysis.runs, folder / "runs.parquet")
    write_parquet(analysis.shifts, folder / "shifts.parquet")
    write_parquet(analysis.domains, folder / "domains.parquet")
    write_parquet(analysis.outputs, folder / "outputs.parquet")
    write_parquet(analysis.cells, folder / "cells.parquet")
    write_parquet(analysis.comparison_table(), folder / "comparisons.parquet")
    write_parquet(analysis.looks, folder / "looks.parquet")
    if not analysis.tiers.empty:
        write_parquet(analysis.tiers, folder / "tiers.parquet")
    for stem, frame in analysis.seed_tables.frames().items():
        write_parquet(frame, folder / f"{stem}.parquet")
    if analysis.fleet is not None:
        for stem, frame in analysis.fleet.frames().items():
            write_parquet(frame, folder / f"{stem}.parquet")
    if analysis.runtime:
        for stem, frame in analysis.runtime.frames().items():
            write_parquet(frame, folder / f"{stem}.parquet")
    write_json_atomic(folder / "summary.json", analysis.to_json())
    return folder


def summary_text(analysis: CampaignAnalysis, *, with_history: bool = False) -> str:
    """JSON text of the summary (for ``--json``); ``with_history`` adds the trends the
    campaign's gate recorded (``analysis/history.json``, under "history"), where there are."""
    payload = analysis.to_json()
    trends = analysis.campaign.root / "analysis" / "history.json"
    if with_history and trends.is_file():
        recorded = read_json(trends)
        payload["history"] = {k: v for k, v in recorded.items() if k != "schema_version"}
    return json.dumps(payload, indent=2, default=str)


__all__ = ["CampaignAnalysis", "RecordError", "analyze_campaign", "write_analysis"]
