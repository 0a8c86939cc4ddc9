"""A step cost model fitted from a finished campaign's telemetry rings (``harness fit-cost``).

Every host step of every ok run is one observation: its duration regressed by least squares on
what the simulator's :class:`CostModel` charges for — a fixed cost, the step's tokens, its cold
lookups and its swaps. The intervals come from resampling whole runs (steps of one run share a
boot, a warm cache and a load on the box, so they are not independent), and the fit says what
it leaves unexplained: R², the residual spread, and the residuals themselves (a seeded sample
of the decode steps' residuals, which a prediction adds back so that its p95 carries the
box's noise and not only the model's mean).

A cold lookup reads one expert row and a swap copies one, so both grow with the row's size:
where the rings record ``bytes_read``, each run's row size is read from it and the two terms are
fitted per row of ``record_bytes`` (the runs' median size). Fitted from runs of one size, a
prediction for a cell of another size scales them by the ratio (all of a lookup's cost taken to
be bytes: an extrapolation in size that the fit cannot check). Fitted from runs of two sizes or
more (``fit-cost DIR DIR``, campaigns of two ``expert_bytes``), each term is split into its cost
at ``record_bytes`` and its growth per row of that size more (``SIZE_TERMS``), a line in size
that a cell between the fitted sizes reads off and one outside extrapolates. Rings without bytes
fit them per lookup as recorded.

A client sees more than the ring's steps. At concurrency 1 a request is one prefill then its
decode steps, and its TPOT is the mean of those steps plus what the HTTP path adds to every
streamed token. Per run the fit matches the ring's requests to the run's (from the last back,
each with its completion tokens less one decode steps) and takes, per timed request, its client
TPOT less the mean of its decode steps (ms a token the ring does not see: the HTTP path and the
host's time between steps); the median over requests, then over runs (interval from the same
resamples of runs), turns a replay's per-request step means into the client's TPOT p50 and
decode tok/s (the geomean of 1 ÷ TPOT, as the runs' metric is). An
empirical calibration of one box's HTTP path at concurrency 1, not a model of it.

Beside the fitted swap term sits seed 000's own reading of the same thing, measured on the same
rings: a step that applies swaps runs at ~1.9× the p95 of a swap-free step
(``swap_cost_ratio``, and ms per applied swap) — the model's figure and the measurement's, side
by side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.analyze.metrics import request_metrics, worst_recovery
from harness.analyze.recovery import DECODE_TOKENS, StepClock, phase_recovery
from harness.analyze.ring_figures import swap_cost
from harness.errors import BadInput
from harness.formats.records import open_campaign, read_json, write_json_atomic
from harness.formats.ring import RING_FIELDS
from harness.sim.cost import CostModel
from harness.sim.run_cost_fit import KIND as RUN_KIND
from harness.sim.run_cost_fit import RunCostFit, read_run_cost
from harness.stats.cycles import geomean

__all__ = [
    "CLIENT_METRICS",
    "SPEED_METRICS",
    "TERMS",
    "CostFit",
    "fit_cost",
    "predict_recovery",
    "predict_speed",
    "read_cost",
    "request_steps",
    "write_cost",
]

SCHEMA_VERSION = 1
TERMS = ("step_ns", "token_ns", "cold_lookup_ns", "swap_ns")
# Fitted only from runs of two row sizes or more: ns a cold lookup (a swap) grows by per
# ``record_bytes`` of row beyond ``record_bytes`` (with one size, the whole term scales instead).
SIZE_TERMS = ("cold_size_ns", "swap_size_ns")
_count_words = {4: "four", 6: "six"}
REPLICATES = 200
# Runs a fit needs, and runs whose requests matched the ring one by one for the HTTP path: with
# fewer, resamples of runs repeat a handful of values and a "95%" interval is far too narrow
# (one run gives every resample the same fit: an interval of zero width).
MIN_RUNS = 4
RESIDUAL_SAMPLE = 4000
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CostFit:
    """The fitted cost of a host step, its intervals and what it leaves unexplained."""

    source: str
    runs: int
    steps: int
    estimate: dict[str, float]  # ns per unit of each term
    interval: dict[str, tuple[float, float]]  # 95% percentile intervals over resampled runs
    r2: float
    residual_sd_ns: float
    decode_residual_sd_ns: float
    replicates: list[list[float]]  # one [step, token, cold, swap(, cold_size, swap_size)] each
    residuals_ns: list[float]  # a seeded sample of decode steps' residuals
    measured_swap: dict[str, float | None] = field(default_factory=dict)
    seed: int = 0
    record_bytes: int | None = None  # the row size the cold and swap terms are for
    # The HTTP path, where the runs had requests: ms a streamed token costs beyond its decode
    # step (median over runs), each resample's beside ``replicates``.
    client: dict[str, Any] | None = None
    row_sizes: tuple[int, ...] = ()  # the distinct row sizes of the fitted runs

    @property
    def terms(self) -> tuple[str, ...]:
        """The fitted terms: TERMS, and SIZE_TERMS where runs of two sizes were fitted."""
        return TERMS + SIZE_TERMS if SIZE_TERMS[0] in self.estimate else TERMS

    @property
    def size_warning(self) -> str | None:
        """Where a fitted line in size falls as rows grow (its whole interval below zero): the
        pooled campaigns differ in more than their rows — another machine speed, other traffic —
        and the split put that difference on size."""
        falling = [
            name
            for term, name in zip(SIZE_TERMS, ("cold lookup", "swap"), strict=True)
            if term in self.interval and self.interval[term][1] < 0
        ]
        if not falling:
            return None
        return (
            f"the {' and '.join(falling)} cost fitted to fall as rows grow: the campaigns pooled "
            "differ in more than expert_bytes (another machine speed, other traffic), and the fit "
            "put that on size; fit from campaigns run side by side on one box, alike but for "
            "expert_bytes"
        )

    def size_note(self, record_bytes: int | None) -> str | None:
        """What pricing rows of ``record_bytes`` rests on, where it is not the fitted size."""
        if self.record_bytes is None or record_bytes is None or record_bytes == self.record_bytes:
            return None
        if self.size_warning is not None:
            return f"rows of {record_bytes:,} bytes priced by a doubtful line in size: " + (
                self.size_warning
            )
        if record_bytes in self.row_sizes:
            return None
        if len(self.row_sizes) >= 2 and min(self.row_sizes) <= record_bytes <= max(self.row_sizes):
            return None  # read off the fitted line in size
        if len(self.row_sizes) >= 2:
            return (
                f"rows of {record_bytes:,} bytes lie outside the fitted sizes "
                f"({min(self.row_sizes):,}-{max(self.row_sizes):,}): the line in size is "
                "extrapolated"
            )
        return (
            f"rows of {record_bytes:,} bytes, fitted at {self.record_bytes:,}: cold and swap "
            "costs scaled by the ratio (fit from campaigns of two expert_bytes to measure it)"
        )

    def _scale(self, record_bytes: int | None) -> float:
        if self.record_bytes is None or record_bytes is None or self.record_bytes <= 0:
            return 1.0
        return record_bytes / self.record_bytes

    def model(self, record_bytes: int | None = None) -> CostModel:
        """The point estimate as the simulator's cost model (no term below 0 ns), its cold and
        swap terms scaled to rows of ``record_bytes``."""
        return _model([self.estimate[t] for t in self.terms], self._scale(record_bytes))

    def replicate_models(self, record_bytes: int | None = None) -> list[CostModel]:
        """One cost model per resample of runs, for predictions with the fit's uncertainty."""
        scale = self._scale(record_bytes)
        return [_model(row, scale) for row in self.replicates]

    def to_json(self) -> dict[str, Any]:
        """cost.json's content."""
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "runs": self.runs,
            "steps": self.steps,
            "terms": {
                t: {"estimate": self.estimate[t], "ci": list(self.interval[t])} for t in self.terms
            },
            "r2": self.r2,
            "residual_sd_ns": self.residual_sd_ns,
            "decode_residual_sd_ns": self.decode_residual_sd_ns,
            "measured_swap": self.measured_swap,
            "replicates": self.replicates,
            "residuals_ns": self.residuals_ns,
            "seed": self.seed,
            "record_bytes": self.record_bytes,
            "row_sizes": list(self.row_sizes),
            "client": self.client,
        }


