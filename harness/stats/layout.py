"""The mirrored layout every design shares: the ABBA/BAAB alternation of a cycle's blocks and
how a fleet deals cycles to boxes. Here, below the planner, because the analysis and the design
simulator reason about the same order the planner lays out."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["cycle_pattern", "fleet_box"]


def cycle_pattern(cycle: int) -> str:
    """ABBA for even cycles, BAAB for odd ones: each pair cancels linear and quadratic drift."""
    return "ABBA" if cycle % 2 == 0 else "BAAB"


def fleet_box(boxes: Sequence[str], cycle: int, lane: int) -> str:
    """The box a cohort is planned on: consecutive cycles on different boxes, so the whole
    fleet works from the first cycles, and every box gets ABBA and BAAB cycles alike (so drift
    cancels within each box): with an odd number of boxes round robin alternates the order by
    itself; with an even one each round of n cycles starts one box further on. Lanes (a
    comparison in a cache state) start one box apart."""
    n = len(boxes)
    shift = cycle // n if n % 2 == 0 else 0
    return boxes[(cycle + shift + lane) % n]
