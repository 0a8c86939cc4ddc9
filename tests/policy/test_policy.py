"""Residency policies: seed 000's adaptive swaps and seed 004's hotlist-seeded expert cache."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import KnobError, MapError, TraceError
from harness.policy.residency import (
    MAX_PRIORITY,
    ExpertCache,
    PolicyKnobs,
    ResidencyPolicy,
    Swap,
    parse_priority,
)

NO_DECAY = math.inf


def knobs(**changes: object) -> PolicyKnobs:
    """Default knobs without decay (integer counts) and a short drain interval, plus changes."""
    values: dict[str, object] = {"decay_half_life_steps": NO_DECAY, "drain_every": 4}
    values.update(changes)
    return PolicyKnobs(**values)  # type: ignore[arg-type]


def feed(policy: ResidencyPolicy, picks: Sequence[int], start: int = 1) -> list[Swap]:
    """One layer, top-1: step start+i chooses picks[i]; returns every swap applied."""
    swaps: list[Swap] = []
    for offset, expert in enumerate(picks):
        swaps += policy.observe(start + offset, np.array([[expert]]))
    return swaps


@pytest.mark.parametrize(("threshold", "swapped"), [(2.0, False), (1.0, True)])
def test_promotion_needs_the_threshold(threshold: float, swapped: bool) -> None:
    policy = ResidencyPolicy(knobs(promote_threshold=threshold), [[0, 1]], experts=4)
    # Counts at the drain (step 4): e0 = 3, e2 = 1, e1 = 0 (the weakest hot expert).
    swaps = feed(policy, [0, 2, 0, 0])
    expected = [Swap(step=4, layer=0, promoted=2, evicted=1)] if swapped else []
    assert swaps == expected


@pytest.mark.parametrize(("hysteresis", "swapped"), [(0.25, True), (0.5, False)])
def test_promotion_needs_the_hysteresis_margin(hysteresis: float, swapped: bool) -> None:
    policy = ResidencyPolicy(knobs(hysteresis=hysteresis, drain_every=10), [[0]], experts=2)
    # At step 10: hot e0 = 4, cold e1 = 6; 6 > 4 * 1.25 but not > 4 * 1.5.
    swaps = feed(policy, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    assert bool(swaps) is swapped
    assert policy.hot_sets() == ([[1]] if swapped else [[0]])


def test_budget_is_per_layer_and_cut_candidates_saturate_the_layer() -> None:
    policy = ResidencyPolicy(knobs(swaps_per_layer=2), [[0, 1, 2], [0, 1, 2]], experts=6)
    step_choice = np.array([[3, 4, 5], [3, 4, 5]])
    swaps: list[Swap] = []
    for step in range(1, 5):
        swaps += policy.observe(step, step_choice)
    # Ties: the lowest cold id is promoted first; the highest hot id is evicted first.
    assert swaps == [
        Swap(4, 0, 3, 2),
        Swap(4, 0, 4, 1),
        Swap(4, 1, 3, 2),
        Swap(4, 1, 4, 1),
    ]
    assert policy.saturated_layers() == 2  # expert 5 met the rule too, past the budget
    for step in range(5, 9):
        swaps = policy.observe(step, step_choice)
    assert swaps == [Swap(8, 0, 5, 0), Swap(8, 1, 5, 0)]
    assert policy.saturated_layers() == 0
    assert policy.hot_sets() == [[3, 4, 5], [3, 4, 5]]


def test_prefill_steps_are_not_counted_and_do_not_drain() -> None:
    policy = ResidencyPolicy(knobs(promote_threshold=1.0), [[0]], experts=3)
    for step in range(1, 9):
        assert policy.observe(step, np.array([[2]]), prefill=True) == []
    assert policy.counts().tolist() == [[0.0, 0.0, 0.0]]
    for step in range(9, 12):
        assert policy.observe(step, np.array([[2]])) == []
    # The fourth decode step drains, whatever its step number.
    assert policy.observe(12, np.array([[2]])) == [Swap(12, 0, 2, 0)]
    assert policy.counts().tolist() == [[0.0, 0.0, 4.0]]


def test_drains_fall_every_n_decode_steps_so_prefill_steps_cannot_swallow_them() -> None:
    # 60-step requests with drain_every 64 used to drain never: every step % 64 == 0 was a
    # prefill step. Drains now count decode steps.
    policy = ResidencyPolicy(knobs(promote_threshold=1.0, drain_every=4), [[0]], experts=2)
    drained: list[int] = []
    for step in range(1, 41):
        prefill = step % 4 == 0  # every multiple of drain_every is a prefill step
        due = not prefill and policy.drain_due()
        policy.observe(step, np.array([[1]]), prefill=prefill)
        if due:
            drained.append(step)
    decode_steps = [step for step in range(1, 41) if step % 4]
    assert drained == decode_steps[3::4]


def test_swaps_happen_only_at_drain_points() -> None:
    policy = ResidencyPolicy(knobs(promote_threshold=1.0, drain_every=8), [[0]], experts=2)
    for step in range(1, 8):
        assert policy.observe(step, np.array([[1]])) == []
    assert policy.observe(8, np.array([[1]]), prefill=True) == []
    assert policy.observe(9, np.array([[1]])) == [Swap(9, 0, 1, 0)]
    # Step 17 drains too, but e0 = 8 does not beat e1 = 8 by the hysteresis until step 25.
    assert feed(policy, [0] * 15, start=10) == []
    assert policy.observe(25, np.array([[0]])) == [Swap(25, 0, 0, 1)]


def test_a_batched_decode_step_is_one_step_with_all_its_tokens_counted() -> None:
    policy = ResidencyPolicy(knobs(promote_threshold=1.0, drain_every=2), [[0]], experts=3)
    batch = np.array([[[1]], [[2]], [[2]]])  # three sequences decode in one host step
    assert policy.observe(1, batch) == []
    assert policy.counts().tolist() == [[0.0, 1.0, 2.0]]
    assert policy.observe(2, batch) == [Swap(2, 0, 2, 0)]


def test_frozen_counts_but_never_swaps() -> None:
    policy = ResidencyPolicy(knobs(policy="frozen", promote_threshold=1.0), [[0]], experts=2)
    assert feed(policy, [1] * 12) == []
    assert policy.counts()[0, 1] == 12.0
    assert policy.hot_sets() == [[0]]
    policy.set_knobs(knobs(promote_threshold=1.0))
    # A drain has been due since step 4: the first decode step after unfreezing drains.
    assert feed(policy, [1] * 4, start=13) == [Swap(13, 0, 1, 0)]


def test_hot_mask_is_a_read_only_live_view() -> None:
    policy = ResidencyPolicy(knobs(promote_threshold=1.0), [[0]], experts=2)
    mask = policy.hot_mask
    with pytest.raises(ValueError, match="read-only"):
        mask[0, 1] = True
    feed(policy, [1, 1, 1, 1])
    assert mask.tolist() == [[False, True]]


def test_counts_are_an_ewma_read_at_every_drain() -> None:
    """Each drain reads the counters: counts = counts * 0.5 ** (elapsed / half-life) + new."""
    rng = np.random.default_rng(7)
    layers, experts, half_life = 3, 10, 5.0
    rule = PolicyKnobs(decay_half_life_steps=half_life, drain_every=3, promote_threshold=1e9)
    policy = ResidencyPolicy(rule, [[0]] * layers, experts)
    expected = np.zeros((layers, experts))
    pending = np.zeros((layers, experts))
    read_at: int | None = None
    step = 0
    for _ in range(400):
        step += int(rng.integers(1, 10))
        chosen = np.stack([rng.choice(experts, 2, replace=False) for _ in range(layers)])
        prefill = bool(rng.random() < 0.2)
        drains = not prefill and policy.drain_due()
        policy.observe(step, chosen, prefill=prefill)
        if prefill:
            continue
        for layer in range(layers):
            pending[layer, chosen[layer]] += 1
        if drains:
            elapsed = 0 if read_at is None else step - read_at
            expected = expected * 0.5 ** (elapsed / half_life) + pending
            pending[:] = 0
            read_at = step
    assert read_at is not None
    since = 0.5 ** ((step - read_at) / half_life)
    assert policy.counts() == pytest.approx(expected * since + pending, rel=1e-9, abs=1e-12)


def test_long_idle_counts_flush_to_zero_instead_of_going_subnormal() -> None:
    rule = PolicyKnobs(decay_half_life_steps=1.0, drain_every=1, promote_threshold=1e9)
    policy = ResidencyPolicy(rule, [[0]], experts=3)
    policy.observe(1, np.array([[2]]))
    for step in range(2, 1200):
        policy.observe(step, np.array([[1]]))
    assert policy.counts()[0, 2] == 0.0  # 2 ** -1198 would be subnormal


def reference_plan(
    counts: np.ndarray, hot: np.ndarray, knobs: PolicyKnobs
) -> tuple[list[tuple[int, int, int]], int]:
    """The promotion rule written plainly: (layer, promoted, evicted) swaps and saturated
    layers."""
    swaps: list[tuple[int, int, int]] = []
    saturated = 0
    for layer in range(counts.shape[0]):
        row = counts[layer].tolist()
        cold = sorted((e for e in range(len(row)) if not hot[layer, e]), key=lambda e: (-row[e], e))
        warm = sorted((e for e in range(len(row)) if hot[layer, e]), key=lambda e: (row[e], -e))
        eligible = 0
        for c, h in zip(cold, warm, strict=False):
            if row[c] >= knobs.promote_threshold and row[c] > row[h] * (1 + knobs.hysteresis):
                eligible += 1
            else:
                break
        applied = min(eligible, knobs.swaps_per_layer)
        swaps += [(layer, cold[i], warm[i]) for i in range(applied)]
        saturated += eligible > applied
    return swaps, saturated


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    experts=st.integers(2, 9),
    budget=st.integers(0, 3),
    threshold=st.sampled_from([0.0, 1.0, 2.5]),
    hysteresis=st.sampled_from([0.0, 0.25, 1.0]),
    half_life=st.sampled_from([3.0, 64.0, NO_DECAY]),
)
def test_drains_follow_the_plain_rule(
    seed: int, experts: int, budget: int, threshold: float, hysteresis: float, half_life: float
) -> None:
    rng = np.random.default_rng(seed)
    layers, top_k = 3, min(2, experts - 1)
    rule = PolicyKnobs(
        decay_half_life_steps=half_life,
        promote_threshold=threshold,
        hysteresis=hysteresis,
        drain_every=3,
        swaps_per_layer=budget,
    )
    hot = [sorted(rng.choice(experts, int(rng.integers(1, experts)), replace=False).tolist())]
    policy = ResidencyPolicy(rule, hot * layers, experts)
    skew = rng.dirichlet(np.ones(experts) * 0.5)
    for step in range(1, 40):
        chosen = np.stack(
            [rng.choice(experts, top_k, replace=False, p=skew) for _ in range(layers)]
        )
        before = policy.hot_mask.copy()
        swaps = policy.observe(step, chosen)
        if step % 3:
            assert swaps == []
            continue
        expected, saturated = reference_plan(policy.counts(), before, rule)
        assert [(s.layer, s.promoted, s.evicted) for s in swaps] == expected
        assert policy.saturated_layers() == saturated
        assert (policy.hot_mask.sum(axis=1) == before.sum(axis=1)).all()


def domain_stream(
    rng: np.random.Generator, domain: np.ndarray, layers: int, top_k: int
) -> np.ndarray:
    """One step's choices from a domain's experts, skewed towards its first ones."""
    weights = 1.0 / np.arange(1, len(domain) + 1)
    weights /= weights.sum()
    return np.stack(
        [domain[rng.choice(len(domain), top_k, replace=False, p=weights)] for _ in range(layers)]
    )


def run_shift(seed: int) -> tuple[list[float], list[Swap], int]:
    """Route over X, then over Y: cold share per 100-step window, swaps, peak saturated
    layers."""
    rng = np.random.default_rng(seed)
    layers, experts, top_k = 4, 64, 4
    domain_x, domain_y = np.arange(0, 16), np.arange(32, 48)
    policy = ResidencyPolicy(PolicyKnobs(), [domain_x.tolist()] * layers, experts)
    shares: list[float] = []
    swaps: list[Swap] = []
    cold = 0
    peak_saturated = 0
    for step in range(1, 3001):
        chosen = domain_stream(rng, domain_x if step <= 1000 else domain_y, layers, top_k)
        cold += policy.count_cold(chosen)
        swaps += policy.observe(step, chosen)
        peak_saturated = max(peak_saturated, policy.saturated_layers())
        if step % 100 == 0:
            shares.append(cold / (100 * layers * top_k))
            cold = 0
    return shares, swaps, peak_saturated


def test_domain_shift_raises_cold_share_and_the_policy_brings_it_down() -> None:
    shares, swaps, peak_saturated = run_shift(seed=3)
    assert max(shares[:10]) == 0.0  # X is hot from boot
    assert shares[10] > 0.9  # the first window after the shift reads almost all cold
    assert max(shares[-5:]) < 0.05  # Y has been promoted
    assert all(swap.step > 1000 for swap in swaps)
    assert {swap.promoted for swap in swaps} <= set(range(32, 48))
    assert peak_saturated > 0  # the queue saturated on the way


def test_policy_is_deterministic() -> None:
    assert run_shift(seed=5) == run_shift(seed=5)


def test_invalid_knobs_name_the_knob() -> None:
    cases = {
        "policy": PolicyKnobs(policy="eager"),  # type: ignore[arg-type]
        "decay_half_life_steps": PolicyKnobs(decay_half_life_steps=0),
        "promote_threshold": PolicyKnobs(promote_threshold=-1),
        "hysteresis": PolicyKnobs(hysteresis=math.nan),
        "drain_every": PolicyKnobs(drain_every=0),
        "swaps_per_layer": PolicyKnobs(swaps_per_layer=1.5),  # type: ignore[arg-type]
    }
    for name, bad in cases.items():
        with pytest.raises(KnobError, match=rf"^{name}: must be"):
            bad.validate()


def test_bad_hot_sets_and_steps_are_refused() -> None:
    with pytest.raises(MapError, match=r"layer 1: ids \[9\] are not in 0..3"):
        ResidencyPolicy(PolicyKnobs(), [[0], [9]], experts=4)
    with pytest.raises(MapError, match=r"ids \[1\] are listed twice"):
        ResidencyPolicy(PolicyKnobs(), [[1, 1]], experts=4)
    policy = ResidencyPolicy(PolicyKnobs(), [[0]], experts=4)
    with pytest.raises(TraceError, match=r"expert ids \[-1, 4\]"):
        policy.observe(1, np.array([[4, -1]]))
    with pytest.raises(TraceError, match="shape"):
        policy.observe(1, np.array([[1], [2]]))
    policy.observe(5, np.array([[1]]))
    with pytest.raises(TraceError, match="backwards"):
        policy.observe(4, np.array([[1]]))


# --- seed 004: the expert cache ----------------------------------------------------------


def test_cache_is_lfu_then_lru() -> None:
    cache = ExpertCache(2, [], "adaptive", layers=1, experts=8)
    assert [cache.access(0, e) for e in (1, 2, 1)] == [False, False, True]
    assert cache.last_evicted is None
    assert cache.access(0, 3) is False  # evicts (0, 2): priority 1 against (0, 1)'s 2
    assert cache.last_evicted == (0, 2)
    assert cache.resident() == [(0, 1), (0, 3)]
    assert cache.access(0, 4) is False  # (0, 3) has priority 1, the lowest; evicted
    assert cache.resident() == [(0, 1), (0, 4)]
    assert (cache.hits, cache.misses, cache.loads, cache.evictions) == (1, 4, 4, 2)


def test_cache_ties_evict_the_least_recently_used() -> None:
    cache = ExpertCache(2, [], "adaptive", layers=1, experts=8)
    for expert in (5, 6, 7):
        cache.access(0, expert)
    assert cache.resident() == [(0, 6), (0, 7)]


@pytest.mark.parametrize(
    ("priority", "expected"),
    [("legacy", [3, 2, 1]), ("adaptive", [1, 1, 1]), (7, [7, 7, 7])],
)
def test_hotlist_priors(priority: str | int, expected: list[int]) -> None:
    hotlist = [(0, 4), (1, 2), (0, 4), (0, 1), (1, 0)]  # a duplicate, and one past capacity
    cache = ExpertCache(3, hotlist, priority, layers=2, experts=8)  # type: ignore[arg-type]
    assert cache.preloaded == 3
    assert [cache.priority_of(*entry) for entry in [(0, 4), (1, 2), (0, 1)]] == expected
    assert cache.priority_of(1, 0) is None


def stale_workload_hit_rate(priority: str | int) -> float:
    """A hotlist fitted on experts 0..23 of each layer; the workload routes mostly to 24..47."""
    rng = np.random.default_rng(11)
    layers, experts, top_k = 4, 64, 4
    hotlist = [(layer, expert) for expert in range(24) for layer in range(layers)]
    weights = 1.0 / np.arange(1, 25) ** 0.8
    weights /= weights.sum()
    cache = ExpertCache(96, hotlist, priority, layers, experts)  # type: ignore[arg-type]
    for _ in range(64):
        base = 24 if rng.random() < 0.9 else 0
        chosen = np.stack(
            [base + rng.choice(24, top_k, replace=False, p=weights) for _ in range(layers)]
        )
        hits, misses = cache.access_step(chosen)
        assert hits + misses == layers * top_k
    return cache.hits / (cache.hits + cache.misses)


def test_adaptive_priority_escapes_a_stale_hotlist_and_legacy_locks_in() -> None:
    legacy = stale_workload_hit_rate("legacy")
    adaptive = stale_workload_hit_rate("adaptive")
    assert adaptive > legacy + 0.3
    assert stale_workload_hit_rate(1) == adaptive


class ReferenceCache:
    """The cache rule by linear scan, to check the heap version against."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[tuple[int, int], tuple[int, int]] = {}
        self.clock = 0

    def access(self, key: tuple[int, int]) -> bool:
        self.clock += 1
        if key in self.entries:
            self.entries[key] = (self.entries[key][0] + 1, self.clock)
            return True
        if len(self.entries) >= self.capacity:
            victim = min(self.entries, key=lambda k: (*self.entries[k], k))
            del self.entries[victim]
        self.entries[key] = (1, self.clock)
        return False


