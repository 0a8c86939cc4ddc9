"""Statistics of mirrored A/B campaigns: block values, per-cycle effects, labels and drift flags.

Formulas are DESIGN.md "Statistics", adopted exactly:

- block value yᵢ = ln(geomean over held-out prompts) — one block = one boot of one arm;
- effect per cycle Dⱼ = ½(y_B1 + y_B2) − ½(y_A1 + y_A2); ratio R = exp(D̄);
  95% CI exp(D̄ ± t₀.₉₇₅,ₘ₋₁·s_D/√m) (the one-sample t-interval of the m cycle effects);
- labels with margin Δ = ln(1 + δ): *better*/*worse* when the CI excludes 0 and |D̄| ≥ Δ;
  *within noise* when the 90 % CI lies inside (−Δ, Δ) (TOST); *inconclusive* otherwise;
- drift flags DRIFT (|y_outer2 − y_outer1| > max(Δ, z·s_w·√(2/k))) and NONLINEAR
  (|r| > max(Δ, z·s_w·√(20/k)), r = 3(y_inner2 − y_inner1) − (y_outer2 − y_outer1)); DESIGN.md
  has z = 2, here z is Bonferroni-corrected over the 2m flag tests (see drift_flags).

A is always the control and B the cell; the ratio is always cell/control, whichever direction
is "better" for the metric. Everything here is pure: numbers in, frozen dataclasses out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from harness.errors import BadInput

FloatArray = npt.NDArray[np.float64]

ORDERS = ("ABBA", "BAAB")
LABELS = ("better", "worse", "within noise", "inconclusive")
CONFOUNDED = "confounded"
DEFAULT_MARGIN_PCT = 2.0
# The remedy every "add cycles" warning ends with (pyperf style: the warning says what to do).
RESUME_HINT = "harness run --resume DIR with design.cycles raised"
# Wilcoxon's smallest two-sided p with m cycles is 2/2^m: below 6 cycles it can never reach 0.05.
WILCOXON_MIN_CYCLES = 6
_MAX_CYCLES_SEARCH = 100_000


def geomean(values: npt.ArrayLike) -> float:
    """Geometric mean exp(mean(ln xᵢ)) (DESIGN.md "Metrics": geomean across prompts).

    Raises BadInput for an empty input or any non-positive or non-finite value, since a rate or
    a latency of zero or less means the measurement itself is broken.
    """
    return math.exp(_mean_log(values, what="geomean"))


def block_value(per_prompt_values: npt.ArrayLike) -> float:
    """Block value y = ln(geomean over held-out prompts) (DESIGN.md "Statistics").

    One block is one boot of one arm; pass only that boot's per-prompt values — requests of
    different boots are never pooled.
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
    """

    index: int
    order: str
    y: tuple[float, float, float, float]
    prompt_logs: tuple[FloatArray, ...] | None = None
    prompts_aligned: bool = False

    def __post_init__(self) -> None:
        where = f"cycle {self.index}"
        if self.order not in ORDERS:
            raise BadInput(f"{where}: order must be ABBA or BAAB, got {self.order!r}")
        if len(self.y) != 4 or not all(math.isfinite(v) for v in self.y):
            raise BadInput(f"{where}: y must be four finite block values in time order")
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
        return replace(self, order="BAAB" if self.order == "ABBA" else "ABBA")


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

    Only for showing why the log scale differs (DESIGN.md worked example): drift that is linear
    in t/s cancels exactly here but not in ln t/s.
    """
    if len(raw_values) != 4:
        raise BadInput(f"raw_effect: need four values in time order, got {len(raw_values)}")
    if order not in ORDERS:
        raise BadInput(f"raw_effect: order must be ABBA or BAAB, got {order!r}")
    s0, s1, s2, s3 = (float(v) for v in raw_values)
    a_sum, b_sum = (s0 + s3, s1 + s2) if order == "ABBA" else (s1 + s2, s0 + s3)
    return 0.5 * b_sum - 0.5 * a_sum


