"""Runtime-side metrics from the telemetry ring: cold share, recovery times, churn, swap cost.

docs/design.md#runtime-side:

- cold share = Σcold_lookups / Σlookups per window: windows of ``window_s`` seconds (default
  2 s), or, on the step clock (:class:`StepClock`), of a fixed number of host steps;
- converged value C = median of the last window span of a phase; peak P = max after the shift;
- T90 = time from the shift until the cold share enters and stays (for a hold window) at or
  below C + max(0.10·(P − C), N), N the late windows' spread; T2x the same for max(2·C, C + N);
  on the step clock, windows, converged span, hold and T90 itself count host steps, and the
  wall seconds those steps took are kept beside them (a busy box serves the same steps in
  more seconds: counted in steps, load cannot stretch or blur a recovery);
  speed recovery: decode speed back at ≥ 90 % of its converged value. T90 and T2x are
  undefined — "n/a (no excess)", never 0 — when P ≤ C + N: there is no excess to clear, so no
  time to clear it;
- churn = swaps per minute over the converged span;
- swap cost = mean duration of swap-bearing decode steps ÷ p95 of swap-free decode steps, and
  ms per applied swap (prefill steps excluded on both sides);
- inter-token p99 over a whole soak from the ring.

Input is one row per host step in time order with the ring's int64 columns (a pandas DataFrame
or a mapping of numpy arrays). Every pass over steps is vectorised (np.add.reduceat), so a
48-hour soak of 15 million steps takes seconds. Percentiles interpolate linearly
(np.percentile), as everywhere in the harness.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.card.phase_length import t90_min_phase_s
from harness.card.schema import AnalysisSpec
from harness.errors import BadInput, RingError
from harness.formats.ring import RING_FIELDS

# The ring columns recovery reads: the telemetry ring's own fields, defined once there.
RING_COLUMNS = RING_FIELDS
WINDOW_COLUMNS = (
    "t_s",
    "span_s",
    "step0",
    "segment",
    "phase",
    "steps",
    "cold_share",
    "lookups",
    "cold_lookups",
    "swaps",
    "tokens",
    "busy_s",
    "decode_tok_s",
)
DEFAULT_WINDOW_S = 2.0
DEFAULT_CONVERGED_SPAN_S = 10.0
DEFAULT_HOLD_S = 4.0
NS_PER_S = 1_000_000_000
# Tokens a decode step emits: one request decoding (C1). Prefill steps emit other counts.
DECODE_TOKENS = 1
# Words in every note this module writes about timing a recovery (T90, T2x, speed recovery, or a
# phase too short to time one), and in none about the phase's cold share itself: a report on a
# frozen map, where nothing recovers, leaves those notes out (:func:`times_recovery`).
RECOVERY_TIMING_MARKS = (
    "never recovered",
    "(T90 n/a)",
    "converged_span_s + hold_s",
    "converged_span_steps + hold_steps",
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
RingInput = pd.DataFrame | Mapping[str, npt.ArrayLike]


def ring_columns(frame: RingInput) -> dict[str, IntArray]:
    """The ring columns as int64 numpy arrays (views where possible), validated.

    Raises RingError naming the missing column, a length mismatch, an empty ring or time going
    backwards — the signs of a ring that was not unwrapped by its write sequence.
    """
    missing = [c for c in RING_COLUMNS if c not in frame]
    if missing:
        raise RingError(
            f"ring: missing column(s) {', '.join(missing)}; a ring needs {', '.join(RING_COLUMNS)}"
        )
    cols = {c: np.asarray(frame[c], dtype=np.int64) for c in RING_COLUMNS}
    sizes = {a.shape for a in cols.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1:
        raise RingError("ring: columns must be one-dimensional and of equal length")
    t = cols["t_ns"]
    if t.size == 0:
        raise RingError("ring: no steps recorded; was the ring path in the runtime profile right?")
    if t.size > 1 and not bool(np.all(t[1:] >= t[:-1])):
        first = int(np.argmax(t[1:] < t[:-1])) + 1
        raise RingError(
            f"ring: t_ns goes backwards at step {first}; unwrap the ring by its write sequence "
            "before analysis"
        )
    return cols


@dataclass(frozen=True)
class StepClock:
    """Recovery counted in host steps (ring rows) instead of seconds: windows of ``window``
    steps from each phase's first step, a converged span of the phase's last
    ``converged_span`` steps, and a recovery that must hold ``hold`` steps.

    The policies we time adapt per step (a swap queue drained every 64 decode steps), so the
    steps a recovery takes are the policy's; the seconds they take are also the box's speed.
    On a busy box a second-long window holds half the steps, its cold share twice the noise,
    and a prefill can fill it alone: the ladder read "no excess" in 30 of 30 loaded runs where
    a quiet box measured it. A window of whole requests' steps holds the same traffic at any
    speed."""

    window: int
    converged_span: int
    hold: int

    def __post_init__(self) -> None:
        if self.window < 1 or self.converged_span < 1 or self.hold < 0:
            raise BadInput(
                "step clock: window_steps and converged_span_steps must be >= 1, hold_steps >= 0"
            )


def cold_share_windows(
    frame: RingInput,
    window_s: float = DEFAULT_WINDOW_S,
    *,
    decode_tokens: int = DECODE_TOKENS,
    steps: StepClock | None = None,
) -> pd.DataFrame:
    """Per-window sums and cold share, windows restarting at every phase shift.

    Windows are ``window_s`` long (or, with ``steps``, ``steps.window`` host steps) and aligned
    to the first step of each phase span (a span is a run of equal ``phase``), so no window
    mixes two phases and a shift always starts a window; the last window of a span may be
    shorter. Columns: t_s (window start, seconds after the first step), span_s (its wall
    length), step0 (its first step, counted from the ring's first), segment (span number),
    phase, steps, cold_share (Σcold_lookups/Σlookups; NaN with no lookups), lookups,
    cold_lookups, swaps, tokens, busy_s (Σdur_ns), decode_tok_s (decode tokens ÷ decode steps'
    Σdur: a rate over step time, idle gaps and prefill steps excluded; a decode step emits
    exactly ``decode_tokens`` tokens — 1 for one request decoding, the C1 setting of soaks; NaN
    in a window without one). Windows with no step do not appear.
    """
    if not math.isfinite(window_s) or window_s <= 0:
        raise BadInput(f"window_s: must be a positive number of seconds, got {window_s!r}")
    cols = ring_columns(frame)
    t, phase = cols["t_ns"], cols["phase"]
    n = t.size
    w_ns = max(1, round(window_s * NS_PER_S))

    seg_starts = np.flatnonzero(phase[1:] != phase[:-1]) + 1
    seg_first = np.concatenate(([0], seg_starts))
    seg_next = np.concatenate((seg_starts, [n]))
    # A window ends at the next window's start in the same span, else at the span's end (the
    # next span's first step, or the last step's end for the final span).
    seg_end_ns = np.concatenate((t[seg_starts], [t[-1] + cols["dur_ns"][-1]]))
    if steps is not None:
        counts = (seg_next - seg_first + steps.window - 1) // steps.window
        segment = np.repeat(np.arange(seg_first.size), counts)
        k = np.arange(segment.size) - np.repeat(np.cumsum(counts) - counts, counts)
        starts = seg_first[segment] + k * steps.window
        start_ns = t[starts]
        following = np.append(starts[1:], n)
        same_span = np.append(segment[1:] == segment[:-1], False)
        end_ns = np.where(same_span, t[np.minimum(following, n - 1)], seg_end_ns[segment])
    else:
        # Window edges per span, t0 + k·w, located with one searchsorted: O(windows·log steps)
        # instead of a per-step window number (this is what keeps 15M steps fast).
        seg_t0 = t[seg_first]
        n_edges = (t[seg_next - 1] - seg_t0) // w_ns + 1
        edge_segment = np.repeat(np.arange(seg_first.size), n_edges)
        k = np.arange(edge_segment.size) - np.repeat(np.cumsum(n_edges) - n_edges, n_edges)
        edge_ns = seg_t0[edge_segment] + k * w_ns
        # Clipping keeps equal timestamps on both sides of a phase change in their own span.
        idx = np.clip(
            np.searchsorted(t, edge_ns, side="left"),
            seg_first[edge_segment],
            seg_next[edge_segment],
        )
        keep = np.append(idx[1:], n) > idx  # drop windows without a step
        starts, segment, start_ns = idx[keep], edge_segment[keep], edge_ns[keep]
        end_ns = np.minimum(start_ns + w_ns, seg_end_ns[segment])

    sums = {
        name: np.add.reduceat(cols[name], starts)
        for name in ("lookups", "cold_lookups", "swaps", "tokens", "dur_ns")
    }
    n_steps = np.diff(np.concatenate((starts, [n])))
    # Decode sums = all steps minus the (rare) other steps, so only those few are gathered.
    other = np.flatnonzero(cols["tokens"] != decode_tokens)
    other_window = np.searchsorted(starts, other, side="right") - 1
    decode_steps = n_steps - np.bincount(other_window, minlength=starts.size)
    decode_ns = sums["dur_ns"] - np.bincount(
        other_window, weights=cols["dur_ns"][other], minlength=starts.size
    ).astype(np.int64)
    lookups = sums["lookups"]
    busy_s = sums["dur_ns"] / NS_PER_S
    with np.errstate(invalid="ignore", divide="ignore"):
        cold_share = np.where(lookups > 0, sums["cold_lookups"] / np.maximum(lookups, 1), np.nan)
        tok_s = np.where(
            decode_ns > 0,
            decode_steps * decode_tokens * NS_PER_S / np.maximum(decode_ns, 1),
            np.nan,
        )
    return pd.DataFrame(
        {
            "t_s": (start_ns - t[0]) / NS_PER_S,
            "span_s": np.maximum(end_ns - start_ns, 0) / NS_PER_S,
            "step0": starts.astype(np.int64),
            "segment": segment.astype(np.int64),
            "phase": phase[starts],
            "steps": n_steps.astype(np.int64),
            "cold_share": cold_share,
            "lookups": lookups,
            "cold_lookups": sums["cold_lookups"],
            "swaps": sums["swaps"],
            "tokens": sums["tokens"],
            "busy_s": busy_s,
            "decode_tok_s": tok_s,
        },
        columns=list(WINDOW_COLUMNS),
    )


def time_to_stay(
    t_s: npt.ArrayLike,
    values: npt.ArrayLike,
    shift_t_s: float,
    threshold: float,
    *,
    below: bool = True,
    hold_s: float = DEFAULT_HOLD_S,
    end_t_s: float | None = None,
) -> float | None:
    """Time from the shift until the series enters the band and stays there to the end.

    Precisely: among samples at t ≥ shift_t_s, find the earliest sample i such that sample i and
    EVERY later sample lie in the band (value ≤ threshold when ``below``, ≥ threshold
    otherwise). The series then stays in the band until the phase ends (``end_t_s``, default
    the last sample's time); that stay must last at least ``hold_s`` (end_t_s − tᵢ ≥ hold_s),
    or the phase ended too soon to tell. The answer is tᵢ − shift_t_s, so a dip into the band
    that leaves it again does not count: only the final entry does. With windowed series tᵢ is
    a window start — the end of the last window outside the band — so the resolution is one
    window. NaN samples (windows without lookups) carry no evidence and are skipped. Returns
    None when the series never enters-and-stays (never 0 in that case).
    """
    t = np.asarray(t_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise BadInput("time_to_stay: t_s and values must be 1-D arrays of equal length")
    keep = (t >= shift_t_s) & ~np.isnan(v)
    t, v = t[keep], v[keep]
    if t.size == 0:
        return None
    end = float(t[-1]) if end_t_s is None else float(end_t_s)
    outside = (v > threshold) if below else (v < threshold)
    last_out = np.flatnonzero(outside)
    first_in = 0 if last_out.size == 0 else int(last_out[-1]) + 1
    if first_in >= t.size:
        return None
    entered = float(t[first_in])
    if end - entered < hold_s:
        return None
    return entered - shift_t_s


def recovery_time(
    t_s: npt.ArrayLike,
    values: npt.ArrayLike,
    shift_t_s: float,
    converged: float,
    peak: float,
    *,
    fraction: float = 0.1,
    hold_s: float = DEFAULT_HOLD_S,
    end_t_s: float | None = None,
    band: float = 0.0,
) -> float | None:
    """T90 (fraction 0.1): time until the series enters and stays at or below
    C + max(f·(P − C), band).

    ``t_s``/``values`` are the new phase's series (e.g. cold share per window); see
    :func:`time_to_stay` for "enters and stays". ``band`` is how far the converged windows
    themselves stray above C by noise: a threshold inside it would ask the series to stay
    below its own noise, which it does only by chance. When P ≤ C there is no excess to clear
    and the recovery time is undefined: this raises BadInput, and
    :func:`recovery_from_windows` records the shift as "no excess" instead of calling it.
    None: never recovered.
    """
    if not 0 < fraction < 1:
        raise BadInput(f"fraction: must lie in (0, 1), got {fraction!r}")
    if not peak > converged:
        raise BadInput(
            f"recovery_time: no excess (peak {peak!r} <= converged {converged!r}): T90 undefined"
        )
    threshold = converged + max(fraction * (peak - converged), band)
    return time_to_stay(
        t_s, values, shift_t_s, threshold, below=True, hold_s=hold_s, end_t_s=end_t_s
    )


@dataclass(frozen=True)
class ShiftRecovery:
    """Recovery after one phase shift; times in seconds from the shift.

    On the step clock (``clock`` "steps") the recovery is timed in host steps
    (``t90_steps``, ``t2x_steps``, ``speed_recovery_steps``) and the ``_s`` fields are the wall
    seconds those steps took on this box; on the seconds clock the ``_steps`` fields are the
    steps the box served in that time. Either way both are kept, and ``clock`` says which one
    the recovery was measured in.

    ``excess`` is False when there was nothing to recover from (no lookups, or the peak did not
    exceed the converged value): T90 and T2x are then None and mean "n/a", not "never".
    With ``excess`` True, a None time means the series never entered and stayed in its band.
    """

    from_phase: int
    to_phase: int
    shift_t_s: float
    peak: float
    converged: float
    t90_s: float | None
    t2x_s: float | None
    speed_recovery_s: float | None
    converged_tok_s: float
    notes: tuple[str, ...]
    excess: bool = True
    t90_steps: float | None = None
    t2x_steps: float | None = None
    speed_recovery_steps: float | None = None
    clock: str = "seconds"


def phase_recovery(
    frame: RingInput,
    window_s: float = DEFAULT_WINDOW_S,
    *,
    converged_span_s: float = DEFAULT_CONVERGED_SPAN_S,
    fraction: float = 0.1,
    hold_s: float = DEFAULT_HOLD_S,
    speed_fraction: float = 0.9,
    steps: StepClock | None = None,
) -> list[ShiftRecovery]:
    """T90, T2x and speed recovery for every phase shift of a ring (one row per host step);
    with ``steps``, on the step clock (its window, converged span and hold replace the
    seconds ones)."""
    windows = cold_share_windows(frame, window_s, steps=steps)
    return recovery_from_windows(
        windows,
        converged_span_s=converged_span_s,
        fraction=fraction,
        hold_s=hold_s,
        speed_fraction=speed_fraction,
        steps=steps,
    )


def recovery_from_windows(
    windows: pd.DataFrame,
    *,
    converged_span_s: float = DEFAULT_CONVERGED_SPAN_S,
    fraction: float = 0.1,
    hold_s: float = DEFAULT_HOLD_S,
    speed_fraction: float = 0.9,
    steps: StepClock | None = None,
) -> list[ShiftRecovery]:
    """:func:`phase_recovery` over windows already built by :func:`cold_share_windows` (with
    the same ``steps``).

    For each span after the first: C = median cold share of the windows starting in the span's
    last ``converged_span_s``; P = max cold share in the span; N = the spread of the windows in
    the span's second half (:func:`_late_spread`, clear of the transient; at most half the
    excess, so T90 is never looser than T50); T90 threshold C + max(f·(P − C), N), T2x
    threshold max(2·C, C + N) (a band inside the noise is left only by chance); converged
    speed = median decode_tok_s over the same converged windows, and speed recovery =
    enter-and-stay at ≥ speed_fraction of it.
    """
    if converged_span_s <= 0 or hold_s < 0:
        raise BadInput("converged_span_s must be > 0 and hold_s >= 0")
    position, span_len, conv_span, hold, unit, names = _clock(steps, converged_span_s, hold_s)
    out: list[ShiftRecovery] = []
    seg = windows["segment"].to_numpy()
    phases = windows["phase"].to_numpy(dtype=np.int64)
    bounds = np.flatnonzero(np.diff(seg)) + 1
    firsts = np.concatenate(([0], bounds))
    lasts = np.concatenate((bounds, [seg.size]))
    for i in range(1, firsts.size):
        span = windows.iloc[firsts[i] : lasts[i]]
        t = span[position].to_numpy(dtype=np.float64)
        share = span["cold_share"].to_numpy(dtype=np.float64)
        speed = span["decode_tok_s"].to_numpy(dtype=np.float64)
        shift_t = float(t[0])
        end_t = float(t[-1] + span[span_len].to_numpy()[-1])
        conv = t >= end_t - conv_span
        notes: list[str] = []
        minimum = t90_min_phase_s(converged_span_s=conv_span, hold_s=hold)
        if end_t - shift_t < minimum:
            notes.append(
                f"phase lasted {end_t - shift_t:.{0 if steps else 1}f}{unit}, under "
                f"{names[0]} + {names[1]} ({minimum:g}{unit}): the converged value may include "
                "the transient"
            )
        c = _nan_stat(np.nanmedian, share[conv])
        p = _nan_stat(np.nanmax, share)
        c_speed = _nan_stat(np.nanmedian, speed[conv])
        # The noise is read where the phase has converged, when it has four windows there: a
        # transient as long as half the phase, whose prompts differ in cold share, would
        # otherwise count its own fall as noise (a 7.7% peak over 2.3% read "within noise").
        settled = share[conv] if np.count_nonzero(np.isfinite(share[conv])) >= 4 else share
        floor = _noise_floor(c, settled, span["lookups"].to_numpy(dtype=np.float64)[conv])
        excess = not (math.isnan(c) or math.isnan(p)) and p > c + floor
        t90 = t2x = None
        if math.isnan(c) or math.isnan(p):
            notes.append("no lookups in this phase: no cold share")
        elif not excess and p > c:
            notes.append(
                f"no excess beyond noise: the peak ({p * 100:.2f}%) is within the windows' "
                f"sampling noise of the converged value ({c * 100:.2f}% + "
                f"{floor * 100:.2f} points) (T90 n/a)"
            )
        elif not excess:
            notes.append("no excess: the peak does not exceed the converged value (T90 n/a)")
        else:
            spread = _late_spread(share[t >= (shift_t + end_t) / 2.0])
            if math.isnan(spread):  # too few late windows: the whole phase's noise instead
                spread = floor
            band = min(spread, 0.5 * (p - c))
            t90 = recovery_time(
                t, share, shift_t, c, p,
                fraction=fraction, hold_s=hold, end_t_s=end_t, band=band,
            )  # fmt: skip
            t2x = time_to_stay(
                t, share, shift_t, max(2.0 * c, c + band), hold_s=hold, end_t_s=end_t
            )
        speed_rec = None
        if not math.isnan(c_speed):
            back = speed_fraction * c_speed
            speed_rec = time_to_stay(
                t, speed, shift_t, back, below=False, hold_s=hold, end_t_s=end_t
            )
        defined = (
            ("T90", t90, c if excess else math.nan),
            ("T2x", t2x, c if excess else math.nan),
            ("speed recovery", speed_rec, c_speed),
        )
        for name, value, basis in defined:
            if value is None and not math.isnan(basis):
                notes.append(
                    f"{name}: never recovered (held for {hold:g}{unit}) before the phase ended"
                )
        both = _both_clocks(span, position)
        out.append(
            ShiftRecovery(
                from_phase=int(phases[firsts[i - 1]]),
                to_phase=int(phases[firsts[i]]),
                shift_t_s=float(span["t_s"].iloc[0]),
                peak=p,
                converged=c,
                t90_s=both(t90)[0],
                t2x_s=both(t2x)[0],
                speed_recovery_s=both(speed_rec)[0],
                converged_tok_s=c_speed,
                notes=tuple(notes),
                excess=excess,
                t90_steps=both(t90)[1],
                t2x_steps=both(t2x)[1],
                speed_recovery_steps=both(speed_rec)[1],
                clock="steps" if steps is not None else "seconds",
            )
        )
    return out


def _clock(
    steps: StepClock | None, converged_span_s: float, hold_s: float
) -> tuple[str, str, float, float, str, tuple[str, str]]:
    """The clock a recovery is timed on: its windows' position and length columns, converged
    span, hold, unit, and the card fields that set the span and hold (for notes)."""
    if steps is not None:
        names = ("converged_span_steps", "hold_steps")
        return "step0", "steps", float(steps.converged_span), float(steps.hold), " steps", names
    return "t_s", "span_s", converged_span_s, hold_s, " s", ("converged_span_s", "hold_s")


def _both_clocks(
    span: pd.DataFrame, position: str
) -> Callable[[float | None], tuple[float | None, float | None]]:
    """A time after the span's shift, on the clock of ``position``, as (seconds, steps): every
    recovery time is a window's start (or None: never, n/a), so both are that window's."""
    at = span[position].to_numpy(dtype=np.float64)
    seconds = span["t_s"].to_numpy(dtype=np.float64)
    steps = span["step0"].to_numpy(dtype=np.float64)

    def convert(offset: float | None) -> tuple[float | None, float | None]:
        if offset is None:
            return None, None
        j = min(int(np.searchsorted(at, at[0] + offset - 1e-9)), at.size - 1)
        return float(seconds[j] - seconds[0]), float(steps[j] - steps[0])

    return convert


def general_note(note: str) -> str:
    """A recovery note without its per-run numbers, so equal notes group across runs (a
    ladder's 18 runs read 14 notes of "1 of 18 runs" apiece while each carried its own peak).
    Beside the notes' words, which :func:`recovery_from_windows` writes."""
    note = re.sub(r"^phase lasted [0-9.]+ s, under", "phase shorter than", note)
    return re.sub(
        r"the peak \([0-9.]+%\) is within the windows' sampling noise of the converged value "
        r"\([0-9.]+% \+ [0-9.]+ points\)",
        "the peak is within the windows' sampling noise of the converged value",
        note,
    )


def times_recovery(note: str) -> bool:
    """Whether a recovery note (as written here, or grouped by the seed tables) is about timing
    a recovery rather than about the phase's cold share."""
    return any(mark in note for mark in RECOVERY_TIMING_MARKS)


def recovery_measured(
    frame: RingInput,
    phase_index: int,
    window_s: float = DEFAULT_WINDOW_S,
    *,
    converged_span_s: float = DEFAULT_CONVERGED_SPAN_S,
    fraction: float = 0.1,
    hold_s: float = DEFAULT_HOLD_S,
    steps: StepClock | None = None,
) -> bool:
    """Whether the ring so far measures the recovery of the shift into ``phase_index``, if the
    phase ended now: it has lasted converged_span_s + hold_s (on the step clock, its steps),
    and either there is nothing to recover from (no excess) or T90 is found, held, and ends
    before the converged span begins (so the converged value is not the transient). The same
    definitions as the analysis (:func:`recovery_from_windows`), so a phase cut here reads as
    measured there."""
    cols = ring_columns(frame)
    if cols["t_ns"].size == 0 or int(cols["phase"][-1]) != phase_index:
        return False
    shifts = phase_recovery(
        frame, window_s, converged_span_s=converged_span_s, fraction=fraction, hold_s=hold_s,
        steps=steps,
    )  # fmt: skip
    if not shifts or shifts[-1].to_phase != phase_index:
        return False
    last = shifts[-1]
    if steps is not None:
        before = np.flatnonzero(cols["phase"] != phase_index)
        start = int(before[-1]) + 1 if before.size else 0
        lasted, t90, conv_span = (
            float(cols["phase"].size - start),
            last.t90_steps,
            float(steps.converged_span),
        )
        minimum = t90_min_phase_s(converged_span_s=steps.converged_span, hold_s=steps.hold)
    else:
        end_t = (float(cols["t_ns"][-1]) - float(cols["t_ns"][0])) / NS_PER_S
        lasted, t90, conv_span = end_t - last.shift_t_s, last.t90_s, converged_span_s
        minimum = t90_min_phase_s(converged_span_s=converged_span_s, hold_s=hold_s)
    if lasted < minimum:
        return False
    if not last.excess:
        return not math.isnan(last.converged)  # nothing to recover from: measured as n/a
    if t90 is None:
        return False
    # Strictly before: at least some recovered windows lie outside the converged span.
    return t90 < lasted - conv_span


def _late_spread(share: FloatArray) -> float:
    """How far above their median the windows of a phase's second half reach by noise: their
    window-to-window SD (median absolute successive difference ÷ 0.954) times the expected
    maximum of that many standard normals, 1 + √(2 ln n); NaN under four windows (no spread to
    read). A recovery band narrower than this is one the converged windows leave by chance,
    so whether a run "recovered" would be a coin toss (the demo's fitted map: a 1.1% peak
    over 0.5% read recovered in one run and "never" in the next)."""
    if np.count_nonzero(np.isfinite(share)) < 4:
        return math.nan
    # The noise floor's own window-to-window part, without its binomial floor (no lookups).
    return _noise_floor(0.0, share, np.empty(0))


def _noise_floor(converged: float, share: FloatArray, lookups: FloatArray) -> float:
    """How far above the converged cold share a window's share reaches by noise alone: the
    window-to-window SD (from the median absolute successive difference, which a transient's few
    falling windows barely move; at least the binomial SE of the converged windows' lookups,
    which undercounts, a step's lookups being correlated) times the expected maximum of the
    span's windows as standard normals, 1 + √(2 ln n). A peak within it is no transient: T90
    of it would time noise (a flat 0.58% against 0.42% read "never" after 40 more requests)."""
    values = share[np.isfinite(share)]
    if math.isnan(converged) or values.size == 0:
        return 0.0
    sd = 0.0
    if values.size >= 4:
        sd = float(np.median(np.abs(np.diff(values)))) / 0.954  # MAD of a difference of two
    counts = lookups[np.isfinite(lookups) & (lookups > 0)]
    if counts.size:
        c = min(max(converged, 0.0), 1.0)
        sd = max(sd, math.sqrt(c * (1.0 - c) / float(np.median(counts))))
    return sd * (1.0 + math.sqrt(2.0 * math.log(max(values.size, 2))))


def _nan_stat(fn: Callable[[FloatArray], np.floating[Any]], values: FloatArray) -> float:
    """nanmedian/nanmax without numpy's all-NaN RuntimeWarning: NaN when nothing is finite."""
    finite = values[~np.isnan(values)]
    if finite.size == 0:
        return math.nan
    return float(fn(finite))


def converged_mask(
    windows: pd.DataFrame, converged_span_s: float, *, steps: StepClock | None = None
) -> npt.NDArray[np.bool_]:
    """Windows that start within the last ``converged_span_s`` of their phase span (with
    ``steps``, within its last ``steps.converged_span`` host steps)."""
    position, length = ("step0", "steps") if steps is not None else ("t_s", "span_s")
    span = float(steps.converged_span) if steps is not None else converged_span_s
    t = windows[position].to_numpy(dtype=np.float64)
    end = (windows[position] + windows[length]).groupby(windows["segment"]).transform("max")
    mask: npt.NDArray[np.bool_] = t >= end.to_numpy(dtype=np.float64) - span
    return mask


def step_clock(analysis: AnalysisSpec) -> StepClock | None:
    """The card's step clock (``analysis.window_steps``), or None: recovery timed in seconds.
    Unset, the converged span is four windows (its median and noise need four) and the hold
    two."""
    if analysis.window_steps is None:
        return None
    return StepClock(
        window=analysis.window_steps,
        converged_span=analysis.converged_span_steps or 4 * analysis.window_steps,
        hold=analysis.hold_steps if analysis.hold_steps is not None else 2 * analysis.window_steps,
    )