def _model(values: list[float], scale: float = 1.0) -> CostModel:
    """A cost model from fitted terms, for rows ``scale`` times the fit's size: the cold and
    swap terms scaled whole (one size fitted) or along their fitted lines in size."""
    step, token, cold, swap = (float(v) for v in values[:4])
    if len(values) > 4:
        cold_size, swap_size = (float(v) for v in values[4:6])
        cold, swap = cold + cold_size * (scale - 1.0), swap + swap_size * (scale - 1.0)
    else:
        cold, swap = cold * scale, swap * scale
    step_ns, token_ns, cold_ns, swap_ns = (max(0, round(v)) for v in (step, token, cold, swap))
    return CostModel(step_ns=step_ns, token_ns=token_ns, cold_lookup_ns=cold_ns, swap_ns=swap_ns)


def row_bytes(ring: pd.DataFrame) -> int | None:
    """The expert row size a ring's reads imply: bytes_read ÷ (cold lookups + swaps), the
    median over steps that read any; None where the ring records no bytes."""
    loads = ring["cold_lookups"].to_numpy(dtype=np.float64) + ring["swaps"].to_numpy(
        dtype=np.float64
    )
    read = ring["bytes_read"].to_numpy(dtype=np.float64)
    some = (loads > 0) & (read > 0)
    if not some.any():
        return None
    return round(float(np.median(read[some] / loads[some])))


