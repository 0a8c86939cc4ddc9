"""Drift flags: DRIFT and NONLINEAR per mirrored cycle, and the within-block SD they scale by.

Formulas are docs/design.md#drift-flags: DRIFT when |y_outer2 − y_outer1| > max(Δ, z·s_w·√(2/k)),
NONLINEAR when |r| > max(Δ, z·s_w·√(20/k)), r = 3(y_inner2 − y_inner1) − (y_outer2 − y_outer1).
z is Bonferroni over the 2m flag tests, z = Φ⁻¹(1 − 0.05/(4m)) (the original 2·s_w flagged
29–66% of clean A/A campaigns), and the noise is the larger of s_w and, with two other cycles
or more, the boot-to-boot SD from their r at its 90% upper bound (see drift_flags).

A flag alone changes no label. What drift could do to D̄ is bounded by
:func:`harness.stats.effect.drift_bias`, and a label is *confounded* only when that bound
reaches its interval (:func:`harness.stats.labels.is_confounded`). Two gaps closed there: charging
a flagged cycle the whole ½|outer − inner|, linear drift included, called a real +3% effect under
benign linear drift *confounded* in a third of quiet campaigns (issue 26), so the other cycles'
trend is taken out; and a box that slows in steps gives every cycle the same outer change, which
the trend term nearly cancels, so while the trend is not established a cycle is charged at least
½|r| (an A/A drift campaign on CI had been called *better* on TPOT p50 through that gap).
Everything here is pure: cycles in, frozen flags out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.stats.cycles import Cycle, pct_change
from harness.stats.distributions import chi2_ppf, norm_ppf


@dataclass(frozen=True)
class Flag:
    """A drift flag on one cycle: kind "DRIFT" or "NONLINEAR", with the numbers behind it."""

    kind: str
    cycle: int
    detail: str


def pooled_within_sd(cycles: Sequence[Cycle]) -> float | None:
    """s_w, the pooled within-block SD of per-prompt ln values; None without prompt_logs.

    docs/design.md#drift-flags defines it as sqrt(Σ(kᵦ − 1)·sᵦ² / Σ(kᵦ − 1)) over every block.
    When every cycle has ``prompts_aligned``, prompt-to-prompt differences (up to ~19 % between
    prompts in seed 000) would inflate that spread and blunt the drift flags, so s_w is then
    estimated from the same-arm paired differences xᵢ(second block) − xᵢ(first block), whose
    variance is 2σ² and whose mean (the drift) is removed: s_w² = Σ SS(diff)/2 / Σ(k − 1).
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
    """DRIFT and NONLINEAR flags per cycle (docs/design.md#drift-flags).

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
    z_flag = norm_ppf(1.0 - FLAG_ALPHA / (4.0 * max(len(cycles), 1)))
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
            upper = math.sqrt(dof / chi2_ppf(0.10, dof))
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
                    f"({pct_change(c.outer_change)} between the outer blocks)",
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
