"""Small-sample sequential boundaries for the campaign's t statistic, by seeded simulation.

docs/design.md#sequential-designs. The O'Brien–Fleming-type spending of
:mod:`harness.stats.sequential` solves its equations for a statistic that is exactly normal
at every look. The campaign's statistic is a t statistic on m − 1 degrees of freedom whose
variance estimate grows with the looks, and deciding each look at the normal boundary's
nominal level overspends: 5.5–5.7% two-sided instead of 5% for the bench's 3…12-cycle design.

Here the same spending is solved for the t statistic itself. Under H₀ with normal cycle effects
the statistic's law does not depend on the effects' SD, so one seeded simulation per design
(looks, orders, α) gives it: 2·10⁶ campaigns of m_max standard normal Dⱼ, the order-balanced t
at every look (from running sums, so memory does not grow with the cycles), and per look the
boundary c_k that the survivors of the earlier looks cross with probability
α(t_k) − α(t_{k−1}); the first look's is Student's t quantile itself (nothing stopped before
it). Each look then decides at the nominal two-sided level p_k = 2·P(T_{m_k−1} > c_k) that the
fixed analysis understands. Where the simulation expects fewer than :data:`MIN_CROSSINGS`
crossings (the first looks of an O'Brien–Fleming design spend almost nothing), the normal
boundary's nominal level is kept: there it is far out in the tail and the difference is below
what the simulation could resolve. The level the looks reach together is then measured on
2·10⁶ fresh campaigns of another seed (:attr:`Calibration.reached`). Results are cached per
design, in memory and under ~/.cache/harness/look-levels (a few seconds to compute).

For looks at 3…12 cycles the levels rise to 0.0320 at the last look, for 3…8 to 0.0335; the
3…8 design reaches 5.02% two-sided on fresh campaigns (Monte Carlo SE 0.015 points), printed by
``harness bench sequential``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harness.stats.cycles import FloatArray
from harness.stats.distributions import t_isf, t_sf

CALIBRATION_CAMPAIGNS = 2_000_000
CALIBRATION_SEED = 26
MIN_CROSSINGS = 100


def balanced_weights(m: int) -> FloatArray:
    """Weights of the order-balanced mean over m alternating cycles (ABBA first)."""
    orders = np.arange(m) % 2
    n_abba = int((orders == 0).sum())
    n_baab = m - n_abba
    if n_baab == 0:
        return np.full(m, 1.0 / m)
    w: FloatArray = np.where(orders == 0, 0.5 / n_abba, 0.5 / n_baab).astype(np.float64)
    return w


def balanced_t(effects: npt.NDArray[np.float64]) -> tuple[FloatArray, FloatArray]:
    """Order-balanced mean and its SE per row of ``effects`` (campaigns × m cycles).

    The same estimator as :func:`harness.stats.effect.balanced_effect`, vectorised.
    """
    m = effects.shape[1]
    w = balanced_weights(m)
    mean: FloatArray = effects @ w
    ss = ((effects - mean[:, None]) ** 2).sum(axis=1)
    sum_w2 = float(w @ w)
    sd = np.sqrt(ss / (m - 2 + m * sum_w2))
    se: FloatArray = sd * np.sqrt(sum_w2)
    return mean, se


@dataclass(frozen=True)
class Calibration:
    """A design's t-calibrated nominal levels and the two-sided level they reach."""

    levels: tuple[float, ...]  # two-sided nominal level of each look
    reached: float  # share of fresh null campaigns (another seed) that any look rejects


def t_nominal_levels(
    looks: tuple[int, ...],
    spent_by_look: tuple[float, ...],
    normal_levels: tuple[float, ...],
) -> tuple[float, ...]:
    """Two-sided nominal levels per look that spend ``spent_by_look`` for the t statistic."""
    return t_calibration(looks, spent_by_look, normal_levels).levels


@lru_cache(maxsize=64)
def t_calibration(
    looks: tuple[int, ...],
    spent_by_look: tuple[float, ...],
    normal_levels: tuple[float, ...],
    campaigns: int = CALIBRATION_CAMPAIGNS,
    seed: int = CALIBRATION_SEED,
) -> Calibration:
    """The levels that spend ``spent_by_look`` (cumulative two-sided α by look), and the level
    they reach on as many fresh campaigns: cached in memory and on disk (a few seconds each).

    ``looks`` are cycle counts, ``normal_levels`` the normal-theory nominal levels kept where
    the simulation cannot resolve the tail (fewer than :data:`MIN_CROSSINGS` expected
    crossings).
    """
    key = json.dumps([CACHE_VERSION, looks, spent_by_look, normal_levels, campaigns, seed])
    cached = _read_cache(key)
    if cached is not None:
        return cached
    levels = _solve_levels(looks, spent_by_look, normal_levels, campaigns, seed)
    crossed = _crossings(looks, levels, campaigns, seed + 1)
    found = Calibration(levels, float(crossed.mean()))
    _write_cache(key, found)
    return found


