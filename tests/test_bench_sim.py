"""``harness bench sim`` on its quick trace: both replays run and decide identically."""

from __future__ import annotations

import re

import numpy as np

from harness.benchmarks import sim as bench_sim


def test_sim_bench_quick_checks_decisions_and_times_three_fast_runs() -> None:
    identical, speed, floor, load, wall, memory = bench_sim.run_bench(quick=True)
    assert identical.name.startswith("identical decisions") and identical.passed is True
    assert speed.name.startswith("replay_fast speed-up, 100,000 tokens x 40 layers x top-6")
    runs = re.search(r"single runs ([\d., ]+)\)", speed.baseline)
    assert runs is not None and len(runs.group(1).split(", ")) == 3
    assert speed.value > 0 and load.value >= 0
    assert wall.passed is True and memory.passed is True
    assert floor.name.startswith("replay_fast over the floor") and floor.value > 0


def test_the_floor_counts_every_layers_expert_ids() -> None:
    trace, _ = bench_sim.generate_trace(5_000, seed=2)
    counts = bench_sim.count_floor(trace, chunk=777)  # a chunk that does not divide the rows
    for layer in (0, 17, 39):
        ids = trace.experts[:, layer, :].ravel()
        assert (counts[layer] == np.bincount(ids, minlength=trace.experts_count)).all()
