"""The oracle bound: Belady's MIN with bypass is the fewest loads any policy can make.

Checked against an exhaustive search that may do anything a policy could — load any experts
into any slots before any lookup (prefetching), evict anything, read in place — on every
small case, and against the real replay: no policy's loads fall below it."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from harness.policy.residency import PolicyKnobs
from harness.sim.oracle import min_loads, next_uses, oracle_bound
from harness.sim.replay import replay_fast
from harness.sim.trace_files import load_trace
from tests.conftest import run_cli
from tests.sim.test_simulate import _domain_trace, simulate_domains


def _exhaustive(sequence: list[int], start: frozenset[int], slots: int, experts: int) -> int:
    """The optimum over every hot set before every lookup: changing the set costs one load per
    expert brought in; a lookup outside the set costs one load (read in place)."""
    states = [frozenset(c) for k in range(slots + 1) for c in combinations(range(experts), k)]
    cost = {s: len(s - start) for s in states}
    for expert in sequence:
        cost = {
            s: min(c + len(s - t) for t, c in cost.items()) + (0 if expert in s else 1)
            for s in states
        }
    return min(cost.values())


@pytest.mark.parametrize("seed", range(40))
def test_min_with_bypass_equals_the_exhaustive_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    experts = int(rng.integers(2, 6))
    slots = int(rng.integers(0, min(experts, 3) + 1))
    sequence = rng.integers(0, experts, int(rng.integers(1, 11)))
    start = rng.choice(experts, size=slots, replace=False) if slots else np.zeros(0, np.int64)
    seq = sequence.astype(np.int64)
    got = min_loads(seq, next_uses(seq), start.astype(np.int64), slots, experts)
    assert got == _exhaustive(seq.tolist(), frozenset(start.tolist()), slots, experts)


def test_next_uses_points_at_the_next_lookup_of_the_same_expert() -> None:
    seq = np.array([3, 1, 3, 2, 1, 3], dtype=np.int64)
    assert next_uses(seq).tolist() == [2, 4, 5, 6, 6, 6]


def test_no_policy_replay_loads_fewer_than_the_oracle(tmp_path: Path) -> None:
    _domain_trace(tmp_path / "prose.npy", 0, 1)
    trace = load_trace(tmp_path / "prose.npy")
    hot = [list(range(8))] * trace.layers
    bound = oracle_bound(trace, hot)
    assert bound.lookups == trace.rows * trace.layers * 2 and bound.hot_slots == 8
    policies = (
        PolicyKnobs(policy="frozen"),
        PolicyKnobs(drain_every=8, promote_threshold=1.0),
        PolicyKnobs(drain_every=1, promote_threshold=1.0, swaps_per_layer=8),
    )
    for knobs in policies:
        replayed = replay_fast(trace, knobs, hot).counters()
        assert replayed["lookups"] == bound.lookups
        assert replayed["expert_loads"] >= bound.loads > 0
        if knobs.policy == "frozen":  # a frozen map is no better than the best one in hindsight
            assert replayed["cold_lookups"] >= bound.static_loads > bound.loads
    # More slots never need more loads; as many slots as experts need only the ones not hot.
    wider = oracle_bound(trace, [list(range(12))] * trace.layers)
    assert wider.loads <= bound.loads
    assert oracle_bound(trace, [list(range(16))] * trace.layers).loads == 0


def test_simulate_prints_the_oracle_beside_each_rowmap_cell(tmp_path: Path) -> None:
    result = simulate_domains(tmp_path)
    assert result.code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "Belady's MIN" in line]
    assert len(lines) == 3, result.stdout  # stale, adaptive and seeded are rowmap cells
    assert all("8 hot slots a layer" in line and "best frozen map" in line for line in lines)
    # The bounds are the simulated campaign's own: in analyze --json, the report and record.md.
    analyzed = run_cli("analyze", str(tmp_path / "sim"), "--json")
    assert analyzed.code == 0, analyzed.stderr
    oracle = json.loads(analyzed.stdout)["oracle"]
    assert {b["cell"] for b in oracle} == {"stale", "adaptive", "seeded"}
    assert all(b["policy_loads"] >= b["min_loads"] for b in oracle)
    assert run_cli("report", str(tmp_path / "sim")).code == 0
    assert "<h3>Oracle bounds</h3>" in (tmp_path / "sim" / "report.html").read_text()
    record = (tmp_path / "sim" / "record.md").read_text()
    assert "## Oracle bounds" in record and "Belady's MIN" in record
