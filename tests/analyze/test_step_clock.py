"""T90 on the step clock: a busy box serves the same steps slower, and the recovery it times in
steps is the quiet box's, while the seconds beside it stretch.

The rings come from a generative model of their own, not from the analysis: requests of one
prefill step (many lookups) and 63 decode steps, whose chance of a cold lookup decays after a
shift as C + (P − C)·exp(−step/τ), drawn binomially. Its excess falls to 10% at step τ·ln 10,
which the measured T90 must find to within a window.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness.analyze.recovery import (
    RING_COLUMNS,
    StepClock,
    phase_recovery,
    recovery_measured,
    step_clock,
)
from harness.card.schema import AnalysisSpec

TOKENS = 64  # a request: one prefill step and 63 decode steps
PREFILL_LOOKUPS = 12_000
DECODE_LOOKUPS = 32
CONVERGED, PEAK, TAU = 0.02, 0.25, 120.0  # cold chance; decay constant in host steps
CLOCK = StepClock(window=TOKENS, converged_span=4 * TOKENS, hold=2 * TOKENS)


def _ring(requests: tuple[int, ...], *, slow: float, seed: int = 3) -> pd.DataFrame:
    """Phases of ``requests`` each (a shift into every phase after the first); step times at
    ``slow`` × a quiet box's (2 ms a decode, 200 ms a prefill), jittered as a loaded box's are.
    The cold draws use their own seed, so every ``slow`` serves the same routing."""
    cold_rng = np.random.default_rng(seed)
    time_rng = np.random.default_rng(seed + 1)
    rows = []
    t = 0
    for phase, count in enumerate(requests):
        for k in range(count * TOKENS):
            prefill = k % TOKENS == 0
            lookups = PREFILL_LOOKUPS if prefill else DECODE_LOOKUPS
            chance = CONVERGED + (PEAK - CONVERGED) * math.exp(-k / TAU) if phase else CONVERGED
            base_ns = 200e6 if prefill else 2e6
            dur = int(base_ns * slow * (time_rng.uniform(1.0, 1.6) if slow > 1 else 1.0))
            rows.append(
                {
                    "t_ns": t,
                    "dur_ns": dur,
                    "tokens": 473 if prefill else 1,
                    "lookups": lookups,
                    "cold_lookups": int(cold_rng.binomial(lookups, chance)),
                    "swaps": 0,
                    "bytes_read": 0,
                    "phase": phase,
                }
            )
            t += dur
    return pd.DataFrame(rows, columns=list(RING_COLUMNS))


def test_a_busy_box_times_the_same_recovery_in_steps_and_longer_in_seconds() -> None:
    quiet = phase_recovery(_ring((8, 16), slow=1.0), 0.25, steps=CLOCK)
    busy = phase_recovery(_ring((8, 16), slow=2.5), 0.25, steps=CLOCK)
    assert len(quiet) == len(busy) == 1
    q, b = quiet[0], busy[0]
    assert q.clock == b.clock == "steps"
    assert q.excess and q.t90_steps is not None
    assert b.t90_steps == q.t90_steps
    # The independent model's crossing: the excess is 10% at τ·ln 10 steps; the window that
    # holds it starts at most a window before, and the band may end it a window later.
    truth = TAU * math.log(10)
    assert truth - TOKENS <= q.t90_steps <= truth + 2 * TOKENS
    # The seconds are the box's: the same steps took 2.5-4x as long.
    assert q.t90_s is not None and b.t90_s is not None
    assert 2.5 * q.t90_s <= b.t90_s <= 4.0 * q.t90_s


def test_on_the_seconds_clock_both_times_are_kept_too() -> None:
    shifts = phase_recovery(_ring((8, 16), slow=1.0), 0.25, converged_span_s=1.0, hold_s=0.5)
    assert shifts[0].clock == "seconds"
    assert shifts[0].t90_s is not None and shifts[0].t90_steps is not None
    assert shifts[0].t90_steps > 0


def test_the_watch_stops_a_phase_once_its_steps_measure_the_recovery() -> None:
    ring = _ring((8, 30), slow=2.5)
    shift_at = 8 * TOKENS
    measured_at = next(
        n
        for n in range(shift_at + TOKENS, len(ring) + 1, TOKENS)
        if recovery_measured(ring.iloc[:n], 1, 0.25, steps=CLOCK)
    )
    lasted = measured_at - shift_at
    final = phase_recovery(ring.iloc[:measured_at], 0.25, steps=CLOCK)[-1]
    # Measured means: long enough for the converged span and hold, and T90 before the span.
    assert lasted >= CLOCK.converged_span + CLOCK.hold
    assert final.t90_steps is not None and final.t90_steps < lasted - CLOCK.converged_span
    # The same ring on a quiet box's times stops at the same step.
    quiet = _ring((8, 30), slow=1.0)
    assert recovery_measured(quiet.iloc[:measured_at], 1, 0.25, steps=CLOCK)
    assert not recovery_measured(quiet.iloc[: measured_at - TOKENS], 1, 0.25, steps=CLOCK)


def test_the_card_sets_the_step_clock_and_defaults_its_span_and_hold() -> None:
    assert step_clock(AnalysisSpec()) is None
    assert step_clock(AnalysisSpec(window_steps=64)) == StepClock(64, 256, 128)
    assert step_clock(AnalysisSpec(window_steps=64, hold_steps=0)) == StepClock(64, 256, 0)
    with pytest.raises(ValueError, match="set window_steps too"):
        AnalysisSpec(hold_steps=3)
