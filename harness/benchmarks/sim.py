"""``harness bench sim``: the fast replay against the plain step-by-step one, side by side.

A generated trace of 40 layers x 384 experts x top-6 (seed 000's geometry): two domains with
Zipf-skewed expert popularity in different orders, shifting half way, every token a decode step;
the shipped knobs (drain every 64, 2 swaps per layer) from domain 0's top-295 map. Tokens: 1M
(quick: 100k). Both replays run over the same trace; the bench asserts identical decisions
(swaps, drain points, saturated layers, final hot sets, per-step cold lookups).

The headline is the speed-up on equal resources: the fast replay on one thread against the
plain replay (one thread by nature), in CPU seconds of the process. Wall time on a shared
machine includes the waits for a core (one busy core can double a threaded replay's), while CPU
time stays within a few percent. So the headline and its spread are CPU time, wall times are
printed beside them, and the threaded replay is reported as its scaling over one thread, with
the load average, not as the target. The floor is what no replay can beat, reading the trace
once: its bytes over the memory bandwidth measured here (a copy of a buffer of the trace's size,
bytes read plus written per second, on as many threads as the replay uses).

Both replays drive the same compiled policy kernels, loaded (or compiled) before any timing and
reported apart. The fast replay is timed three times during the reference's single run, at its
quarters (the reference's time leaves those pauses out): the machine's speed drifts over half a
minute, and both sides see the same drift. The median of the three counts, and the spread of
the three is reported. With ``reference_prefix_tokens`` below the trace length, the reference
is timed on that prefix and its time scaled linearly (it is a per-step loop with a constant
cost per step); the figures say so.
"""

from __future__ import annotations

import itertools
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from harness.benchmarks import Figure
from harness.policy.residency import PolicyKnobs
from harness.sim.replay import replay_fast, replay_reference
from harness.sim.results import ReplayResult
from harness.sim.traces import Trace, trace_from_arrays

LAYERS, EXPERTS, TOP_K, HOT_SLOTS = 40, 384, 6, 295
_FAST_RUNS = 3
_POOL = 2048  # distinct routings per domain; tokens draw from them at random


def generate_trace(tokens: int, seed: int = 0) -> tuple[Trace, list[list[int]]]:
    """The benchmark trace and the starting map (domain 0's most popular experts)."""
    rng = np.random.default_rng(seed)
    popularity = (1.0 / np.arange(1, EXPERTS + 1) ** 1.1).astype(np.float32)
    log_p = np.log(popularity)
    orders = [rng.permutation(EXPERTS) for _ in range(2)]
    pools = []
    for order in orders:
        # Gumbel top-k: top_k distinct experts per (routing, layer), drawn by popularity.
        noise = rng.gumbel(size=(_POOL, LAYERS, EXPERTS)).astype(np.float32)
        ranks = np.argpartition(-(log_p + noise), TOP_K, axis=2)[..., :TOP_K]
        pools.append(order[ranks].astype(np.int16))
    half = tokens // 2
    picks = rng.integers(0, _POOL, size=tokens)
    experts = np.empty((tokens, LAYERS, TOP_K), dtype=np.int16)
    experts[:half] = pools[0][picks[:half]]
    experts[half:] = pools[1][picks[half:]]
    trace = trace_from_arrays(experts, experts_count=EXPERTS, path="<bench>")
    hot = [sorted(orders[0][:HOT_SLOTS].tolist())] * LAYERS
    return trace, hot


def _same(a: ReplayResult, b: ReplayResult) -> bool:
    return (
        bool(np.array_equal(a.swaps, b.swaps))
        and bool(np.array_equal(a.drain_steps, b.drain_steps))
        and bool(np.array_equal(a.saturated, b.saturated))
        and a.final_hot == b.final_hot
        and bool(np.array_equal(a.cold_lookups, b.cold_lookups))
    )


def memory_bandwidth(nbytes: int, threads: int = 1, repeats: int = 5) -> float:
    """Bytes per second through memory (read plus written) copying a buffer of ``nbytes``,
    split across ``threads`` (numpy's copy releases the GIL); the best of ``repeats`` copies.

    Both buffers are touched before the first timing, so page faults are not counted.
    """
    size = max(nbytes, 1 << 20)
    source = np.ones(size, dtype=np.uint8)
    target = np.zeros(size, dtype=np.uint8)
    edges = np.linspace(0, size, threads + 1).astype(int)
    spans = [(int(a), int(b)) for a, b in itertools.pairwise(edges)]

    def part(span: tuple[int, int]) -> None:
        np.copyto(target[span[0] : span[1]], source[span[0] : span[1]])

    best = float("inf")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(part, spans))
            best = min(best, time.perf_counter() - start)
    return 2 * size / best


