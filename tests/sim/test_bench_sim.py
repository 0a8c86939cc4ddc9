"""``harness bench sim`` on its quick trace, through the CLI: both replays decide identically,
and the figures say what they were measured against."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from harness.benchmarks import sim as bench_sim
from tests.conftest import run_cli
from tests.test_benchmarks import assert_figures


@pytest.mark.slow
def test_sim_bench_quick_checks_decisions_and_times_three_fast_runs() -> None:
    result = run_cli("bench", "sim", "--quick", "--json", timeout_s=600)
    assert result.code == 0, result.stdout + result.stderr
    assert_figures("sim", result.stdout)
    figures = json.loads(result.stdout)["figures"]
    identical, speed, spread, scaling, floor, load, wall, memory = figures
    assert identical["name"].startswith("identical decisions") and identical["passed"] is True
    assert speed["name"].startswith("replay_fast speed-up on one thread, 100,000 tokens")
    runs = re.search(r"single runs ([\d., ]+)\)", speed["baseline"])
    assert runs is not None and len(runs.group(1).split(", ")) == 3
    assert speed["value"] > 0 and load["value"] >= 0 and spread["value"] >= 1
    assert scaling["name"].startswith("replay_fast on") and scaling["value"] > 0
    # The floor is reading the trace once: 100k tokens x 40 layers x 6 int16 ids = 48 MB.
    assert floor["name"].endswith("(reading the trace once)") and floor["value"] > 1
    assert "48 MB at" in floor["baseline"]
    assert wall["passed"] is True and memory["passed"] is True


def test_memory_bandwidth_counts_bytes_read_and_written() -> None:
    # A copy of 64 MiB on one thread: some GB/s on any machine this runs on, and the same order
    # on two threads (the copy is split, not repeated).
    one = bench_sim.memory_bandwidth(64 << 20, threads=1, repeats=3)
    two = bench_sim.memory_bandwidth(64 << 20, threads=2, repeats=3)
    assert 1e8 < one < 1e12 and 1e8 < two < 1e12
    assert 0.2 < two / one < 5


def test_the_generated_trace_has_the_benchmark_geometry() -> None:
    trace, hot = bench_sim.generate_trace(5_000, seed=2)
    assert trace.experts.shape == (5_000, bench_sim.LAYERS, bench_sim.TOP_K)
    assert trace.experts.dtype == np.int16 and trace.experts_count == bench_sim.EXPERTS
    assert len(hot) == bench_sim.LAYERS and all(len(h) == bench_sim.HOT_SLOTS for h in hot)
    # Top-k distinct experts a token and layer.
    per_row = np.sort(trace.experts[:100], axis=2)
    assert (np.diff(per_row, axis=2) > 0).all()
