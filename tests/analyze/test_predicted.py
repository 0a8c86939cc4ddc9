"""A prediction's row: its errors, and whether the box's value lies in its interval."""

from __future__ import annotations

import math

import pandas as pd

from harness.analyze.predicted import Prediction, recovery_median


def test_a_recovery_interval_open_above_still_judges_the_low_end() -> None:
    # Some resampled fits never recovered: the upper end is open (None), the lower one holds.
    slow = Prediction("t90_s", "stale", 2.0, 5.0, low=1.75, high=None)
    fast = Prediction("t90_s", "stale", 2.0, 1.0, low=1.75, high=None)
    assert slow.within is True and fast.within is False
    # No interval at all judges nothing.
    assert Prediction("t90_s", "stale", 2.0, 5.0).within is None
    closed = Prediction("ring_decode_tok_s", "seed", 1000.0, 1200.0, low=900.0, high=1100.0)
    assert closed.within is False and closed.ratio is not None and closed.ratio < 1


def test_a_box_that_never_recovered_is_outside_a_closed_interval_and_inside_an_open_one() -> None:
    never = {"measured_never": True}
    assert Prediction("t90_s", "seed", 2.0, None, low=1.5, high=2.5, **never).within is False
    assert Prediction("t90_s", "seed", 2.0, None, low=1.5, high=None, **never).within is True
    assert Prediction("t90_s", "seed", 2.0, None, **never).within is None  # no interval


def test_a_cells_recovery_counts_the_runs_that_never_recovered() -> None:
    # The cell table's median drops a run that never recovered; the prediction's reading does
    # not: per run the worst shift with an excess (a shift without one is n/a, not never).
    rows = [
        ("r1", 1.0, True), ("r1", 2.0, True),  # worst 2.0
        ("r2", None, True), ("r2", 0.5, True),  # never
        ("r3", None, True),  # never
        ("r4", None, False),  # no excess: no T90 to read, left out
    ]  # fmt: skip
    shifts = pd.DataFrame(
        [{"run_id": r, "cell": "stale", "cache_state": "warm", "t90_s": t, "excess": e}
         for r, t, e in rows]
    )  # fmt: skip
    assert recovery_median(shifts, "stale", "warm", "t90_s") == math.inf  # 2 of 3 never
    shifts.loc[shifts["run_id"] == "r3", "t90_s"] = 3.0
    assert recovery_median(shifts, "stale", "warm", "t90_s") == 3.0  # 2.0, 3.0, never
    assert recovery_median(shifts, "seed", "warm", "t90_s") is None
