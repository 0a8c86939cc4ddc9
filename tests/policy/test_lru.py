"""llama.cpp's expert cache as the simulator models it: one byte-budgeted LRU over every cached
layer (harness/policy/lru.py), and its replay over a trace (harness/sim/replay.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.errors import KnobError, TraceError
from harness.policy.lru import GlobalLruCache
from harness.sim.replay import replay_lru
from harness.sim.traces import trace_from_arrays

# (layer, expert) lookups, and what a 3-expert LRU shared by both layers does with each; the
# cache after the step, least recently used first, worked out by hand.
HAND = [
    ((0, 0), False, [(0, 0)]),
    ((1, 0), False, [(0, 0), (1, 0)]),
    ((0, 1), False, [(0, 0), (1, 0), (0, 1)]),
    ((0, 0), True, [(1, 0), (0, 1), (0, 0)]),
    ((1, 1), False, [(0, 1), (0, 0), (1, 1)]),  # evicts (1, 0): a layer-1 miss took layer 1's
    ((1, 0), False, [(0, 0), (1, 1), (1, 0)]),  # evicts (0, 1): another layer's expert
    ((0, 1), False, [(1, 1), (1, 0), (0, 1)]),
    ((1, 1), True, [(1, 0), (0, 1), (1, 1)]),
]


def test_hand_checked_trace_hits_misses_evictions_and_uploads() -> None:
    cache = GlobalLruCache(budget_bytes=350, expert_bytes=100, layers=2, experts=4)
    assert cache.capacity == 3  # 350 bytes hold three whole 100-byte experts
    for (layer, expert), hit, resident in HAND:
        assert cache.access(layer, expert) is hit, (layer, expert)
        assert cache.resident() == resident
    assert (cache.hits, cache.misses, cache.evictions) == (2, 6, 3)
    assert cache.uploaded_bytes == 600


def test_a_budget_under_one_expert_caches_nothing_and_uploads_nothing() -> None:
    cache = GlobalLruCache(budget_bytes=99, expert_bytes=100, layers=1, experts=2)
    assert [cache.access(0, 0) for _ in range(3)] == [False, False, False]
    assert (cache.hits, cache.misses, cache.uploaded_bytes, cache.resident()) == (0, 3, 0, [])


def test_replay_counts_distinct_experts_per_step_and_only_cached_layers() -> None:
    # Step 0 is a two-token prefill; both tokens chose expert 1 in layer 0: one lookup.
    experts = np.array(
        [
            [[1, 2], [0, 3]],
            [[1, 3], [0, 1]],
            [[2, 1], [3, 3]],
            [[1, 2], [0, 3]],
        ]
    )
    trace = trace_from_arrays(
        experts, steps=[0, 0, 1, 2], prefill=[True, True, False, False], experts_count=4
    )
    # Layer 0 only (n_cpu_moe 1), room for two experts, least recently used first:
    # step 0 (rows 0-1): 1 miss, 2 miss, 3 miss (evicts 1)   -> [2, 3]
    # step 1 (row 2):    2 hit, 1 miss (evicts 3)            -> [2, 1]
    # step 2 (row 3):    1 hit, 2 hit                        -> [1, 2]
    result = replay_lru(trace, budget_bytes=2 * 64, expert_bytes=64, cached_layers=[0])
    assert result.lookups.tolist() == [3, 2, 2]
    assert result.cold_lookups.tolist() == [3, 1, 0]
    assert (result.hits, result.misses, result.evictions) == (3, 4, 2)
    counters = result.counters(record_bytes=64)
    assert counters["bytes_read"] == 4 * 64 and counters["expert_loads"] == 4


def _zipf_trace(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 33) ** 1.2
    rows = [
        [rng.choice(32, size=4, replace=False, p=weights / weights.sum()) for _ in range(6)]
        for _ in range(600)
    ]
    return np.array(rows)


def test_hit_rate_never_falls_as_the_cache_grows() -> None:
    trace = trace_from_arrays(_zipf_trace(7), experts_count=32)
    rates = []
    for experts_held in range(0, 6 * 32 + 1, 8):
        result = replay_lru(trace, budget_bytes=experts_held * 1000, expert_bytes=1000)
        rates.append(result.hits / int(result.lookups.sum()))
    assert rates[0] == 0.0 and rates[-1] > 0.95  # all 192 experts fit: only first uses miss
    assert all(a <= b for a, b in itertools.pairwise(rates)), rates
    assert len(set(rates)) > 10  # and it is not flat


def test_bad_sizes_and_layers_are_refused() -> None:
    with pytest.raises(KnobError, match="expert_bytes: must be a positive integer"):
        GlobalLruCache(1000, 0, 2, 4)
    with pytest.raises(KnobError, match="budget_bytes: must not be negative"):
        GlobalLruCache(-1, 10, 2, 4)
    with pytest.raises(KnobError, match=r"cached_layers: 2 is outside 0\.\.1"):
        GlobalLruCache(1000, 10, 2, 4, cached_layers=[2])
    cache = GlobalLruCache(1000, 10, 2, 4, cached_layers=[0])
    with pytest.raises(TraceError, match="layer 1 is not a cached"):
        cache.access(1, 0)
    with pytest.raises(TraceError, match="outside 2 layers x 4 experts"):
        cache.access(0, 4)
