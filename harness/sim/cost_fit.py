"""A step cost model fitted from a finished campaign's telemetry rings (``harness fit-cost``).

Every host step of every ok run is one observation: its duration regressed by least squares on
what the simulator's :class:`CostModel` charges for — a fixed cost, the step's tokens, its cold
lookups and its swaps. The intervals come from resampling whole runs (steps of one run share a
boot, a warm cache and a load on the box, so they are not independent), and the fit says what
it leaves unexplained: R², the residual spread, and the residuals themselves (a seeded sample
of the decode steps' residuals, which a prediction adds back so that its p95 carries the
box's noise and not only the model's mean).

A cold lookup reads one expert row and a swap copies one, so both scale with the row's size:
where the rings record ``bytes_read``, each run's row size is read from it and the two terms are
fitted per row of ``record_bytes`` (the campaign's own size), and a prediction for a cell of
another size scales them by the ratio (an extrapolation in size that the fit cannot check:
say so when the sizes differ). Rings without bytes fit them per lookup as recorded.

Beside the fitted swap term sits seed 000's own reading of the same thing, measured on the same
rings: a step that applies swaps runs at ~1.9× the p95 of a swap-free step
(``swap_cost_ratio``, and ms per applied swap) — the model's figure and the measurement's, side
by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.analyze.recovery import DECODE_TOKENS, swap_cost
from harness.errors import BadInput
from harness.formats.records import open_campaign, read_json, write_json_atomic
from harness.formats.ring import RING_FIELDS
from harness.sim.cost import CostModel

__all__ = [
    "SPEED_METRICS",
    "TERMS",
    "CostFit",
    "fit_cost",
    "predict_speed",
    "read_cost",
    "write_cost",
]

SCHEMA_VERSION = 1
TERMS = ("step_ns", "token_ns", "cold_lookup_ns", "swap_ns")
REPLICATES = 200
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
    replicates: list[list[float]]  # one [step, token, cold, swap] per resample
    residuals_ns: list[float]  # a seeded sample of decode steps' residuals
    measured_swap: dict[str, float | None] = field(default_factory=dict)
    seed: int = 0
    record_bytes: int | None = None  # the row size the cold and swap terms are for

    def _scale(self, record_bytes: int | None) -> float:
        if self.record_bytes is None or record_bytes is None or self.record_bytes <= 0:
            return 1.0
        return record_bytes / self.record_bytes

    def model(self, record_bytes: int | None = None) -> CostModel:
        """The point estimate as the simulator's cost model (no term below 0 ns), its cold and
        swap terms scaled to rows of ``record_bytes``."""
        return _model((self.estimate[t] for t in TERMS), self._scale(record_bytes))

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
                t: {"estimate": self.estimate[t], "ci": list(self.interval[t])} for t in TERMS
            },
            "r2": self.r2,
            "residual_sd_ns": self.residual_sd_ns,
            "decode_residual_sd_ns": self.decode_residual_sd_ns,
            "measured_swap": self.measured_swap,
            "replicates": self.replicates,
            "residuals_ns": self.residuals_ns,
            "seed": self.seed,
            "record_bytes": self.record_bytes,
        }


def _model(values: Any, scale: float = 1.0) -> CostModel:
    step, token, cold, swap = (float(v) for v in values)
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


def _design(ring: pd.DataFrame, scale: float) -> tuple[FloatArray, FloatArray]:
    x = np.column_stack(
        [
            np.ones(len(ring)),
            ring["tokens"].to_numpy(dtype=np.float64),
            ring["cold_lookups"].to_numpy(dtype=np.float64) * scale,
            ring["swaps"].to_numpy(dtype=np.float64) * scale,
        ]
    )
    return x, ring["dur_ns"].to_numpy(dtype=np.float64)


def _solve(x: FloatArray, y: FloatArray) -> FloatArray:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return np.asarray(coef, dtype=np.float64)


def _rings(root: Path) -> list[pd.DataFrame]:
    """The rings of the campaign's ok runs, in plan order."""
    campaign = open_campaign(root)
    rings = []
    for run in campaign.plan().get("runs", []):
        run_id = str(run.get("run_id", ""))
        record = campaign.run_record(run_id)
        path = campaign.run_dir(run_id) / "ring.parquet"
        if record is None or record.get("status") != "ok" or not path.is_file():
            continue
        ring = pd.read_parquet(path, columns=list(RING_FIELDS))
        if len(ring):
            rings.append(ring)
    return rings


