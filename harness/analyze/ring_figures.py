"""Whole-ring figures from the telemetry ring: swap cost and the ring summary.

docs/design.md#runtime-side: churn over the converged spans (on the card's clock), swap cost
against swap-free decode steps with as many cold lookups, the ring's decode speed and
inter-token percentiles. The windows and spans are :mod:`harness.analyze.recovery`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from harness.analyze.recovery import (
    DECODE_TOKENS,
    DEFAULT_CONVERGED_SPAN_S,
    DEFAULT_WINDOW_S,
    NS_PER_S,
    IntArray,
    RingInput,
    StepClock,
    cold_share_windows,
    converged_mask,
    ring_columns,
)

__all__ = ["MIN_MATCHED_FREE", "ring_summary", "swap_cost"]


# The fewest swap-free steps with a swap-bearing step's count of slow-tier lookups that its p95
# is read from; a swap-bearing step with fewer such neighbours is left out of both figures.
MIN_MATCHED_FREE = 20


def swap_cost(frame: RingInput, *, decode_tokens: int = DECODE_TOKENS) -> dict[str, float | None]:
    """Swap cost from decode step durations (seed 000 measured ~1.9× and 1.9–2.4 ms).

    Only decode steps (``tokens == decode_tokens``) count on both sides: a prefill step is
    slower by the prompt's length, not by a swap, and would make the swap-free side slow. And a
    swap-bearing step is compared with the swap-free steps that looked up as many experts in
    the slow tier (``cold_lookups``): a cold lookup reads a row as a swap does, so the swap-free
    p95 of all steps is the p95 of the coldest ones, and a swap step read "0.4× a step without
    one" on the reference runtime. swap_cost_ratio = mean dur_ns of the swap-bearing decode
    steps (swaps > 0) ÷ the mean, over them, of the p95 of the swap-free decode steps with the
    same cold lookups; swap_ms_per_swap = the mean, over them, of (dur − mean of those
    swap-free steps) ÷ mean swaps per swap-bearing step, in ms. A swap-bearing step whose cold
    count has fewer than MIN_MATCHED_FREE swap-free steps is left out; None where none is left.
    A ring that records no cold lookups is one group: all its decode steps.
    """
    cols = ring_columns(frame)
    return _swap_cost(cols, decode_tokens)


def _swap_cost(
    cols: Mapping[str, IntArray], decode_tokens: int = DECODE_TOKENS
) -> dict[str, float | None]:
    decode = cols["tokens"] == decode_tokens
    dur, swaps, cold = cols["dur_ns"], cols["swaps"], cols["cold_lookups"]
    swap_idx = np.flatnonzero((swaps > 0) & decode)
    free = (swaps == 0) & decode
    out: dict[str, float | None] = {
        "swap_steps": float(swap_idx.size),
        "swap_cost_ratio": None,
        "swap_ms_per_swap": None,
    }
    durations: list[IntArray] = []
    p95s: list[float] = []
    excess: list[float] = []
    counts: list[IntArray] = []
    # Swap-bearing steps are rare: one pass over the free steps per cold count they have.
    for value in np.unique(cold[swap_idx]):
        mine = swap_idx[cold[swap_idx] == value]
        neighbours = dur[free & (cold == value)]  # a copy: percentile may partition it
        if neighbours.size < MIN_MATCHED_FREE:
            continue
        p95 = float(np.percentile(neighbours, 95, overwrite_input=True))
        mean_free = float(neighbours.mean())
        durations.append(dur[mine])
        p95s += [p95] * mine.size
        excess += (dur[mine] - mean_free).tolist()
        counts.append(swaps[mine])
    if not durations:
        return out
    mean_p95 = float(np.mean(p95s))
    mean_swap = float(np.concatenate(durations).mean())
    out["swap_cost_ratio"] = mean_swap / mean_p95 if mean_p95 > 0 else None
    out["swap_ms_per_swap"] = float(np.mean(excess)) / float(np.concatenate(counts).mean()) / 1e6
    return out


def ring_summary(
    frame: RingInput,
    window_s: float = DEFAULT_WINDOW_S,
    *,
    converged_span_s: float = DEFAULT_CONVERGED_SPAN_S,
    windows: pd.DataFrame | None = None,
    decode_tokens: int = DECODE_TOKENS,
    steps: StepClock | None = None,
) -> dict[str, float | None]:
    """Whole-ring figures for reports and soak gates; None where undefined.

    Keys: steps, duration_s, cold_share (Σcold/Σlookups over the ring), converged_cold_share
    and churn_per_min (swaps per minute) over the converged spans — the last
    ``converged_span_s`` of every phase span —, swap_steps, swap_cost_ratio, swap_ms_per_swap,
    decode_tok_s (decode tokens ÷ Σdur of decode steps), itl_p50_ms, itl_p95_ms and itl_p99_ms
    (dur_ns of decode steps, tokens == ``decode_tokens``, linear-interpolation percentiles).
    Pass ``windows`` to reuse a cold_share_windows result (built with the same ``steps``). On
    the step clock the converged spans are the last ``steps.converged_span`` steps of each
    phase, the span T90 is read clear of, so churn is the steady state's there too.
    """
    cols = ring_columns(frame)
    if windows is None:
        windows = cold_share_windows(frame, window_s, decode_tokens=decode_tokens, steps=steps)
    dur = cols["dur_ns"]
    # Whole-ring totals come from the window sums: no further pass over the steps.
    lookups = int(windows["lookups"].sum())
    conv = converged_mask(windows, converged_span_s, steps=steps)
    conv_lookups = int(windows["lookups"].to_numpy()[conv].sum())
    conv_minutes = float(windows["span_s"].to_numpy()[conv].sum()) / 60.0
    decode = np.delete(dur, np.flatnonzero(cols["tokens"] != decode_tokens))  # a copy
    decode_ns = int(decode.sum())
    itl_ms: list[float | None] = [None, None, None]
    if decode.size:
        p50, p95, p99 = np.percentile(decode, [50, 95, 99], overwrite_input=True)
        itl_ms = [float(p50) / 1e6, float(p95) / 1e6, float(p99) / 1e6]
    summary: dict[str, float | None] = {
        "steps": float(dur.size),
        "duration_s": float(cols["t_ns"][-1] + dur[-1] - cols["t_ns"][0]) / NS_PER_S,
        "cold_share": float(windows["cold_lookups"].sum()) / lookups if lookups else None,
        "converged_cold_share": (
            float(windows["cold_lookups"].to_numpy()[conv].sum()) / conv_lookups
            if conv_lookups
            else None
        ),
        "churn_per_min": (
            float(windows["swaps"].to_numpy()[conv].sum()) / conv_minutes if conv_minutes else None
        ),
        "decode_tok_s": (decode.size * decode_tokens * NS_PER_S / decode_ns if decode_ns else None),
        "itl_p50_ms": itl_ms[0],
        "itl_p95_ms": itl_ms[1],
        "itl_p99_ms": itl_ms[2],
    }
    summary.update(_swap_cost(cols, decode_tokens))
    return summary