def _design(ring: pd.DataFrame, scale: float, split: bool = False) -> tuple[FloatArray, FloatArray]:
    """The regressors of a ring's steps: 1, tokens, cold lookups, swaps — the last two in
    rows of the fit's size (``scale`` this run's row over it); or, ``split`` (runs of several
    sizes), as counted, with each again times ``scale - 1`` for the size terms."""
    cold = ring["cold_lookups"].to_numpy(dtype=np.float64)
    swaps = ring["swaps"].to_numpy(dtype=np.float64)
    columns = [np.ones(len(ring)), ring["tokens"].to_numpy(dtype=np.float64)]
    if split:
        columns += [cold, swaps, cold * (scale - 1.0), swaps * (scale - 1.0)]
    else:
        columns += [cold * scale, swaps * scale]
    return np.column_stack(columns), ring["dur_ns"].to_numpy(dtype=np.float64)


def _solve(x: FloatArray, y: FloatArray) -> FloatArray:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return np.asarray(coef, dtype=np.float64)


def _rings(root: Path) -> tuple[list[pd.DataFrame], list[float | None]]:
    """The rings of the campaign's ok runs, in plan order, and each run's HTTP path
    (:func:`_client_path`; None where the run sent no timed request)."""
    campaign = open_campaign(root)
    rings = []
    clients = []
    for run in campaign.plan().get("runs", []):
        run_id = str(run.get("run_id", ""))
        record = campaign.run_record(run_id)
        path = campaign.run_dir(run_id) / "ring.parquet"
        if record is None or record.get("status") != "ok" or not path.is_file():
            continue
        ring = pd.read_parquet(path, columns=list(RING_FIELDS))
        if len(ring):
            rings.append(ring)
            requests = campaign.run_dir(run_id) / "requests.parquet"
            clients.append(_client_path(ring, pd.read_parquet(requests))
                           if requests.is_file() else None)  # fmt: skip
    return rings, clients


