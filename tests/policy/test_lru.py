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
    cache = GlobalLruCache(budget_bytes=450, expert_bytes=100, layers=2, experts=4)
    assert cache.capacity == 3  # four whole 100-byte slots, one of them upstream's spare
    for (layer, expert), hit, resident in HAND:
        assert cache.access(layer, expert) is hit, (layer, expert)
        assert cache.resident() == resident
    assert (cache.hits, cache.misses, cache.evictions) == (2, 6, 3)
    assert cache.uploaded_bytes == 600


def test_a_budget_under_one_expert_caches_nothing_and_uploads_nothing() -> None:
    cache = GlobalLruCache(budget_bytes=199, expert_bytes=100, layers=1, experts=2)
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
    # Layer 0 only (n_cpu_moe 1), room for four experts (five slots, one spare), least
    # recently used first, misses inserted in ascending order after the ubatch's hits:
    # step 0 (rows 0-1): 1, 2, 3 miss                       -> [1, 2, 3]
    # step 1 (row 2):    2 hit, 1 hit                       -> [3, 2, 1]
    # step 2 (row 3):    1 hit, 2 hit                       -> [3, 1, 2]
    result = replay_lru(trace, budget_bytes=5 * 64, expert_bytes=64, cached_layers=[0])
    assert result.lookups.tolist() == [3, 2, 2]
    assert result.cold_lookups.tolist() == [3, 0, 0]
    assert (result.hits, result.misses, result.evictions) == (4, 3, 0)
    counters = result.counters(record_bytes=64)
    assert counters["bytes_read"] == 3 * 64 and counters["expert_loads"] == 3
    # Room for three: the two-token prefill could select four experts, more than the slots, so
    # it skips the cache (neither hit nor miss), as upstream's get_slot_map decides.
    small = replay_lru(trace, budget_bytes=4 * 64, expert_bytes=64, cached_layers=[0])
    assert small.lookups.tolist() == [0, 2, 2] and small.cold_lookups.tolist() == [0, 2, 0]


def test_a_ubatch_plans_its_hits_before_its_misses_and_skips_the_cache_over_32_tokens() -> None:
    cache = GlobalLruCache(budget_bytes=4 * 10, expert_bytes=10, layers=1, experts=8)
    assert cache.access_step(np.array([[[5, 1, 3]]])) == (3, 3)
    assert cache.resident() == [(0, 1), (0, 3), (0, 5)]  # misses in ascending order
    # 1 is a hit: it moves to the recent end before 0 and 7 evict, so it survives them (taken
    # one lookup at a time in selection order, 7 would have evicted it first).
    assert cache.access_step(np.array([[[7, 1, 0]]])) == (3, 2)
    assert cache.resident() == [(0, 1), (0, 0), (0, 7)]
    assert (cache.hits, cache.misses, cache.evictions) == (1, 5, 2)
    # A 33-token ubatch (a prompt chunk) neither hits nor misses; 9 tokens count as "> 8".
    assert cache.access_step(np.zeros((33, 1, 3), dtype=int)) == (0, 0)
    assert cache.bypassed == 1
    assert cache.small_batches == (1, 5)
    wide = GlobalLruCache(budget_bytes=9 * 10, expert_bytes=10, layers=1, experts=8)
    assert wide.access_step(np.array([[[0, 1, 7]]] * 9)) == (3, 3)
    assert wide.small_batches == (0, 0) and (wide.hits, wide.misses) == (0, 3)


class _UpstreamLru:
    """A line-by-line port of upstream's ``moe_cache_lru`` (src/llama-moe-cache.cpp at
    ggml-org/llama.cpp 4b060f27): slots in a doubly linked list, head the least recently
    used, a slot map per layer. The reference the simulator's cache is checked against."""

    def __init__(self, layers: int, experts: int, slots: int) -> None:
        self.experts, self.slots = experts, slots
        self.slot_map = [[-1] * experts for _ in range(layers)]
        self.key_of = [-1] * slots
        self.prev = [s - 1 for s in range(slots)]
        self.next = [s + 1 if s + 1 < slots else -1 for s in range(slots)]
        self.head, self.tail = 0, slots - 1

    def touch(self, s: int) -> None:
        if s == self.tail:
            return
        if self.prev[s] >= 0:
            self.next[self.prev[s]] = self.next[s]
        else:
            self.head = self.next[s]
        self.prev[self.next[s]] = self.prev[s]
        self.prev[s], self.next[s] = self.tail, -1
        self.next[self.tail] = s
        self.tail = s

    def plan(self, layer: int, ids: list[int]) -> tuple[int, int]:
        uniq = list(dict.fromkeys(ids))
        assert len(uniq) <= self.slots
        slots = self.slot_map[layer]
        hits = 0
        for e in uniq:
            if slots[e] >= 0:
                self.touch(slots[e])
                hits += 1
        fills = 0
        for e in sorted(uniq):
            if slots[e] >= 0:
                continue
            s = self.head
            if self.key_of[s] >= 0:
                old = self.key_of[s]
                self.slot_map[old // self.experts][old % self.experts] = -1
            self.key_of[s] = layer * self.experts + e
            slots[e] = s
            self.touch(s)
            fills += 1
        return hits, fills


def test_the_cache_replays_a_trace_as_a_port_of_upstreams_plan_does() -> None:
    rng = np.random.default_rng(11)
    layers, experts, top_k, slots = 3, 16, 2, 9
    weights = 1.0 / np.arange(1, experts + 1) ** 1.1
    steps = [int(n) for n in rng.choice([1, 1, 1, 2, 4, 40], size=300)]
    ours = GlobalLruCache((slots + 1) * 100, 100, layers, experts)
    port = _UpstreamLru(layers, experts, slots)
    for tokens in steps:
        chosen = np.array(
            [
                [rng.choice(experts, size=top_k, replace=False, p=weights / weights.sum())
                 for _ in range(layers)]
                for _ in range(tokens)
            ]
        )  # fmt: skip
        lookups, misses = ours.access_step(chosen)
        if tokens > 32 or tokens * top_k > slots:  # upstream's get_slot_map: no cache
            assert (lookups, misses) == (0, 0)
            continue
        want_hits = want_fills = 0
        for layer in range(layers):
            hits, fills = port.plan(layer, chosen[:, layer, :].reshape(-1).tolist())
            want_hits, want_fills = want_hits + hits, want_fills + fills
        assert (lookups - misses, misses) == (want_hits, want_fills)
    resident = {layer * experts + e for layer, e in ours.resident()}
    assert resident == {k for k in port.key_of if k >= 0}
    assert ours.bypassed > 0 and ours.hits > 0


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
    for experts_held in range(8, 6 * 32 + 1, 8):  # one token's 4 experts need 4 slots
        result = replay_lru(trace, budget_bytes=(experts_held + 1) * 1000, expert_bytes=1000)
        rates.append(result.hits / int(result.lookups.sum()))
    assert rates[-1] > 0.95  # all 192 experts fit: only first uses miss
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
