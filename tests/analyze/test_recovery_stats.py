"""T90 over runs (harness.analyze.recovery_stats) on constructed run times."""

from __future__ import annotations

import math

import pytest

from harness.analyze.recovery_stats import (
    median_never_slowest,
    ratio_interval,
    ratio_reason,
    run_times,
    time_range,
)

INF = math.inf


def test_no_excess_runs_are_apart_and_never_is_slowest() -> None:
    times, no_excess = run_times([2.0, None, None, 4.0], [True, True, False, True])
    assert (times, no_excess) == ([2.0, INF, 4.0], 1)  # None with excess = never
    assert median_never_slowest(times) == 4.0  # never sorts last: 2, 4, never
    assert time_range(times) == (2.0, INF)


def test_median_is_never_from_half_the_runs() -> None:
    assert median_never_slowest([1.0, INF]) == INF
    assert median_never_slowest([1.0, 3.0, INF, INF]) == INF
    assert median_never_slowest([1.0, 3.0, 5.0, INF]) == 4.0
    assert median_never_slowest([]) is None
    assert time_range([]) is None


def test_ratio_reasons_say_why_there_is_no_number() -> None:
    assert ratio_reason(2.0, 4.0) is None
    # Which side's median never recovered, not which is faster: the interval says how sure.
    assert ratio_reason(2.0, INF) == "the control's median run never recovered; the cell's did"
    assert ratio_reason(INF, 4.0) == "the cell's median run never recovered; the control's did"
    assert ratio_reason(INF, INF) == "both never recovered"
    assert "no measurable shift" in str(ratio_reason(None, 4.0))
    # A median of one run beside another's is one pair of boots, not a finding: no number.
    assert ratio_reason(2.0, 4.0, (1, 4)) == (
        "1 measurable run(s) beside the control's 4: a ratio needs 2 a side"
    )
    assert ratio_reason(2.0, 4.0, (3, 1)) is not None
    assert ratio_reason(2.0, 4.0, (2, 2)) is None


def test_ratio_interval_covers_the_ratio_and_is_seeded() -> None:
    cell = [2.0, 2.2, 1.8, 2.1]
    control = [4.0, 4.4, 3.6, 4.2]
    lo, hi = ratio_interval(cell, control, seed=3) or (0.0, 0.0)
    assert lo <= 0.5 <= hi and hi < 1.0  # clearly faster, interval under 1
    assert ratio_interval(cell, control, seed=3) == (lo, hi)
    assert ratio_interval([2.0], control) is None  # one run: no spread to resample


def test_ratio_interval_bounds_may_be_infinite_or_zero() -> None:
    lo, hi = ratio_interval([1.0, INF, INF], [1.0, 1.0, 1.0], seed=0) or (0.0, 0.0)
    assert hi == INF and lo == pytest.approx(1.0)
    lo, hi = ratio_interval([1.0, 1.0, 1.0], [1.0, INF, INF], seed=0) or (9.0, 9.0)
    assert lo == 0.0 and hi == pytest.approx(1.0)
    assert ratio_interval([INF, INF], [INF, INF]) is None  # every replicate undefined


def test_runs_that_all_read_one_window_get_the_windows_width_not_zero() -> None:
    # The demo's eight runs a side read 0.75 s and 1.25 s in quarter-second windows, every
    # one: a bootstrap over runs alone said 0.60x [0.60, 0.60]. Each T90 is known to a window
    # either side, so the interval is as wide as the windows leave it, and no wider.
    assert ratio_interval([0.75] * 8, [1.25] * 8) == (pytest.approx(0.6), pytest.approx(0.6))
    lo, hi = ratio_interval([0.75] * 8, [1.25] * 8, resolution_s=0.25) or (0.0, 0.0)
    assert lo == pytest.approx(0.5 / 1.5) and hi == pytest.approx(1.0)
    # A window as long as the times themselves resolves nothing.
    assert ratio_interval([1.0] * 6, [1.0] * 6, resolution_s=1.0) == (0.0, INF)


def test_a_frozen_map_line_prints_no_ratio_from_one_run_a_side() -> None:
    # A ladder rung's per-domain median from one run beside the control's read "0.60x".
    from harness.analyze.seed_tables import _frozen_row

    thin = _frozen_row("agent C1", 100.0, 60.0, runs=(1, 1))
    assert thin.ratio is None and thin.control == 100.0 and thin.cell == 60.0
    assert thin.note == "medians of 1 run(s) beside the control's 1: a ratio needs 2 a side"
    enough = _frozen_row("agent C1", 100.0, 60.0, runs=(2, 3))
    assert enough.ratio == pytest.approx(0.6) and enough.note is None