def _prefix(trace: Trace, rows: int) -> Trace:
    return trace_from_arrays(trace.experts[:rows], experts_count=trace.experts_count)


def run_bench(quick: bool = False, reference_prefix_tokens: int | None = None) -> list[Figure]:
    """Measure fast vs reference replay (1M tokens, quick 100k); asserts identical decisions."""
    tokens = 100_000 if quick else 1_000_000
    trace, hot = generate_trace(tokens)
    knobs = PolicyKnobs()
    cpus = os.cpu_count() or 1
    prefix = min(tokens, reference_prefix_tokens or tokens)
    reference_trace = trace if prefix == tokens else _prefix(trace, prefix)
    # Both replays run compiled policy code; load it (or compile it, on a fresh install) first,
    # and report that one-time cost apart.
    tiny, tiny_hot = generate_trace(256, seed=1)
    start = time.perf_counter()
    replay_fast(tiny, knobs, tiny_hot)
    replay_reference(tiny, knobs, tiny_hot)
    load_s = time.perf_counter() - start
    # One untimed fast run first: the first pass over a fresh trace pays its page faults and
    # cold caches, which are the machine's start-up, not the replay's.
    replay_fast(trace, knobs, hot, threads=1)
    t = _time_replays(trace, reference_trace, knobs, hot, cpus)
    fast = t.results[0]
    on_prefix = fast if prefix == tokens else replay_fast(reference_trace, knobs, hot)
    identical = _same(t.reference, on_prefix) and all(_same(fast, other) for other in t.results)
    assert identical, "fast and reference replays made different decisions"
    return _figures(t, trace, tokens, prefix, cpus, load_s, identical)


@dataclass
class _Timings:
    """Both replays timed side by side: the reference once, the fast one while it pauses."""

    reference: ReplayResult
    reference_s: float  # wall s, the pauses left out
    reference_cpu: float  # CPU s, the pauses left out
    single: list[float]  # fast, one thread, wall s
    single_cpu: list[float]  # the same runs in CPU s
    threaded: list[float]  # fast, every CPU, wall s
    results: list[ReplayResult]  # every fast replay's
    load_before: float
    load_after: float