@dataclass(frozen=True)
class Flag:
    """A drift flag on one cycle: kind "DRIFT" or "NONLINEAR", with the numbers behind it."""

    kind: str
    cycle: int
    detail: str


@dataclass(frozen=True)
class Comparison:
    """Cell vs control on one metric over m cycles.

    ``ratio`` = exp(D̄), cell/control. ``label`` is "confounded" whenever ``confounded`` (a drift
    flag on a drift-sensitive metric), else ``raw_label``; ``raw_label`` is always the pure
    statistical label. CI bounds and p are None with one cycle (no interval exists).
    """

    metric: str
    ratio: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    label: str
    n_cycles: int
    confounded: bool
    flags: tuple[Flag, ...]
    warnings: tuple[str, ...]
    pair_ratio: float | None
    bootstrap_ci: tuple[float, float] | None
    cycles_needed: int | None
    raw_label: str
    mean_log_effect: float
    sd_log_effect: float | None
    margin_log: float
    alpha: float
    higher_is_better: bool
    n_pairs: int = 0
    tost_ci: tuple[float, float] | None = None
    wilcoxon_p: float | None = None
    p_adjusted: float | None = None


# --- t-statistics -------------------------------------------------------------------------


def t_interval(effects: npt.ArrayLike, confidence: float) -> tuple[float, float]:
    """Two-sided t-interval D̄ ± t_{(1+c)/2, m−1}·s_D/√m of the mean cycle effect (log scale)."""
    d = _effects_array(effects)
    if d.size < 2:
        raise BadInput("t_interval: needs at least 2 cycles")
    mean = float(d.mean())
    half = float(sps.t.ppf(0.5 + confidence / 2.0, d.size - 1)) * _sem(d)
    return mean - half, mean + half


def t_test_p(effects: npt.ArrayLike) -> float:
    """Two-sided one-sample t-test of D against 0: p = 2·P(T_{m−1} > |D̄|/(s_D/√m))."""
    d = _effects_array(effects)
    if d.size < 2:
        raise BadInput("t_test_p: needs at least 2 cycles")
    sem = _sem(d)
    mean = float(d.mean())
    if sem == 0.0:
        # Perfectly consistent cycles: any non-zero effect is certain, a zero one is not evidence.
        return 1.0 if mean == 0.0 else 0.0
    return float(2.0 * sps.t.sf(abs(mean) / sem, d.size - 1))


def wilcoxon_p(effects: npt.ArrayLike) -> float:
    """Two-sided Wilcoxon signed-rank p of D against 0 (scipy.stats.wilcoxon, its defaults)."""
    d = _effects_array(effects)
    if not np.any(d != 0):
        return 1.0
    return float(sps.wilcoxon(d).pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni step-down adjusted p-values, in the input order.

    Sorted ascending p₍₁₎ ≤ … ≤ p₍ₙ₎: p̃₍ᵢ₎ = max_{j ≤ i} min(1, (n − j + 1)·p₍ⱼ₎). Rejecting
    where p̃ < α is Holm's procedure at family-wise level α.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return []
    if not np.all((p >= 0) & (p <= 1)):
        raise BadInput("holm: p-values must lie in [0, 1]")
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (p.size - np.arange(p.size)) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(v) for v in adjusted]


def cycles_needed(s_d: float, margin: float, alpha: float, power: float = 0.8) -> int:
    """Cycles a two-sided one-sample t-test needs to detect an effect of size ``margin`` (log).

    Standard power calculation with the exact noncentral t distribution (as G*Power and
    statsmodels' TTestPower do): smallest m ≥ 2 with
    P(|T| > t_{1−α/2, m−1}) ≥ power, T ~ nct(m − 1, √m·margin/s_d). Capped at 100 000.
    """
    if margin <= 0 or not 0 < alpha < 1 or not 0 < power < 1:
        raise BadInput("cycles_needed: margin > 0, 0 < alpha < 1 and 0 < power < 1 are required")
    if s_d < 0 or not math.isfinite(s_d):
        raise BadInput(f"cycles_needed: s_d must be a finite SD >= 0, got {s_d!r}")
    if s_d == 0:
        return 2

    def achieved(m: int) -> float:
        tc = float(sps.t.ppf(1 - alpha / 2, m - 1))
        nc = math.sqrt(m) * margin / s_d
        return float(sps.nct.sf(tc, m - 1, nc) + sps.nct.cdf(-tc, m - 1, nc))

    # Start from the normal approximation, then walk to the exact answer.
    z = float(sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power))
    m = min(_MAX_CYCLES_SEARCH, max(2, math.ceil((z * s_d / margin) ** 2)))
    while m < _MAX_CYCLES_SEARCH and achieved(m) < power:
        m += 1
    while m > 2 and achieved(m - 1) >= power:
        m -= 1
    return m


