"""The names a card may use: metrics, counters and cache states, with units and direction.

One table, read by card validation (is this metric known?) and by analysis (is higher better?),
so a metric cannot be valid on a card and unknown to the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    """What one metric means, its unit, and which direction is an improvement."""

    unit: str
    higher_is_better: bool
    description: str
    # Deterministic metrics (hit counts, bytes read) cannot be moved by machine drift (seed 004).
    deterministic: bool = False


METRICS: dict[str, MetricInfo] = {
    "decode_tok_s": MetricInfo(
        "tok/s", True, "geomean over held-out prompts of (n-1)/(E2EL-TTFT), per request"
    ),
    "c1_tok_s": MetricInfo("tok/s", True, "decode speed at one concurrent request (geomean)"),
    "tpot_p50_ms": MetricInfo("ms", False, "median time per output token, (E2EL-TTFT)/(n-1)"),
    "tpot_p95_ms": MetricInfo("ms", False, "95th percentile time per output token"),
    "tpot_p99_ms": MetricInfo("ms", False, "99th percentile time per output token"),
    "ttft_ms": MetricInfo("ms", False, "geomean time to first content chunk"),
    "e2el_ms": MetricInfo("ms", False, "geomean end-to-end latency"),
    "itl_p99_ms": MetricInfo("ms", False, "99th percentile inter-token latency, pooled chunks"),
    "prefill_tok_s": MetricInfo("tok/s", True, "prompt tokens / TTFT (geomean)"),
    "output_tok_s": MetricInfo(
        "tok/s", True, "aggregate output tokens per second, as a benchmark tool reported it"
    ),
    "first_request_tok_s": MetricInfo(
        "tok/s", True, "decode speed of the first request after each boot"
    ),
    "hit_rate": MetricInfo("", True, "expert lookups served from the fast tier", True),
    "replayed_hit_rate": MetricInfo(
        "",
        True,
        "REPLAYED, not measured: SGLang Paged Experts' LRU (residency.py) run by the harness over "
        "the run's recorded passes with the cell's resident count; distinct experts per step and "
        "layer found resident / all (the runtime counts no hits)",
        True,
    ),
    "cold_share": MetricInfo("", False, "cold lookups / all lookups", True),
    "expert_loads": MetricInfo("", False, "experts read from the slow tier", True),
    "bytes_read": MetricInfo("B", False, "bytes read from the slow tier", True),
    "t90_s": MetricInfo("s", False, "time after a shift until cold share stays near converged"),
    "t2x_s": MetricInfo("s", False, "time after a shift until cold share stays under 2x C"),
    "churn_per_min": MetricInfo("swaps/min", False, "swaps per minute over the converged span"),
}

COUNTERS: dict[str, str] = {
    "new_swapout_pages": "pages swapped out on the box during the run (before/after delta)",
    "expert_loads": "experts read from the slow tier",
    "bytes_read": "bytes read from the slow tier",
    "swaps": "residency swaps applied",
    "cold_lookups": "expert lookups that missed the fast tier",
    "lost_ring_records": "telemetry ring records overwritten before they were read",
    "failed_runs": "runs that did not complete",
    "route_selections": "expert selections the runtime's route-count dump counted, all layers "
    "(top_k x routed tokens per layer)",
    "full_gpu_selections": "expert selections of the passes KTransformers ran wholly on the GPU "
    "(prefills of kt_gpu_prefill_token_threshold tokens or more), left out of hits, misses and "
    "hit_rate",
    "replayed_hits": "REPLAYED, not measured: distinct experts per step and layer that SGLang "
    "Paged Experts' LRU, run by the harness over the recorded passes, found resident",
    "replayed_misses": "REPLAYED, not measured: distinct experts per step and layer that SGLang "
    "Paged Experts' LRU, run by the harness over the recorded passes, paged in from host memory",
    "eplb_rearrangements": "expert rearrangements vLLM's EPLB logged during the run",
    # vLLM's Prometheus counters (/metrics), summed over their label sets.
    "vllm:prompt_tokens_total": "prompt tokens vLLM processed",
    "vllm:generation_tokens_total": "tokens vLLM generated",
    "vllm:prefix_cache_queries_total": "prompt tokens vLLM looked up in its prefix cache",
    "vllm:prefix_cache_hits_total": "prompt tokens vLLM served from its prefix cache",
    "vllm:num_preemptions_total": "requests vLLM preempted (KV cache full)",
    "vllm:request_success_total": "requests vLLM finished, any reason",
}

# Counters read from Prometheus text: a name with a ':' (vllm:..., llamacpp:...). A run's value is
# the delta summed over every label set of that name.
PROMETHEUS_COUNTERS = tuple(name for name in COUNTERS if ":" in name)

# Metrics and counters only a telemetry ring provides (recovery, churn, records lost): a gate on
# one against a runtime without a ring could only ever read "not recorded", or worse, 0.
RING_ONLY = frozenset({"t90_s", "t2x_s", "churn_per_min", "lost_ring_records"})

CACHE_STATES = ("warm", "cold")
