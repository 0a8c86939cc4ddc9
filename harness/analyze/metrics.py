"""Per-request and per-run metrics from run records (docs/design.md#metrics).

Client side, comparable with vLLM and SGLang: TTFT = first content chunk − t0; E2EL = last content
chunk − t0; n = server ``usage.completion_tokens``; TPOT = (E2EL − TTFT)/(n − 1) for n > 1;
decode tok/s = (n − 1)/(E2EL − TTFT); ITL = gaps between chunks, pooled. Percentiles by linear
interpolation; geomeans across prompts. Runtime side from counters (deltas) and the ring.

Counters are deterministic for a fixed workload: machine drift cannot move them. Hit rate =
hits/(hits + misses), and none unless the runtime reports both (a missing ``misses`` is not 0).
A Prometheus counter (a name with ``:``) is its delta summed over every label set;
``route_selections`` is the route counts' total, and for a routed token every MoE layer counts
top_k selections, so a layer sums to top_k × (prompt tokens computed, not served from a prefix
cache, + generated tokens − requests): a request's last token is never fed back through the
model. A command driver's rows aggregate as counts summed, ``hit_rate`` and ``cold_share``
averaged, everything else a geomean over rows, whose log speeds take the place of per-prompt
ones in the bootstrap.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.recovery import ShiftRecovery, StepClock, phase_recovery
from harness.analyze.ring_figures import ring_summary
from harness.catalog import COUNTERS, PROMETHEUS_COUNTERS

_SCORED_COLUMNS = [
    "request",
    "first_after_boot",
    "domain",
    "prompt_id",
    "tpot_ms",
    "decode_tok_s",
    "ttft_ms",
    "e2el_ms",
    "prefill_tok_s",
]
_EMPTY_SCORED = pd.DataFrame({column: [] for column in _SCORED_COLUMNS})


def request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Scored requests (ok, not warm-up) with tpot_ms, decode_tok_s, ttft_ms, e2el_ms added."""
    if requests.empty:
        return _EMPTY_SCORED.copy()
    timed = requests["phase"] != "quality"  # the quality suite's outputs are checked, not timed
    scored = requests[requests["ok"] & ~requests["warmup"] & timed].copy()
    n = scored["completion_tokens"].astype(float)
    decode_s = scored["e2el_s"].astype(float) - scored["ttft_s"].astype(float)
    valid = (n > 1) & (decode_s > 0)
    scored["tpot_ms"] = np.where(valid, decode_s / (n - 1) * 1e3, np.nan)
    scored["decode_tok_s"] = np.where(valid, (n - 1) / decode_s.where(valid, 1.0), np.nan)
    scored["ttft_ms"] = scored["ttft_s"].astype(float) * 1e3
    scored["e2el_ms"] = scored["e2el_s"].astype(float) * 1e3
    prompt_tokens = scored["prompt_tokens"].astype(float)
    scored["prefill_tok_s"] = prompt_tokens / scored["ttft_s"].astype(float)
    return scored


def _geomean(values: pd.Series | np.ndarray) -> float | None:
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array) & (array > 0)]
    if array.size == 0:
        return None
    return float(np.exp(np.mean(np.log(array))))


def _percentile(values: pd.Series | np.ndarray, q: float) -> float | None:
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    return float(np.percentile(array, q)) if array.size else None


def itl_ms(chunks: pd.DataFrame, scored_requests: pd.Series) -> np.ndarray:
    """Inter-token gaps in ms between consecutive chunks of the scored requests, pooled."""
    if chunks.empty:
        return np.array([], dtype=float)
    chunks = chunks[chunks["request"].isin(scored_requests)].sort_values(["request", "chunk"])
    gaps = chunks.groupby("request")["t_s"].diff().dropna().to_numpy(dtype=float)
    return gaps * 1e3


def counter_metrics(counters: dict[str, Any]) -> dict[str, float | None]:
    """Hit rate, cold share, expert loads, bytes read and new swap-out pages from deltas."""
    delta = counters.get("delta") or {}

    def get(key: str) -> float | None:
        value = delta.get(key)
        return float(value) if isinstance(value, int | float) else None

    hits, misses = get("hits"), get("misses")
    lookups, cold = get("lookups"), get("cold_lookups")
    # Both counters or no rate: a runtime that counts hits but not misses has no hit rate
    # (reading the missing counter as 0 would report every lookup served from the fast tier).
    hit_rate = None
    if hits is not None and misses is not None and hits + misses:
        hit_rate = hits / (hits + misses)
    # Paged Experts' residency replayed over the recorded passes (runtimes/recorder.py): never
    # the measured hit_rate, whose name a reader takes for the runtime's own count.
    replayed_hits, replayed_misses = get("replayed_hits"), get("replayed_misses")
    replayed = None
    if replayed_hits is not None and replayed_misses is not None:
        looked_up = replayed_hits + replayed_misses
        replayed = replayed_hits / looked_up if looked_up else None
    out: dict[str, float | None] = {
        "hit_rate": hit_rate,
        "replayed_hit_rate": replayed,
        "replayed_hits": replayed_hits,
        "replayed_misses": replayed_misses,
        "cold_share": cold / lookups if cold is not None and lookups else None,
        "expert_loads": get("expert_loads"),
        "bytes_read": get("bytes_read"),
        "swaps": get("swaps"),
        "cold_lookups": cold,
        "new_swapout_pages": get("new_swapout_pages"),
        "route_selections": get("route_selections"),
        # KT's passes run wholly on the GPU: in neither hits nor misses (runtimes/recorder.py).
        "full_gpu_selections": get("full_gpu_selections"),
    }
    for name in PROMETHEUS_COUNTERS:
        out[name] = prometheus_sum(delta, name)
    return out


