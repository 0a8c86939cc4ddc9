"""The labels a comparison can carry, and every rule that gives or withholds one, in one place.

:func:`decide_label` is the statistical label (docs/design.md#statistics); drift can withhold it
(:func:`is_confounded` → *confounded*), and so can carry-over: unestimated on unwashed blocks
(:func:`carry_over_unchecked`), or able to explain the claim once estimated
(:func:`carry_over_explains`, and on washed blocks only where :func:`washout_left` shows the
washout did not clear it) → *carry-over*. :func:`final_label` applies them in order, and
:func:`carry_over_reason` / :func:`label_reason` are the only places the reason is worded: the
gate, the report, the terminal and the warnings all quote them.

The carry-over decision. *Washed* blocks (every block followed a washout of its own arm lasting
a whole block, a cold run's eviction, or a simulated run) keep D̄'s label, which is the deployed
effect by design; the crossover model, with "before" the arm before the washout, is the evidence
that the washout worked, and only where c_A's or c_B's (1 − α) interval excludes 0 must the label
also hold for τ̂ + ĉ_B. That can only withhold a label: no preliminary test picks the estimator,
which Freeman (1989) showed inflates the size to 22.5%. *Unwashed* blocks (a washout of part of a
block included: it clears what its traffic clears, not an order of carry-over) must hold for
τ̂ + ĉ_B's t-interval on 2m − 3 df, and below MIN_CARRY_CYCLES (3) cycles they are *carry-over*
outright, on any boot, but for a deterministic metric whose two blocks of each arm read the same
in every cycle. When a washout of part of a block was decided as washed (the demo's 0.25), the
traffic-time bank held 4 of 20 cases, heat with a one-block half-life at 48% false *better*.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from harness.stats.crossover import MIN_CARRY_CYCLES, ROUNDING, CarryOver
from harness.stats.cycles import Cycle, pct_change


class Label(StrEnum):
    """A comparison's label; each is its own word (``str(Label.BETTER) == "better"``)."""

    BETTER = "better"
    WORSE = "worse"
    WITHIN_NOISE = "within noise"
    INCONCLUSIVE = "inconclusive"
    CONFOUNDED = "confounded"  # statistically decided, but flagged drift could explain it
    CARRY_OVER = "carry-over"  # statistically decided, but carry-over could explain it
    NOT_ENGAGED = "not engaged"  # the cell's change did not show on its boots: nothing to compare
    CORRUPT = "corrupt"  # a boot computed other outputs than the control: wrong weights
    NOT_EQUIVALENT = "not equivalent"  # a lossy cell's outputs agree less than its margin allows

    @property
    def decided(self) -> bool:
        """A statistical decision: better, worse or within noise."""
        return self in (Label.BETTER, Label.WORSE, Label.WITHIN_NOISE)

    @property
    def claims_a_difference(self) -> bool:
        """Better or worse: a claim that carry-over or drift could have produced."""
        return self in (Label.BETTER, Label.WORSE)


STATISTICAL = (Label.BETTER, Label.WORSE, Label.WITHIN_NOISE, Label.INCONCLUSIVE)


def decide_label(
    mean: float,
    ci95: tuple[float, float] | None,
    ci90: tuple[float, float] | None,
    margin: float,
    *,
    higher_is_better: bool,
    p_value: float | None = None,
    alpha: float = 0.05,
) -> Label:
    """The labels of docs/design.md#statistics, on the log scale.

    *better*/*worse*: the (1−α) CI excludes 0 and |D̄| ≥ Δ, the sign read through
    ``higher_is_better``; when ``p_value`` is given (e.g. Holm-adjusted) "excludes 0" is taken
    as p < α, which for the unadjusted t-test is the same statement. *within noise*: the
    (1−2α) CI lies inside (−Δ, Δ) (TOST). *inconclusive*: anything else, or no interval.
    """
    if ci95 is None or ci90 is None:
        return Label.INCONCLUSIVE
    excludes_zero = (p_value < alpha) if p_value is not None else (ci95[0] > 0 or ci95[1] < 0)
    if excludes_zero and abs(mean) >= margin:
        improved = (mean > 0) == higher_is_better
        return Label.BETTER if improved else Label.WORSE
    if -margin < ci90[0] and ci90[1] < margin:
        return Label.WITHIN_NOISE
    return Label.INCONCLUSIVE


def is_confounded(
    raw_label: str,
    mean: float,
    ci: tuple[float, float] | None,
    tost_ci: tuple[float, float] | None,
    margin: float,
    bias: float,
) -> bool:
    """Whether drift of size ``bias`` could have produced the label (log scale).

    *better*/*worse* is confounded when the interval moved towards 0 by the bias touches 0, or
    the effect less the bias falls short of the margin; *within noise* when the 90% interval
    widened by the bias leaves (−Δ, Δ). An inconclusive label claims nothing to confound.
    """
    if bias <= 0:
        return False
    if raw_label in ("better", "worse") and ci is not None:
        if mean > 0:
            return ci[0] - bias <= 0 or mean - bias < margin
        return ci[1] + bias >= 0 or -mean - bias < margin
    if raw_label == "within noise" and tost_ci is not None:
        return tost_ci[0] - bias <= -margin or tost_ci[1] + bias >= margin
    return False


