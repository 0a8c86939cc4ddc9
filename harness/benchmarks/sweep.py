"""``harness bench sweep``: a 27-point sweep in parallel processes against one after another.

27 points (drain_every 32/64/128 x swaps_per_layer 1/2/4 x hysteresis 0.1/0.25/0.5) x 2 traces
of 1M tokens x 40 layers x top-6 (``harness bench sim``'s generator, seeds 0 and 1, each tagged
as two phases at its domain shift so T90 is measured), from the benchmark's own map. The tasks
(54: one point on one trace) run three ways over the same traces, each checked to give the same
rows:

* one after another in this process on one thread: the baseline of the speed-up target;
* one after another in this process, each replay on every CPU's thread (what ``--jobs 1`` does);
* in ``--jobs`` processes (one per CPU), one thread each.

The load average before and after is reported: the machine is shared, and a busy one lowers
the speed-up. Quick: 9 points (hysteresis 0.25 only) x 100k tokens.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from harness.benchmarks import Figure
from harness.benchmarks.sim import generate_trace
from harness.policy.residency import PolicyKnobs
from harness.sim.results import CostModel
from harness.sim.simulate import CellSettings
from harness.sim.sweep.evaluate import PointTask
from harness.sim.sweep.workers import default_jobs, run_tasks
from harness.sim.traces import Trace, trace_from_arrays

DRAIN_EVERY = (32, 64, 128)
SWAPS_PER_LAYER = (1, 2, 4)
HYSTERESIS = (0.1, 0.25, 0.5)


def _tagged(tokens: int, seed: int) -> tuple[Trace, list[list[int]]]:
    trace, hot = generate_trace(tokens, seed)
    phase = np.zeros(trace.rows, dtype=np.int64)
    phase[tokens // 2 :] = 1  # the generator shifts domain half way
    tagged = trace_from_arrays(
        trace.experts, phase=phase, experts_count=trace.experts_count, path=f"<bench {seed}>"
    )
    return tagged, hot


def _tasks(hot: list[list[int]], traces: int, hystereses: tuple[float, ...]) -> list[PointTask]:
    tasks = []
    index = 0
    for drain_every in DRAIN_EVERY:
        for swaps in SWAPS_PER_LAYER:
            for hysteresis in hystereses:
                knobs = PolicyKnobs(
                    drain_every=drain_every, swaps_per_layer=swaps, hysteresis=hysteresis
                )
                settings = CellSettings("rowmap", knobs, hot)
                for trace in range(traces):
                    tasks.append(
                        PointTask(f"p{index:03d}", trace, settings, CostModel(), 2.0, 10.0, 4.0,
                                  ("a", "b"))
                    )  # fmt: skip
                index += 1
    return tasks


def _timed(call: object) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    rows = call()  # type: ignore[operator]
    return time.perf_counter() - start, pd.DataFrame(rows)


def run_bench(quick: bool = False) -> list[Figure]:
    """Time the sweep three ways; asserts all three give the same rows."""
    tokens = 100_000 if quick else 1_000_000
    made = [_tagged(tokens, seed) for seed in (0, 1)]
    traces = [t for t, _ in made]
    tasks = _tasks(made[0][1], len(traces), (0.25,) if quick else HYSTERESIS)
    points = len(tasks) // len(traces)
    jobs = default_jobs()
    load_before = os.getloadavg()
    run_tasks(tasks[:1], traces)  # load the compiled kernels before any timing
    one_thread = [replace(t, threads=1) for t in tasks]
    serial_s, serial = _timed(lambda: run_tasks(one_thread, traces, jobs=1))
    threaded_s, threaded = _timed(lambda: run_tasks(tasks, traces, jobs=1))
    parallel_s, parallel = _timed(lambda: run_tasks(tasks, traces, jobs=jobs))
    load_after = os.getloadavg()
    same = serial.equals(parallel) and serial.equals(threaded)
    assert same, "the sweep's rows depend on where its tasks ran"
    speedup = serial_s / parallel_s
    busy = (
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after, "
        f"on {os.cpu_count()} CPUs"
    )
    size = f"{points} points x {len(traces)} traces of {tokens:,} tokens x 40 layers x top-6"
    return [
        Figure(
            name=f"identical rows three ways ({len(tasks)} tasks)",
            value=1.0 if same else 0.0,
            unit="bool",
            target="1",
            passed=same,
        ),
        Figure(
            name=f"sweep speed-up in {jobs} processes over one after another, {size}",
            value=speedup,
            unit="x",
            baseline=f"one thread one after another {serial_s:.1f} s, {jobs} processes "
            f"{parallel_s:.1f} s; {busy}",
            target=">= 1.8x on 2 cores",
            passed=speedup >= 1.8 if jobs >= 2 else None,
        ),
        Figure(
            name="speed-up over one after another with threaded replays (--jobs 1)",
            value=threaded_s / parallel_s,
            unit="x",
            baseline=f"threaded one after another {threaded_s:.1f} s",
        ),
        Figure(name="sweep wall time in processes", value=parallel_s, unit="s"),
        Figure(name="points per second in processes", value=points / parallel_s, unit="points/s"),
    ]
