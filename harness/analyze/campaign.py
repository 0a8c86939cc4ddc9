"""Analysis of a whole campaign directory: run table, cell table, comparisons and flags.

Pure over the records it reads: no network, no boxes. Writes ``analysis/*.parquet`` and
``analysis/summary.json``; the same numbers feed the gates and the report.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from harness.analyze.box_load import BoxLoad, box_load_table
from harness.analyze.canaries import CanaryCheck, check_canaries
from harness.analyze.cell_values import cell_value
from harness.analyze.compare import (
    DEFAULT_METRICS,
    CellComparison,
    compare_cells,
    comparison_rows,
)
from harness.analyze.engagement import Engagement, check_engagement
from harness.analyze.equivalence import EquivalenceRow, apply_equivalence, check_equivalence
from harness.analyze.fleet import FleetTables, fleet_tables
from harness.analyze.logit_parity import embedded_mismatch
from harness.analyze.looks import (
    LookState,
    design_plan,
    extension_warnings,
    look_state,
    looks_frame,
    planned_cycles,
    undecided,
)
from harness.analyze.predicted import PredictedVsMeasured, predicted_vs_measured, provenance
from harness.analyze.recovery import step_clock
from harness.analyze.runs import RUN_KEYS, RunTables, load_runs
from harness.analyze.runtime_tables import RuntimeTables, build_runtime_tables
from harness.analyze.seed_tables import SeedTables, build_seed_tables
from harness.analyze.tails import (
    TAIL_METHOD,
    TAIL_METRICS,
    TailRow,
    find_tail,
    tail_check,
    tail_records,
    tail_table,
)
from harness.card import BetterGate, Card, SurvivesGate, read_card_schema
from harness.catalog import METRICS
from harness.errors import HarnessError, RecordError
from harness.formats.records import (
    CAMPAIGN_JOURNAL,
    CampaignDir,
    read_json,
    write_json_atomic,
    write_parquet,
)

if TYPE_CHECKING:
    from harness.analyze.series import FigureSeries
    from harness.stats.sequential import SequentialPlan


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
    head_checked: str = ""  # the head given back, which is that last line ("" when none was)
    checked_against: str = ""  # which head was checked, or "verified against itself only"
    box_load: BoxLoad | None = None  # the box's load and speed per run (harness.analyze.box_load)
    # A simulated campaign's oracle bounds per cell (oracle.json, written by harness simulate).
    oracle: list[dict[str, Any]] = field(default_factory=list)
    # Gated tail metrics' order-statistic bounds per cell × state (harness.analyze.tails).
    tails: list[TailRow] = field(default_factory=list)
    # Each cell's change checked against the profile's signatures (harness.analyze.engagement);
    # None where nothing could be checked (no frozen profile: imported, simulated).
    engagement: Engagement | None = None
    # Each boot's canaries against the control's (harness.analyze.canaries; None: not checked),
    # and each lossy cell's equivalence endpoint (harness.analyze.equivalence).
    canaries: CanaryCheck | None = None
    equivalence: list[EquivalenceRow] = field(default_factory=list)

    def cell_value(self, cell: str, state: str, column: str) -> float | None:
        """One finite value of the cell table (a metric's median over the cell's ok runs)."""
        return cell_value(self.cells, cell, state, column)

    def tail(self, cell: str, state: str, metric: str) -> TailRow | None:
        """A gated tail metric's bounds for the cell and state (None: not judged by a bound)."""
        return find_tail(self.tails, cell, state, metric)

    @property
    def tail_method(self) -> str:
        """How tail metrics are judged, for the report's method ("" when no gate judges one)."""
        return TAIL_METHOD if self.tails else ""

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
        if self.engagement is not None and (self.engagement.rows or self.engagement.unverified):
            out["engagement"] = {
                "signatures": self.engagement.records(),
                "not_verified": {k: list(v) for k, v in self.engagement.unverified.items()},
            }
        if self.canaries is not None:
            out["canaries"] = self.canaries.record()
        if self.equivalence:
            out["equivalence"] = [dataclasses.asdict(r) for r in self.equivalence]
        if self.runtime:  # only where a runtime recorded them: other summaries are unchanged
            out["runtime"] = self.runtime.to_json()
        if self.fleet is not None:  # only for a campaign that ran on several boxes
            out["fleet"] = self.fleet.to_json()
        if self.oracle:  # only for a simulated campaign whose replay wrote its bounds
            out["oracle"] = self.oracle
        if self.box_load is not None and self.box_load.recorded:  # only where runs read it
            out["box_load"] = self.box_load.to_json()
        if self.tails:  # only where a gate judges a tail metric
            out["tails"] = [{k: _clean(v) for k, v in r.items()} for r in tail_records(self.tails)]
        return out

    def undecided(self) -> list[str]:
        """The gated comparisons this look has not decided (empty: the campaign may stop).

        A tail metric's *better* is decided only where its order-statistic bounds show it or
        show it worse (harness.analyze.tails): bounds that overlap, or an arm with too few
        samples for them, are settled by more cycles, so a sequential design looks again.
        """
        rows = [{str(k): v for k, v in r.items()} for r in comparison_rows(self.comparisons)]
        gated = gated_metrics(self.card)
        open_tails = [
            f"{r['cell']}/{r['cache_state']} {r['metric']} better, its tail bound not yet shown"
            for r in rows
            if r["metric"] in gated
            and r["label"] == "better"
            and (
                tail := tail_check(
                    self.tails, str(r["cell"]), str(r["cache_state"]), str(r["metric"])
                )
            )
            and not tail.shown
            and not tail.decided
        ]
        return undecided(rows, gated) + open_tails