def _running_t(
    rng: np.random.Generator, campaigns: int, looks: tuple[int, ...]
) -> Iterator[tuple[int, FloatArray]]:
    """|t| of the order-balanced mean at each look, for ``campaigns`` campaigns of standard
    normal Dⱼ, from running sums (memory O(campaigns), whatever the number of cycles)."""
    sums = np.zeros((2, campaigns))  # Σ D over ABBA cycles, over BAAB cycles
    squares = np.zeros(campaigns)
    counts = [0, 0]
    wanted = set(looks)
    for m in range(1, looks[-1] + 1):
        d = rng.standard_normal(campaigns)
        order = (m - 1) % 2
        sums[order] += d
        squares += d * d
        counts[order] += 1
        if m not in wanted or m < 2:
            continue
        w = balanced_weights(m)
        weight = (float(w[0]), float(w[1]) if m > 1 else 0.0)
        mean = weight[0] * sums[0] + weight[1] * sums[1]
        # Σ(D − mean)² = ΣD² − 2·mean·ΣD + m·mean²
        total = sums[0] + sums[1]
        ss = np.maximum(squares - 2.0 * mean * total + m * mean * mean, 0.0)
        sum_w2 = float(w @ w)
        se = np.sqrt(ss / (m - 2 + m * sum_w2) * sum_w2)
        yield m, np.abs(mean) / np.where(se > 0, se, np.inf)


def _solve_levels(
    looks: tuple[int, ...],
    spent_by_look: tuple[float, ...],
    normal_levels: tuple[float, ...],
    campaigns: int,
    seed: int,
) -> tuple[float, ...]:
    """Per look, the boundary c_k that the campaigns still running cross in a share
    α(t_k) − α(t_{k−1}) of all. The first look's is exact: nothing has stopped before it, so its
    statistic is Student's t on m − 1 df, whose quantile carries no Monte Carlo error."""
    rng = np.random.default_rng(seed)
    alive = np.ones(campaigns, dtype=bool)
    by_look = dict(zip(looks, zip(spent_by_look, normal_levels, strict=True), strict=True))
    out: dict[int, float] = {m: normal for m, (_, normal) in by_look.items() if m < 2}
    previous = 0.0
    for m, t_abs in _running_t(rng, campaigns, looks):
        spent_k, normal = by_look[m]
        to_spend = spent_k - previous
        previous = spent_k
        if alive.all():
            c = t_isf(to_spend / 2.0, m - 1)
        elif to_spend * campaigns < MIN_CROSSINGS:
            c = t_isf(normal / 2.0, m - 1)
        else:
            rank = round(to_spend * campaigns)
            survivors = np.sort(t_abs[alive])[::-1]
            c = float(survivors[min(rank, survivors.size - 1)])
        alive &= t_abs <= c  # a look rejects when p < p_k, i.e. |t| > c
        out[m] = 2.0 * t_sf(c, m - 1)
    # A look at one cycle has no t statistic and spends nothing of the running total.
    return tuple(out[m] for m in looks)


def _crossings(
    looks: tuple[int, ...], levels: tuple[float, ...], campaigns: int, seed: int
) -> npt.NDArray[np.bool_]:
    """Which of ``campaigns`` fresh null campaigns any look rejects at its level."""
    rng = np.random.default_rng(seed)
    crossed = np.zeros(campaigns, dtype=bool)
    level = dict(zip(looks, levels, strict=True))
    for m, t_abs in _running_t(rng, campaigns, looks):
        crossed |= t_abs > t_isf(level[m] / 2.0, m - 1)
    return crossed


CACHE_VERSION = 3


def _cache_file(key: str) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return root / "harness" / "look-levels" / f"{digest}.json"


def _read_cache(key: str) -> Calibration | None:
    try:
        data = json.loads(_cache_file(key).read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        return Calibration(tuple(float(v) for v in data["levels"]), float(data["reached"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no cache, or a damaged one: computed again


def _write_cache(key: str, found: Calibration) -> None:
    path = _cache_file(key)
    text = json.dumps({"key": key, "levels": found.levels, "reached": found.reached})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A random name made exclusively (mkstemp), never a fixed one a link could be planted
        # at; the decision math imports no writer of the harness's (formats/safe_write.py).
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(scratch, path)
    except OSError:
        pass  # a read-only home: the in-memory cache still holds it


__all__ = [
    "CALIBRATION_CAMPAIGNS",
    "Calibration",
    "balanced_t",
    "balanced_weights",
    "t_calibration",
    "t_nominal_levels",
]
