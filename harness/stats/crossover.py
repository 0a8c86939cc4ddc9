"""The crossover model of one comparison: arm, trend and carry-over fitted to the ln block values.

docs/design.md#the-crossover-model. Every block of a comparison, in time order, is one
observation y (ln block value). The model, fitted by least squares:

    y = α_cycle + β_cycle·t + τ·B + c_A·[A after B] + c_B·[B after B] + ε

- α_cycle, one level per cycle: whatever moves between cycles (slow drift of any shape, a
  reboot of the box, a box of its own in a fleet) is absorbed, as the mirrored D does;
- β_cycle, a linear trend per slot within each cycle (t = −1.5, −0.5, 0.5, 1.5): the drift the
  mirrored order cancels, cycle by cycle as D does, so the residual is the noise D sees (one
  common slope would leave every cycle's own drift in the residual, where D has none);
  their mean is the trend reported;
- τ, the arm: the candidate's effect over a block run after a control block (no carry-over
  from the candidate in either arm);
- c_A and c_B, first-order carry-over: how much a control block (c_A) and a candidate block
  (c_B) move when the block before them on the box was a candidate block. Two terms, not the
  textbook one λ·[after B]: a candidate that evicts the control's pages slows A-after-B and
  leaves B-after-B alone, which one common λ cannot describe, and that misfit alone biases τ by
  half the carry-over.

The four (arm, block before) cells are then saturated, and the **deployed effect** — the
candidate after itself against the control after itself, E[B after B] − E[A after A], what a
box running only the candidate shows against one running only the control — is τ + c_B. τ
alone is the candidate after a control block: a control that leaves the next block faster, or a
candidate that is fast on a cool box and heats whatever runs after it, itself included, moves τ
and not the deployed effect.

What ran before each block is read from the runs' start times on their box (``Cycle.before``):
with two treatments or cache states the planner interleaves lanes, and a fleet deals
consecutive cycles to different boxes, so the previous cycle index is not what ran before. A
washed block's "before" is what ran before its washout: the model then estimates the carry-over
the washout left, the evidence that it worked. Cycles without that information take the plan's
back-to-back order (the previous cycle's last block when that cycle directly precedes it).

In the ABBA/BAAB alternation the arm, trend and carry-over columns are not aliased (the tests
check the rank for every m the planner can produce); carry-over costs 2 degrees of freedom and
is fitted from :data:`MIN_CARRY_CYCLES` cycles on, the trends cost m; n = 4m blocks less m
levels, m slopes and the arm leave df = 2m − 1 − 2·[carry-over] for the residual. Without
carry-over τ̂ is exactly the plain mean of the cycles' D. With one cycle the model keeps level,
trend and arm (1 df); a rank-deficient matrix (a lone BAAB after a gap, say) drops the carry-over
terms too.

Run back to back, the alternation puts the (arm, previous arm) cells at A|B three times in every
eight blocks, B|A three times, A|A and B|B once each: correlated columns, never collinear. The
price is variance: Var(τ̂)/Var(D̄) = 2.4–3.0, and the deployed contrast τ̂ + ĉ_B rests on the one
B|B block in eight, so without a washout a +5% effect at 3% block noise is found in about 40% of
3…8-cycle sequential campaigns against 95% with one (``harness bench sequential``). That is why
the whole-block washout is the default.

The audit behind this module: with τ̂ alone as the check, carry-over patterns read *better* in
15–75% (up to 97.7%) of A/A campaigns; taking the previous cycle's last block as what ran before
gave up to 10% false *better* with two interleaved treatments.

Pure: cycles in, a frozen fit out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.stats.cycles import Cycle, FloatArray
from harness.stats.distributions import t_ppf, t_sf

# Below three cycles the two carry-over terms would leave at most two residual degrees of
# freedom (t₀.₉₇₅ = 4.3): the model keeps arm and trend only and says so.
MIN_CARRY_CYCLES = 3
SLOT_TIMES = (-1.5, -0.5, 0.5, 1.5)


@dataclass(frozen=True)
class Term:
    """One fitted coefficient (log scale), its standard error and the residual df."""

    estimate: float
    se: float
    df: int

    def interval(self, confidence: float) -> tuple[float, float]:
        """Two-sided t-interval estimate ± t_{(1+c)/2, df}·se."""
        half = t_ppf(0.5 + confidence / 2.0, self.df) * self.se
        return self.estimate - half, self.estimate + half

    def p_value(self) -> float:
        """Two-sided t-test of the coefficient against 0."""
        if self.se == 0.0:
            return 1.0 if self.estimate == 0.0 else 0.0
        return 2.0 * t_sf(abs(self.estimate) / self.se, self.df)


@dataclass(frozen=True)
class CrossoverFit:
    """The model fitted to one comparison's blocks; None terms were left out (too few cycles)."""

    arm: Term  # τ: B after a control block against A after one
    deployed: Term  # τ + c_B: B after a candidate block against A after a control block
    trend: Term  # mean of the cycles' β per slot (one block)
    carry_control: Term | None  # c_A: a control block after a candidate block
    carry_candidate: Term | None  # c_B: a candidate block after a candidate block
    residual_sd: float  # block-to-block SD after the model, log scale
    df: int
    cycle_levels: tuple[float, ...]  # fitted α per cycle, in the order given
    # E[sample variance of the fitted levels] = cycle variance + level_noise·σ² (the levels'
    # own estimation noise, from (XᵀX)⁻¹: not σ²/4 once slopes and carry-over are fitted)
    level_noise: float = 0.25