def prometheus_sum(samples: dict[str, Any], name: str) -> float | None:
    """A Prometheus counter summed over its label sets (``name`` and ``name{…}`` keys); None
    when the runtime served no sample of it."""
    values = [
        float(v)
        for k, v in samples.items()
        if (k == name or k.startswith(name + "{")) and isinstance(v, int | float)
    ]
    return sum(values) if values else None


# Result-row metrics summed over a run's rows (counts of work done); shares are averaged; the rest
# (speeds, times) are geomeans over rows, as over prompts.
_SUMMED = frozenset(COUNTERS) - {"failed_runs", "lost_ring_records"}
_AVERAGED = frozenset({"hit_rate", "replayed_hit_rate", "cold_share"})


def bench_metrics(bench: pd.DataFrame) -> dict[str, float | None]:
    """Metrics of a command-driver run from its ``bench.parquet`` (one row per result row)."""
    out: dict[str, float | None] = {"requests": float(len(bench))}
    for metric in bench.columns:
        if metric == "row":
            continue
        values = bench[metric].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if metric in _SUMMED:
            out[metric] = float(values.sum()) if values.size else None
        elif metric in _AVERAGED:
            out[metric] = float(values.mean()) if values.size else None
        else:
            out[metric] = _geomean(values)
    return out


def run_metrics(
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    counters: dict[str, Any],
    ring: pd.DataFrame | None,
    *,
    concurrency: int,
    window_s: float,
    converged_span_s: float,
    hold_s: float,
    steps: StepClock | None = None,
    samples: pd.DataFrame | None = None,
    bench: pd.DataFrame | None = None,
) -> tuple[dict[str, Any], list[ShiftRecovery]]:
    """Every per-run metric of the catalog, plus the shift recoveries from the ring.

    ``samples`` is the run's ``samples.parquet`` (RSS and swap-out over time), when it has one;
    ``bench`` its ``bench.parquet`` (a command-driver run), whose mapped metrics win over the
    same names from counters (the binary's own figure for its own phase).
    """
    scored = request_metrics(requests) if not requests.empty else _EMPTY_SCORED
    decode = _geomean(scored["decode_tok_s"])
    first = scored[scored["first_after_boot"].astype(bool)]
    gaps = itl_ms(chunks, scored["request"])
    out: dict[str, Any] = {
        "requests": len(scored),
        "decode_tok_s": decode,
        "c1_tok_s": decode if concurrency == 1 else None,
        "tpot_p50_ms": _percentile(scored["tpot_ms"], 50),
        "tpot_p95_ms": _percentile(scored["tpot_ms"], 95),
        "tpot_p99_ms": _percentile(scored["tpot_ms"], 99),
        "ttft_ms": _geomean(scored["ttft_ms"]),
        "e2el_ms": _geomean(scored["e2el_ms"]),
        "prefill_tok_s": _geomean(scored["prefill_tok_s"]),
        "first_request_tok_s": (float(first["decode_tok_s"].iloc[0]) if len(first) else None),
        "itl_p99_ms": _percentile(gaps, 99),
    }
    out.update(counter_metrics(counters))
    # Per request served: run totals move with how many requests a timed phase let through;
    # per request they compare across cells whatever the throughput.
    for total in ("expert_loads", "bytes_read"):
        value = out.get(total)
        out[f"{total}_per_request"] = (
            value / len(scored) if value is not None and len(scored) else None
        )
    if bench is not None:
        out.update(bench_metrics(bench))
    if samples is not None:
        out.update(rss_metrics(samples))
    shifts: list[ShiftRecovery] = []
    if ring is not None and len(ring):
        summary = ring_summary(ring, window_s, converged_span_s=converged_span_s, steps=steps)
        out["churn_per_min"] = summary.get("churn_per_min")
        out["swap_cost_ratio"] = summary.get("swap_cost_ratio")
        out["swap_ms_per_swap"] = summary.get("swap_ms_per_swap")
        out["swap_steps"] = summary.get("swap_steps")
        out["ring_itl_p99_ms"] = summary.get("itl_p99_ms")
        # The ring's own decode speed and step percentiles: what a fitted cost model predicts.
        out["ring_decode_tok_s"] = summary.get("decode_tok_s")
        out["ring_itl_p50_ms"] = summary.get("itl_p50_ms")
        out["ring_itl_p95_ms"] = summary.get("itl_p95_ms")
        out["ring_duration_s"] = summary.get("duration_s")
        if "boot" in ring.columns and ring["boot"].nunique() > 1:
            # A resumed run: time served is the sum of each boot's span, not the wall time
            # between the first and last record, which would count the downtime as served.
            spans = ring.groupby("boot")["t_ns"].agg(lambda t: (t.max() - t.min()) / 1e9)
            out["ring_duration_s"] = float(spans.sum())
            out["boots"] = int(ring["boot"].nunique())
        out["ring_cold_share"] = summary.get("cold_share")
        shifts = phase_recovery(
            ring, window_s, converged_span_s=converged_span_s, hold_s=hold_s, steps=steps
        )
        out.update(worst_recovery(shifts))
    return out, shifts


