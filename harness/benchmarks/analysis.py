"""``harness bench analysis``: ring analysis of a 48-hour soak vs the raw-numpy floor.

Synthesises a soak ring (15 million host steps; 2 million with ``quick``) with phase shifts,
transients, swaps and prefill steps, writes it as raw little-endian int64 records (the ring's
record layout) and times, in the same run:

- **ours**: np.fromfile → pandas DataFrame → cold_share_windows (2 s) → T90/T2x/speed recovery
  for every shift → ring_summary (cold share, churn, swap cost, inter-token p50/p99);
- **floor**: np.fromfile plus one vectorised pass — one np.searchsorted for the 2 s window
  starts and one np.add.reduceat over all columns.

Targets: ours within 3× the floor, under 10 s, peak traced memory under 2 GB.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.recovery import RING_COLUMNS, cold_share_windows, recovery_from_windows
from harness.analyze.ring_figures import ring_summary
from harness.benchmarks import Figure

FULL_STEPS = 15_000_000
QUICK_STEPS = 2_000_000
WINDOW_S = 2.0
PHASE_S = 600.0  # a domain shift every ten minutes
SOAK_S = 48 * 3600.0
LOOKUPS_PER_STEP = 240  # 40 layers × top-6
ROW_BYTES = 18_800_000  # one 17.93 MiB expert row
GIB = 1024**3


def synthesize_soak(n_steps: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.int64]]:
    """A synthetic soak ring as an (n_steps, 8) int64 record array in RING_COLUMNS order.

    Steps are spaced so that FULL_STEPS cover 48 hours; three domains rotate every PHASE_S.
    After each shift the cold share decays from ~6 % towards a per-domain floor (1–2 %) with a
    4 s time constant and swaps are more frequent; each swap adds 2 ms to its step; one step in
    1024 is a 256-token prefill step.
    """
    rng = np.random.default_rng(seed)
    mean_step_ns = SOAK_S * 1e9 / FULL_STEPS
    dur = rng.integers(int(0.9 * mean_step_ns), int(1.0 * mean_step_ns), size=n_steps)
    t = np.cumsum(dur) - dur[0]
    since_shift_s = (t % int(PHASE_S * 1e9)) / 1e9
    phase = (t // int(PHASE_S * 1e9)) % 3
    floor = np.array([0.010, 0.015, 0.020])[phase]
    transient = np.exp(-since_shift_s / 4.0)
    cold = rng.binomial(LOOKUPS_PER_STEP, floor + 0.05 * transient)
    swaps = rng.poisson(0.02 + 0.3 * transient)
    dur += swaps * 2_000_000
    t = np.cumsum(dur) - dur[0]
    tokens = np.ones(n_steps, dtype=np.int64)
    tokens[::1024] = 256
    records = np.empty((n_steps, len(RING_COLUMNS)), dtype=np.int64)
    for i, column in enumerate(
        (t, dur, tokens, np.full(n_steps, LOOKUPS_PER_STEP), cold, swaps, cold * ROW_BYTES, phase)
    ):
        records[:, i] = column
    return records


def _ours(path: Path) -> tuple[int, dict[str, float | None]]:
    raw = np.fromfile(path, dtype="<i8").reshape(-1, len(RING_COLUMNS))
    frame = pd.DataFrame(raw, columns=list(RING_COLUMNS), copy=False)
    windows = cold_share_windows(frame, WINDOW_S)
    shifts = recovery_from_windows(windows)
    summary = ring_summary(frame, WINDOW_S, windows=windows)
    return len(shifts), summary


def _floor(path: Path) -> int:
    raw = np.fromfile(path, dtype="<i8").reshape(-1, len(RING_COLUMNS))
    t = raw[:, 0]
    edges = np.arange(int(t[0]), int(t[-1]) + 1, int(WINDOW_S * 1e9))
    starts = np.searchsorted(t, edges)
    sums = np.add.reduceat(raw, np.unique(starts), axis=0)
    return int(sums.shape[0])


def _best_time(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run_bench(quick: bool = False) -> list[Figure]:
    """Time the ring analysis of a synthetic 48-hour soak against the fromfile+reduceat floor."""
    n_steps = QUICK_STEPS if quick else FULL_STEPS
    repeats = 3 if quick else 2
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        path = Path(tmp) / "ring.i64"
        records = synthesize_soak(n_steps)
        records.tofile(path)
        del records
        ours_s = _best_time(lambda: _ours(path), repeats)
        floor_s = _best_time(lambda: _floor(path), repeats)
        ours_peak = _peak_bytes(lambda: _ours(path))
        floor_peak = _peak_bytes(lambda: _floor(path))
        n_shifts, summary = _ours(path)
    ratio = ours_s / floor_s
    base = f"fromfile + 1 reduceat, {n_steps:,} steps"
    itl = summary["itl_p99_ms"]
    return [
        Figure("ring analysis time", ours_s, "s", base, "< 10 s", ours_s < 10.0),
        Figure("floor time", floor_s, "s", "np.fromfile + np.add.reduceat"),
        Figure("ratio vs floor", ratio, "x", base, "<= 3x", ratio <= 3.0),
        Figure("peak traced memory", ours_peak / GIB, "GiB", base, "< 2 GB", ours_peak < 2 * 1e9),
        Figure("floor peak traced memory", floor_peak / GIB, "GiB", "np.fromfile + reduceat"),
        Figure("shifts analysed", float(n_shifts), "shifts", "T90/T2x/speed per shift"),
        Figure("inter-token p99", float(itl) if itl is not None else float("nan"), "ms"),
    ]
