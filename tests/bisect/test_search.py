"""The bisect's search and its step test, on scripted calls (the campaigns are the e2e test's)."""

from __future__ import annotations

import math

import pytest

from harness.bisect.search import Measured, Outcome, Search
from harness.errors import BadInput
from harness.stats.build_step import StepCall, StepDesign, call_step

SLOWER = math.log(0.95)


def _bisect(count: int, call_of: dict[int, StepCall] | None, culprit: int | None) -> Search:
    """Run a search whose steps are called by the truth, or by ``call_of`` where it says."""
    search = Search(count)
    while (build := search.next_build()) is not None:
        bad = culprit is not None and build >= culprit
        call = (call_of or {}).get(build, StepCall.BAD if bad else StepCall.GOOD)
        search.record(Measured(build, call, SLOWER if bad else 0.0, 0.01))
    return search


@pytest.mark.parametrize("culprit", range(1, 16))
def test_every_culprit_of_16_builds_is_named_within_five_steps(culprit: int) -> None:
    search = _bisect(16, None, culprit)
    assert search.outcome() is Outcome.CULPRIT
    assert search.culprit_range() == (culprit, culprit)
    assert len(search.steps) <= math.ceil(math.log2(16)) + 1


def test_a_bad_build_that_does_not_reproduce_ends_with_no_culprit_in_one_step() -> None:
    search = _bisect(16, None, None)
    assert search.outcome() is Outcome.NO_CULPRIT and len(search.steps) == 1
    undecided = _bisect(16, {15: StepCall.UNDECIDED}, 3)
    assert undecided.outcome() is Outcome.UNDECIDED and len(undecided.steps) == 1


def test_an_undecided_build_is_skipped_and_can_leave_a_range() -> None:
    # Build 7 stays undecided: the search measures its neighbour instead and still names 9.
    search = _bisect(16, {7: StepCall.UNDECIDED}, 9)
    assert search.outcome() is Outcome.CULPRIT and search.culprit_range() == (9, 9)
    assert search.skipped() == [7]
    # The culprit's own parent undecided: 5 or 6 is the first bad build, and the bisect says so.
    ranged = _bisect(16, {5: StepCall.UNDECIDED}, 6)
    assert ranged.outcome() is Outcome.RANGE and ranged.culprit_range() == (5, 6)


def test_the_regression_searched_for_pools_every_build_called_bad() -> None:
    search = Search(8)
    search.record(Measured(7, StepCall.BAD, math.log(0.94), 0.01))
    search.record(Measured(3, StepCall.BAD, math.log(0.96), 0.02))
    weights = (1 / 0.01**2, 1 / 0.02**2)
    pooled = (weights[0] * math.log(0.94) + weights[1] * math.log(0.96)) / sum(weights)
    assert search.regression() == pytest.approx(pooled)
    with pytest.raises(ValueError, match="was next"):
        search.record(Measured(6, StepCall.GOOD, 0.0, 0.01))


def test_the_step_call_holds_wald_bounds_and_calls_a_deterministic_metric_by_the_nearer_level() -> (
    None
):
    design = StepDesign()
    lower, upper = design.bounds
    assert upper == pytest.approx(-lower) and upper == pytest.approx(math.log(0.9995 / 0.0005))
    assert call_step(SLOWER, 0.004, SLOWER, design) is StepCall.BAD
    assert call_step(0.0, 0.004, SLOWER, design) is StepCall.GOOD
    assert call_step(SLOWER / 2, 0.004, SLOWER, design) is None  # halfway: look again
    assert call_step(SLOWER, 0.05, SLOWER, design) is None  # too noisy yet
    assert call_step(0.0, None, SLOWER, design) is None
    assert call_step(-0.001, 0.0, SLOWER, design) is StepCall.GOOD
    assert call_step(SLOWER * 0.9, 0.0, SLOWER, design) is StepCall.BAD


def test_a_step_design_out_of_range_is_bad_input() -> None:
    with pytest.raises(BadInput, match="first cycles"):
        StepDesign(first_cycles=2)
    with pytest.raises(BadInput, match="error rate"):
        StepDesign(error=0.6)
    with pytest.raises(BadInput, match="a good and a bad build"):
        Search(1)