def request_steps(
    dur_ns: npt.ArrayLike, decode: npt.ArrayLike, prefill: npt.ArrayLike
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Each request's mean decode step in ns and its decode steps, at concurrency 1, in order:
    a request is a run of prefill steps and the decode steps after them (one whose decode steps
    were all left out has mean NaN). Steps before the first prefill belong to none."""
    dur = np.asarray(dur_ns, dtype=np.float64)
    is_decode = np.asarray(decode, dtype=bool)
    is_prefill = np.asarray(prefill, dtype=bool)
    starts = is_prefill & ~np.r_[False, is_prefill[:-1]]  # the first of a run of prefill steps
    request = np.cumsum(starts)
    size = int(request[-1]) + 1 if request.size else 1
    chosen = is_decode & (request > 0)
    sums = np.bincount(request[chosen], weights=dur[chosen], minlength=size)[1:]
    counts = np.bincount(request[chosen], minlength=size)[1:].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return np.asarray(means, dtype=np.float64), counts


def _client_path(ring: pd.DataFrame, requests: pd.DataFrame) -> float | None:
    """One run's HTTP path: the median over its timed requests of client TPOT less the mean
    of the request's own decode steps in the ring, in ms. The ring's requests are matched to
    the run's from the last one back (a probe at boot may precede them), and each match must
    have the request's completion tokens less one decode steps; None where they do not."""
    if requests.empty:
        return None
    tokens = ring["tokens"].to_numpy()
    means, counts = request_steps(ring["dur_ns"], tokens == DECODE_TOKENS, tokens > DECODE_TOKENS)
    ordered = requests.sort_values("t_start_s", kind="stable").reset_index(drop=True)
    if means.size < len(ordered):
        return None
    means, counts = means[means.size - len(ordered) :], counts[counts.size - len(ordered) :]
    if not np.array_equal(counts, ordered["completion_tokens"].to_numpy(dtype=np.int64) - 1):
        return None  # another order or another concurrency: no request-by-request match
    position = {int(r): i for i, r in enumerate(ordered["request"])}
    scored = request_metrics(ordered)
    gaps = [
        float(t) - means[position[int(r)]] / 1e6
        for r, t in zip(scored["request"], scored["tpot_ms"], strict=True)
        if math.isfinite(float(t)) and math.isfinite(means[position[int(r)]])
    ]
    return float(np.median(gaps)) if gaps else None


def _client_summary(
    clients: list[float | None], picks: list[npt.NDArray[np.int64]]
) -> dict[str, Any] | None:
    """The HTTP path's ms a token, the median over runs, with a 95% interval over the fit's
    resamples of runs (one per kept replicate, in the same order); None under MIN_RUNS runs
    with a match."""
    if sum(c is not None for c in clients) < MIN_RUNS:
        return None

    def median(indices: Any) -> float:
        chosen = [clients[i] for i in indices if clients[i] is not None]
        return float(np.median(chosen)) if chosen else math.nan

    point = median(range(len(clients)))
    table = np.asarray([median(pick) for pick in picks], dtype=np.float64)
    low, high = np.nanpercentile(table, [2.5, 97.5])
    return {
        "runs": sum(c is not None for c in clients),
        "tpot_overhead_ms": {"estimate": point, "ci": [float(low), float(high)]},
        "replicates": [float(v) for v in table],
    }


def fit_cost(
    root: Path | list[Path],
    *,
    seed: int = 0,
    replicates: int = REPLICATES,
    allow_unsealed: bool = False,
) -> CostFit:
    """Fit the step cost from every ok run's ring in ``root`` — one campaign, or several
    pooled (runs of two row sizes split the cold and swap terms) — BadInput when none can.
    A directory with no seal from its start is refused unless ``allow_unsealed``."""
    from harness.formats.verify import verified_source

    roots = [root] if isinstance(root, Path) else list(root)
    rings: list[pd.DataFrame] = []
    clients: list[float | None] = []
    names = []
    for each in roots:
        # A fit from records that do not verify would predict from anything.
        names.append(verified_source(each, allow_unsealed=allow_unsealed, command="fit-cost"))
        more, paths = _rings(each)
        rings += more
        clients += paths
    source = ", ".join(names)  # what cost.json and every message name
    if 0 < len(rings) < MIN_RUNS:
        raise BadInput(
            f"{source}: {len(rings)} ok run(s) with a telemetry ring; a fit needs {MIN_RUNS} or "
            "more (its intervals resample runs, and a few runs resample to the same few fits)"
        )
    if not rings:
        raise BadInput(
            f"{source}: no ok run with a telemetry ring (ring.parquet): a per-step fit needs a "
            "campaign on a runtime that writes one (the reference runtime, or seed 000's hook); "
            "for a runtime with counters only, fit from run aggregates with --per-run"
        )
    sizes = [row_bytes(r) for r in rings]
    known = [b for b in sizes if b is not None]
    reference = round(float(np.median(known))) if known and len(known) == len(sizes) else None
    # Runs of two sizes or more (a few bytes apart is the same size read through rounding).
    sizes_seen = sorted({int(b) for b in known}) if reference else []
    split = bool(reference) and max(sizes_seen) > 1.05 * min(sizes_seen)
    row_sizes = sizes_seen if split else [reference] if reference else []
    terms = TERMS + SIZE_TERMS if split else TERMS
    # Each run's cold and swap counts in rows of the reference size (1 where bytes are unknown).
    parts = [
        _design(r, (b / reference) if reference and b else 1.0, split)
        for r, b in zip(rings, sizes, strict=True)
    ]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    if np.linalg.matrix_rank(x) < x.shape[1]:
        varied = [t for t, col in zip(terms[1:], x[:, 1:].T, strict=True) if np.ptp(col) > 0]
        raise BadInput(
            f"{source}: the rings cannot separate the {_count_words[len(terms)]} costs (only "
            f"{', '.join(varied) or 'no'} term(s) vary across steps): fit from a campaign whose "
            "runs have prefill and decode steps, cold lookups and swaps (an adaptive cell, a "
            "domain shift)" + (", at each row size" if split else "")
        )
    coef = _solve(x, y)
    residual = y - x @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    decode = x[:, 1] == DECODE_TOKENS
    rng = np.random.default_rng(seed)
    draws = []
    picks = []
    for _ in range(replicates):
        pick = rng.integers(0, len(parts), len(parts))
        xs = np.concatenate([parts[i][0] for i in pick])
        if np.linalg.matrix_rank(xs) < xs.shape[1]:
            continue  # a resample without swaps (or cold lookups) cannot price them
        draws.append(_solve(xs, np.concatenate([parts[i][1] for i in pick])))
        picks.append(pick)
    if len(draws) < replicates // 2:
        raise BadInput(
            f"{source}: too few runs carry swaps or cold lookups for an interval "
            f"({len(draws)} of {replicates} resamples could price every term): fit from more runs"
        )
    table = np.asarray(draws)
    low, high = np.percentile(table, [2.5, 97.5], axis=0)
    decode_residual = residual[decode]
    sample = decode_residual
    if sample.size > RESIDUAL_SAMPLE:
        sample = rng.choice(decode_residual, RESIDUAL_SAMPLE, replace=False)
    measured = [swap_cost(r) for r in rings]
    return CostFit(
        source=source,
        runs=len(rings),
        steps=int(y.size),
        estimate={t: float(c) for t, c in zip(terms, coef, strict=True)},
        interval={t: (float(lo), float(hi)) for t, lo, hi in zip(terms, low, high, strict=True)},
        r2=r2,
        residual_sd_ns=float(residual.std(ddof=x.shape[1])),
        decode_residual_sd_ns=float(decode_residual.std()) if decode_residual.size else 0.0,
        replicates=[[float(v) for v in row] for row in table],
        residuals_ns=[float(v) for v in sample],
        measured_swap={
            "swap_cost_ratio": _median(m.get("swap_cost_ratio") for m in measured),
            "swap_ms_per_swap": _median(m.get("swap_ms_per_swap") for m in measured),
        },
        seed=seed,
        record_bytes=reference,
        client=_client_summary(clients, picks),
        row_sizes=tuple(row_sizes),
    )


def _median(values: Any) -> float | None:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.median(finite)) if finite else None


