"""The series the report's figures draw, computed here so the report computes nothing.

Per completed run: the cold-share windows (downsampled to at most :data:`MAX_POINTS`), the
step durations and swap counts of its ring, and its per-request TPOT; per comparison and
metric: each cycle's block values (the geomean of a block's ok runs) in slot order. Each run's
files are read once, when a figure first needs them (``CampaignAnalysis.series``), so
``harness analyze`` and ``gate --quiet`` without a report never read a ring twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.analyze.metrics import request_metrics
from harness.analyze.recovery import RING_COLUMNS, cold_share_windows
from harness.card.schema import Card
from harness.errors import HarnessError
from harness.formats.records import CampaignDir


class AnalysedRuns(Protocol):
    """What the series read of an analysis (harness.analyze.campaign.CampaignAnalysis, which
    hands itself over): the campaign directory, its card and the run table."""

    @property
    def campaign(self) -> CampaignDir: ...

    @property
    def card(self) -> Card: ...

    @property
    def runs(self) -> pd.DataFrame: ...


FloatArray = npt.NDArray[np.float64]

MAX_POINTS = 400  # plotted windows per run: enough for the eye, small enough for 100 runs
CYCLE_METRICS = ("decode_tok_s", "tpot_p50_ms")  # the metrics whose cycles the report draws

__all__ = [
    "CYCLE_METRICS",
    "MAX_POINTS",
    "BlockPoint",
    "FigureSeries",
    "RunSeries",
    "figure_series",
    "prompt_domains",
]


@dataclass(frozen=True)
class RunSeries:
    """What the figures draw of one completed run."""

    run_id: str
    cell: str
    cache_state: str
    cold_share: tuple[FloatArray, FloatArray] | None  # window start (s), cold share (0–1)
    step_ms: FloatArray | None  # every ring step's duration
    step_swaps: npt.NDArray[np.int64] | None  # swaps applied by each step
    tpot_ms: FloatArray  # per scored request, finite values only


@dataclass(frozen=True)
class BlockPoint:
    """One block of a cycle: its slot, the cell that ran it and the geomean of its ok runs."""

    slot: int
    cell: str
    value: float


Cycles = tuple[tuple[int, tuple[BlockPoint, ...]], ...]  # per cycle: its blocks in slot order


@dataclass(frozen=True)
class FigureSeries:
    """Every run's series, and the block values of every (cell, cache state, metric)."""

    runs: tuple[RunSeries, ...]
    metrics: tuple[str, ...]  # the metrics whose block values are drawn
    blocks: dict[tuple[str, str, str], Cycles]

    def of(self, cell: str, state: str) -> list[RunSeries]:
        """The runs of one cell in one cache state."""
        return [r for r in self.runs if r.cell == cell and r.cache_state == state]

    def cycles(
        self, cell: str, state: str, metric: str
    ) -> tuple[tuple[int, tuple[BlockPoint, ...]], ...]:
        """Per cycle of the comparison's cohorts: its blocks in slot order (none if unknown)."""
        return self.blocks.get((cell, state, metric), ())


def _downsample(windows: pd.DataFrame) -> tuple[FloatArray, FloatArray]:
    """Window start times and cold share, merged into at most MAX_POINTS bins by summing."""
    t = windows["t_s"].to_numpy(dtype=np.float64)
    lookups = windows["lookups"].to_numpy(dtype=np.float64)
    cold = windows["cold_lookups"].to_numpy(dtype=np.float64)
    if t.size > MAX_POINTS:
        step = math.ceil(t.size / MAX_POINTS)
        starts = np.arange(0, t.size, step)
        t = t[starts]
        lookups = np.add.reduceat(lookups, starts)
        cold = np.add.reduceat(cold, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(lookups > 0, cold / np.maximum(lookups, 1), np.nan)
    return t, share


def _run_series(analysis: AnalysedRuns, run_id: str, cell: str, state: str) -> RunSeries:
    folder = analysis.campaign.run_dir(run_id)
    cold: tuple[FloatArray, FloatArray] | None = None
    step_ms = step_swaps = None
    ring_path = folder / "ring.parquet"
    if ring_path.is_file():
        frame = pd.read_parquet(ring_path, columns=list(RING_COLUMNS))
        if len(frame):
            ring = {c: frame[c].to_numpy(dtype=np.int64) for c in RING_COLUMNS}
            step_ms = ring["dur_ns"].astype(np.float64) / 1e6
            step_swaps = ring["swaps"]
            try:
                cold = _downsample(cold_share_windows(ring, analysis.card.analysis.window_s))
            except HarnessError:
                cold = None  # a ring the windows cannot read draws no line
    tpot = np.array([], dtype=np.float64)
    requests_path = folder / "requests.parquet"
    if requests_path.is_file():
        scored = request_metrics(pd.read_parquet(requests_path))
        values = scored["tpot_ms"].to_numpy(dtype=np.float64)
        tpot = values[np.isfinite(values)]
    return RunSeries(run_id, cell, state, cold, step_ms, step_swaps, tpot)


def _block_values(runs: pd.DataFrame, cell: str, state: str, metric: str) -> Cycles:
    """Per cycle: each block's geomean over its ok runs, in slot order."""
    if runs.empty or metric not in runs.columns:
        return ()
    subset = runs[(runs["comparison"] == cell) & (runs["cache_state"] == state)]
    out = []
    for cycle, group in subset.groupby("cycle"):
        points = []
        for slot, block in group.groupby("slot"):
            values = block[block["status"] == "ok"][metric].to_numpy(dtype=np.float64)
            values = values[np.isfinite(values) & (values > 0)]
            if values.size:
                value = float(np.exp(np.mean(np.log(values))))
                points.append(BlockPoint(int(str(slot)), str(block["cell"].iloc[0]), value))
        out.append((int(str(cycle)), tuple(points)))
    return tuple(out)


def prompt_domains(analysis: AnalysedRuns) -> dict[str, str]:
    """prompt id → domain, from the requests of the first completed run that has them."""
    root = analysis.campaign.root
    runs = analysis.runs
    if runs.empty:
        return {}
    for run_id in runs[runs["status"] == "ok"]["run_id"]:
        path = root / "runs" / str(run_id) / "requests.parquet"
        if path.is_file():
            frame = pd.read_parquet(path, columns=["prompt_id", "domain"])
            return dict(
                zip(frame["prompt_id"].astype(str), frame["domain"].astype(str), strict=True)
            )
    return {}


def figure_series(analysis: AnalysedRuns, metrics: tuple[str, ...] = CYCLE_METRICS) -> FigureSeries:
    """Every completed run's series, each file read once, and the block values of every
    treatment × cache state on ``metrics``."""
    runs = analysis.runs
    series: list[RunSeries] = []
    if not runs.empty:
        for row in runs[runs["status"] == "ok"].itertuples():
            series.append(
                _run_series(analysis, str(row.run_id), str(row.cell), str(row.cache_state))
            )
    card = analysis.card
    blocks: dict[tuple[str, str, str], Cycles] = {
        (cell, str(state), metric): _block_values(runs, cell, state, metric)
        for cell in card.treatments
        for state in card.design.cache_states
        for metric in metrics
    }
    return FigureSeries(tuple(series), metrics, blocks)