# Fewest post-warm-up samples of one boot for an RSS growth figure: fewer cannot fill both
# quarters with more than one sample each.
RSS_MIN_SAMPLES = 8


def rss_growth_pct(samples: pd.DataFrame) -> float | None:
    """RSS growth of a run in percent: median of the last quarter vs the first, after warm-up.

    Per boot, over the samples taken after the warm-up requests (``scored``) while the runtime
    was alive (finite ``rss_bytes``): the time span [t0, t1] is cut in quarters and growth is
    100·(median RSS with t ≥ t1 − span/4 ÷ median RSS with t ≤ t0 + span/4 − 1). Medians
    over a quarter ignore single spikes; comparing quarters rather than the first and last
    sample lets allocator warm-up settle. A run resumed on fresh boots reports its worst boot
    (memory is not carried across a boot). None when no boot has ``RSS_MIN_SAMPLES`` samples.
    """
    if samples.empty:
        return None
    kept = samples[samples["scored"].astype(bool) & np.isfinite(samples["rss_bytes"])]
    boots = kept["boot"] if "boot" in kept.columns else pd.Series(0, index=kept.index)
    worst: float | None = None
    for _, group in kept.groupby(boots):
        if len(group) < RSS_MIN_SAMPLES:
            continue
        t = group["t_s"].to_numpy(dtype=float)
        rss = group["rss_bytes"].to_numpy(dtype=float)
        quarter_s = (t.max() - t.min()) / 4
        first = float(np.median(rss[t <= t.min() + quarter_s]))
        last = float(np.median(rss[t >= t.max() - quarter_s]))
        if first <= 0:
            continue
        growth = 100.0 * (last / first - 1.0)
        worst = growth if worst is None else max(worst, growth)
    return worst


def rss_metrics(samples: pd.DataFrame) -> dict[str, float | None]:
    """``rss_growth_pct``, peak RSS and sampled swap-out growth from ``samples.parquet``."""
    rss = samples["rss_bytes"].to_numpy(dtype=float) if not samples.empty else np.array([])
    rss = rss[np.isfinite(rss)]
    swap = samples["swapout_pages"].to_numpy(dtype=float) if not samples.empty else np.array([])
    swap = swap[np.isfinite(swap)]
    return {
        "rss_growth_pct": rss_growth_pct(samples),
        "rss_peak_bytes": float(rss.max()) if rss.size else None,
        "sampled_swapout_pages": float(swap[-1] - swap[0]) if swap.size > 1 else None,
    }


def worst_recovery(shifts: list[ShiftRecovery]) -> dict[str, float | None]:
    """A run's T90 and T2x: the slowest of its shifts that had an excess (no excess: n/a, not
    never); None when one never recovered, or when no shift had an excess. In seconds, and in
    host steps (the step clock's measure; on the seconds clock, the steps served meanwhile)."""
    measurable = [s for s in shifts if s.excess]
    return {
        "t90_s": _nan_max([s.t90_s for s in measurable]),
        "t2x_s": _nan_max([s.t2x_s for s in measurable]),
        "t90_steps": _nan_max([s.t90_steps for s in measurable]),
        "t2x_steps": _nan_max([s.t2x_steps for s in measurable]),
    }


def _nan_max(values: list[float | None]) -> float | None:
    """The worst recovery; None when any shift never recovered (or there were none)."""
    if not values or any(v is None for v in values):
        return None
    return max(v for v in values if v is not None)


def domain_speeds(requests: pd.DataFrame) -> dict[str, float]:
    """Geomean decode tok/s per domain (seed 000's per-domain C1)."""
    scored = request_metrics(requests)
    out = {}
    for domain, group in scored.groupby("domain"):
        value = _geomean(group["decode_tok_s"])
        if value is not None and not math.isnan(value):
            out[str(domain)] = value
    return out