@dataclass(frozen=True)
class Design:
    """The model matrix of a set of cycles and what each column is."""

    matrix: FloatArray
    arm_col: int
    slope_cols: tuple[int, ...]
    carry_cols: tuple[int, int] | None


def blocks_in_time_order(cycles: Sequence[Cycle]) -> list[Cycle]:
    """The cycles sorted by index (the order they ran in)."""
    return sorted(cycles, key=lambda c: c.index)


def design_matrix(cycles: Sequence[Cycle], *, carry_over: bool | None = None) -> Design:
    """The model matrix for ``cycles`` (sorted by index), rows in time order.

    ``carry_over`` None: fitted when there are at least :data:`MIN_CARRY_CYCLES` cycles. A block
    is "after a candidate" when what ran on its box right before it (``Cycle.before``; for a
    washed block, what ran before its washout) was not the control: this cell or another one. A
    cycle without ``before`` takes the plan's back-to-back order: the previous cycle's last
    block when that cycle directly precedes it, else nothing.
    """
    ordered = blocks_in_time_order(cycles)
    m = len(ordered)
    with_carry = m >= MIN_CARRY_CYCLES if carry_over is None else carry_over
    width = 2 * m + 1 + (2 if with_carry else 0)
    x = np.zeros((4 * m, width), dtype=np.float64)
    previous: str | None = None
    last_index: int | None = None
    for j, c in enumerate(ordered):
        if last_index is None or c.index != last_index + 1:
            previous = None  # a gap: the block before slot 0 belongs to no cycle we have
        for s, arm in enumerate(c.order):
            row = 4 * j + s
            x[row, j] = 1.0
            x[row, m] = 1.0 if arm == "B" else 0.0
            x[row, m + 1 + j] = SLOT_TIMES[s]
            before = c.before[s] if c.before is not None else previous
            if with_carry and before in ("B", "X"):
                x[row, 2 * m + 1 if arm == "A" else 2 * m + 2] = 1.0
            previous = arm
        last_index = c.index
    slopes = tuple(range(m + 1, 2 * m + 1))
    return Design(x, m, slopes, (2 * m + 1, 2 * m + 2) if with_carry else None)


ROUNDING = 1e-11  # on the log scale: a relative difference far below any clock's resolution


