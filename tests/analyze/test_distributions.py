"""harness.stats.distributions gives scipy.stats's numbers, bit for bit, over the ranges the
analysis asks for (levels from 1e-12 to 0.5 and their complements, 1 to 10,000 degrees of
freedom, statistics from -40 to 40), so no verdict moves because the analysis no longer imports
scipy.stats."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from harness.stats import distributions as dist

LEVELS = [1e-12, 1e-6, 7e-4, 0.0121, 0.025, 0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 0.95, 0.975, 0.999]
DFS = [1, 2, 3, 5, 7, 11, 29, 100, 1000, 10_000]
XS = [-40.0, -6.5, -1.96, -0.3, 0.0, 0.25, 1.0, 2.7, 8.0, 40.0]


@pytest.mark.parametrize("df", DFS)
def test_students_t_is_scipys(df: int) -> None:
    for q in LEVELS:
        assert dist.t_ppf(q, df) == float(sps.t.ppf(q, df)), (q, df)
        assert dist.t_isf(q, df) == float(sps.t.isf(q, df)), (q, df)
    for x in XS:
        assert dist.t_sf(x, df) == float(sps.t.sf(x, df)), (x, df)


def test_the_normal_is_scipys() -> None:
    for q in LEVELS:
        assert dist.norm_ppf(q) == float(sps.norm.ppf(q)), q
        assert dist.norm_isf(q) == float(sps.norm.isf(q)), q
    for x in XS:
        assert dist.norm_cdf(x) == float(sps.norm.cdf(x)), x
        assert dist.norm_sf(x) == float(sps.norm.sf(x)), x
    grid = np.linspace(-9.0, 9.0, 2001)
    assert np.array_equal(dist.norm_cdf_array(grid), sps.norm.cdf(grid))
    assert np.array_equal(dist.norm_sf_array(grid), sps.norm.sf(grid))
    assert np.array_equal(dist.norm_pdf_array(grid), sps.norm.pdf(grid))
    for scale in (0.1, np.sqrt(0.37), 1.0, 3.0):
        assert np.array_equal(
            dist.norm_pdf_array(grid, scale=scale), sps.norm.pdf(grid, scale=scale)
        )


@pytest.mark.parametrize("df", DFS)
def test_chi_square_is_scipys(df: int) -> None:
    for q in LEVELS:
        assert dist.chi2_isf(q, df) == float(sps.chi2.isf(q, df)), (q, df)
        assert dist.chi2_ppf(q, df) == float(sps.chi2.ppf(q, df)), (q, df)


@pytest.mark.parametrize(("a", "b"), [(1.0, 8.0), (3.5, 20.25), (17.0, 1.5), (0.5, 0.5)])
def test_beta_is_scipys(a: float, b: float) -> None:
    for q in (0.001, 0.025, 0.5, 0.975, 0.999):
        assert dist.beta_ppf(q, a, b) == float(sps.beta.ppf(q, a, b)), (q, a, b)
