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
from harness.sim.oracle import cache_oracle_bound, min_loads, next_uses, oracle_bound
from harness.sim.replay import replay_cache, replay_fast, replay_lru
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


def _exhaustive_demand(sequence: list[int], start: frozenset[int], slots: int) -> int:
    """The optimum of a cache that admits every miss: a miss costs one load and takes a slot,
    evicting any one held expert when all are taken; every choice is tried."""
    cost = {start: 0}
    for expert in sequence:
        following: dict[frozenset[int], int] = {}
        for held, c in cost.items():
            if expert in held:
                options, step = [held], 0
            elif len(held) < slots:
                options, step = [held | {expert}], 1
            else:
                options, step = [(held - {x}) | {expert} for x in held], 1
            for option in options:
                following[option] = min(following.get(option, c + step), c + step)
        cost = following
    return min(cost.values())


@pytest.mark.parametrize("seed", range(40))
def test_min_admitting_every_miss_equals_the_exhaustive_optimum(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    experts = int(rng.integers(2, 7))
    slots = int(rng.integers(1, min(experts, 4) + 1))
    seq = rng.integers(0, experts, int(rng.integers(1, 13))).astype(np.int64)
    start = rng.choice(experts, size=int(rng.integers(0, slots + 1)), replace=False)
    got = min_loads(seq, next_uses(seq), start.astype(np.int64), slots, experts, False)
    assert got == _exhaustive_demand(seq.tolist(), frozenset(start.tolist()), slots)
    # Reading in place where it pays never needs more loads than admitting every miss.
    assert min_loads(seq, next_uses(seq), start.astype(np.int64), slots, experts) <= got


def test_no_cache_replay_loads_fewer_than_its_oracle(tmp_path: Path) -> None:
    """Seed 004's hotlist cache and llama.cpp's LRU, each against OPT on the lookups it served."""
    _domain_trace(tmp_path / "prose.npy", 0, 1)
    trace = load_trace(tmp_path / "prose.npy")
    keys_count = trace.layers * trace.experts_count
    offsets = (np.arange(trace.layers) * trace.experts_count)[:, None]
    keys = trace.experts.astype(np.int64) + offsets
    hotlist = [(layer, expert) for expert in range(4) for layer in range(trace.layers)]
    for priority in ("legacy", "adaptive"):
        replayed = replay_cache(trace, 24, hotlist, priority).counters()
        start = [layer * trace.experts_count + expert for layer, expert in hotlist]
        bound = cache_oracle_bound(keys, start, 24, keys_count)
        assert bound.scope == "cache" and bound.lookups == replayed["lookups"]
        assert replayed["expert_loads"] >= bound.loads > 0, priority
        assert bound.static_loads > bound.loads  # pinning the best 24 is no better than OPT
    for budget in (9, 25):  # experts of 1 byte: 8 and 24 slots (one spare, as upstream's)
        trail: list[int] = []
        lru = replay_lru(trace, budget, 1, None, trail).counters()
        assert len(trail) == lru["lookups"]
        bound = cache_oracle_bound(trail, [], budget - 1, keys_count)
        assert lru["expert_loads"] >= bound.loads > 0, budget
    # The whole key space in the cache: only the first lookup of each record loads.
    everything = cache_oracle_bound(keys, [], keys_count, keys_count)
    assert everything.loads == len(np.unique(keys))


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


def test_simulate_prints_the_oracle_beside_every_cell(tmp_path: Path) -> None:
    result = simulate_domains(tmp_path, "  cached: {knobs: {cache_records: 24}}\n")
    assert result.code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "Belady's MIN" in line]
    assert len(lines) == 4, result.stdout  # three rowmap cells and a cache cell
    rowmaps = [line for line in lines if "8 hot slots a layer" in line]
    assert len(rowmaps) == 3 and all("best frozen map" in line for line in rowmaps)
    (cached,) = [line for line in lines if "24 records in all, every miss admitted" in line]
    assert "best frozen set" in cached
    # The bounds are the simulated campaign's own: in analyze --json, the report and record.md.
    analyzed = run_cli("analyze", str(tmp_path / "sim"), "--json")
    assert analyzed.code == 0, analyzed.stderr
    oracle = json.loads(analyzed.stdout)["oracle"]
    assert {b["cell"] for b in oracle} == {"stale", "adaptive", "seeded", "cached"}
    assert all(b["policy_loads"] >= b["min_loads"] for b in oracle)
    assert {b["cell"]: b["scope"] for b in oracle}["cached"] == "cache"
    assert run_cli("report", str(tmp_path / "sim")).code == 0
    page = (tmp_path / "sim" / "report.html").read_text()
    assert "<h3>Oracle bounds</h3>" in page and "24 in all" in page and "8 a layer" in page
    record = (tmp_path / "sim" / "record.md").read_text()
    assert "## Oracle bounds" in record and "Belady's MIN" in record and "24 in all" in record