def fit_crossover(
    cycles: Sequence[Cycle], *, carry_over: bool | None = None
) -> CrossoverFit | None:
    """Least-squares fit of the crossover model; None when no residual df is left.

    Carry-over terms are dropped (as with fewer than :data:`MIN_CARRY_CYCLES` cycles) if the
    design cannot separate them from the arm (a rank-deficient matrix, e.g. a lone BAAB).
    """
    ordered = blocks_in_time_order(cycles)
    y = np.asarray([v for c in ordered for v in c.y], dtype=np.float64)
    design = design_matrix(ordered, carry_over=carry_over)
    x = design.matrix
    if design.carry_cols is not None and np.linalg.matrix_rank(x) < x.shape[1]:
        design = design_matrix(ordered, carry_over=False)
        x = design.matrix
    if np.linalg.matrix_rank(x) < x.shape[1]:
        return None
    n, p = x.shape
    df = n - p
    if df < 1:
        return None
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    resid = y - x @ beta
    sigma = math.sqrt(float(resid @ resid) / df)
    # Blocks the model fits exactly leave residuals of rounding size, whose values (and any p
    # from them) depend on the CPU's float paths: below that size, exact is what they are.
    rounding = ROUNDING * max(1.0, float(np.abs(y).max()))
    if sigma < rounding:
        sigma = 0.0
        beta = np.where(np.abs(beta) < rounding, 0.0, beta)

    def combination(weights: dict[int, float]) -> Term:
        """The term Σ wᵢβᵢ over the columns named, with its standard error."""
        c = np.zeros(p)
        for col, weight in weights.items():
            c[col] = weight
        return Term(float(c @ beta), sigma * math.sqrt(float(c @ xtx_inv @ c)), df)

    def term(col: int) -> Term:
        return combination({col: 1.0})

    trend = combination(dict.fromkeys(design.slope_cols, 1.0 / len(design.slope_cols)))
    carry = design.carry_cols
    deployed = combination({design.arm_col: 1.0, **({carry[1]: 1.0} if carry else {})})
    return CrossoverFit(
        arm=term(design.arm_col),
        deployed=deployed,
        trend=trend,
        carry_control=term(carry[0]) if carry else None,
        carry_candidate=term(carry[1]) if carry else None,
        residual_sd=sigma,
        df=df,
        cycle_levels=tuple(float(v) for v in beta[: len(ordered)]),
        level_noise=_level_noise(xtx_inv[: len(ordered), : len(ordered)]),
    )


def _level_noise(levels_cov: npt.NDArray[np.floating[Any]]) -> float:
    """E[s²(α̂)]/σ² for fitted levels with covariance V·σ²: (tr V − 1ᵀV1/m)/(m − 1)."""
    m = levels_cov.shape[0]
    if m < 2:
        return 0.0
    return float((np.trace(levels_cov) - levels_cov.sum() / m) / (m - 1))


@dataclass(frozen=True)
class ArmStatistic:
    """The arm coefficient of many campaigns that share one design, fitted at once."""

    estimate: FloatArray
    se: FloatArray
    df: int
    with_carry: bool  # the carry-over terms were in the model (else τ̂ alone)


def fit_arm_many(
    cycles_design: Sequence[Cycle], y: FloatArray, *, deployed: bool = False
) -> ArmStatistic | None:
    """τ̂ (or with ``deployed`` τ̂ + ĉ_B) and its SE for every row of ``y`` (campaigns × 4m
    blocks in time order), one design (:func:`fit_terms_many`)."""
    terms = fit_terms_many(cycles_design, y)
    if terms is None:
        return None
    name = "deployed" if deployed else "arm"
    return ArmStatistic(terms.estimate[name], terms.se[name], terms.df, terms.with_carry)


@dataclass(frozen=True)
class TermsMany:
    """The model's terms of many campaigns that share one design, fitted at once: "arm",
    "deployed" and, with carry-over in the model, "carry_control" and "carry_candidate"."""

    estimate: dict[str, FloatArray]
    se: dict[str, FloatArray]
    df: int
    with_carry: bool


def fit_terms_many(cycles_design: Sequence[Cycle], y: FloatArray) -> TermsMany | None:
    """The model's terms and SEs for every row of ``y`` (campaigns × 4m blocks in time order).

    For simulation: the design (orders, indices, what ran before) comes from ``cycles_design``;
    only the block values differ. Same model and same column choice as :func:`fit_crossover`.
    """
    found = _projection(tuple((c.index, c.order, c.before) for c in cycles_design))
    if found is None:
        return None
    weights, scales, basis, df, with_carry = found
    # The residual sum of squares is |y|² less the squared length of y's projection on the
    # model's columns (an orthonormal basis): no coefficients or residuals per campaign.
    rss = np.maximum((y * y).sum(axis=1) - ((y @ basis) ** 2).sum(axis=1), 0.0)
    sigma = np.sqrt(rss / df)
    estimates = y @ weights
    names = list(scales)
    return TermsMany(
        {name: estimates[:, k] for k, name in enumerate(names)},
        {name: sigma * scales[name] for name in names},
        df,
        with_carry,
    )