@settings(max_examples=50, deadline=None)
@given(
    capacity=st.integers(1, 6),
    accesses=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5)), max_size=300),
)
def test_heap_cache_matches_a_linear_scan(capacity: int, accesses: list[tuple[int, int]]) -> None:
    cache = ExpertCache(capacity, [], "adaptive", layers=2, experts=6)
    reference = ReferenceCache(capacity)
    for key in accesses:
        assert cache.access(*key) == reference.access(key)
    assert cache.resident() == sorted(reference.entries)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("legacy", "legacy"), ("adaptive", "adaptive"), ("1", 1), ("3097", 3097)],
)
def test_parse_priority_accepts(text: str, expected: str | int) -> None:
    assert parse_priority(text) == expected


@pytest.mark.parametrize(
    "text", ["0", "-1", "abc", "", "1.5", "+3", " 7", "Legacy", str(MAX_PRIORITY + 1), "9" * 40]
)
def test_parse_priority_refuses(text: str) -> None:
    with pytest.raises(KnobError, match="must be one of legacy, adaptive, or a positive integer"):
        parse_priority(text)


def test_cache_refuses_bad_settings() -> None:
    with pytest.raises(KnobError, match="capacity"):
        ExpertCache(0, [], "adaptive", layers=1, experts=4)
    with pytest.raises(KnobError, match="priority 0"):
        ExpertCache(4, [], 0, layers=1, experts=4)
    with pytest.raises(TraceError, match=r"hotlist entry 1: \(layer 3, expert 0\)"):
        ExpertCache(4, [(0, 0), (3, 0)], "adaptive", layers=1, experts=4)