def _cycles_to_clear(s_d: float, distance: float, alpha: float) -> int:
    """Smallest m with t_{1−α, m−1}·s_d/√m < distance (a one-sided CI edge moving by distance)."""
    if s_d == 0:
        return 2
    if distance <= 0:
        return _MAX_CYCLES_SEARCH
    m = 2
    while m < _MAX_CYCLES_SEARCH and float(sps.t.ppf(1 - alpha, m - 1)) * s_d / math.sqrt(m) >= (
        distance
    ):
        m = m * 2 if m < 1024 else m + 1024
    lo = max(2, m // 2)
    while lo < m:  # bisect the last doubling step
        mid = (lo + m) // 2
        if float(sps.t.ppf(1 - alpha, mid - 1)) * s_d / math.sqrt(mid) < distance:
            m = mid
        else:
            lo = mid + 1
    return m


def _cycles_to_decide(spread: float, mean: float, delta: float, alpha: float) -> int:
    """Cycles likely to turn this comparison into a verdict, if the effect is as observed.

    Beyond the margin, the question is power to detect the observed effect (never less than
    the margin); inside it, how many cycles narrow the 90% interval inside (−Δ, Δ).
    """
    if abs(mean) >= delta:
        return cycles_needed(spread, abs(mean), alpha)
    return _cycles_to_clear(spread, delta - abs(mean), alpha)


def _effects_array(effects: npt.ArrayLike) -> FloatArray:
    d = np.asarray(effects, dtype=np.float64).ravel()
    if not np.isfinite(d).all():
        raise BadInput("cycle effects must be finite")
    return d


def _sem(d: FloatArray) -> float:
    return float(d.std(ddof=1) / math.sqrt(d.size))


# --- labels -------------------------------------------------------------------------------


def decide_label(
    mean: float,
    ci95: tuple[float, float] | None,
    ci90: tuple[float, float] | None,
    margin: float,
    *,
    higher_is_better: bool,
    p_value: float | None = None,
    alpha: float = 0.05,
) -> str:
    """DESIGN.md labels on the log scale.

    *better*/*worse*: the (1−α) CI excludes 0 and |D̄| ≥ Δ, the sign read through
    ``higher_is_better``; when ``p_value`` is given (e.g. Holm-adjusted) "excludes 0" is taken
    as p < α, which for the unadjusted t-test is the same statement. *within noise*: the
    (1−2α) CI lies inside (−Δ, Δ) (TOST). *inconclusive*: anything else, or no interval.
    """
    if ci95 is None or ci90 is None:
        return "inconclusive"
    excludes_zero = (p_value < alpha) if p_value is not None else (ci95[0] > 0 or ci95[1] < 0)
    if excludes_zero and abs(mean) >= margin:
        improved = (mean > 0) == higher_is_better
        return "better" if improved else "worse"
    if -margin < ci90[0] and ci90[1] < margin:
        return "within noise"
    return "inconclusive"


# --- drift --------------------------------------------------------------------------------


def pooled_within_sd(cycles: Sequence[Cycle]) -> float | None:
    """s_w, the pooled within-block SD of per-prompt ln values; None without prompt_logs.

    DESIGN.md's definition: sqrt(Σ(kᵦ − 1)·sᵦ² / Σ(kᵦ − 1)) over every block. When every cycle
    has ``prompts_aligned``, prompt-to-prompt differences (up to ~19 % between prompts in seed
    000) would inflate that spread and blunt the drift flags, so s_w is then estimated from the
    same-arm paired differences xᵢ(second block) − xᵢ(first block), whose variance is 2σ² and
    whose mean (the drift) is removed: s_w² = Σ SS(diff)/2 / Σ(k − 1).
    """
    if not cycles or any(c.prompt_logs is None for c in cycles):
        return None
    ss = 0.0
    dof = 0
    if all(c.prompts_aligned for c in cycles):
        for c in cycles:
            assert c.prompt_logs is not None
            for first, second in ((0, 3), (1, 2)):  # outer pair, inner pair: same arm each
                diff = c.prompt_logs[second] - c.prompt_logs[first]
                ss += float(((diff - diff.mean()) ** 2).sum()) / 2.0
                dof += diff.size - 1
    else:
        for c in cycles:
            assert c.prompt_logs is not None
            for logs in c.prompt_logs:
                ss += float(((logs - logs.mean()) ** 2).sum())
                dof += logs.size - 1
    return math.sqrt(ss / dof) if dof > 0 else None


FLAG_ALPHA = 0.05  # family-wise rate of false DRIFT/NONLINEAR flags on a clean campaign


def drift_flags(cycles: Sequence[Cycle], margin: float, s_w: float | None) -> tuple[Flag, ...]:
    """DRIFT and NONLINEAR flags per cycle (DESIGN.md "Statistics", Drift).

    Slots t = −1.5, −0.5, 0.5, 1.5; outer arm at ±1.5, inner at ±0.5. Under linear drift βt the
    outer change is 3β and the inner change β, so r = 3·inner − outer = 0 (quadratic drift also
    gives r = 0: both arms' pairs sit symmetric about 0). With no drift and block values of k
    prompts each with within-block SD σ, Var(yᵢ) = σ²/k, so
    Var(outer) = 2σ²/k and Var(r) = 9·2σ²/k + 2σ²/k = 20σ²/k; the flags fire beyond z SDs or
    beyond the margin Δ, whichever is larger: DRIFT when |outer| > max(Δ, z·s_w·√(2/k)),
    NONLINEAR when |r| > max(Δ, z·s_w·√(20/k)). Unequal block sizes use 1/k₁ + 1/k₂ in place of
    2/k. Without s_w the threshold is Δ alone. s_w misses boot-to-boot noise, so with two or
    more cycles the block SD is also estimated from the other cycles' r (leave-one-out), and
    the larger estimate is used: a flag then means "beyond the margin and beyond the noise".
    """
    flags: list[Flag] = []
    # Two flags per cycle are tested; at two SDs each, a clean 6-cycle campaign would raise a
    # false flag about half the time. Bonferroni over the 2m tests keeps the chance of any
    # false flag near FLAG_ALPHA (z = 2.39 for one cycle, 2.64 for three, 2.86 for six).
    z_flag = float(sps.norm.ppf(1.0 - FLAG_ALPHA / (4.0 * max(len(cycles), 1))))
    for c in cycles:
        if s_w is not None and c.prompt_logs is not None:
            inv_k = [1.0 / len(b) for b in c.prompt_logs]
            sd_outer = s_w * math.sqrt(inv_k[0] + inv_k[3])
            sd_r = s_w * math.sqrt(9.0 * (inv_k[1] + inv_k[2]) + inv_k[0] + inv_k[3])
        else:
            sd_outer = sd_r = 0.0
        # s_w sees only prompt-to-prompt noise inside a boot. Boot-to-boot noise is estimated
        # from the other cycles' r, which linear and quadratic drift leave at zero:
        # Var(r) = 20·σ_block², so σ_block² = mean(r²)/20. Leaving this cycle out keeps a
        # real step in it from hiding itself.
        others = [o.nonlinearity for o in cycles if o.index != c.index]
        if len(others) >= 2:  # one other cycle says next to nothing about the noise
            # An SD estimated from a handful of r values is often far too small (with two, a
            # tenth of the time under a third of the truth), which would flag plain noise. Use
            # its one-sided 90% upper bound: χ² with one degree of freedom per other cycle.
            dof = len(others)
            upper = math.sqrt(dof / float(sps.chi2.ppf(0.10, dof)))
            sd_block = upper * math.sqrt(sum(r * r for r in others) / dof / 20.0)
            sd_outer = max(sd_outer, math.sqrt(2.0) * sd_block)
            sd_r = max(sd_r, math.sqrt(20.0) * sd_block)
        limit_outer = max(margin, z_flag * sd_outer)
        limit_r = max(margin, z_flag * sd_r)
        outer_arm = "A" if c.order == "ABBA" else "B"
        if abs(c.outer_change) > limit_outer:
            flags.append(
                Flag(
                    "DRIFT",
                    c.index,
                    f"cycle {c.index} ({c.order}): y_{outer_arm}2 − y_{outer_arm}1 = "
                    f"{c.outer_change:+.4f} beyond ±{limit_outer:.4f} "
                    f"({_pct(c.outer_change)} between the outer blocks)",
                )
            )
        if abs(c.nonlinearity) > limit_r:
            flags.append(
                Flag(
                    "NONLINEAR",
                    c.index,
                    f"cycle {c.index} ({c.order}): r = 3(inner change) − (outer change) = "
                    f"{c.nonlinearity:+.4f} beyond ±{limit_r:.4f}: a step or an arm-dependent "
                    "change mid-cycle",
                )
            )
    return tuple(flags)


def _pct(log_value: float) -> str:
    return f"{math.expm1(log_value) * 100:+.1f}%"


# --- pairs and bootstrap ----------------------------------------------------------------------


def pair_effects(cycles: Sequence[Cycle]) -> FloatArray:
    """Effect per ABBA+BAAB pair: mean of two consecutive opposite-order cycles' D.

    A single ABBA is biased by −2γ under quadratic drift γt² and a BAAB by +2γ; their mean is
    not. Cycles are taken in index order and paired greedily; a cycle whose neighbour has the
    same order (or none) is left out.
    """
    ordered = sorted(cycles, key=lambda c: c.index)
    out: list[float] = []
    i = 0
    while i + 1 < len(ordered):
        first, second = ordered[i], ordered[i + 1]
        if first.order != second.order:
            out.append(0.5 * (first.effect + second.effect))
            i += 2
        else:
            i += 1
    return np.asarray(out, dtype=np.float64)


def bootstrap_ratio_ci(
    cycles: Sequence[Cycle],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Two-level percentile bootstrap CI of R = exp(D̄): resample cycles, then prompts.

    Each replicate draws m cycles with replacement and, for every drawn cycle, redraws the
    prompts of each block with replacement (one shared index set for the four blocks when
    ``prompts_aligned``, so prompt effects cancel in D as they do in the data). Cycles without
    prompt_logs make it a one-level (cycles only) bootstrap. Deterministic for a given seed.
    None with fewer than 2 cycles: prompts alone would ignore boot-to-boot noise.
    """
    m = len(cycles)
    if m < 2 or resamples < 1:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, m, size=(resamples, m))
    totals = np.zeros(resamples, dtype=np.float64)
    two_level = all(c.prompt_logs is not None for c in cycles)
    for pos in range(m):
        for j, c in enumerate(cycles):
            rows = np.flatnonzero(picks[:, pos] == j)
            if rows.size == 0:
                continue
            if not two_level:
                totals[rows] += c.effect
                continue
            totals[rows] += _resampled_effects(c, rows.size, rng)
    lo, hi = np.percentile(totals / m, [50 * (1 - confidence), 50 * (1 + confidence)])
    return math.exp(float(lo)), math.exp(float(hi))


def _resampled_effects(c: Cycle, n: int, rng: np.random.Generator) -> FloatArray:
    assert c.prompt_logs is not None
    means = []
    shared = rng.integers(0, len(c.prompt_logs[0]), size=(n, len(c.prompt_logs[0])))
    for logs in c.prompt_logs:
        idx = shared if c.prompts_aligned else rng.integers(0, len(logs), size=(n, len(logs)))
        means.append(logs[idx].mean(axis=1))
    s0, s1, s2, s3 = means
    a_sum, b_sum = (s0 + s3, s1 + s2) if c.order == "ABBA" else (s1 + s2, s0 + s3)
    result: FloatArray = 0.5 * b_sum - 0.5 * a_sum
    return result


# --- the main entry -------------------------------------------------------------------------


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
) -> Comparison:
    """Compare cell (B) with control (A) over mirrored cycles on one metric.

    Block values are ln(geomean) of the metric; pass ``higher_is_better=False`` for latencies
    such as TPOT (the ratio stays cell/control, the better/worse labels flip). A drift flag on a
    ``drift_sensitive`` (timing) metric makes the comparison confounded: its ``label`` becomes
    "confounded" and ``raw_label`` keeps the statistical one. Deterministic evidence (hit counts,
    bytes read) is drift-proof: pass ``drift_sensitive=False`` and flags are only reported.
    """
    if not cycles:
        raise BadInput(f"{metric}: no cycles to compare; the campaign has no complete cycle")
    if not 0 < alpha < 0.5:
        raise BadInput(f"{metric}: alpha must lie in (0, 0.5), got {alpha!r}")
    indices = [c.index for c in cycles]
    if len(set(indices)) != len(indices):
        raise BadInput(f"{metric}: duplicate cycle indices {sorted(indices)}")
    delta = margin_log(margin_pct)
    d = np.asarray([c.effect for c in cycles], dtype=np.float64)
    m = d.size
    mean = float(d.mean())
    s_w = pooled_within_sd(cycles)
    flags = drift_flags(cycles, delta, s_w)
    confounded = drift_sensitive and bool(flags)
    warnings: list[str] = []

    ci95 = ci90 = None
    p = wil_p = None
    sd: float | None = None
    if m >= 2:
        sd = float(d.std(ddof=1))
        ci95 = t_interval(d, 1 - alpha)
        ci90 = t_interval(d, 1 - 2 * alpha)
        p = t_test_p(d)
        if m >= WILCOXON_MIN_CYCLES:
            wil_p = wilcoxon_p(d)
    raw_label = decide_label(mean, ci95, ci90, delta, higher_is_better=higher_is_better)

    # Spread per cycle for the power calculation: observed s_D, or with one cycle the
    # within-block estimate Var(D) = s_w²/k (a lower bound: it misses boot-to-boot noise).
    if sd is not None:
        spread: float | None = sd
    elif s_w is not None:
        k = min(len(b) for b in cycles[0].prompt_logs or ())
        spread = s_w / math.sqrt(k)
    else:
        spread = None
    needed = _cycles_to_decide(spread, mean, delta, alpha) if spread is not None else None
    warnings.extend(
        _power_warnings(
            metric, m, raw_label, mean, sd, needed, delta, alpha, margin_pct, spread is not None
        )
    )
    if p is not None and wil_p is not None and (p < alpha) != (wil_p < alpha):
        warnings.append(
            f"{metric}: t-test p={p:.3g} and Wilcoxon p={wil_p:.3g} disagree at α={alpha}; one "
            "cycle may be an outlier — inspect the per-cycle effects before trusting the label"
        )
    boot = bootstrap_ratio_ci(
        cycles, confidence=1 - alpha, resamples=bootstrap_resamples, seed=seed
    )
    if boot is not None and ci95 is not None:
        t_excludes = ci95[0] > 0 or ci95[1] < 0
        b_excludes = boot[0] > 1 or boot[1] < 1
        if t_excludes != b_excludes:
            warnings.append(
                f"{metric}: the t-interval and the two-level bootstrap disagree on whether the "
                "ratio excludes 1; treat the label as fragile and add cycles "
                f"({RESUME_HINT})"
            )
    if confounded:
        kinds = sorted({f.kind for f in flags})
        warnings.append(
            f"{metric}: {'/'.join(kinds)} flagged in cycle(s) "
            f"{sorted({f.cycle for f in flags})}: this throughput comparison is confounded by "
            "drift; rely on deterministic evidence (hit counts, bytes read, exact outputs) or "
            "rerun the cycles on a quiet box"
        )
    pairs = pair_effects(cycles)
    return Comparison(
        metric=metric,
        ratio=math.exp(mean),
        ci_low=math.exp(ci95[0]) if ci95 else None,
        ci_high=math.exp(ci95[1]) if ci95 else None,
        p_value=p,
        label=CONFOUNDED if confounded else raw_label,
        n_cycles=m,
        confounded=confounded,
        flags=flags,
        warnings=tuple(warnings),
        pair_ratio=math.exp(float(pairs.mean())) if pairs.size else None,
        bootstrap_ci=boot,
        cycles_needed=needed,
        raw_label=raw_label,
        mean_log_effect=mean,
        sd_log_effect=sd,
        margin_log=delta,
        alpha=alpha,
        higher_is_better=higher_is_better,
        n_pairs=int(pairs.size),
        tost_ci=(math.exp(ci90[0]), math.exp(ci90[1])) if ci90 else None,
        wilcoxon_p=wil_p,
    )


def _power_warnings(
    metric: str,
    m: int,
    raw_label: str,
    mean: float,
    sd: float | None,
    needed: int | None,
    delta: float,
    alpha: float,
    margin_pct: float,
    have_spread: bool,
) -> list[str]:
    """benchstat-style "cannot reach significance" warnings, each ending with the remedy."""
    if m == 1:
        more = max(1, (needed or 2) - 1)
        basis = (
            "estimated from the within-block spread, a lower bound"
            if have_spread
            else "the minimum for any interval"
        )
        return [
            f"{metric}: only 1 cycle: no interval; run at least {more} more cycle(s) ({basis}; "
            f"{RESUME_HINT})"
        ]
    if raw_label != "inconclusive" or sd is None or needed is None:
        return []
    if needed > m:
        target = needed
        why = (
            f"per-cycle SD {sd:.4f} (log) is too large for {m} cycles; if the effect is as "
            f"observed ({_pct(mean)}), about {needed} cycles decide it (80% power, ±{margin_pct:g}%"
            " margin)"
        )
    else:
        # Enough power for the margin, but D̄ sits near it: narrow the 90% CI past the margin.
        target = max(m + 1, _cycles_to_clear(sd, abs(delta - abs(mean)), alpha))
        why = (
            f"the effect {_pct(mean)} sits near the ±{margin_pct:g}% margin; about {target} cycles "
            "would narrow the interval enough to decide"
        )
    return [
        f"{metric}: inconclusive: {why}; run at least {target - m} more cycle(s) ({RESUME_HINT})"
    ]


def apply_holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """Holm-adjust the p-values of one gate set's metrics and recompute their labels.

    A comparison without a p-value (one cycle) counts in the family as p = 1, which keeps the
    correction conservative. *better*/*worse* then need adjusted p < α (and |D̄| ≥ Δ as
    before); the TOST *within noise* test and the intervals are left as they were.
    """
    ps = [c.p_value if c.p_value is not None else 1.0 for c in comparisons]
    adjusted = holm(ps)
    out: list[Comparison] = []
    for c, p_adj in zip(comparisons, adjusted, strict=True):
        if c.p_value is None or c.ci_low is None or c.ci_high is None or c.tost_ci is None:
            out.append(c)
            continue
        ci95 = (math.log(c.ci_low), math.log(c.ci_high))
        ci90 = (math.log(c.tost_ci[0]), math.log(c.tost_ci[1]))
        raw = decide_label(
            c.mean_log_effect,
            ci95,
            ci90,
            c.margin_log,
            higher_is_better=c.higher_is_better,
            p_value=p_adj,
            alpha=c.alpha,
        )
        out.append(
            replace(c, p_adjusted=p_adj, raw_label=raw, label=CONFOUNDED if c.confounded else raw)
        )
    return out