def _time_replays(
    trace: Trace, reference_trace: Trace, knobs: PolicyKnobs, hot: list[list[int]], cpus: int
) -> _Timings:
    # The machine's speed drifts over the reference's half minute, so the fast replay is timed
    # during it: paused at each quarter of the reference, three times; the median counts and
    # the reference's time leaves the pauses out.
    # Each single-thread replay is timed in CPU seconds of this process as well as wall seconds:
    # both replays then run on one thread, so CPU time is their work, whatever else the machine
    # runs (wall time on a shared machine includes the waits for a core).
    single: list[float] = []
    single_cpu: list[float] = []
    threaded: list[float] = []
    pause_cpu: list[float] = []  # all a pause cost in CPU, both threads of the threaded run too
    results: list[ReplayResult] = []

    def time_fast() -> None:
        if len(single) == _FAST_RUNS:
            return
        start, start_cpu = time.perf_counter(), time.process_time()
        results.append(replay_fast(trace, knobs, hot, threads=1))
        single.append(time.perf_counter() - start)
        single_cpu.append(time.process_time() - start_cpu)
        start = time.perf_counter()
        results.append(replay_fast(trace, knobs, hot, threads=cpus))
        threaded.append(time.perf_counter() - start)
        pause_cpu.append(time.process_time() - start_cpu)

    load_before = os.getloadavg()[0]
    quarter = max(1, len(reference_trace.step_bounds()[1]) // (_FAST_RUNS + 1))
    start, start_cpu = time.perf_counter(), time.process_time()
    reference = replay_reference(reference_trace, knobs, hot, pause=(quarter, time_fast))
    reference_s = time.perf_counter() - start - sum(single) - sum(threaded)
    reference_cpu = time.process_time() - start_cpu - sum(pause_cpu)
    while len(single) < _FAST_RUNS:  # a trace too short to pause in three times
        time_fast()
    load_after = os.getloadavg()[0]
    return _Timings(
        reference, reference_s, reference_cpu, single, single_cpu, threaded, results,
        load_before, load_after,
    )  # fmt: skip


def _figures(
    t: _Timings,
    trace: Trace,
    tokens: int,
    prefix: int,
    cpus: int,
    load_s: float,
    identical: bool,
) -> list[Figure]:
    """What the bench prints: the speed-up in CPU time, its spread, threading, the floor, the
    one-time load, the wall time and the peak memory."""
    reference, single, single_cpu, threaded = t.reference, t.single, t.single_cpu, t.threaded
    bandwidth = memory_bandwidth(trace.experts.nbytes, threads=cpus)
    floor_s = trace.experts.nbytes / bandwidth
    # ru_maxrss is KiB on Linux, bytes on macOS; it is the whole process's peak, trace included.
    peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
        1 if sys.platform == "darwin" else 1024
    )
    fast_s, threaded_s = statistics.median(single), statistics.median(threaded)
    fast_cpu = statistics.median(single_cpu)
    scaled_s = t.reference_s * tokens / prefix
    scaled_cpu = t.reference_cpu * tokens / prefix
    how = "measured" if prefix == tokens else f"timed on {prefix:,} tokens, scaled linearly"
    ratio = scaled_cpu / fast_cpu
    spread = max(single_cpu) / min(single_cpu)
    busy = f"load average {t.load_before:.2f} before, {t.load_after:.2f} after, on {cpus} CPUs"
    return [
        Figure(
            name=f"identical decisions ({len(reference.swaps):,} swaps, "
            f"{len(reference.drain_steps):,} drains; one thread and {cpus})",
            value=1.0 if identical else 0.0,
            unit="bool",
            target="1",
            passed=identical,
        ),
        Figure(
            name=f"replay_fast speed-up on one thread, {tokens:,} tokens x {LAYERS} layers x "
            f"top-{TOP_K} (CPU time)",
            value=ratio,
            unit="x",
            baseline=f"replay_reference {scaled_cpu:.1f} CPU s ({how}), replay_fast "
            f"{fast_cpu:.2f} CPU s (median of {_FAST_RUNS}; single runs {_runs(single_cpu)}); "
            f"wall {scaled_s:.1f} s and {fast_s:.2f} s ({scaled_s / fast_s:.1f}x)",
            target=">= 30x",
            passed=ratio >= 30.0,
        ),
        Figure(
            name="spread of replay_fast's single runs on one thread (slowest / fastest CPU time)",
            value=spread,
            unit="x",
            baseline=busy,
            target="<= 1.25x",
            passed=spread <= 1.25,
        ),
        Figure(
            name=f"replay_fast on {cpus} threads over one thread (scaling, wall time)",
            value=fast_s / threaded_s,
            unit="x",
            baseline=f"{threaded_s:.2f} s on {cpus} threads (single runs {_runs(threaded)}); "
            f"{busy}",
        ),
        Figure(
            name="replay_fast on one thread over the floor (reading the trace once)",
            value=fast_cpu / floor_s,
            unit="x",
            baseline=f"floor {floor_s * 1e3:.1f} ms: {trace.experts.nbytes / 1e6:.0f} MB at "
            f"{bandwidth / 1e9:.1f} GB/s, a copy's bytes read + written on {cpus} threads",
        ),
        Figure(
            name="one-time load of the compiled policy code (compile on a fresh install)",
            value=load_s,
            unit="s",
            baseline="numba caches machine code beside the package after the first compile",
        ),
        Figure(
            name="replay_fast wall time on one thread",
            value=fast_s,
            unit="s",
            baseline=f"single runs {_runs(single)}",
            target="< 60 s",
            passed=fast_s < 60.0,
        ),
        Figure(
            name="peak RSS of the whole bench process (trace, both replays)",
            value=peak_bytes / 2**30,
            unit="GiB",
            baseline=f"the trace itself {trace.experts.nbytes / 2**30:.2f} GiB",
            target="< 4 GiB",
            passed=peak_bytes < 4 * 2**30,
        ),
    ]


def _runs(times: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in times)
