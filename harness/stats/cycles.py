"""Block values and the mirrored cycle: what one A/B cycle measures.

Formulas are docs/design.md#statistics (and #metrics for the geomean), adopted exactly:

- block value yᵢ = ln(geomean over held-out prompts) — one block = one arm in one slot
  (with one repeat, one boot);
- a cycle is four blocks in time order (slots t = −1.5, −0.5, 0.5, 1.5), ABBA or BAAB;
- effect per cycle Dⱼ = ½(y_B1 + y_B2) − ½(y_A1 + y_A2);
- outer change y_outer2 − y_outer1, inner change y_inner2 − y_inner1 and the nonlinearity
  r = 3(y_inner2 − y_inner1) − (y_outer2 − y_outer1), which the drift flags test;
- margin Δ = ln(1 + δ), δ in percent.

A is always the control and B the cell. Everything here is pure: numbers in, frozen dataclasses
out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import BadInput
from harness.stats.box_state import BlockTraffic, StateReading

FloatArray = npt.NDArray[np.float64]

ORDERS = ("ABBA", "BAAB")
# What ran on the box right before a block: the control ("A"), this comparison's cell ("B"),
# another cell ("X", a second treatment or a cache state's other lane), or nothing ("-": the
# box's first run of the campaign).
BEFORE = ("A", "B", "X", "-")


def geomean(values: npt.ArrayLike) -> float:
    """Geometric mean exp(mean(ln xᵢ)) (docs/design.md#metrics: geomean across prompts).

    Raises BadInput for an empty input or any non-positive or non-finite value, since a rate or
    a latency of zero or less means the measurement itself is broken.
    """
    return math.exp(_mean_log(values, what="geomean"))


def block_value(per_prompt_values: npt.ArrayLike) -> float:
    """Block value y = ln(geomean over held-out prompts) (docs/design.md#statistics).

    One block is one arm in one slot of a cycle; pass only one run's per-prompt values —
    requests of different boots are never pooled.
    """
    return _mean_log(per_prompt_values, what="block_value")


def margin_log(margin_pct: float) -> float:
    """Margin on the log scale, Δ = ln(1 + δ), with δ given in percent (the card's margin_pct)."""
    if not math.isfinite(margin_pct) or margin_pct <= 0:
        raise BadInput(f"margin_pct: must be a positive percentage, got {margin_pct!r}")
    return math.log1p(margin_pct / 100.0)


def _mean_log(values: npt.ArrayLike, *, what: str) -> float:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise BadInput(f"{what}: no values; a block needs at least one prompt")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise BadInput(
            f"{what}: value #{first} is {arr[first]!r}; every value must be a positive, finite "
            "rate or duration (drop failed requests before summarising the block)"
        )
    return float(np.log(arr).mean())


@dataclass(frozen=True)
class Cycle:
    """One mirrored cycle: four block values in TIME order (slots t = −1.5, −0.5, 0.5, 1.5).

    ``order`` is "ABBA" or "BAAB" (A = control, B = cell). ``prompt_logs``, when given, holds the
    per-prompt ln values of each block in the same time order (their means must equal ``y``);
    they feed the two-level bootstrap and the within-block SD s_w of the drift flags.
    ``prompts_aligned`` says element i of every block is the same prompt (the plan's normal
    case); the bootstrap then resamples one prompt set per cycle so prompt effects cancel in D,
    and s_w comes from same-arm paired differences instead of raw within-block spread.
    ``shared_boot`` says two or more of its blocks ran on one boot (``design.boot`` per-cycle or
    per-campaign), where a block can inherit the state the block before it left.
    ``before`` names, per block in time order, what ran on the box right before it (one of
    :data:`BEFORE`, from the runs' start times on their box); None where the records do not say,
    and the crossover model then takes the plan's back-to-back order. ``washed`` says every block
    was preceded by a washout of its own arm (requests sent and not scored): the block before a
    scored block is then its own arm, and ``before`` is what ran before the washout.
    ``box`` names the box all four blocks ran on (None where the records do not say).
    ``box_state``, per block in time order, holds a runtime profile's probes of the box's state
    (probe name → readings before the block's own traffic, as it scored, as it ended) and
    ``own_traffic`` the block's own traffic before it scored (warm-up and washout), in blocks:
    harness.stats.box_state asks whether the state had settled.
    """

    index: int
    order: str
    y: tuple[float, float, float, float]
    prompt_logs: tuple[FloatArray, ...] | None = None
    prompts_aligned: bool = False
    shared_boot: bool = False
    before: tuple[str, str, str, str] | None = None
    washed: bool = False
    box: str | None = None
    box_state: tuple[Mapping[str, StateReading], ...] | None = None
    own_traffic: tuple[float, float, float, float] | None = None

    def __post_init__(self) -> None:
        where = f"cycle {self.index}"
        if self.order not in ORDERS:
            raise BadInput(f"{where}: order must be ABBA or BAAB, got {self.order!r}")
        if len(self.y) != 4 or not all(math.isfinite(v) for v in self.y):
            raise BadInput(f"{where}: y must be four finite block values in time order")
        if self.before is not None and (
            len(self.before) != 4 or any(b not in BEFORE for b in self.before)
        ):
            raise BadInput(f"{where}: before must name four of {BEFORE}, got {self.before!r}")
        if self.box_state is not None and len(self.box_state) != 4:
            raise BadInput(f"{where}: box_state must hold four blocks' readings")
        if self.prompt_logs is None:
            if self.prompts_aligned:
                raise BadInput(f"{where}: prompts_aligned needs prompt_logs")
            return
        if len(self.prompt_logs) != 4:
            raise BadInput(
                f"{where}: prompt_logs must hold four blocks, got {len(self.prompt_logs)}"
            )
        sizes = {len(b) for b in self.prompt_logs}
        if self.prompts_aligned and len(sizes) != 1:
            raise BadInput(f"{where}: prompts_aligned needs the same prompt count in every block")
        for slot, (logs, yv) in enumerate(zip(self.prompt_logs, self.y, strict=True)):
            if len(logs) == 0 or not np.isfinite(logs).all():
                raise BadInput(f"{where}: block {slot} prompt_logs must be non-empty and finite")
            if not math.isclose(float(np.mean(logs)), yv, rel_tol=1e-9, abs_tol=1e-12):
                raise BadInput(
                    f"{where}: block {slot} y={yv!r} is not the mean of its prompt_logs; build "
                    "cycles with cycle_from_prompt_values()"
                )

    def arms(self) -> tuple[float, float, float, float]:
        """(y_A1, y_A2, y_B1, y_B2): each arm's first and second block, whatever the order."""
        s0, s1, s2, s3 = self.y
        if self.order == "ABBA":
            return s0, s3, s1, s2
        return s1, s2, s0, s3

    @property
    def y_a1(self) -> float:
        """First control block."""
        return self.arms()[0]

    @property
    def y_a2(self) -> float:
        """Second control block."""
        return self.arms()[1]

    @property
    def y_b1(self) -> float:
        """First cell block."""
        return self.arms()[2]

    @property
    def y_b2(self) -> float:
        """Second cell block."""
        return self.arms()[3]

    @property
    def effect(self) -> float:
        """Dⱼ = ½(y_B1 + y_B2) − ½(y_A1 + y_A2)."""
        a1, a2, b1, b2 = self.arms()
        return 0.5 * (b1 + b2) - 0.5 * (a1 + a2)

    @property
    def outer_change(self) -> float:
        """y_outer2 − y_outer1 (slots ±1.5: A in ABBA, B in BAAB); 3β under linear drift βt."""
        return self.y[3] - self.y[0]

    @property
    def inner_change(self) -> float:
        """y_inner2 − y_inner1 (slots ±0.5); β under linear drift βt."""
        return self.y[2] - self.y[1]

    @property
    def nonlinearity(self) -> float:
        """r = 3(y_inner2 − y_inner1) − (y_outer2 − y_outer1); 0 under linear or quadratic drift."""
        return 3.0 * self.inner_change - self.outer_change

    def swapped(self) -> Cycle:
        """The same blocks with the arms' roles exchanged (cell becomes control): D → −D."""
        flip = {"A": "B", "B": "A", "X": "X", "-": "-"}
        before = None
        if self.before is not None:
            b0, b1, b2, b3 = (flip[b] for b in self.before)
            before = (b0, b1, b2, b3)
        return replace(self, order="BAAB" if self.order == "ABBA" else "ABBA", before=before)


def cycle_from_prompt_values(
    index: int,
    order: str,
    blocks: Sequence[npt.ArrayLike],
    *,
    prompts_aligned: bool = False,
) -> Cycle:
    """Build a Cycle from four blocks of raw per-prompt values (rates or durations), time order."""
    if len(blocks) != 4:
        raise BadInput(f"cycle {index}: need four blocks in time order, got {len(blocks)}")
    ys = tuple(block_value(b) for b in blocks)
    logs = tuple(np.log(np.asarray(b, dtype=np.float64).ravel()) for b in blocks)
    return Cycle(index, order, (ys[0], ys[1], ys[2], ys[3]), logs, prompts_aligned)


def raw_effect(order: str, raw_values: Sequence[float]) -> float:
    """½(B1 + B2) − ½(A1 + A2) on the RAW scale (e.g. t/s), four values in time order.

    Only for showing why the log scale differs (the worked example in
    docs/design.md#statistics): drift that is linear in t/s cancels exactly here but not in
    ln t/s.
    """
    if len(raw_values) != 4:
        raise BadInput(f"raw_effect: need four values in time order, got {len(raw_values)}")
    if order not in ORDERS:
        raise BadInput(f"raw_effect: order must be ABBA or BAAB, got {order!r}")
    s0, s1, s2, s3 = (float(v) for v in raw_values)
    a_sum, b_sum = (s0 + s3, s1 + s2) if order == "ABBA" else (s1 + s2, s0 + s3)
    return 0.5 * b_sum - 0.5 * a_sum


def log_to_ratio(log_value: float) -> float:
    """A log ratio as the ratio exp(value): ``math.inf`` beyond the largest float (a log ratio
    over ~709.8, such as the upper end of a first look's interval at one df and a tiny nominal
    level), where ``math.exp`` raises OverflowError; 0.0 below the smallest."""
    try:
        return math.exp(log_value)
    except OverflowError:
        return math.inf


def pct_change(log_value: float) -> str:
    """A log-scale effect as the signed percent change it stands for, e.g. "+2.0%"."""
    if log_value > 700:  # exp overflows; no such rate is a measurement anyway
        return "over +1e300%"
    return f"{math.expm1(log_value) * 100:+.1f}%"


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing, NaN, infinite, a bool or a string."""
    if value is None or isinstance(value, bool | str):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


UNBOUNDED = "∞"


def interval_text(low: Any, high: Any, none: str = "no interval") -> str:
    """A ratio interval as every renderer prints it, "[0.912, 1.126]"; ``none`` without a lower
    bound (one cycle). An upper bound past the largest float (:func:`log_to_ratio`) is "∞",
    whether it comes as ``math.inf`` or, beside a finite lower bound, as the None or NaN that
    JSON and parquet store it as."""
    lo = finite(low)
    if lo is None:
        return none
    hi = finite(high)
    return f"[{lo:.3f}, {UNBOUNDED if hi is None else f'{hi:.3f}'}]"


def cycle_blocks(cycles: Sequence[Cycle]) -> list[BlockTraffic]:
    """The scored blocks of cycles that carry box-state readings, as harness.stats.box_state
    checks them (time order; blocks without readings read as none)."""
    out: list[BlockTraffic] = []
    for c in sorted(cycles, key=lambda c: c.index):
        if c.box_state is None:
            continue
        before = c.before or ("-", "-", "-", "-")
        own = c.own_traffic or (0.0, 0.0, 0.0, 0.0)
        for slot, arm in enumerate(c.order):
            out.append(BlockTraffic(arm, before[slot], own[slot], c.box_state[slot]))
    return out
