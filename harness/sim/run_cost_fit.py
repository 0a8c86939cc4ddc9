"""A cost fitted from run aggregates, for runtimes without a ring (``fit-cost --per-run``).

vLLM, SGLang and llama.cpp give per-run counters and request timings but no per-step ring, so
the step regression of :mod:`harness.sim.cost_fit` has nothing to regress. One run is one
observation instead: its client time per decode token (the scored requests' decode seconds over
their decode tokens) against its expert loads per token served (the counters' delta: loads, or
the cache's misses where a runtime counts no loads; tokens from the counters, else the scored
requests' prompt and completion tokens). A straight line through the runs, ms a token at no
loads and ms per load a token, with R² and 95% intervals from the regression's own standard
errors on n − 2 degrees of freedom (Student's t). Not from resampling runs: with the four to a
dozen runs a campaign gives, a bootstrap of runs has too few distinct resamples, and its
"95%" line covered the true one about half the time at four runs (two a rate).

A replay's counters then give a cell's loads per token, and the line its decode time per token:
``decode_tok_s`` (1000 ÷ it) and ``tpot_p50_ms`` (it: the mean stands for the median, which
per-run data cannot give), with the line's 95% interval at that rate — the fit's uncertainty,
which widens away from the runs' mean rate; not the box's run-to-run spread. The line needs
runs whose load rates differ — two maps, a cache of another size, an adaptive cell — and prices
only what it saw: a rate outside the fitted range is an extrapolation, flagged in the
prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.metrics import request_metrics
from harness.errors import BadInput
from harness.formats.records import open_campaign, read_json
from harness.stats.distributions import t_ppf

__all__ = [
    "KIND",
    "RunCostFit",
    "fit_points",
    "fit_run_cost",
    "predict_run_speed",
    "read_run_cost",
]

KIND = "per-run"
MIN_RUNS = 4


@dataclass(frozen=True)
class RunCostFit:
    """Decode time per token against expert loads per token, one point per run."""

    source: str
    runs: int
    base_ms: float  # ms a decode token with no expert loads
    per_load_ms: float  # ms added per expert load per token served
    base_ci: tuple[float, float]
    per_load_ci: tuple[float, float]
    r2: float
    points: list[list[float]]  # [loads per token, ms per decode token] of each fitted run
    load_range: tuple[float, float]  # loads per token across the fitted runs

    def line_interval(self, rate: float) -> tuple[float, float]:
        """The fitted line's 95% interval at ``rate`` loads per token (t on n − 2 degrees of
        freedom; it widens with the distance from the runs' mean rate)."""
        x = np.asarray([p[0] for p in self.points], dtype=np.float64)
        y = np.asarray([p[1] for p in self.points], dtype=np.float64)
        point = self.base_ms + self.per_load_ms * rate
        sd = _residual_sd(x, y, self.base_ms, self.per_load_ms)
        half = _t95(x.size) * _line_se(x, sd, rate)
        return point - half, point + half

    def to_json(self) -> dict[str, Any]:
        """cost.json's content."""
        return {
            "schema_version": 1,
            "kind": KIND,
            "source": self.source,
            "runs": self.runs,
            "base_ms": {"estimate": self.base_ms, "ci": list(self.base_ci)},
            "per_load_ms": {"estimate": self.per_load_ms, "ci": list(self.per_load_ci)},
            "r2": self.r2,
            "points": self.points,
            "load_range": list(self.load_range),
        }


def _residual_sd(x: np.ndarray, y: np.ndarray, base: float, slope: float) -> float:
    """The SD of the points about the line ``base + slope * x``, on n − 2 degrees of freedom."""
    residual = y - (base + slope * x)
    return math.sqrt(float((residual**2).sum()) / (x.size - 2))


def _line_se(x: np.ndarray, sd: float, rate: float) -> float:
    """The standard error of a line fitted through points at ``x`` (residual SD ``sd``), read
    at ``rate``: sd · √(1/n + (rate − x̄)²/Sxx). At rate 0 it is the intercept's."""
    spread = float(((x - x.mean()) ** 2).sum())
    return sd * math.sqrt(1.0 / x.size + (rate - float(x.mean())) ** 2 / spread)


def _t95(n: int) -> float:
    """The two-sided 95% t quantile for a line fitted through ``n`` points."""
    return t_ppf(0.975, n - 2)


def load_rate(delta: dict[str, Any], tokens: float | None = None) -> float | None:
    """Expert loads per token served from a counters delta (loads, else misses; tokens from
    the delta, else ``tokens``); None where the run counted neither."""
    loads = delta.get("expert_loads", delta.get("misses"))
    served = delta.get("tokens", tokens)
    if not isinstance(loads, int | float) or not isinstance(served, int | float) or served <= 0:
        return None
    return float(loads) / float(served)


