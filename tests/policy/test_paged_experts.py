"""SGLang's Paged Experts residency as the harness replays it (harness/policy/paged_experts.py),
and the replayed hit rate a run's counters give; its agreement with SGLang's own code is
tests/engines/test_sglang_paged_residency.py."""

from __future__ import annotations

import numpy as np
import pytest

from harness.analyze.metrics import counter_metrics
from harness.catalog import COUNTERS, METRICS
from harness.errors import KnobError, TraceError
from harness.policy.paged_experts import PagedExpertsLru, replay_paged_experts


def test_hand_checked_steps_and_waves() -> None:
    # Two slots (experts 0, 1 at boot, 0 least recently used), worked out by hand.
    policy = PagedExpertsLru(2)
    assert policy.step([1, 2]) == 1  # 1 resident; 2 evicts 0
    assert list(policy.resident) == [1, 2]
    # Four experts for two slots: the resident 1 and 2 are the first wave (no page-in), then
    # 0 and 3 evict them both.
    assert policy.step([0, 1, 2, 3]) == 2
    assert list(policy.resident) == [0, 3]
    assert policy.resident == {0: 1, 3: 0}  # each took the slot of the expert it evicted
    assert policy.step([3]) == 0
    assert policy.step([]) == 0  # a step that routes nothing (padding) pages nothing


def test_replay_over_recorded_passes() -> None:
    counts = np.zeros((3, 2, 4), dtype=np.int64)
    counts[0, 0, [1, 2]] = [3, 1]  # the hand-checked steps on layer 0
    counts[1, 0, :] = 1
    counts[2, 0, 3] = 5
    counts[:, 1, 0] = 2  # layer 1: expert 0, resident from boot, every pass
    replayed = replay_paged_experts(counts, 2)
    assert (replayed.hits, replayed.misses) == (1 + 2 + 1 + 3, 1 + 2)
    assert replayed.hit_rate == pytest.approx(7 / 10)
    # More slots than experts: SGLang caps them at the layer's experts, all resident.
    assert replay_paged_experts(counts, 64).misses == 0
    assert replay_paged_experts(np.zeros((0, 2, 4)), 2).hit_rate is None
    with pytest.raises(TraceError, match="passes, layers, experts"):
        replay_paged_experts(counts[0], 2)
    with pytest.raises(KnobError, match="num_resident"):
        replay_paged_experts(counts, 0)


def test_the_replayed_hit_rate_is_named_and_described_as_replayed() -> None:
    metrics = counter_metrics({"delta": {"replayed_hits": 7.0, "replayed_misses": 3.0}})
    assert metrics["replayed_hit_rate"] == pytest.approx(0.7)
    assert metrics["hit_rate"] is None  # never the measured hit rate
    assert counter_metrics({"delta": {"replayed_hits": 7.0}})["replayed_hit_rate"] is None
    assert METRICS["replayed_hit_rate"].description.startswith("REPLAYED, not measured")
    for name in ("replayed_hits", "replayed_misses"):
        assert COUNTERS[name].startswith("REPLAYED, not measured")