def write_cost(fit: CostFit, path: Path) -> None:
    """Write cost.json atomically."""
    write_json_atomic(path, fit.to_json())


def read_cost(path: Path) -> CostFit | RunCostFit:
    """Read a cost.json written by :func:`write_cost` or ``fit-cost --per-run`` (BadInput
    naming the field otherwise)."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise BadInput(f"{path}: not a cost model written by `harness fit-cost` (schema_version 1)")
    if data.get("kind") == RUN_KIND:
        return read_run_cost(path, data)
    try:
        terms = data["terms"]
        names = TERMS + SIZE_TERMS if SIZE_TERMS[0] in terms else TERMS
        estimate = {t: float(terms[t]["estimate"]) for t in names}
        interval = {t: (float(terms[t]["ci"][0]), float(terms[t]["ci"][1])) for t in names}
        replicates = [[float(v) for v in row] for row in data["replicates"]]
        residuals = [float(v) for v in data["residuals_ns"]]
        fit = CostFit(
            source=str(data["source"]),
            runs=int(data["runs"]),
            steps=int(data["steps"]),
            estimate=estimate,
            interval=interval,
            r2=float(data["r2"]),
            residual_sd_ns=float(data["residual_sd_ns"]),
            decode_residual_sd_ns=float(data["decode_residual_sd_ns"]),
            replicates=replicates,
            residuals_ns=residuals,
            measured_swap=dict(data.get("measured_swap") or {}),
            seed=int(data.get("seed", 0)),
            record_bytes=(None if data.get("record_bytes") is None else int(data["record_bytes"])),
            client=_read_client(data.get("client"), len(replicates)),
            row_sizes=tuple(int(b) for b in data.get("row_sizes") or ()),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInput(
            f"{path}: cost model field missing or mistyped ({exc}); fit it again"
        ) from None
    bad = [t for t in names if not math.isfinite(estimate[t])]
    if bad or any(len(row) != len(names) for row in replicates):
        raise BadInput(f"{path}: cost model terms are not finite numbers; fit it again")
    return fit


# Speeds a fitted cost model predicts for a replay, named as the measured runs' ring metrics.
SPEED_METRICS = ("ring_decode_tok_s", "ring_itl_p50_ms", "ring_itl_p95_ms", "ring_itl_p99_ms")


def _speeds(decode_ns: FloatArray) -> dict[str, float]:
    """The ring's decode speed and inter-token percentiles from decode step durations (a decode
    step of one sequence emits one token), as :func:`harness.analyze.ring_figures.ring_summary`."""
    total = float(decode_ns.sum())
    p50, p95, p99 = np.percentile(decode_ns, [50, 95, 99])
    return {
        "ring_decode_tok_s": decode_ns.size * 1e9 / total if total > 0 else math.nan,
        "ring_itl_p50_ms": float(p50) / 1e6,
        "ring_itl_p95_ms": float(p95) / 1e6,
        "ring_itl_p99_ms": float(p99) / 1e6,
    }


def predict_speed(
    fit: CostFit,
    tokens: npt.ArrayLike,
    cold: npt.ArrayLike,
    swaps: npt.ArrayLike,
    record_bytes: int | None = None,
    *,
    prefill: npt.ArrayLike | None = None,
    scored: npt.ArrayLike | None = None,
) -> dict[str, dict[str, float]]:
    """Decode speed and inter-token percentiles of a replay's decode steps, each with a 95%
    interval: every resampled fit prices the steps (cold and swap terms scaled to rows of
    ``record_bytes``), plus residuals drawn from the fit's own (so percentiles carry the box's
    step-to-step noise, not only the model's mean). With ``prefill`` (each step's flag) and a fit
    that has the campaign's HTTP path, the client's TPOT p50 and decode tok/s too, over the
    requests whose steps are ``scored`` (not warm-up), each draw with its resample's path."""
    tok = np.asarray(tokens, dtype=np.int64)
    decode = tok == DECODE_TOKENS
    if not decode.any():
        return {}
    cold_d = np.asarray(cold, dtype=np.int64)[decode]
    swaps_d = np.asarray(swaps, dtype=np.int64)[decode]
    tok_d = tok[decode]
    pool = np.asarray(fit.residuals_ns or [0.0], dtype=np.float64)
    rng = np.random.default_rng(fit.seed)
    client = fit.client if prefill is not None else None
    if client is not None:
        flags = np.asarray(prefill, dtype=bool)
        keep = np.ones(tok.size, dtype=bool) if scored is None else np.asarray(scored, dtype=bool)
    overheads = [client["tpot_overhead_ms"]["estimate"], *client["replicates"]] if client else []

    def priced(model: CostModel, draw: int) -> dict[str, float]:
        base = model.durations(tok_d, cold_d, swaps_d).astype(np.float64)
        noisy = np.maximum(base + rng.choice(pool, base.size), 1.0)
        out = _speeds(noisy)
        if client is not None:
            steps = np.zeros(tok.size, dtype=np.float64)
            steps[decode] = noisy
            means, _ = request_steps(steps, decode & keep, flags)
            means = means[np.isfinite(means)] / 1e6 + overheads[draw]
            out["tpot_p50_ms"] = float(np.median(means)) if means.size else math.nan
            positive = means.size and bool((means > 0).all())
            out["decode_tok_s"] = geomean(1e3 / means) if positive else math.nan
        return out

    point = priced(fit.model(record_bytes), 0)
    draws = [priced(m, i + 1) for i, m in enumerate(fit.replicate_models(record_bytes))]
    metrics = SPEED_METRICS + (CLIENT_METRICS if client is not None else ())
    out: dict[str, dict[str, float]] = {}
    for metric in metrics:
        values = np.asarray([d[metric] for d in draws], dtype=np.float64)
        values = values[np.isfinite(values)]
        low, high = np.percentile(values, [2.5, 97.5]) if values.size else (math.nan, math.nan)
        out[metric] = {"estimate": point[metric], "low": float(low), "high": float(high)}
    return out