@lru_cache(maxsize=256)
def _projection(
    key: tuple[tuple[int, str, tuple[str, str, str, str] | None], ...],
) -> tuple[FloatArray, dict[str, float], FloatArray, int, bool] | None:
    """For one design (each cycle's index, order and what ran before its blocks): the weights
    that give each term from y (one column a term), each term's SE per unit σ, an orthonormal
    basis of the model's columns, the residual df and whether carry-over is in the model."""
    cycles_design = [Cycle(i, order, (0.0, 0.0, 0.0, 0.0), before=b) for i, order, b in key]
    design = design_matrix(cycles_design)
    x = design.matrix
    if design.carry_cols is not None and np.linalg.matrix_rank(x) < x.shape[1]:
        design = design_matrix(cycles_design, carry_over=False)
        x = design.matrix
    n, p = x.shape
    if np.linalg.matrix_rank(x) < p or n - p < 1:
        return None
    xtx_inv = np.linalg.inv(x.T @ x)
    contrasts: dict[str, FloatArray] = {"arm": np.zeros(p)}
    contrasts["arm"][design.arm_col] = 1.0
    contrasts["deployed"] = contrasts["arm"].copy()
    if design.carry_cols is not None:
        control, candidate = design.carry_cols
        contrasts["deployed"][candidate] = 1.0
        contrasts["carry_control"] = np.eye(p)[control]
        contrasts["carry_candidate"] = np.eye(p)[candidate]
    weights = np.stack([x @ (xtx_inv @ c) for c in contrasts.values()], axis=1)
    scales = {name: math.sqrt(float(c @ xtx_inv @ c)) for name, c in contrasts.items()}
    basis, _ = np.linalg.qr(x)
    return weights, scales, basis, n - p, design.carry_cols is not None


@dataclass(frozen=True)
class CarryOver:
    """The crossover model's view of one comparison (log scale; None where a term was left out).

    ``adjusted`` is the arm effect with carry-over and trend in the model (τ̂, a block after a
    control block), ``deployed`` the candidate after itself against the control after itself
    (τ̂ + ĉ_B, the effect a box running only the candidate would show),
    ``control``/``candidate`` the carry-over a candidate block leaves in the next control (c_A)
    or candidate (c_B) block, each with its (1 − α) interval. ``trend`` is β̂ per block;
    ``trend_per_min`` the same per minute of wall time when block times are known.
    """

    adjusted: float
    adjusted_ci: tuple[float, float]
    deployed: float
    deployed_ci: tuple[float, float]
    df: int
    trend: float
    trend_ci: tuple[float, float]
    trend_p: float
    control: float | None = None
    control_ci: tuple[float, float] | None = None
    candidate: float | None = None
    candidate_ci: tuple[float, float] | None = None
    trend_per_min: float | None = None

    @property
    def trend_pct_per_block(self) -> float | None:
        """The trend as a percent change per block (None beyond a finite ratio)."""
        return log_to_pct(self.trend)

    @property
    def trend_pct_per_min(self) -> float | None:
        """The trend as a percent change per minute, where block times are known."""
        return log_to_pct(self.trend_per_min)


def log_to_pct(value: float | None) -> float | None:
    """A log change as a percent; None for none, and for one beyond ±700 (a trend per minute
    over blocks milliseconds apart, say), which has no finite ratio."""
    if value is None or not math.isfinite(value) or abs(value) > 700:
        return None
    return math.expm1(value) * 100.0


def model_view(fit: CrossoverFit, alpha: float, block_minutes: float | None) -> CarryOver:
    """The fitted model's effect, trend and carry-over with their (1 − α) intervals."""
    conf = 1.0 - alpha
    control, candidate = fit.carry_control, fit.carry_candidate
    return CarryOver(
        adjusted=fit.arm.estimate,
        adjusted_ci=fit.arm.interval(conf),
        deployed=fit.deployed.estimate,
        deployed_ci=fit.deployed.interval(conf),
        df=fit.df,
        trend=fit.trend.estimate,
        trend_ci=fit.trend.interval(conf),
        trend_p=fit.trend.p_value(),
        control=control.estimate if control else None,
        control_ci=control.interval(conf) if control else None,
        candidate=candidate.estimate if candidate else None,
        candidate_ci=candidate.interval(conf) if candidate else None,
        trend_per_min=(
            fit.trend.estimate / block_minutes if block_minutes and block_minutes > 0 else None
        ),
    )


__all__ = [
    "MIN_CARRY_CYCLES",
    "ArmStatistic",
    "CarryOver",
    "CrossoverFit",
    "Design",
    "Term",
    "TermsMany",
    "design_matrix",
    "fit_arm_many",
    "fit_crossover",
    "fit_terms_many",
    "log_to_pct",
    "model_view",
]
