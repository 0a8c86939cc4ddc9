"""Group-sequential boundaries against published values, scipy, and their error rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.errors import BadInput
from harness.stats.sequential import SequentialPlan, boundaries, spent


def test_boundaries_match_the_published_lan_demets_table() -> None:
    # Two-sided α = 0.05, four equally spaced looks, O'Brien–Fleming-type spending (ldbounds'
    # bounds(t = c(.25, .5, .75, 1), iuse = c(1, 1), alpha = c(.025, .025)); gsDesign's sfLDOF).
    got = boundaries((0.25, 0.5, 0.75, 1.0), 0.05)
    assert got == pytest.approx((4.3326, 2.9631, 2.3590, 2.0141), abs=2e-4)


def test_spending_reaches_alpha_and_starts_near_zero() -> None:
    assert spent(1.0, 0.05) == pytest.approx(0.05, rel=1e-12)
    assert spent(0.0, 0.05) == 0.0
    assert spent(0.25, 0.05) < 1e-4
    fractions = np.linspace(0.1, 1.0, 10)
    values = [spent(t, 0.05) for t in fractions]
    assert values == sorted(values)


@pytest.mark.parametrize("fractions", [(0.3, 0.6, 1.0), (0.25, 0.75, 1.0), (0.5, 1.0)])
def test_each_look_spends_its_increment_under_the_joint_normal(
    fractions: tuple[float, ...],
) -> None:
    # Independent check with scipy's multivariate normal: the look statistics are Brownian
    # motion observed at t_k, Corr(Z_i, Z_j) = √(t_i / t_j); the chance of crossing by look k
    # must be what the spending function allows.
    c = np.asarray(boundaries(fractions, 0.05))
    t = np.asarray(fractions)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for k in range(1, len(t) + 1):
        inside = sps.multivariate_normal.cdf(
            c[:k],
            mean=np.zeros(k),
            cov=cov[:k, :k],
            lower_limit=-c[:k],
            rng=np.random.default_rng(0),
        )
        assert 1 - inside == pytest.approx(spent(t[k - 1], 0.05), abs=2e-5)


def test_overall_false_positive_rate_is_alpha_over_all_looks() -> None:
    # Brownian motion under H0 observed at ten looks: crossing any boundary happens α of the time.
    rng = np.random.default_rng(11)
    fractions = tuple(np.arange(3, 13) / 12)
    c = np.asarray(boundaries(fractions, 0.05))
    n = 200_000
    increments = np.diff(np.concatenate(([0.0], fractions)))
    path = np.cumsum(rng.normal(size=(n, len(fractions))) * np.sqrt(increments), axis=1)
    z = path / np.sqrt(fractions)
    crossed = (np.abs(z) >= c).any(axis=1).mean()
    assert crossed == pytest.approx(0.05, abs=0.002)
    # Looking ten times at a fixed 5% would cross far more often.
    naive = (np.abs(z) >= sps.norm.isf(0.025)).any(axis=1).mean()
    assert naive > 0.15


def test_plan_schedule_and_nominal_levels() -> None:
    plan = SequentialPlan(first_cycles=3, max_cycles=9, look_every=2, alpha=0.05)
    assert plan.scheduled() == [3, 5, 7, 9]
    assert plan.next_look(3) == 5 and plan.next_look(9) is None
    levels = [plan.nominal_alpha(m) for m in plan.scheduled()]
    assert levels == sorted(levels) and levels[-1] < 0.05 and levels[0] < 0.002
    # An unscheduled look taken by hand counts: the final level is then lower still.
    assert plan.nominal_alpha(9, [3, 4, 5, 7]) < levels[-1]
    table = plan.table()
    assert [row["cycles"] for row in table] == [3, 5, 7, 9]
    assert table[-1]["alpha_spent"] == pytest.approx(0.05)
    assert table[-1]["normal_alpha"] == pytest.approx(2 * sps.norm.sf(table[-1]["z_boundary"]))
    # The t statistic's heavier tails need a stricter level than the normal boundary's.
    assert table[-1]["nominal_alpha"] < table[-1]["normal_alpha"]


def _balanced_t(d: np.ndarray) -> np.ndarray:
    """The order-balanced t statistic of harness.stats.effect.balanced_effect, per row."""
    m = d.shape[1]
    abba = np.arange(m) % 2 == 0
    w = np.where(abba, 0.5 / abba.sum(), 0.5 / max(1, (~abba).sum()))
    mean = d @ w
    ss = ((d - mean[:, None]) ** 2).sum(axis=1)
    sd = np.sqrt(ss / (m - 2 + m * float(w @ w)))
    return np.asarray(mean / (sd * math.sqrt(float(w @ w))))


def test_t_statistic_looks_spend_alpha_not_more() -> None:
    # Deciding each look's t statistic at the normal boundary's level spent 5.5–5.7% two-sided
    # for 3…12 cycles (issue 26); the simulated t boundaries spend 5%. Fresh draws, not the
    # calibration's own: 60,000 A/A campaigns of normal cycle effects.
    plan = SequentialPlan(first_cycles=3, max_cycles=12, look_every=1, alpha=0.05)
    d = np.random.default_rng(20260).standard_normal((60_000, 12))
    crossed = np.zeros(d.shape[0], dtype=bool)
    upper = np.zeros(d.shape[0], dtype=bool)
    for m in plan.scheduled():
        t = _balanced_t(d[:, :m])
        p = 2 * sps.t.sf(np.abs(t), m - 1)
        now = ~crossed & (p < plan.nominal_alpha(m))
        upper |= now & (t > 0)
        crossed |= now
    assert crossed.mean() == pytest.approx(0.05, abs=0.003)
    assert upper.mean() <= 0.025 + 0.002


def test_bad_designs_are_refused() -> None:
    with pytest.raises(BadInput, match="max_cycles"):
        SequentialPlan(first_cycles=5, max_cycles=3, look_every=1, alpha=0.05)
    with pytest.raises(BadInput, match="increase"):
        boundaries((0.5, 0.5), 0.05)
    with pytest.raises(BadInput, match="outside"):
        SequentialPlan(3, 6, 1, 0.05).nominal_alpha(7)


def test_one_look_is_the_fixed_design() -> None:
    assert SequentialPlan(4, 4, 1, 0.05).nominal_alpha(4) == pytest.approx(0.05, rel=1e-9)
    assert boundaries((1.0,), 0.05)[0] == pytest.approx(sps.norm.isf(0.025))
    assert math.isclose(spent(1.0, 0.01), 0.01)