# What a client sees, predicted from the replay's requests and the fit's HTTP path.
CLIENT_METRICS = ("tpot_p50_ms", "decode_tok_s")


def _read_client(data: Any, replicates: int) -> dict[str, Any] | None:
    """cost.json's HTTP-path block (absent in a fit without requests), checked for shape."""
    if data is None:
        return None
    rows = [float(v) for v in data["replicates"]]
    if len(rows) != replicates:
        raise ValueError("client replicates do not match the fit's")
    term = data["tpot_overhead_ms"]
    return {
        "runs": int(data["runs"]),
        "tpot_overhead_ms": {"estimate": float(term["estimate"]),
                             "ci": [float(term["ci"][0]), float(term["ci"][1])]},
        "replicates": rows,
    }  # fmt: skip


def predict_recovery(
    fit: CostFit,
    ring_of: Callable[[CostModel], pd.DataFrame],
    record_bytes: int | None,
    *,
    window_s: float,
    converged_span_s: float,
    hold_s: float,
    steps: StepClock | None = None,
) -> dict[str, dict[str, float | None]]:
    """T90 and T2x in seconds (the worst measurable shift, as a run's metrics take them) with a
    95% interval: ``ring_of`` prices the replay's ring with each resampled fit, decode steps
    given residuals drawn from the fit's own; the interval is then widened by one window either
    side, the resolution of both the prediction and the box's reading (on the step clock,
    ``steps``, T90 is timed as the runs time it, and a window's wall time is its steps at the
    replay's median step). A draw that never
    recovers is infinitely slow (an open upper end, null); a replay with no measurable shift
    predicts nothing here."""
    rng = np.random.default_rng(fit.seed + 1)
    pool = np.asarray(fit.residuals_ns or [0.0], dtype=np.float64)

    def times(ring: pd.DataFrame, noisy: bool) -> dict[str, float] | None:
        if noisy:
            dur = ring["dur_ns"].to_numpy(dtype=np.float64).copy()
            decode = ring["tokens"].to_numpy() == DECODE_TOKENS
            dur[decode] = np.maximum(dur[decode] + rng.choice(pool, int(decode.sum())), 1.0)
            ring = ring.assign(dur_ns=dur.astype(np.int64))
            ring = ring.assign(t_ns=np.cumsum(ring["dur_ns"].to_numpy()))
        shifts = phase_recovery(
            ring, window_s, converged_span_s=converged_span_s, hold_s=hold_s, steps=steps
        )
        if not any(s.excess for s in shifts):
            return None
        # The runs' own reading of the worst shift; None there is "never", slowest of all.
        worst = worst_recovery(shifts)
        return {
            metric: math.inf if v is None else v
            for metric, v in worst.items()
            if metric in ("t90_s", "t2x_s")
        }

    point_ring = ring_of(fit.model(record_bytes))
    resolution = window_s
    if steps is not None and len(point_ring):
        resolution = steps.window * float(np.median(point_ring["dur_ns"])) / 1e9
    point = times(point_ring, noisy=False)
    if point is None:
        return {}
    draws = [d for m in fit.replicate_models(record_bytes) if (d := times(ring_of(m), noisy=True))]
    out: dict[str, dict[str, float | None]] = {}
    for metric, estimate in point.items():
        values = np.asarray([d[metric] for d in draws], dtype=np.float64)
        if not math.isfinite(estimate) or values.size == 0:
            continue  # never recovered at the point estimate: the sim's own "never" stands
        low, high = (float(v) for v in np.percentile(values, [2.5, 97.5]))
        # The draws carry residual noise the point estimate's ring has not; where its mean
        # moves them past the estimate, the interval still holds its own estimate.
        out[metric] = {
            "estimate": estimate,
            "low": min(max(0.0, low - resolution), estimate) if math.isfinite(low) else None,
            "high": max(high + resolution, estimate) if math.isfinite(high) else None,
        }
    return out