def carry_over_explains(raw_label: str, mean: float, model: CarryOver | None) -> bool:
    """Whether carry-over could have produced a *better*/*worse* label of unwashed blocks (or of
    washed ones whose washout left carry-over: :func:`washout_left`).

    The label stands on D̄, which carry-over biases (by −¾·c_A + ¼·c_B in the planner's back-to-
    back alternation, where three of four control blocks follow a candidate block) and which,
    without a washout, measures neither the candidate after a control block nor the candidate
    deployed. The claim must hold for the deployed effect τ̂ + ĉ_B (the candidate after itself
    against the control after itself), unbiased under any first-order carry-over: when its
    (1 − α) interval does not exclude 0 on the side of D̄, carry-over could explain the claim and
    the label is *carry-over*. Needs the carry-over terms (MIN_CARRY_CYCLES cycles); without
    them :func:`carry_over_unchecked` decides.
    """
    if raw_label not in ("better", "worse") or model is None or model.control is None:
        return False
    low, high = model.deployed_ci
    return not (low > 0) if mean > 0 else not (high < 0)


def carry_over_unchecked(
    raw_label: str, model: CarryOver | None, cycles: Sequence[Cycle], *, exact: bool
) -> bool:
    """Whether a *better*/*worse* label of unwashed blocks stands on carry-over nobody checked.

    Without a washout each block runs on the state the block before it left (a cache, a queue,
    a map, heat or a dirtied page cache, on a boot of its own or a shared one), and with fewer
    than MIN_CARRY_CYCLES cycles the model cannot estimate it, so such a label fails closed. A
    deterministic (``exact``) metric can rule it out without the model: when each arm's two
    blocks read the same in every cycle, whichever arm ran before them (ABBA: A after the boot
    or another comparison, then after B; B after A, then after B), a first-order carry-over of
    either arm onto the other is exactly zero.
    """
    if raw_label not in ("better", "worse"):
        return False
    if model is not None and model.control is not None:
        return False  # estimated: carry_over_explains decides
    return not (exact and same_arm_blocks_equal(cycles))


def washout_left(model: CarryOver | None) -> bool:
    """Whether washed blocks still show carry-over: c_A or c_B's (1 − α) interval excludes 0."""
    if model is None or model.control_ci is None or model.candidate_ci is None:
        return False
    return any(lo > 0 or hi < 0 for lo, hi in (model.control_ci, model.candidate_ci))


def same_arm_blocks_equal(cycles: Sequence[Cycle]) -> bool:
    """Each arm's first and second block of every cycle read the same (to rounding)."""
    for c in cycles:
        a1, a2, b1, b2 = c.arms()
        if abs(a1 - a2) > ROUNDING or abs(b1 - b2) > ROUNDING:
            return False
    return True


def final_label(raw_label: Label, *, carried: bool, confounded: bool) -> Label:
    """The label a comparison carries: carry-over first (its pattern, a slow block after each
    switch, also moves the outer blocks and raises drift flags, and the model names its cause),
    then drift, then the statistical label."""
    if carried:
        return Label.CARRY_OVER
    if confounded:
        return Label.CONFOUNDED
    return raw_label


def _cycles(m: int) -> str:
    return f"{m} cycle{'' if m == 1 else 's'}"


def carry_over_reason(
    raw_label: str, model: CarryOver | None, m: int, *, named: bool = True
) -> str:
    """Why carry-over withholds a *better*/*worse* label, in one clause: the deployed effect and
    the carry-over the model estimated, or that no washout preceded the blocks and too few
    cycles could estimate it. ``named`` False says "it" for the label (after "statistically
    better, but")."""
    label = f"the {raw_label} label" if named else "it"
    if model is None or model.control is None:
        return (
            f"no washout preceded the blocks, and {_cycles(m)} cannot estimate the carry-over "
            f"that could explain {label}: run {MIN_CARRY_CYCLES} or declare "
            "design.washout"
        )
    lo, hi = model.deployed_ci
    return (
        f"carry-over could explain {label}: deployed (the candidate after itself "
        f"against the control after itself) it is {pct_change(model.deployed)} "
        f"[{pct_change(lo)}, {pct_change(hi)}]; a control block after a candidate block moves "
        f"{pct_change(model.control)}, a candidate block after one "
        f"{pct_change(model.candidate or 0.0)}"
    )


def label_reason(
    label: Label, raw_label: Label, model: CarryOver | None, m: int, drift_bias: float
) -> str | None:
    """Why ``label`` is not the statistical ``raw_label`` (None when it is)."""
    if label == Label.CARRY_OVER:
        reason = carry_over_reason(raw_label, model, m, named=False)
        return f"statistically {raw_label}, but {reason}"
    if label == Label.CONFOUNDED:
        return (
            f"statistically {raw_label}, but flagged drift could bias the effect by up to "
            f"{pct_change(drift_bias)}, enough to explain it"
        )
    return None


__all__ = [
    "STATISTICAL",
    "Label",
    "carry_over_explains",
    "carry_over_reason",
    "carry_over_unchecked",
    "decide_label",
    "final_label",
    "is_confounded",
    "label_reason",
    "same_arm_blocks_equal",
    "washout_left",
]
