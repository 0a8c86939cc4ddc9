"""Statistics of mirrored A/B campaigns: intervals, tests, labels and the comparison.

Formulas are docs/design.md#statistics, adopted exactly (block values and cycle effects Dⱼ are
in harness.stats.cycles, drift flags in harness.stats.drift, cycles needed in
harness.stats.power):

- ratio R = exp(D̄), D̄ the order-balanced mean of the m cycle effects Dⱼ
  (:func:`balanced_effect`); CI exp(D̄ ± t₁₋α/₂,ₘ₋₁·SE), SE = s·√Σwⱼ²;
- labels with margin Δ = ln(1 + δ): *better*/*worse* when the CI excludes 0 and |D̄| ≥ Δ;
  *within noise* when the 90 % CI lies inside (−Δ, Δ) (TOST); *inconclusive* otherwise;
- the crossover model (harness.stats.crossover) beside it: the drift it removes, the
  carry-over it estimates (a *better*/*worse* label the carry-over-adjusted effect does not
  support is labelled *carry-over*) and the variance components.

The estimand is the deployed effect, E[B after B] − E[A after A]: a box running only the cell
against one running only the control. With a washout of a whole block before every scored block
each block follows its own arm and D̄ estimates it; without one, the crossover model's τ̂ + ĉ_B
does. Beside the t-interval, cross-checks reported as warnings when they disagree: a two-level
bootstrap of the same estimator (cycles, then prompts, one prompt draw per cycle where the blocks
hold the same prompts), Wilcoxon's signed-rank test from six cycles, and the effect over
ABBA+BAAB pairs. A timed metric's per-cycle SD is floored at s_w/√k (:func:`_spread_floor`),
since an SD from a few cycles can fall below what four blocks of k prompts allow; deterministic
metrics keep their exact intervals.

A is always the control and B the cell; the ratio is always cell/control, whichever direction
is "better" for the metric. Everything here is pure: numbers in, frozen dataclasses out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from harness.errors import BadInput
from harness.stats.box_state import StateCheck, check_state
from harness.stats.crossover import (
    MIN_CARRY_CYCLES,
    ROUNDING,
    CarryOver,
    fit_crossover,
    model_view,
)
from harness.stats.cycles import Cycle, cycle_blocks, log_to_ratio, margin_log, pct_change
from harness.stats.design_sim import (
    Layout,
    fixed_cycles_needed,
    stopping_distribution,
)
from harness.stats.drift import Flag, drift_flags, pooled_within_sd
from harness.stats.effect import (
    Effect,
    VarianceComponents,
    balanced_effect,
    between_boxes,
    drift_bias,
    variance_components,
)
from harness.stats.intervals import bootstrap_ratio_ci, pair_effects, wilcoxon_p
from harness.stats.labels import (
    Label,
    carry_over_explains,
    carry_over_reason,
    carry_over_unchecked,
    decide_label,
    final_label,
    is_confounded,
    label_reason,
    washout_left,
)
from harness.stats.power import (
    RESUME_HINT,
    cycles_to_decide,
    needed_range,
    needed_words,
    power_warnings,
)
from harness.stats.sequential import SequentialPlan

DEFAULT_MARGIN_PCT = 2.0
# The washout share simulations assume for washed blocks: the default's (the simulations that
# advise cycles carry neither drift nor carry-over, so its length changes nothing there).
WASHED_SHARE = 1.0
# Wilcoxon's smallest two-sided p with m cycles is 2/2^m: below 6 cycles it can never reach 0.05.
WILCOXON_MIN_CYCLES = 6


@dataclass(frozen=True)
class Comparison:
    """Cell vs control on one metric over m cycles.

    ``ratio`` = exp(D̄), cell/control, D̄ the order-balanced mean (:func:`balanced_effect`).
    ``label`` is "carry-over" whenever ``carry_over_explains`` — the carry-over-adjusted effect
    does not support the *better*/*worse* claim —, else "confounded" whenever ``confounded`` —
    the bias flagged drift could cause (``drift_bias``) reaches the interval the label stands
    on —, else ``raw_label``, the pure statistical label. CI bounds and p are None with one
    cycle (no interval exists). A ratio past the largest float is ``math.inf`` (in ``ratio``,
    the levels and every interval's bounds: :func:`harness.stats.cycles.log_to_ratio`), as the
    upper bound of a first look at 2 cycles and a tiny nominal level is (t on one df); the
    labels stand on the log scale, where every bound is finite, and such an interval is
    inconclusive wherever it also reaches below 1.
    """

    metric: str
    ratio: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    label: Label
    n_cycles: int
    confounded: bool
    flags: tuple[Flag, ...]
    warnings: tuple[str, ...]
    pair_ratio: float | None
    bootstrap_ci: tuple[float, float] | None
    cycles_needed: int | None
    raw_label: Label
    mean_log_effect: float
    sd_log_effect: float | None
    margin_log: float
    alpha: float
    higher_is_better: bool
    n_pairs: int = 0
    tost_ci: tuple[float, float] | None = None
    wilcoxon_p: float | None = None
    drift_bias: float = 0.0  # bound on the bias unmodelled drift could put in D̄ (log scale)
    carry_over_explains: bool = False
    model: CarryOver | None = None  # None with too few blocks for the model
    washed: bool = False  # every block followed a washout of its own arm
    variance: VarianceComponents | None = None
    # The paired blocks' levels, geometric and weighted as D̄ is: cell_level ÷ control_level is
    # exactly ``ratio``, so a row showing them beside it can never point the other way.
    control_level: float | None = None
    cell_level: float | None = None
    # How far cycles_needed moves across the spread's 80% interval (harness.stats.power).
    cycles_needed_range: tuple[int, int] | None = None
    box_state: tuple[StateCheck, ...] = ()  # the probes' checks (harness.stats.box_state)
    state_withholds: bool = False  # a probe alone withheld the label (the model did not)
    # Why the cell's change did not take effect (harness.analyze.engagement): the label is then
    # *not engaged* whatever the statistics said.
    not_engaged: str | None = None
    # Why the cell's boots computed something else (harness.analyze.canaries), or its lossy
    # outputs are not shown equivalent (harness.analyze.equivalence): the label says so.
    corrupt: str | None = None
    not_equivalent: str | None = None

    @property
    def needed_text(self) -> str | None:
        """ "about N cycles (lo–hi …) would be needed"; None when no count is known."""
        if not self.cycles_needed:
            return None
        return needed_words(self.cycles_needed, self.cycles_needed_range)

    @property
    def reason(self) -> str | None:
        """Why the label is not the statistical one, in one clause (None when it is)."""
        if self.label == Label.NOT_ENGAGED and self.not_engaged:
            return f"statistically {self.raw_label}, but {self.not_engaged}"
        if self.label == Label.CORRUPT and self.corrupt:
            return f"statistically {self.raw_label}, but {self.corrupt}"
        if self.not_equivalent and self.label in (Label.NOT_EQUIVALENT, Label.INCONCLUSIVE):
            return f"statistically {self.raw_label}, but {self.not_equivalent}"
        unsettled = next((c for c in self.box_state if c.unsettled), None)
        if self.label == Label.CARRY_OVER and unsettled is not None and self.state_withholds:
            return f"statistically {self.raw_label}, but {unsettled.words()}"
        reason = label_reason(
            self.label, self.raw_label, self.model, self.n_cycles, self.drift_bias
        )
        if self.label == Label.CARRY_OVER and unsettled is not None and reason:
            # The model explains it too; the probe's reading still says what washout settles it.
            return f"{reason}; and {unsettled.words()}"
        return reason


# --- t-statistics -------------------------------------------------------------------------


# --- the crossover model ---------------------------------------------------------------------


# --- labels -------------------------------------------------------------------------------


# --- pairs and bootstrap ----------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Step 1 of :func:`compare_cycles`: D̄ and its intervals, the statistical label, the drift
    flags and the within-block spread (log scale)."""

    effect: Effect
    s_w: float | None  # pooled within-block SD of the per-prompt logs
    k_min: int | None  # fewest prompts in a block
    ci95: tuple[float, float] | None  # the (1 − α) interval
    ci90: tuple[float, float] | None  # the (1 − 2α) interval (TOST)
    p_value: float | None
    wilcoxon_p: float | None
    raw_label: Label
    flags: tuple[Flag, ...]
    notes: tuple[str, ...]  # what the spread floor did

    @property
    def mean(self) -> float:
        """D̄."""
        return self.effect.mean

    @property
    def spread(self) -> float | None:
        """Spread per cycle for power: the observed s_D, or with one cycle the within-block
        Var(D) = s_w²/k (a lower bound: it misses boot-to-boot noise)."""
        if self.effect.sd is not None:
            return self.effect.sd
        if self.s_w is not None and self.k_min:
            return self.s_w / math.sqrt(self.k_min)
        return None


@dataclass(frozen=True)
class CarryCheck:
    """Step 2: the crossover model beside D̄ and what it says of carry-over."""

    model: CarryOver | None
    variance: VarianceComponents | None
    washed: bool  # every block followed a washout of its own arm
    leftover: bool  # washed, but the model still sees carry-over beyond noise
    carried: bool  # an estimated carry-over could explain the claim
    unchecked: bool  # unwashed, and too few cycles to estimate carry-over: fail closed
    state: tuple[StateCheck, ...] = ()  # the box-state probes' checks (harness.stats.box_state)
    unsettled: bool = False  # a probed state had not settled under a better/worse claim


@dataclass(frozen=True)
class DriftCheck:
    """Step 3: the bias flagged drift could put in D̄ and whether it could explain the label."""

    bias: float
    confounded: bool


def estimate(
    cycles: Sequence[Cycle], metric: str, delta: float, alpha: float, *,
    higher_is_better: bool, drift_sensitive: bool, boxes: str = "fixed",
) -> Estimate:  # fmt: skip
    """D̄, its intervals and the statistical label; a timed metric's spread floored, and on a
    fleet (``boxes`` "random") the interval taken between boxes."""
    d = np.asarray([c.effect for c in cycles], dtype=np.float64)
    effect = balanced_effect(cycles)
    s_w = pooled_within_sd(cycles)
    flags = drift_flags(cycles, delta, s_w)
    notes: list[str] = []
    k_min = min(len(b) for b in cycles[0].prompt_logs) if cycles[0].prompt_logs else None
    if drift_sensitive:
        effect = _spread_floor(metric, effect, s_w, k_min, notes)
    if boxes == "random":
        effect = between_boxes(cycles, effect)
    ci95 = effect.interval(1 - alpha)
    ci90 = effect.interval(1 - 2 * alpha)
    return Estimate(
        effect=effect, s_w=s_w, k_min=k_min, ci95=ci95, ci90=ci90, p_value=effect.p_value(),
        wilcoxon_p=wilcoxon_p(d) if d.size >= WILCOXON_MIN_CYCLES else None,
        raw_label=decide_label(effect.mean, ci95, ci90, delta, higher_is_better=higher_is_better),
        flags=tuple(flags), notes=tuple(notes),
    )  # fmt: skip


def check_carry_over(
    cycles: Sequence[Cycle], est: Estimate, alpha: float, *,
    exact: bool, block_minutes: float | None,
) -> CarryCheck:  # fmt: skip
    """Fit the crossover model and apply the carry-over rules (harness.stats.labels).

    Washed blocks each follow their own arm, so D̄ is the deployed effect by design and the
    model's carry-over terms are the evidence that the washout cleared the state; evidence that
    it did not withholds a label as if there had been none (it can only withhold, never grant:
    no preliminary test chooses the estimator).
    """
    m = len(cycles)
    # One cycle leaves the model one df: no interval worth printing beside "no interval".
    fit = fit_crossover(cycles) if m >= 2 else None
    # A trend per minute only where the blocks span a minute: four blocks seconds apart once
    # extrapolated 471%/min.
    spans_a_minute = block_minutes is not None and block_minutes * (4 * m - 1) >= 1.0
    model = model_view(fit, alpha, block_minutes if spans_a_minute else None) if fit else None
    washed = all(c.washed for c in cycles)
    leftover = washed and washout_left(model)
    carried = (not washed or leftover) and carry_over_explains(est.raw_label, est.mean, model)
    unchecked = not washed and carry_over_unchecked(est.raw_label, model, cycles, exact=exact)
    variance = variance_components(fit, est.s_w, est.k_min) if fit is not None else None
    # What the box remembers, read off the box: a probed state that had not settled before
    # the blocks scored withholds a claim whatever the washout (it can only withhold).
    state = tuple(check_state(cycle_blocks(cycles))) if any(c.box_state for c in cycles) else ()
    unsettled = est.raw_label.claims_a_difference and any(s.unsettled for s in state)
    return CarryCheck(model, variance, washed, leftover, carried, unchecked, state, unsettled)


def check_drift(
    cycles: Sequence[Cycle], est: Estimate, delta: float, *, drift_sensitive: bool
) -> DriftCheck:
    """Deterministic evidence (hit counts, bytes read) is drift-proof: flags are only reported;
    on a timed metric their bias can confound the label."""
    bias = drift_bias(cycles, est.flags, est.effect.weights) if drift_sensitive else 0.0
    confounded = is_confounded(est.raw_label, est.mean, est.ci95, est.ci90, delta, bias)
    return DriftCheck(bias, confounded)


def cycles_needed(
    est: Estimate, carry: CarryCheck, metric: str, m: int, delta: float, alpha: float, *,
    margin_pct: float, seed: int, remedy: str | None, sequential: SequentialPlan | None,
    simulate: bool = True,
) -> tuple[int | None, list[str]]:  # fmt: skip
    """The cycles an undecided comparison needs, by the decision rule itself, and the advice
    (``simulate`` False: the t-test's count, a lower bound, without simulating the rule)."""
    mean, spread, sd, raw = est.mean, est.spread, est.effect.sd, est.raw_label
    warnings: list[str] = []
    layout = Layout(
        washout=WASHED_SHARE if carry.washed else 0.0,
        boxes=est.effect.boxes,
        random_boxes=est.effect.boxes > 1,
    )
    needed = cycles_to_decide(spread, mean, delta, alpha) if spread is not None else None
    undecided = raw == Label.INCONCLUSIVE or carry.carried or carry.unchecked
    if (
        simulate
        and needed is not None
        and spread is not None
        and m > 1
        and sequential is None
        and undecided
    ):
        # What the rule itself needs (the margin and the carry-over check included), not the
        # plain t-test's power: simulated from the t-test's count up.
        simulated = fixed_cycles_needed(
            mean, spread, delta, alpha, layout=layout, start=needed, seed=seed
        )
        needed = simulated or needed  # beyond the search: the t-test's, a lower bound
    if est.effect.boxes > 1 and raw == Label.INCONCLUSIVE:
        n = est.effect.boxes
        warnings.append(
            f"{metric}: a verdict about boxes like these rests on the {n} boxes' own effects "
            f"({n - 1} df), so more cycles narrow it little: more boxes do; or set "
            "analysis.boxes: fixed for a verdict about these boxes only"
        )
    if carry.unchecked:
        needed = max(needed or 0, MIN_CARRY_CYCLES)
        warnings.append(f"{metric}: {carry_over_reason(raw, None, m)} ({remedy or RESUME_HINT})")
    if carry.leftover and carry.model is not None:
        model = carry.model
        warnings.append(
            f"{metric}: the washout did not clear the carry-over: a control block after a "
            f"candidate block still moves {pct_change(model.control or 0.0)}, a candidate block "
            f"{pct_change(model.candidate or 0.0)} (beyond noise at α={alpha:.3g}), so a label "
            "must hold for the deployed effect from the model too; lengthen design.washout"
        )
    if sequential is not None and raw == Label.INCONCLUSIVE and sd is not None:
        needed, advice = sequential_advice(
            metric, sequential, mean, sd, delta, seed, remedy, layout
        )
        warnings.append(advice)
    else:
        advice_lines = power_warnings(
            metric, m, raw, mean, sd, needed, delta, alpha, margin_pct,
            spread is not None, remedy,
        )  # fmt: skip
        warnings.extend(advice_lines)
    return needed, warnings


def cross_checks(
    cycles: Sequence[Cycle], est: Estimate, metric: str, alpha: float, *,
    resamples: int, seed: int, remedy: str | None,
) -> tuple[tuple[float, float] | None, list[str]]:  # fmt: skip
    """The two-level bootstrap interval, and where Wilcoxon or the bootstrap disagree with t."""
    warnings: list[str] = []
    p, wil_p, ci95 = est.p_value, est.wilcoxon_p, est.ci95
    if p is not None and wil_p is not None and (p < alpha) != (wil_p < alpha):
        warnings.append(
            f"{metric}: t-test p={p:.3g} and Wilcoxon p={wil_p:.3g} disagree at α={alpha}; one "
            "cycle may be an outlier — inspect the per-cycle effects before trusting the label"
        )
    boot = bootstrap_ratio_ci(cycles, confidence=1 - alpha, resamples=resamples, seed=seed)
    if boot is not None and ci95 is not None:
        t_excludes = ci95[0] > 0 or ci95[1] < 0
        b_excludes = boot[0] > 1 or boot[1] < 1
        if t_excludes != b_excludes:
            warnings.append(
                f"{metric}: the t-interval and the two-level bootstrap disagree on whether the "
                "ratio excludes 1; treat the label as fragile and add cycles "
                f"({remedy or RESUME_HINT})"
            )
    return boot, warnings


def drift_warnings(
    est: Estimate, drift: DriftCheck, carry: CarryCheck, metric: str, *, drift_sensitive: bool
) -> list[str]:
    """What the drift flags mean for the label: confounding, or a bias too small to matter."""
    if not est.flags or not drift_sensitive:
        return []
    kinds = "/".join(sorted({f.kind for f in est.flags}))
    where = sorted({f.cycle for f in est.flags})
    raw, bias = est.raw_label, drift.bias
    if drift.confounded:
        return [
            f"{metric}: {kinds} flagged in cycle(s) {where}: drift could bias the effect by "
            f"up to {pct_change(bias)}, enough to explain the {raw} label"
            + (
                " (carry-over, which moves the outer blocks too, is the label)"
                if carry.carried
                else ", so it is confounded; rely on deterministic evidence (hit counts, "
                "bytes read, exact outputs) or rerun the cycles on a quiet box"
            )
        ]
    if raw != Label.INCONCLUSIVE:
        return [
            f"{metric}: {kinds} flagged in cycle(s) {where}; the bias it could cause (up to "
            f"{pct_change(bias)}) cannot explain the {raw} label"
        ]
    return []


def compare_cycles(
    cycles: Sequence[Cycle],
    *,
    metric: str,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    alpha: float = 0.05,
    higher_is_better: bool = True,
    bootstrap_resamples: int = 2000,
    seed: int = 0,
    drift_sensitive: bool = True,
    remedy: str | None = None,
    block_minutes: float | None = None,
    sequential: SequentialPlan | None = None,
    boxes: str = "fixed",
    cycles_advice: bool = True,
) -> Comparison:
    """Compare cell (B) with control (A) over mirrored cycles on one metric.

    Block values are ln(geomean) of the metric; pass ``higher_is_better=False`` for latencies
    such as TPOT (the ratio stays cell/control, the better/worse labels flip). On a
    ``drift_sensitive`` (timing) metric, drift flags whose possible bias reaches the label's
    interval make the comparison confounded: its ``label`` becomes "confounded" and
    ``raw_label`` keeps the statistical one. Deterministic evidence (hit counts, bytes read) is
    drift-proof: pass ``drift_sensitive=False`` and flags are only reported. ``alpha`` is the
    level of this look: a sequential design passes its nominal level (harness.stats.sequential).
    The crossover model (harness.stats.crossover) runs beside D̄: its trend is reported (per
    block, and per minute given ``block_minutes``, the time from one block's start to the next)
    and taken out of the drift bound; a *better*/*worse* label its carry-over-adjusted effect
    does not support becomes "carry-over". For a ``sequential`` design the cycles an
    inconclusive comparison needs come from the design's own simulated stopping distribution
    at the observed effect and spread, not from a fixed-design power calculation. Cycles that
    name two or more boxes keep the cycle-level interval with ``boxes`` "fixed" (a verdict about
    those boxes); "random" compares them between boxes (:func:`between_boxes`). With
    ``cycles_advice`` False an undecided comparison's ``cycles_needed`` is the t-test's count (a
    lower bound) instead of a simulation of the decision rule (2,000 campaigns at each cycle
    count searched, most of a call's time): for a caller that reads only the label and interval,
    such as a fleet's per-box rows or an error-rate simulation of the decision itself.

    The steps, each a small frozen result: :func:`estimate`, :func:`check_carry_over`,
    :func:`check_drift`, :func:`cycles_needed`, :func:`cross_checks`, then the label
    (:func:`harness.stats.labels.final_label`) and the warnings.
    """
    if not cycles:
        raise BadInput(f"{metric}: no cycles to compare; the campaign has no complete cycle")
    if not 0 < alpha < 0.5:
        raise BadInput(f"{metric}: alpha must lie in (0, 0.5), got {alpha!r}")
    indices = [c.index for c in cycles]
    if len(set(indices)) != len(indices):
        raise BadInput(f"{metric}: duplicate cycle indices {sorted(indices)}")
    delta = margin_log(margin_pct)
    m = len(cycles)
    est = estimate(
        cycles, metric, delta, alpha,
        higher_is_better=higher_is_better, drift_sensitive=drift_sensitive, boxes=boxes,
    )  # fmt: skip
    carry = check_carry_over(
        cycles, est, alpha, exact=not drift_sensitive, block_minutes=block_minutes
    )
    drift = check_drift(cycles, est, delta, drift_sensitive=drift_sensitive)
    needed, warnings = cycles_needed(
        est, carry, metric, m, delta, alpha, margin_pct=margin_pct, seed=seed,
        remedy=remedy, sequential=sequential, simulate=cycles_advice,
    )  # fmt: skip
    boot, checks = cross_checks(
        cycles, est, metric, alpha, resamples=bootstrap_resamples, seed=seed, remedy=remedy
    )
    unestimated = (
        "fails closed" if carry.unchecked else "washed out" if carry.washed else "exactly none"
    )
    warnings = [
        *est.notes,
        *warnings,
        *checks,
        *drift_warnings(est, drift, carry, metric, drift_sensitive=drift_sensitive),
        *model_warnings(
            metric, est.raw_label, carry.model, m, carry.carried, drift_sensitive, unestimated
        ),
    ]
    carried = carry.carried or carry.unchecked or carry.unsettled
    warnings.extend(f"{metric}: {c.words()}" for c in carry.state if c.unsettled)
    pairs = pair_effects(cycles)
    ci95, ci90 = est.ci95, est.ci90
    control_level, cell_level = paired_levels(cycles, est.effect.weights)
    return Comparison(
        metric=metric,
        ratio=log_to_ratio(est.mean),
        ci_low=log_to_ratio(ci95[0]) if ci95 else None,
        ci_high=log_to_ratio(ci95[1]) if ci95 else None,
        p_value=est.p_value,
        label=final_label(est.raw_label, carried=carried, confounded=drift.confounded),
        n_cycles=m,
        confounded=drift.confounded,
        flags=est.flags,
        warnings=tuple(warnings),
        pair_ratio=log_to_ratio(float(pairs.mean())) if pairs.size else None,
        bootstrap_ci=boot,
        cycles_needed=needed,
        raw_label=est.raw_label,
        mean_log_effect=est.mean,
        sd_log_effect=est.effect.sd,
        margin_log=delta,
        alpha=alpha,
        higher_is_better=higher_is_better,
        n_pairs=int(pairs.size),
        tost_ci=(log_to_ratio(ci90[0]), log_to_ratio(ci90[1])) if ci90 else None,
        wilcoxon_p=est.wilcoxon_p,
        drift_bias=drift.bias,
        carry_over_explains=carried,
        model=carry.model,
        washed=carry.washed,
        variance=carry.variance,
        control_level=control_level,
        cell_level=cell_level,
        cycles_needed_range=(
            needed_range(needed, est.spread, est.mean, delta, alpha, m) if needed else None
        ),
        box_state=carry.state,
        state_withholds=carry.unsettled and not (carry.carried or carry.unchecked),
    )


def paired_levels(cycles: Sequence[Cycle], weights: Sequence[float]) -> tuple[float, float]:
    """The control's and the cell's level over the paired blocks: exp of each arm's block mean,
    weighted per cycle as D̄ is (so cell ÷ control = exp(D̄) exactly)."""
    w = np.asarray(weights, dtype=np.float64)
    arms = np.asarray([c.arms() for c in cycles], dtype=np.float64)
    control = float(w @ (0.5 * (arms[:, 0] + arms[:, 1])))
    cell = float(w @ (0.5 * (arms[:, 2] + arms[:, 3])))
    return log_to_ratio(control), log_to_ratio(cell)


def _spread_floor(
    metric: str, effect: Effect, s_w: float | None, k: int | None, warnings: list[str]
) -> Effect:
    """A timed metric's cycle effects cannot agree more closely than the prompts inside a block
    allow: Var(D) ≥ s_w²/k (four blocks of k prompts). Identical Dⱼ once gave a zero-width
    interval. Below that floor the SD is raised to it; with no within-block spread to floor it
    (summary-only records), an SD of rounding size leaves no interval at all."""
    if effect.sd is None or effect.se is None:
        return effect
    scale = math.sqrt(sum(w * w for w in effect.weights))
    if s_w is not None and s_w > 0 and k:
        floor = s_w / math.sqrt(k)
        if effect.sd < floor:
            warnings.append(
                f"{metric}: the cycles agree more closely (per-cycle SD {effect.sd:.2g}) than "
                f"the prompts inside a block allow ({floor:.2g}); the interval uses the latter"
            )
            return replace(effect, sd=floor, se=floor * scale)
        return effect
    if effect.sd <= ROUNDING * max(1.0, abs(effect.mean)):
        warnings.append(
            f"{metric}: every cycle's effect is identical on a timed metric and no per-prompt "
            "values say how much a block varies: no interval"
        )
        return replace(effect, sd=None, se=None)
    return effect


def sequential_advice(
    metric: str,
    design: SequentialPlan,
    mean: float,
    sd: float,
    delta: float,
    seed: int,
    remedy: str | None,
    layout: Layout | None = None,
) -> tuple[int | None, str]:
    """Cycles a sequential design needs, from its simulated stopping distribution, and why."""
    stop = stopping_distribution(
        design.scheduled(), design.nominal_alpha, mean, sd, delta, layout=layout, seed=seed
    )
    basis = f"if the effect is as observed ({pct_change(mean)}, per-cycle SD {sd:.4f} log)"
    where = remedy or "run the next look"
    if stop.cycles_80 is not None:
        return stop.cycles_80, (
            f"{metric}: inconclusive: {basis}, this design decides it by {stop.cycles_80} "
            f"cycles in 80% of simulated campaigns ({stop.mean_cycles:.1f} on average); {where}"
        )
    return None, (
        f"{metric}: inconclusive: {basis}, this design decides it by max_cycles "
        f"({design.max_cycles}) in only {stop.decided_share:.0%} of simulated campaigns; {where}"
    )


def model_warnings(
    metric: str,
    raw_label: str,
    model: CarryOver | None,
    m: int,
    carried: bool,
    drift_sensitive: bool,
    unestimated: str = "exactly none",
) -> list[str]:
    """What the crossover model saw: drift it removed, carry-over, and terms it left out.

    ``unestimated`` is what a decided label does about carry-over too few cycles to estimate:
    "washed out" (every block followed a washout of its own arm), "exactly none"
    (carry_over_unchecked found none) or "fails closed" (said by the caller).
    """
    if model is None:
        return []
    out: list[str] = []
    if drift_sensitive and model.trend_p < 0.05:
        per_min = (
            f", {pct_change(model.trend_per_min)} per minute"
            if model.trend_per_min is not None
            else ""
        )
        out.append(
            f"{metric}: the box drifted {pct_change(model.trend)} per block{per_min} "
            f"(trend p={model.trend_p:.3g}); the mirrored order cancels a linear trend and the "
            "model removes it, so it does not bias the ratio, but the machine was not steady"
        )
    if carried:
        out.append(
            f"{metric}: {carry_over_reason(raw_label, model, m)}; declare design.washout "
            "(requests of the block's own arm before it is measured) or add cycles"
        )
    elif model.control is None and raw_label in ("better", "worse") and m >= 1:
        if unestimated == "exactly none":
            out.append(
                f"{metric}: no carry-over: each arm's two blocks read the same in every cycle, "
                "whichever arm ran before them"
            )
        elif unestimated == "washed out":
            out.append(
                f"{metric}: every block followed a washout of its own arm; carry-over the "
                f"washout did not clear is estimated from {MIN_CARRY_CYCLES} cycles on"
            )
    return out
