"""Student's t, the normal, chi-square and beta: the tails and quantiles the analysis reads.

Each is the special function ``scipy.stats`` itself calls for that distribution (scipy 1.17's
``t_gen``, ``norm_gen`` and ``chi2_gen`` delegate to exactly these), so the numbers are the
same to the last bit (tests/stats/test_distributions.py holds them to ``scipy.stats``). What
differs is the import: ``scipy.stats`` costs a command about 0.4 s on top of
``scipy.special``, and every ``harness gate``, ``analyze`` and ``run`` paid it.
Arguments are the analysis's own (probabilities inside (0, 1), finite degrees of freedom);
the generic argument checks of ``scipy.stats`` are not repeated here.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special

F64 = npt.NDArray[np.float64]


_SQRT_2PI = math.sqrt(2.0 * math.pi)


def t_sf(x: float, df: float) -> float:
    """P(T > x), T ~ t(df) (``scipy.stats.t.sf``)."""
    return float(special.stdtr(df, -x))


def t_ppf(q: float, df: float) -> float:
    """The q quantile of t(df) (``scipy.stats.t.ppf``)."""
    return float(special.stdtrit(df, q))


def t_isf(q: float, df: float) -> float:
    """The x with P(T > x) = q (``scipy.stats.t.isf``)."""
    return float(-special.stdtrit(df, q))


def norm_cdf(x: float) -> float:
    """P(Z ≤ x), Z standard normal (``scipy.stats.norm.cdf``)."""
    return float(special.ndtr(x))


def norm_sf(x: float) -> float:
    """P(Z > x) (``scipy.stats.norm.sf``)."""
    return float(special.ndtr(-x))


def norm_ppf(q: float) -> float:
    """The q quantile of the standard normal (``scipy.stats.norm.ppf``)."""
    return float(special.ndtri(q))


def norm_isf(q: float) -> float:
    """The x with P(Z > x) = q (``scipy.stats.norm.isf``)."""
    return float(-special.ndtri(q))


def norm_cdf_array(x: F64) -> F64:
    """:func:`norm_cdf` elementwise."""
    out: F64 = special.ndtr(x)
    return out


def norm_sf_array(x: F64) -> F64:
    """:func:`norm_sf` elementwise."""
    out: F64 = special.ndtr(-x)
    return out


def norm_pdf_array(x: F64, scale: float = 1.0) -> F64:
    """The normal density with mean 0 and ``scale`` elementwise (``scipy.stats.norm.pdf``:
    the standard density at x / scale, divided by scale)."""
    z = x / scale
    out: F64 = np.exp(-(z**2) / 2.0) / _SQRT_2PI / scale
    return out


def chi2_isf(q: float, df: float) -> float:
    """The x with P(X > x) = q, X ~ chi-square(df) (``scipy.stats.chi2.isf``)."""
    return float(special.chdtri(df, q))


def beta_ppf(q: float, a: float, b: float) -> float:
    """The q quantile of Beta(a, b) (``scipy.stats.beta.ppf``)."""
    return float(special.betaincinv(a, b, q))


def chi2_ppf(q: float, df: float) -> float:
    """The q quantile of chi-square(df) (``scipy.stats.chi2.ppf``)."""
    return float(2.0 * special.gammaincinv(df / 2.0, q))


__all__ = [
    "beta_ppf",
    "chi2_isf",
    "chi2_ppf",
    "norm_cdf",
    "norm_cdf_array",
    "norm_isf",
    "norm_pdf_array",
    "norm_ppf",
    "norm_sf",
    "norm_sf_array",
    "t_isf",
    "t_ppf",
    "t_sf",
]