def _clean(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


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
        clocks = _recovery_clock(card), _recovery_clock(predicted.card)
        found = predicted_vs_measured(
            card, cells, predicted.cells, source, _predicted_speed(sibling),
            shifts=(shifts, predicted.shifts), recovery=clocks[0] == clocks[1],
        )  # fmt: skip
        if found is not None:
            unlike = (
                [f"T90 and T2x not compared: the simulation timed recovery {clocks[1]}, this "
                 f"campaign {clocks[0]} (one definition a side, not the same one)"]
                if clocks[0] != clocks[1]
                else []
            )  # fmt: skip
            return replace(
                found,
                mismatches=(*_simulation_mismatches(root, sibling), *unlike),
                fitted_swap=_fitted_swap(sibling),
                provenance=_provenance(root, sibling),
            )
    return None


def _recovery_clock(card: Card) -> str:
    """How a campaign times recovery, in words: two campaigns' T90s compare only alike."""
    a = card.analysis
    if a.window_steps is not None:
        clock = step_clock(a)
        assert clock is not None
        return (
            f"on the step clock ({clock.window}-step windows, span {clock.converged_span}, "
            f"hold {clock.hold})"
        )
    return (
        f"in seconds ({a.window_s:g} s windows, span {a.converged_span_s:g} s, hold {a.hold_s:g} s)"
    )


def _provenance(root: Path, sibling: Path) -> str:
    """:func:`~harness.analyze.predicted.provenance` from the two directories' records: the
    simulation's traces (its inputs file) and when each campaign started (its journal)."""
    from harness.card.simulation_match import SIMULATED_INPUTS

    try:
        traces = read_json(sibling / SIMULATED_INPUTS).get("traces") or []
    except (HarnessError, AttributeError):
        traces = []
    return provenance(
        str(root.resolve()), [str(t) for t in traces], _started(root), _started(sibling)
    )


def _started(root: Path) -> float | None:
    """When a campaign started: its journal's first event's time (None: not recorded)."""
    try:
        with (root / CAMPAIGN_JOURNAL).open(encoding="utf-8") as journal:
            first = json.loads(journal.readline())
    except (OSError, ValueError):
        return None
    started = first.get("t") if isinstance(first, dict) else None
    return float(started) if isinstance(started, int | float) else None


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
    tables = load_runs(campaign, card, tails=bool(_gated_tails(card)))
    runs = tables.runs
    warnings: list[str] = []
    bad = runs[runs["status"] != "ok"]
    for _, row in bad.iterrows():
        warnings.append(f"run {row['run_id']} {row['status']}: {row.get('reason', '')}")
    warnings.extend(tables.imported_notes)
    box_load = box_load_table(tables.box_load)
    if box_load.warning:
        warnings.append(box_load.warning)
    warnings.extend(extension_warnings(card, events))
    mismatch = embedded_mismatch(tables.logit_embedded)
    if mismatch is not None:
        warnings.append(mismatch)
    look = look_state(card, planned_cycles(planned), events)
    imported = (root / "IMPORTED").is_file()
    canaries = check_canaries(root, card, runs, tables.outputs) if not imported else None
    comparisons = _comparisons(card, tables, look, canaries, imported=imported)
    engagement = check_engagement(root, card, runs) if not imported else None
    if engagement is not None:
        comparisons = engagement.apply(comparisons)
    equivalence = check_equivalence(card, tables.outputs)
    comparisons = apply_equivalence(equivalence, comparisons)
    if canaries is not None:
        comparisons = canaries.apply(comparisons)
        warnings.extend(f"corrupt boot {c.words()}" for c in canaries.corrupt)
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
        head_checked=verification.heads.head,
        checked_against=verification.heads.text,
        oracle=_oracle(root) if simulated else [],
        box_load=box_load,
        tails=_tail_rows(card, tables, comparisons),
        engagement=engagement,
        canaries=canaries,
        equivalence=equivalence,
    )


