"""The synthetic cost of a host step, for a simulated campaign's ring.

A module of its own so that ``harness simulate``'s flags can show its defaults without loading
numpy, the replay (numba) or the results tables (pandas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.sim.traces import IntArray

__all__ = ["CostModel"]


@dataclass(frozen=True)
class CostModel:
    """Synthetic step durations for the simulated ring (defaults: a seed-000-like decode step)."""

    step_ns: int = 4_000_000
    token_ns: int = 1_000_000
    cold_lookup_ns: int = 50_000
    swap_ns: int = 2_000_000

    def durations(self, tokens: IntArray, cold: IntArray, swaps: IntArray) -> IntArray:
        """Duration of each host step in ns."""
        import numpy as np  # here, not at the top: `harness simulate --help` needs no numpy

        return (
            self.step_ns
            + self.token_ns * tokens
            + self.cold_lookup_ns * cold
            + self.swap_ns * swaps
        ).astype(np.int64)
