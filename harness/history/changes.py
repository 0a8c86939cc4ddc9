"""Change points in a metric's history, by Apache Otava's E-Divisive means.

Otava (``otava.analysis.compute_change_points``) is the Hunter variant of E-Divisive
(Matteson & James; Fleming et al., ICPE 2023): sliding windows find candidate splits by energy
distance, then a merge step keeps those whose before/after t-test clears ``max_pvalue``. It
is maintained (an Apache incubator project, released 2026), needs only numpy and scipy at
run time, and works on the short series a campaign history has. MongoDB's
``signal-processing-algorithms`` (the same algorithm) pins numpy below 2 and pulls gevent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import BadInput

__all__ = ["ChangePoint", "change_points"]

# Fewer points than this cannot show a change against noise: Otava finds nothing in them.
MIN_POINTS = 4


@dataclass(frozen=True)
class ChangePoint:
    """A change between ``values[index - 1]`` and ``values[index]``."""

    index: int
    mean_before: float
    mean_after: float
    pvalue: float

    @property
    def change_pct(self) -> float:
        """Relative change of the mean, in percent."""
        return 100.0 * (self.mean_after / self.mean_before - 1.0) if self.mean_before else 0.0


def change_points(values: Sequence[float], max_pvalue: float = 0.001) -> list[ChangePoint]:
    """Change points of a series (oldest first); none for a series too short to show one."""
    if len(values) < MIN_POINTS:
        return []
    try:
        from otava.analysis import compute_change_points
    except ModuleNotFoundError:
        raise BadInput(
            "change points need Apache Otava: pip install --no-deps apache-otava==0.8.0 "
            "(make test installs it)"
        ) from None
    found, _ = compute_change_points(list(map(float, values)), window_len=50, max_pvalue=max_pvalue)
    return [
        ChangePoint(
            index=int(cp.index),
            mean_before=float(cp.stats.mean_1),
            mean_after=float(cp.stats.mean_2),
            pvalue=float(cp.stats.pvalue),
        )
        for cp in found
    ]