def fit_cost(root: Path, *, seed: int = 0, replicates: int = REPLICATES) -> CostFit:
    """Fit the step cost from every ok run's ring in ``root`` (BadInput when none can)."""
    from harness.formats.verify import verify_campaign

    verify_campaign(root)  # a fit from records that do not verify would predict from anything
    rings = _rings(root)
    if not rings:
        raise BadInput(
            f"{root}: no ok run with a telemetry ring (ring.parquet): fit-cost needs a campaign "
            "on a runtime that writes one (the reference runtime, or seed 000's hook)"
        )
    sizes = [row_bytes(r) for r in rings]
    known = [b for b in sizes if b is not None]
    reference = round(float(np.median(known))) if known and len(known) == len(sizes) else None
    # Each run's cold and swap counts in rows of the reference size (1 where bytes are unknown).
    parts = [
        _design(r, (b / reference) if reference and b else 1.0)
        for r, b in zip(rings, sizes, strict=True)
    ]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    if np.linalg.matrix_rank(x) < x.shape[1]:
        varied = [t for t, col in zip(TERMS[1:], x[:, 1:].T, strict=True) if np.ptp(col) > 0]
        raise BadInput(
            f"{root}: the rings cannot separate the four costs (only {', '.join(varied) or 'no'} "
            "term(s) vary across steps): fit from a campaign whose runs have prefill and decode "
            "steps, cold lookups and swaps (an adaptive cell, a domain shift)"
        )
    coef = _solve(x, y)
    residual = y - x @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    decode = x[:, 1] == DECODE_TOKENS
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(replicates):
        pick = rng.integers(0, len(parts), len(parts))
        xs = np.concatenate([parts[i][0] for i in pick])
        if np.linalg.matrix_rank(xs) < xs.shape[1]:
            continue  # a resample without swaps (or cold lookups) cannot price them
        draws.append(_solve(xs, np.concatenate([parts[i][1] for i in pick])))
    if len(draws) < replicates // 2:
        raise BadInput(
            f"{root}: too few runs carry swaps or cold lookups for an interval "
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
        source=str(root),
        runs=len(rings),
        steps=int(y.size),
        estimate={t: float(c) for t, c in zip(TERMS, coef, strict=True)},
        interval={t: (float(lo), float(hi)) for t, lo, hi in zip(TERMS, low, high, strict=True)},
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
    )


def _median(values: Any) -> float | None:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.median(finite)) if finite else None


def write_cost(fit: CostFit, path: Path) -> None:
    """Write cost.json atomically."""
    write_json_atomic(path, fit.to_json())


def read_cost(path: Path) -> CostFit:
    """Read a cost.json written by :func:`write_cost` (BadInput naming the field otherwise)."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise BadInput(f"{path}: not a cost model written by `harness fit-cost` (schema_version 1)")
    try:
        terms = data["terms"]
        estimate = {t: float(terms[t]["estimate"]) for t in TERMS}
        interval = {t: (float(terms[t]["ci"][0]), float(terms[t]["ci"][1])) for t in TERMS}
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
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInput(
            f"{path}: cost model field missing or mistyped ({exc}); fit it again"
        ) from None
    bad = [t for t in TERMS if not math.isfinite(estimate[t])]
    if bad or any(len(row) != len(TERMS) for row in replicates):
        raise BadInput(f"{path}: cost model terms are not finite numbers; fit it again")
    return fit


# Speeds a fitted cost model predicts for a replay, named as the measured runs' ring metrics.
SPEED_METRICS = ("ring_decode_tok_s", "ring_itl_p50_ms", "ring_itl_p95_ms", "ring_itl_p99_ms")


def _speeds(decode_ns: FloatArray) -> dict[str, float]:
    """The ring's decode speed and inter-token percentiles from decode step durations (a decode
    step of one sequence emits one token), as :func:`harness.analyze.recovery.ring_summary`."""
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
) -> dict[str, dict[str, float]]:
    """Decode speed and inter-token percentiles of a replay's decode steps, each with a 95%
    interval: every resampled fit prices the steps (cold and swap terms scaled to rows of
    ``record_bytes``), plus residuals drawn from the fit's own (so percentiles carry the box's
    step-to-step noise, not only the model's mean)."""
    tok = np.asarray(tokens, dtype=np.int64)
    decode = tok == DECODE_TOKENS
    if not decode.any():
        return {}
    cold_d = np.asarray(cold, dtype=np.int64)[decode]
    swaps_d = np.asarray(swaps, dtype=np.int64)[decode]
    tok_d = tok[decode]
    pool = np.asarray(fit.residuals_ns or [0.0], dtype=np.float64)
    rng = np.random.default_rng(fit.seed)

    def priced(model: CostModel) -> dict[str, float]:
        base = model.durations(tok_d, cold_d, swaps_d).astype(np.float64)
        noisy = np.maximum(base + rng.choice(pool, base.size), 1.0)
        return _speeds(noisy)

    point = priced(fit.model(record_bytes))
    draws = [priced(m) for m in fit.replicate_models(record_bytes)]
    out: dict[str, dict[str, float]] = {}
    for metric in SPEED_METRICS:
        values = np.asarray([d[metric] for d in draws], dtype=np.float64)
        low, high = np.percentile(values, [2.5, 97.5]) if values.size else (math.nan, math.nan)
        out[metric] = {"estimate": point[metric], "low": float(low), "high": float(high)}
    return out