def _run_points(root: Path) -> list[tuple[float, float]]:
    """(loads per token, client ms per decode token) of every ok run that has both."""
    campaign = open_campaign(root)
    points = []
    for run in campaign.plan().get("runs", []):
        run_id = str(run.get("run_id", ""))
        folder = campaign.run_dir(run_id)
        if not campaign.is_done(run_id):
            continue
        requests_path, counters_path = folder / "requests.parquet", folder / "counters.json"
        if not requests_path.is_file() or not counters_path.is_file():
            continue
        scored = request_metrics(pd.read_parquet(requests_path))
        decode_s = (scored["e2el_s"] - scored["ttft_s"]).to_numpy(dtype=np.float64)
        tokens = scored["completion_tokens"].to_numpy(dtype=np.float64) - 1
        timed = np.isfinite(decode_s) & (decode_s > 0) & (tokens > 0)
        if not timed.any():
            continue
        served = float((scored["prompt_tokens"] + scored["completion_tokens"]).sum())
        delta = (read_json(counters_path) or {}).get("delta") or {}
        rate = load_rate(delta, served)
        if rate is not None:
            points.append((rate, float(decode_s[timed].sum() / tokens[timed].sum() * 1e3)))
    return points


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def fit_run_cost(root: Path, *, allow_unsealed: bool = False) -> RunCostFit:
    """Fit the per-run line from every ok run in ``root`` (BadInput when it cannot; a
    directory with no seal from its start refused unless ``allow_unsealed``)."""
    from harness.formats.verify import verified_source

    source = verified_source(root, allow_unsealed=allow_unsealed, command="fit-cost --per-run")
    return fit_points(_run_points(root), source)


def fit_points(points: list[tuple[float, float]], source: str) -> RunCostFit:
    """The line through (loads per token, ms per decode token) points, one a run."""
    if len(points) < MIN_RUNS:
        raise BadInput(
            f"{source}: {len(points)} ok run(s) with timed requests and load counters (expert "
            f"loads or misses); a per-run fit needs {MIN_RUNS} or more"
        )
    x = np.asarray([p[0] for p in points], dtype=np.float64)
    y = np.asarray([p[1] for p in points], dtype=np.float64)
    if np.ptp(x) <= 0:
        raise BadInput(
            f"{source}: every run loaded experts at the same rate ({x[0]:.4g} a token): a per-run "
            "fit needs runs whose load rates differ (two maps, another cache size, an adaptive "
            "cell)"
        )
    base, per_load = _line(x, y)
    residual = y - (base + per_load * x)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    n = x.size
    t = _t95(n)
    sd = _residual_sd(x, y, base, per_load)
    slope_se = sd / math.sqrt(float(((x - x.mean()) ** 2).sum()))
    base_se = _line_se(x, sd, 0.0)
    return RunCostFit(
        source=source,
        runs=n,
        base_ms=base,
        per_load_ms=per_load,
        base_ci=(base - t * base_se, base + t * base_se),
        per_load_ci=(per_load - t * slope_se, per_load + t * slope_se),
        r2=r2,
        points=[[float(a), float(b)] for a, b in points],
        load_range=(float(x.min()), float(x.max())),
    )


def predict_run_speed(fit: RunCostFit, delta: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A replay's client decode tok/s and TPOT from its counters' loads per token, with the
    interval of the resampled lines; ``extrapolated`` 1 where the rate lies outside the fit's."""
    rate = load_rate(delta)
    if rate is None:
        return {}
    point = fit.base_ms + fit.per_load_ms * rate
    low, high = fit.line_interval(rate)
    outside = not fit.load_range[0] <= rate <= fit.load_range[1]
    flag = {"extrapolated": 1.0} if outside else {}
    if point <= 0 or low <= 0:
        return {}  # a line through zero time cannot price this rate
    return {
        "tpot_p50_ms": {"estimate": point, "low": low, "high": high, **flag},
        "decode_tok_s": {"estimate": 1e3 / point, "low": 1e3 / high, "high": 1e3 / low, **flag},
    }


def read_run_cost(path: Path, data: dict[str, Any]) -> RunCostFit:
    """A per-run cost.json's fields (BadInput naming the file when one is missing)."""
    try:
        fit = RunCostFit(
            source=str(data["source"]),
            runs=int(data["runs"]),
            base_ms=float(data["base_ms"]["estimate"]),
            per_load_ms=float(data["per_load_ms"]["estimate"]),
            base_ci=(float(data["base_ms"]["ci"][0]), float(data["base_ms"]["ci"][1])),
            per_load_ci=(float(data["per_load_ms"]["ci"][0]), float(data["per_load_ms"]["ci"][1])),
            r2=float(data["r2"]),
            points=[[float(a), float(b)] for a, b in data["points"]],
            load_range=(float(data["load_range"][0]), float(data["load_range"][1])),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInput(
            f"{path}: per-run cost model field missing or mistyped ({exc}); fit it again"
        ) from None
    finite = all(math.isfinite(v) for p in fit.points for v in p)
    if not all(math.isfinite(v) for v in (fit.base_ms, fit.per_load_ms)) or not finite:
        raise BadInput(f"{path}: per-run cost model terms are not finite numbers; fit it again")
    if len(fit.points) < MIN_RUNS or len({p[0] for p in fit.points}) < 2:
        raise BadInput(f"{path}: a per-run cost model needs {MIN_RUNS} runs at two rates or more")
    return fit
