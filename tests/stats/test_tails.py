"""Conservative tail bounds (harness/stats/tails.py) against MLPerf LoadGen's published figures.

LoadGen (mlcommons/inference, loadgen/results.cc) prints, for single-stream (p90) and
multi-stream (p99) runs at confidence 0.99 and tolerance 0:

    * Processed at least 64 queries (N).          <- min_samples(0.90), t = 1
    * Would discard K highest latency queries.    <- allowed_over(N) - 1
    ... would need to process at least 662 total queries.   <- min_samples(0.99), t = 1

The published runs quoted below are MLPerf Inference v4.1 submissions
(github.com/mlcommons/inference_results_v4.1 at a2f5d66d17e8f75c02fd74dfe810ecca6a046696) and a
v3.1 one (github.com/ctuning/mlperf_inference_submissions_v3.1, quoted in mlcommons/ck's GPT-J
guide), each file's ``mlperf_log_summary.txt``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from harness.stats.tails import (
    allowed_over,
    compare_tails,
    lower_bound,
    min_samples,
    upper_bound,
)

UNTETHER = "closed/UntetherAI/compliance/h13_u1_preview/resnet50"
CTUNING = (
    "open/cTuning/results/amd_zen4_workstation-reference-gpu-pytorch-v2.0.1-default_config/"
    "gptj-99/singlestream/performance/run_1"
)


def test_loadgen_minimum_query_counts_at_p90_and_p99() -> None:
    # "Processed at least 64 queries" (every single-stream summary, p90) and "would need to
    # process at least 662 total queries" (the p99 estimate; min_query_count 662 in
    # {UNTETHER}/multistream/TEST04/performance/run_1/mlperf_log_summary.txt).
    assert min_samples(0.90) == 64
    assert min_samples(0.99) == 662
    # One sample fewer does not show the quantile: no estimate at all.
    assert upper_bound(np.arange(63.0), 0.90).value is None
    assert upper_bound(np.arange(64.0), 0.90).value == 63.0
    assert upper_bound(np.arange(661.0), 0.99).needed == 662


def test_no_sample_over_needs_the_first_bracket_of_early_stopping() -> None:
    # t = 0: the chance is (p - d)^n, so n = ceil(ln(1 - c) / ln(p - d)) (early_stopping.cc's
    # first bracket): 459 at p99, 44 at p90.
    assert min_samples(0.99, 0) == math.ceil(math.log(0.01) / math.log(0.99)) == 459
    assert min_samples(0.90, 0) == 44


@pytest.mark.parametrize(
    ("quantile", "n", "discarded", "source"),
    [
        (0.90, 4_850_572, 483_519, f"{UNTETHER}/singlestream/TEST04/performance/run_1"),
        (0.99, 2_222_535, 21_879, f"{UNTETHER}/multistream/TEST04/performance/run_1"),
        (0.90, 201, 9, CTUNING),
    ],
)
def test_published_discard_counts(quantile: float, n: int, discarded: int, source: str) -> None:
    # "Processed at least … queries (n). Would discard K highest latency queries." in source.
    assert allowed_over(n, quantile) - 1 == discarded, source


def test_the_estimate_is_the_kth_largest_after_the_discards() -> None:
    # 201 queries at p90: 9 discarded, the 10th largest reported.
    samples = np.arange(1.0, 202.0)
    bound = upper_bound(samples, 0.90)
    assert bound.rank == 10 and bound.value == 192.0 and bound.n == 201


@pytest.mark.parametrize("quantile", [0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("over", [0, 1, 2, 7])
def test_min_samples_is_the_smallest_n_by_the_binomial_cdf(quantile: float, over: int) -> None:
    n = min_samples(quantile, over)
    assert stats.binom.cdf(over, n, 1 - quantile) <= 0.01
    assert n - 1 <= over or stats.binom.cdf(over, n - 1, 1 - quantile) > 0.01


def test_min_samples_grows_with_the_samples_over_and_the_quantile() -> None:
    counts = [min_samples(0.99, t) for t in range(0, 30)]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert min_samples(0.90) < min_samples(0.95) < min_samples(0.99)
    assert min_samples(0.99, confidence=0.95) < min_samples(0.99)
    assert min_samples(0.99, tolerance=0.005) < min_samples(0.99)


def test_the_samples_over_allowed_never_fall_as_n_grows() -> None:
    allowed = [allowed_over(n, 0.99) for n in range(600, 5_000, 7)]
    assert allowed == sorted(allowed) and allowed[-1] > allowed[0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.1, 1e4, allow_nan=False), min_size=1, max_size=2_000),
    st.sampled_from([0.9, 0.95, 0.99]),
)
def test_bounds_straddle_the_point_percentile(values: list[float], quantile: float) -> None:
    point = float(np.percentile(values, quantile * 100))
    upper, lower = upper_bound(values, quantile), lower_bound(values, quantile)
    if upper.value is not None:
        assert upper.value >= point
    if lower.value is not None:
        assert lower.value <= point


def test_the_upper_bound_covers_the_quantile_at_its_confidence() -> None:
    # Exponential latencies, p99 = ln(100): a bound below it in at most 1% of samples.
    rng = np.random.default_rng(7)
    truth = math.log(100.0)
    below = sum(
        (b := upper_bound(rng.exponential(size=1_500), 0.99)).value is not None and b.value < truth
        for _ in range(2_000)
    )
    assert below <= 20  # 1% of 2,000, by construction conservative
    above = sum(
        (b := lower_bound(rng.exponential(size=1_500), 0.99)).value is not None and b.value > truth
        for _ in range(2_000)
    )
    assert above <= 20


def test_a_tail_is_better_only_when_the_bounds_separate() -> None:
    rng = np.random.default_rng(3)
    control = rng.lognormal(0.0, 0.3, size=2_000)
    clear = compare_tails(control, control * 0.6, 0.99)
    assert clear.better and not clear.worse
    assert clear.words("ms").startswith("the p99 bounds show the cell better: the cell's 99% upper")
    close = compare_tails(control, control * 0.97, 0.99)
    assert not close.better and not close.worse
    assert " not below the control's 99% lower bound " in close.words()
    worse = compare_tails(control, control * 1.6, 0.99)
    assert worse.worse and "show the cell worse: the cell's 99% lower bound" in worse.words()


def test_too_few_samples_say_how_many_the_bound_needs() -> None:
    control = np.linspace(1.0, 2.0, 5_000)
    short = compare_tails(control, control[:300] * 0.5, 0.99)
    assert not short.better
    assert (
        short.words() == "inconclusive: the cell's upper bound on p99 needs 662 samples (have 300)"
    )
