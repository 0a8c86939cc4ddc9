"""Group-sequential boundaries: how strict each look at a growing campaign must be.

docs/design.md#sequential-designs. A sequential campaign looks at its data after ``cycles``
cycles, then after every ``look_every`` more, up to ``max_cycles``. Looking repeatedly at a
fixed level would inflate the false-positive rate; Lan–DeMets alpha spending keeps the overall
two-sided level at α whatever looks are taken. The spending function is the O'Brien–Fleming
type, per side α_s(t) = 2 − 2Φ(Φ⁻¹(1 − α/4)/√t) (gsDesign's sfLDOF and ldbounds' iuse=1 with
α/2 a side), so early looks need overwhelming evidence and the last look's level stays close to
α: a campaign that runs to ``max_cycles`` loses little power against a fixed design of that
size, and one with a large effect stops early. Pocock-type spending would stop sooner on
moderate effects but pays at the last look, which is where a hard-to-call comparison lands.

Information is proportional to cycles, so look k sits at t_k = cycles_k / max_cycles. Each
boundary c_k solves P(|Z_j| < c_j for j < k, |Z_k| ≥ c_k) = α(t_k) − α(t_{k−1}) for the
canonical joint distribution of the look statistics (Brownian motion observed at t_k), found by
the recursive numerical integration of Armitage, McPherson and Rowe (1969) as in Jennison and
Turnbull (2000, ch. 19), with scipy's normal distribution and root finder. No Python library
ships these boundaries; the tests check them against the published table and against scipy's
multivariate normal.

The campaign's statistic is a t-statistic with few degrees of freedom: deciding it at the normal
boundary's level 2(1 − Φ(c_k)) overspends (5.5–5.7% two-sided for 3…12 cycles). The spending is
therefore solved again for the t statistic by seeded simulation
(:mod:`harness.stats.sequential_t`), and each look decides at that nominal two-sided level p_k:
the comparison at look k is the fixed analysis run at α = p_k (its intervals are then repeated
confidence intervals).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize

from harness.errors import BadInput
from harness.stats.distributions import (
    norm_cdf,
    norm_cdf_array,
    norm_isf,
    norm_pdf_array,
    norm_ppf,
    norm_sf,
    norm_sf_array,
)
from harness.stats.sequential_t import Calibration, t_calibration

GRID_POINTS = 401  # Simpson grid over each look's continuation region (odd)
_MAX_Z = 12.0  # boundaries beyond this spend nothing measurable


def spent(t: float, alpha: float) -> float:
    """Two-sided α spent by information fraction t (O'Brien–Fleming type, α/2 a side)."""
    if t <= 0:
        return 0.0
    z = norm_ppf(1.0 - alpha / 4.0)
    return 2.0 * (2.0 - 2.0 * norm_cdf(z / math.sqrt(min(t, 1.0))))


def _simpson_weights(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return w / 3.0


def _crossing(
    c: float, mass: np.ndarray, grid: np.ndarray, root_t: float, sd: float, target: float
) -> float:
    """P(continue to the previous look, then |Z| ≥ c at this one), less the α to spend."""
    edge = c * root_t
    outside = norm_sf_array((edge - grid) / sd) + norm_cdf_array((-edge - grid) / sd)
    return float(mass @ outside) - target


@lru_cache(maxsize=256)
def boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Two-sided boundaries c_k on the Z scale for looks at increasing information fractions."""
    if not fractions:
        return ()
    if not 0 < alpha < 1:
        raise BadInput(f"alpha must lie in (0, 1), got {alpha!r}")
    if any(b <= a for a, b in itertools.pairwise(fractions)) or not (
        fractions[0] > 0 and fractions[-1] <= 1.0 + 1e-12
    ):
        raise BadInput(f"information fractions must increase within (0, 1], got {fractions}")
    out = [norm_isf(spent(fractions[0], alpha) / 2.0)]
    # Density of the score S = Z·√t on the first look's continuation region.
    width = out[0] * math.sqrt(fractions[0])
    grid = np.linspace(-width, width, GRID_POINTS)
    density = norm_pdf_array(grid, scale=math.sqrt(fractions[0]))
    step = grid[1] - grid[0]
    for k in range(1, len(fractions)):
        sd = math.sqrt(fractions[k] - fractions[k - 1])
        mass = density * _simpson_weights(GRID_POINTS) * step
        target = spent(fractions[k], alpha) - spent(fractions[k - 1], alpha)
        root_t = math.sqrt(fractions[k])

        args = (mass, grid, root_t, sd, target)
        if _crossing(_MAX_Z, *args) >= 0:
            c_k = _MAX_Z
        else:
            c_k = float(optimize.brentq(_crossing, 0.0, _MAX_Z, args=args, xtol=1e-9))
        out.append(c_k)
        # Carry the density forward to the new look's continuation region.
        width = c_k * root_t
        new_grid = np.linspace(-width, width, GRID_POINTS)
        kernel = norm_pdf_array((new_grid[:, None] - grid[None, :]) / sd) / sd
        density = kernel @ mass
        grid, step = new_grid, new_grid[1] - new_grid[0]
    return tuple(out)


@dataclass(frozen=True)
class SequentialPlan:
    """The looks of a sequential design and the nominal level each decides at."""

    first_cycles: int
    max_cycles: int
    look_every: int
    alpha: float

    def __post_init__(self) -> None:
        if not 1 <= self.first_cycles <= self.max_cycles or self.look_every < 1:
            raise BadInput(
                "a sequential design needs 1 <= cycles <= max_cycles and look_every >= 1, got "
                f"cycles={self.first_cycles}, max_cycles={self.max_cycles}, "
                f"look_every={self.look_every}"
            )

    def scheduled(self) -> list[int]:
        """Cycle counts at which the design looks: cycles, + look_every…, and max_cycles."""
        looks = list(range(self.first_cycles, self.max_cycles, self.look_every))
        return [*looks, self.max_cycles]

    def next_look(self, cycles: int) -> int | None:
        """The cycle count of the next scheduled look after ``cycles``; None at the end."""
        later = [m for m in self.scheduled() if m > cycles]
        return later[0] if later else None

    def nominal_alpha(self, cycles: int, taken: Sequence[int] = ()) -> float:
        """The two-sided nominal level of the look at ``cycles`` cycles.

        ``taken`` lists the looks already taken (cycle counts); without it the schedule up to
        ``cycles`` is assumed. An unscheduled look (a campaign extended by hand) counts as a
        look taken: spending adapts to whatever looks were actually made.
        """
        if not 1 <= cycles <= self.max_cycles:
            raise BadInput(f"{cycles} cycles lies outside this design's 1..{self.max_cycles}")
        looks = sorted({m for m in (taken or self.scheduled()) if m < cycles} | {cycles})
        return self._levels(tuple(looks))[-1]

    def _levels(self, looks: tuple[int, ...]) -> tuple[float, ...]:
        """The t-calibrated two-sided nominal level of each look in ``looks``."""
        return self._calibration(looks).levels

    def _calibration(self, looks: tuple[int, ...]) -> Calibration:
        fractions = tuple(m / self.max_cycles for m in looks)
        normal = tuple(2.0 * norm_sf(c) for c in boundaries(fractions, self.alpha))
        spent_by = tuple(spent(t, self.alpha) for t in fractions)
        return t_calibration(looks, spent_by, normal)

    def reached_alpha(self) -> float:
        """The two-sided level the scheduled looks reach together on fresh null campaigns
        (not those they were solved on): α within Monte Carlo error when the levels hold."""
        return self._calibration(tuple(self.scheduled())).reached

    def table(self) -> list[dict[str, float]]:
        """Every scheduled look: cycles, information fraction, α spent, boundaries, nominal p.

        ``nominal_alpha`` is the t-calibrated level the look decides at; ``normal_alpha`` the
        normal-theory one (2(1 − Φ(z_boundary))) it replaces.
        """
        looks = self.scheduled()
        fractions = tuple(m / self.max_cycles for m in looks)
        bounds = boundaries(fractions, self.alpha)
        levels = self._levels(tuple(looks))
        return [
            {
                "cycles": float(m),
                "information": t,
                "alpha_spent": spent(t, self.alpha),
                "z_boundary": c,
                "normal_alpha": 2.0 * norm_sf(c),
                "nominal_alpha": level,
            }
            for m, t, c, level in zip(looks, fractions, bounds, levels, strict=True)
        ]


__all__ = ["SequentialPlan", "boundaries", "spent"]
