"""Ring-side metrics: windows, T90/T2x/speed recovery, churn, swap cost, inter-token p99."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analyze.recovery import (
    RING_COLUMNS,
    cold_share_windows,
    general_note,
    phase_recovery,
    recovery_time,
    time_to_stay,
    times_recovery,
)
from harness.analyze.ring_figures import ring_summary, swap_cost
from harness.errors import BadInput, RingError

STEP_NS = 500_000_000  # four steps per 2 s window
LOOKUPS = 100


def _ring_from_windows(
    phases: list[int],
    cold_pct: list[float],
    step_ms: list[float] | None = None,
    swaps: list[int] | None = None,
) -> pd.DataFrame:
    """A ring with four 0.5 s steps per 2 s window; per-window phase, cold %, step time, swaps.

    Cold share per window is exact: each of the four steps has LOOKUPS lookups and
    cold_pct·LOOKUPS/100 cold ones. A window's swaps land on its first step.
    """
    n_windows = len(phases)
    step_ms = step_ms or [10.0] * n_windows
    swaps = swaps or [0] * n_windows
    rows = []
    for w in range(n_windows):
        for s in range(4):
            rows.append(
                {
                    "t_ns": (4 * w + s) * STEP_NS,
                    "dur_ns": int(step_ms[w] * 1e6),
                    "tokens": 1,
                    "lookups": LOOKUPS,
                    "cold_lookups": round(cold_pct[w] * LOOKUPS / 100),
                    "swaps": swaps[w] if s == 0 else 0,
                    "bytes_read": 0,
                    "phase": phases[w],
                }
            )
    return pd.DataFrame(rows, columns=list(RING_COLUMNS))


# --- time_to_stay / recovery_time on constructed series ------------------------------------------


def test_recovery_time_simple_decay() -> None:
    t = np.arange(0, 30, 2.0)
    v = np.array([20, 10, 5, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2], dtype=float)
    # C = 2, P = 20: T90 threshold 2 + 0.1·18 = 3.8 → first stay at t = 6.
    assert recovery_time(t, v, 0.0, 2.0, 20.0) == 6.0
    # T2x threshold 4: 3 at t = 6 is in. 5 at t = 4 is not.
    assert time_to_stay(t, v, 0.0, 4.0) == 6.0
    assert time_to_stay(t, v, 0.0, 5.0) == 4.0  # "at or below": 5 ≤ 5


def test_dip_and_rebound_counts_only_the_final_entry() -> None:
    t = np.arange(0, 24, 2.0)
    v = np.array([20, 2, 2, 12, 9, 2, 2, 2, 2, 2, 2, 2], dtype=float)
    # In the band at t = 2, 4, out again at 6, 8, in for good from t = 10.
    assert recovery_time(t, v, 0.0, 2.0, 20.0) == 10.0


def test_never_recovers_is_none_not_zero() -> None:
    t = np.arange(0, 20, 2.0)
    v = np.array([20, 15, 12, 10, 9, 9, 9, 9, 9, 9], dtype=float)
    assert recovery_time(t, v, 0.0, 2.0, 20.0) is None
    # Enters the band, but the phase ends before the hold window is over.
    late = np.array([20, 15, 12, 10, 9, 9, 9, 9, 2, 2], dtype=float)
    assert recovery_time(t, late, 0.0, 2.0, 20.0, hold_s=4.0) is None
    assert recovery_time(t, late, 0.0, 2.0, 20.0, hold_s=2.0) == 16.0
    assert recovery_time(t, late, 0.0, 2.0, 20.0, hold_s=4.0, end_t_s=20.0) == 16.0


def test_no_excess_has_no_t90() -> None:
    # P <= C: there is no excess to clear, so no time to clear it (not 0 s, not never).
    t = np.arange(0, 10, 2.0)
    with pytest.raises(BadInput, match="no excess"):
        recovery_time(t, np.full(5, 3.0), 0.0, 3.0, 3.0)


def test_time_to_stay_above_for_speed_and_nan_windows() -> None:
    t = np.arange(0, 20, 2.0)
    speed = np.array([50, 80, np.nan, 95, 85, 92, 100, 100, 100, 100])
    # ≥ 90 from t = 10 on (85 at t = 8 is out); the NaN window carries no evidence.
    assert time_to_stay(t, speed, 0.0, 90.0, below=False) == 10.0
    with pytest.raises(BadInput):
        time_to_stay(t, speed[:3], 0.0, 90.0)


def test_samples_before_the_shift_are_ignored() -> None:
    t = np.arange(0, 20, 2.0)
    v = np.array([50, 50, 50, 2, 2, 2, 2, 2, 2, 2], dtype=float)
    assert time_to_stay(t, v, 6.0, 3.0) == 0.0
    assert time_to_stay(t, v, 0.0, 3.0) == 6.0


# --- windows -------------------------------------------------------------------------------


def _reference_windows(frame: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """A slow, obviously-correct reference: pandas groupby over (span, window in span)."""
    f = frame.copy()
    f["segment"] = (f["phase"] != f["phase"].shift()).cumsum() - 1
    seg_t0 = f.groupby("segment")["t_ns"].transform("first")
    f["win"] = (f["t_ns"] - seg_t0) // int(window_s * 1e9)
    g = f.groupby(["segment", "win"], sort=True)
    out = g.agg(
        lookups=("lookups", "sum"),
        cold_lookups=("cold_lookups", "sum"),
        swaps=("swaps", "sum"),
        tokens=("tokens", "sum"),
        steps=("t_ns", "size"),
        phase=("phase", "first"),
    ).reset_index()
    start = f.groupby("segment")["t_ns"].first().loc[out["segment"]].to_numpy()
    out["t_s"] = (start + out["win"] * int(window_s * 1e9) - f["t_ns"].iloc[0]) / 1e9
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 900_000_000),  # gap to the previous step, ns
            st.integers(0, 3),  # phase
            st.integers(0, 50),  # lookups
            st.integers(0, 3),  # swaps
        ),
        min_size=1,
        max_size=80,
    )
)
def test_windows_match_a_groupby_reference(steps: list[tuple[int, int, int, int]]) -> None:
    rng = np.random.default_rng(len(steps))
    gaps, phases, lookups, swaps = (np.array(c, dtype=np.int64) for c in zip(*steps, strict=True))
    frame = pd.DataFrame(
        {
            "t_ns": np.cumsum(gaps),
            "dur_ns": rng.integers(1, 1_000_000, size=len(steps)),
            "tokens": rng.integers(1, 3, size=len(steps)),
            "lookups": lookups,
            "cold_lookups": (lookups * rng.uniform(0, 1, size=len(steps))).astype(np.int64),
            "swaps": swaps,
            "bytes_read": 0,
            "phase": phases,
        }
    )
    got = cold_share_windows(frame, 1.0)
    ref = _reference_windows(frame, 1.0)
    for col in ("lookups", "cold_lookups", "swaps", "tokens", "steps", "phase", "segment"):
        np.testing.assert_array_equal(got[col].to_numpy(), ref[col].to_numpy(), err_msg=col)
    np.testing.assert_allclose(got["t_s"].to_numpy(), ref["t_s"].to_numpy(), rtol=0, atol=1e-9)
    expected_share = np.where(ref["lookups"] > 0, ref["cold_lookups"] / ref["lookups"], np.nan)
    np.testing.assert_allclose(got["cold_share"].to_numpy(), expected_share, equal_nan=True)
    assert (got["span_s"] <= 1.0 + 1e-12).all()
    # The one-pass path over a row-major record block (a ring file read with np.fromfile)
    # gives the same table as the per-column path.
    records = np.ascontiguousarray(frame[list(RING_COLUMNS)].to_numpy(dtype=np.int64))
    from_records = pd.DataFrame(records, columns=list(RING_COLUMNS), copy=False)
    pd.testing.assert_frame_equal(cold_share_windows(from_records, 1.0), got)


def test_equal_timestamps_across_a_phase_change_stay_in_their_span() -> None:
    frame = _ring_from_windows([0, 1], [10, 50])
    frame.loc[4, "t_ns"] = frame.loc[3, "t_ns"]  # new phase's first step shares a timestamp
    w = cold_share_windows(frame, 2.0)
    assert w["phase"].tolist() == [0, 1, 1]
    assert w["steps"].tolist() == [4, 3, 1]
    assert w["cold_share"].tolist() == pytest.approx([0.10, 0.50, 0.50])


def test_windows_restart_at_a_phase_shift() -> None:
    frame = _ring_from_windows([0, 0, 1, 1], [1, 2, 30, 4])
    # Shift the phase change half a window late: the new span starts its own windows.
    frame.loc[8, "phase"] = 0
    w = cold_share_windows(frame, 2.0)
    assert w["t_s"].tolist() == [0.0, 2.0, 4.0, 4.5, 6.5]
    # A span ends at the next span's first step; the ring ends with the last step's end.
    assert w["span_s"].tolist() == pytest.approx([2.0, 2.0, 0.5, 2.0, 1.01])
    assert w["phase"].tolist() == [0, 0, 0, 1, 1]


def test_ring_validation() -> None:
    frame = _ring_from_windows([0, 0], [1, 1])
    with pytest.raises(RingError, match="missing column"):
        cold_share_windows(frame.drop(columns=["swaps"]))
    backwards = frame.copy()
    backwards.loc[3, "t_ns"] = 0
    with pytest.raises(RingError, match="goes backwards at step 3"):
        cold_share_windows(backwards)
    with pytest.raises(RingError, match="no steps"):
        cold_share_windows(frame.iloc[0:0])


# --- phase_recovery --------------------------------------------------------------------------


def test_phase_recovery_t90_t2x_and_speed() -> None:
    before = 10
    after_share = [20, 10, 3.9, 2] + [2] * 16  # 40 s in the new phase
    after_ms = [20.0, 12.5, 12.5, 10.5, 10.0] + [10.0] * 15  # 50, 80, 80, 95.2, 100 t/s
    frame = _ring_from_windows(
        [0] * before + [1] * len(after_share),
        [1] * before + after_share,
        step_ms=[10.0] * before + after_ms,
    )
    (shift,) = phase_recovery(frame, 2.0, converged_span_s=10.0)
    assert (shift.from_phase, shift.to_phase, shift.shift_t_s) == (0, 1, 20.0)
    assert shift.converged == pytest.approx(0.02)
    assert shift.peak == pytest.approx(0.20)
    assert shift.t90_s == 6.0  # threshold 3.8 %: the 3.9 % window is still out
    assert shift.t2x_s == 4.0  # threshold 4 %: 3.9 % is in
    assert shift.converged_tok_s == pytest.approx(100.0)
    assert shift.speed_recovery_s == 6.0  # 95.2 t/s ≥ 90 from the fourth window on
    assert shift.notes == ()


def test_phase_recovery_no_excess_and_never_recovers() -> None:
    flat = [0] * 5 + [1] * 10 + [2] * 10
    share = [1] * 5 + [3] * 10 + [30, 25, 20, 18, 16, 3, 3, 3, 3, 25]
    first, second = phase_recovery(_ring_from_windows(flat, share), converged_span_s=6.0)
    assert (first.t90_s, first.t2x_s, first.excess) == (None, None, False)
    assert any("no excess" in n for n in first.notes)
    assert not any("never recovered" in n for n in first.notes)  # n/a is not never
    assert second.excess
    # A late burst: C = median of the last 6 s (3, 3, 25 → 3 %), but the phase ends out of the
    # band, so neither T90 (5.7 %) nor T2x (6 %) ever holds — None, not the early entry at 10 s.
    assert second.converged == pytest.approx(0.03)
    assert second.t90_s is None
    assert second.t2x_s is None
    assert any(n.startswith("T90: never recovered") for n in second.notes)


def test_every_note_on_timing_a_recovery_is_known_as_one() -> None:
    # A frozen map's report leaves these notes out by times_recovery: no excess (plain and
    # within noise), never recovered, a phase too short, and that note as the seed tables
    # group it; a phase without lookups is about its cold share and stays.
    flat = [0] * 5 + [1] * 10 + [2] * 10
    share = [1] * 5 + [3] * 10 + [30, 25, 20, 18, 16, 3, 3, 3, 3, 25]
    first, second = phase_recovery(_ring_from_windows(flat, share), converged_span_s=6.0)
    wobble = [5.0, 7.0, 5.0, 6.0, 4.0, 6.0, 5.0, 6.0, 5.0, 5.0]
    (noise,) = phase_recovery(_ring_from_windows([0] * 3 + [1] * 10, [5.0] * 3 + wobble), 2.0)
    (short,) = phase_recovery(_ring_from_windows([0] * 3 + [1] * 2, [5.0] * 3 + [40.0, 5.0]), 2.0)
    notes = [*first.notes, *second.notes, *noise.notes, *short.notes]
    kinds = ("no excess:", "never recovered", "no excess beyond noise", "phase lasted")
    for kind in kinds:
        assert any(kind in n for n in notes), (kind, notes)
    assert all(times_recovery(n) for n in notes), notes
    grouped = general_note(next(n for n in short.notes if n.startswith("phase lasted")))
    assert grouped.startswith("phase shorter than") and times_recovery(grouped)
    assert not times_recovery("no lookups in this phase: no cold share")
    # Grouped over runs without their own numbers, so one note counts every run it is true of.
    (within_noise,) = (general_note(n) for n in noise.notes if "beyond noise" in n)
    assert "%" not in within_noise and "points" not in within_noise and times_recovery(within_noise)


# --- swap cost, churn, inter-token p99 ------------------------------------------------------------


def _steps(dur_ms: list[float], swaps: list[int], tokens: list[int] | None = None) -> pd.DataFrame:
    n = len(dur_ms)
    return pd.DataFrame(
        {
            "t_ns": np.arange(n, dtype=np.int64) * 100_000_000,
            "dur_ns": (np.asarray(dur_ms) * 1e6).astype(np.int64),
            "tokens": tokens or [1] * n,
            "lookups": LOOKUPS,
            "cold_lookups": 0,
            "swaps": swaps,
            "bytes_read": 0,
            "phase": 0,
        }
    )


def test_swap_cost_on_constructed_steps() -> None:
    free_ms = [float(x) for x in range(1, 101)]  # p95 (linear) = 95.05 ms, mean 50.5 ms
    frame = _steps(free_ms + [200.0] * 4, [0] * 100 + [2] * 4)
    cost = swap_cost(frame)
    assert cost["swap_cost_ratio"] == pytest.approx(200.0 / 95.05)
    assert cost["swap_ms_per_swap"] == pytest.approx((200.0 - 50.5) / 2)
    assert cost["swap_steps"] == 4.0
    assert swap_cost(_steps([1.0, 2.0], [0, 0]))["swap_cost_ratio"] is None


def test_swap_cost_leaves_prefill_steps_out_of_both_sides() -> None:
    # A 900 ms prefill step (8 tokens) without a swap must not make swap-free steps look slow,
    # nor a prefill step with a swap count as a swap's cost.
    free_ms = [float(x) for x in range(1, 101)]
    frame = _steps(
        free_ms + [200.0] * 4 + [900.0, 900.0],
        [0] * 100 + [2] * 4 + [0, 3],
        tokens=[1] * 104 + [8, 8],
    )
    cost = swap_cost(frame)
    assert cost["swap_cost_ratio"] == pytest.approx(200.0 / 95.05)
    assert cost["swap_ms_per_swap"] == pytest.approx((200.0 - 50.5) / 2)
    assert cost["swap_steps"] == 4.0


def test_swap_cost_is_read_against_steps_with_as_many_cold_lookups() -> None:
    # A known cost: a step takes 1 ms plus 1 ms per cold lookup (a row read from the slow
    # tier), plus 0.5 ms per applied swap. Most steps look nothing up cold; 1 in 10 reads 3
    # rows, so the p95 of all swap-free steps is a 4 ms cold step and a 3 ms swap step (4
    # swaps, no cold lookup) read as 0.75x "a step without a swap" against it.
    rng = np.random.default_rng(3)
    cold = [3 if i % 10 == 0 else 0 for i in range(400)] + [0] * 8
    swaps = [0] * 400 + [4] * 8
    dur = [
        1.0 + c + 0.5 * k + float(rng.uniform(0, 0.05)) for c, k in zip(cold, swaps, strict=True)
    ]
    frame = _steps(dur, swaps).assign(cold_lookups=cold)
    cost = swap_cost(frame)
    assert cost["swap_ms_per_swap"] == pytest.approx(0.5, abs=0.02)
    assert cost["swap_cost_ratio"] is not None and cost["swap_cost_ratio"] >= 1.0
    assert cost["swap_cost_ratio"] == pytest.approx(3.0 / 1.05, rel=0.03)
    # A swap step whose cold count no swap-free step shares (here 7) is left out, not
    # compared with steps that did other work.
    odd = _steps([*dur, 9.0], [*swaps, 2]).assign(cold_lookups=[*cold, 7])
    assert swap_cost(odd)["swap_ms_per_swap"] == pytest.approx(0.5, abs=0.02)


def test_churn_uses_the_converged_span_only() -> None:
    # 30 s phase; 1 swap per 2 s window early on, 5 per window in the last 10 s.
    swaps = [1] * 10 + [5] * 5
    frame = _ring_from_windows([0] * 15, [1] * 15, swaps=swaps)
    summary = ring_summary(frame, 2.0, converged_span_s=10.0)
    # Converged windows start at 20…28 s; the last one ends with the ring at 29.51 s.
    assert summary["churn_per_min"] == pytest.approx(25 / 9.51 * 60)
    assert summary["cold_share"] == pytest.approx(0.01)
    assert summary["duration_s"] == pytest.approx(29.5 + 0.01)


def test_inter_token_percentiles_from_decode_steps_only() -> None:
    dur = [float(x) for x in range(1, 201)] + [5000.0]
    tokens = [1] * 200 + [512]  # a prefill step must not count
    summary = ring_summary(_steps(dur, [0] * 201, tokens))
    assert summary["itl_p99_ms"] == pytest.approx(np.percentile(np.arange(1, 201), 99))
    assert summary["itl_p50_ms"] == pytest.approx(100.5)
    assert summary["decode_tok_s"] == pytest.approx(200 / (sum(range(1, 201)) / 1000))


def test_recovery_is_measured_once_the_converged_span_clears_the_transient() -> None:
    """until_recovered's stop rule, on the analysis's own definitions: the phase must outlast
    converged_span_s + hold_s and T90 must end before the converged span begins."""
    from harness.analyze.recovery import recovery_measured

    before = [0, 0, 0]
    transient = [40.0, 30.0, 15.0, 5.0]  # 2 s windows after the shift, settling at 5%
    spec = {"converged_span_s": 4.0, "hold_s": 2.0}
    ring = _ring_from_windows(before + [1] * 4, [5.0] * 3 + transient)
    assert not recovery_measured(ring, 1, 2.0, **spec)  # the span would still hold the fall
    longer = _ring_from_windows(before + [1] * 7, [5.0] * 3 + transient + [5.0] * 3)
    assert recovery_measured(longer, 1, 2.0, **spec)
    assert not recovery_measured(longer, 2, 2.0, **spec)  # not the phase that is running
    flat = _ring_from_windows(before + [1] * 4, [5.0] * 7)  # nothing to recover from
    assert recovery_measured(flat, 1, 2.0, **spec)


def test_a_peak_within_the_windows_noise_is_no_excess() -> None:
    """A shift whose cold share wobbles by a window-to-window amount has nothing to recover
    from (T90 n/a, not "never"); a real transient far above that wobble is timed."""
    wobble = [5.0, 7.0, 5.0, 6.0, 4.0, 6.0, 5.0, 6.0, 5.0, 5.0]
    (flat,) = phase_recovery(_ring_from_windows([0] * 3 + [1] * 10, [5.0] * 3 + wobble), 2.0)
    assert not flat.excess and flat.t90_s is None
    assert "no excess beyond noise" in " ".join(flat.notes)
    fall = [40.0, 20.0, 9.0, *wobble[3:]]
    (real,) = phase_recovery(_ring_from_windows([0] * 3 + [1] * 10, [5.0] * 3 + fall), 2.0)
    assert real.excess and real.t90_s is not None
