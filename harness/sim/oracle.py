"""The oracle bound: the fewest expert loads any residency policy could make on a trace.

A load reads one expert row from host memory: a cold lookup (read in place) or a swap (a row
copied into a hot slot). With ``K`` hot slots per layer and the cell's boot map as the start,
each lookup is a hit, or costs one load either way — read in place, or loaded into a slot that
serves its later hits. Belady's MIN with bypass is optimal for that cost (each miss costs the
same whatever is done with it): on a miss, load the expert only if it is needed again sooner
than the slot whose next use is furthest, and evict that slot. Loading ahead of need costs the
same load earlier, so prefetching cannot beat it. The bound allows what the runtime cannot
(a slot filled mid-step, swaps without a budget), which only lowers it: it is a floor, and the
policy's loads over it are what any policy could still gain on this trace and hot-slot budget.

Beside it, the bound for a frozen map: the best boot map in hindsight (each layer's ``K`` experts
looked up most often on this very trace) and the loads it leaves (its cold lookups), which no
map fitted on other traffic can beat here.

Rowmap cells only: an LRU cache (llama.cpp) or a hotlist cache has other units of lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.policy.kernels import jit
from harness.sim.traces import Trace

__all__ = ["OracleBound", "min_loads", "next_uses", "oracle_bound"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OracleBound:
    """MIN's loads over a trace, beside the lookups they served."""

    loads: int
    lookups: int
    hot_slots: int
    static_loads: int = 0  # the best boot map in hindsight, frozen: its cold lookups

    @property
    def load_share(self) -> float:
        """Loads per lookup: the floor under any policy's (cold lookups + swaps) ÷ lookups."""
        return self.loads / self.lookups if self.lookups else 0.0

    @property
    def static_share(self) -> float:
        """The best frozen map's cold share: the floor under any frozen map's on this trace."""
        return self.static_loads / self.lookups if self.lookups else 0.0


def next_uses(sequence: I64) -> I64:
    """For each position, the next position holding the same expert (``len(sequence)``: none)."""
    n = sequence.size
    order = np.lexsort((np.arange(n), sequence))  # by expert, then position
    out = np.full(n, n, dtype=np.int64)
    same = sequence[order[1:]] == sequence[order[:-1]]
    out[order[:-1][same]] = order[1:][same]
    return out


@jit
def min_loads(sequence: I64, upcoming: I64, start: I64, slots: int, experts: int) -> int:
    """Belady's MIN with bypass over one layer's lookups: the fewest loads with ``slots`` hot
    slots holding ``start`` at first. ``upcoming`` is :func:`next_uses` of ``sequence``."""
    n = sequence.size
    if slots <= 0:
        return n
    where = np.full(experts, -1, dtype=np.int64)  # slot of each expert, -1 when not hot
    item = np.full(slots, -1, dtype=np.int64)
    due = np.full(slots, n + 1, dtype=np.int64)  # next use of each slot's expert; empty: n + 1
    first = np.full(experts, n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        first[sequence[i]] = i
    for s in range(min(slots, start.size)):
        item[s] = start[s]
        where[start[s]] = s
        due[s] = first[start[s]]
    loads = 0
    for i in range(n):
        expert = sequence[i]
        slot = where[expert]
        if slot >= 0:
            due[slot] = upcoming[i]
            continue
        loads += 1
        far = 0
        for s in range(1, slots):
            if due[s] > due[far]:
                far = s
        if due[far] > upcoming[i]:  # worth a slot: needed again before the furthest one is
            if item[far] >= 0:
                where[item[far]] = -1
            item[far] = expert
            where[expert] = far
            due[far] = upcoming[i]
    return loads


def oracle_bound(trace: Trace, hot: list[list[int]]) -> OracleBound:
    """MIN's loads over every layer of ``trace``, each layer starting from its boot hot set."""
    experts = trace.experts_count
    loads = lookups = static = 0
    for layer in range(trace.layers):
        sequence = np.asarray(trace.experts[:, layer, :], dtype=np.int64).reshape(-1)
        sequence = sequence[sequence >= 0]  # a dense layer's placeholder routes nothing
        start = np.asarray(hot[layer] if layer < len(hot) else [], dtype=np.int64)
        slots = len(hot[layer]) if layer < len(hot) else 0
        loads += int(min_loads(sequence, next_uses(sequence), start, slots, experts))
        lookups += int(sequence.size)
        counts = np.sort(np.bincount(sequence, minlength=experts))[::-1]
        static += int(counts[slots:].sum())
    return OracleBound(loads, lookups, max((len(h) for h in hot), default=0), static)
