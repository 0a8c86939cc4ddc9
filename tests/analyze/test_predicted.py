"""A prediction's row: its errors, and whether the box's value lies in its interval."""

from __future__ import annotations

from harness.analyze.predicted import Prediction


def test_a_recovery_interval_open_above_still_judges_the_low_end() -> None:
    # Some resampled fits never recovered: the upper end is open (None), the lower one holds.
    slow = Prediction("t90_s", "stale", 2.0, 5.0, low=1.75, high=None)
    fast = Prediction("t90_s", "stale", 2.0, 1.0, low=1.75, high=None)
    assert slow.within is True and fast.within is False
    # No interval at all judges nothing.
    assert Prediction("t90_s", "stale", 2.0, 5.0).within is None
    closed = Prediction("ring_decode_tok_s", "seed", 1000.0, 1200.0, low=900.0, high=1100.0)
    assert closed.within is False and closed.ratio is not None and closed.ratio < 1