def _comparisons(
    card: Card,
    tables: RunTables,
    look: LookState | None,
    canaries: CanaryCheck | None,
    *,
    imported: bool,
) -> list[CellComparison]:
    """Every treatment against the control, on the runs of boots whose canaries were clean."""
    if card.control is None or card.design.order == "sequential":
        return []
    runs = tables.runs

    def compare(frame: pd.DataFrame, cells: list[str]) -> list[CellComparison]:
        return compare_cells(
            frame,
            tables.prompt_logs,
            control=card.control or "",
            cells=cells,
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

    if canaries is None:
        return compare(runs, card.treatments)
    # A corrupt boot's runs ran on wrong weights: no comparison reads them.
    comparisons = compare(runs[~runs["run_id"].isin(canaries.corrupt_runs())], card.treatments)
    # A cell with no clean boot left still gets its rows, from its corrupt boots, so every
    # reader sees its label (corrupt) rather than no comparison at all.
    compared = {c.cell for c in comparisons}
    lost = [c for c in card.treatments if c not in compared and canaries.corrupt_text(c)]
    return comparisons + (compare(runs, lost) if lost else [])


def _gated_tails(card: Card) -> list[str]:
    """The tail metrics a gate judges: their bounds are a second condition of its *better*."""
    return [m for m in gated_metrics(card) if m in TAIL_METRICS]


def _tail_rows(card: Card, tables: RunTables, comparisons: list[CellComparison]) -> list[TailRow]:
    """The gated tail metrics' bounds per cell × cache state (none without a comparison)."""
    if not comparisons or card.control is None:
        return []
    return tail_table(
        tables.runs,
        tables.tail_samples,
        control=card.control,
        cells=card.treatments,
        cache_states=card.design.cache_states,
        metrics=_gated_tails(card),
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
    if analysis.box_load is not None and analysis.box_load.recorded:
        write_parquet(analysis.box_load.rows, folder / "box_load.parquet")
    if analysis.tails:
        write_parquet(pd.DataFrame(tail_records(analysis.tails)), folder / "tails.parquet")
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
