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

A cache cell (seed 004's hotlist cache, llama.cpp's expert cache) holds records of any layer
in one budget, and admits every miss: its bound is MIN without bypass (Belady's classic OPT) over
the lookups in the order the cache served them, with the cache's records as slots and its preload
as the start: no eviction order can load less. Its frozen bound is the cache's size in the
trace's most looked-up records, pinned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.policy.kernels import jit
from harness.sim.traces import Trace

__all__ = ["OracleBound", "cache_oracle_bound", "min_loads", "next_uses", "oracle_bound"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OracleBound:
    """MIN's loads over a trace, beside the lookups they served."""

    loads: int
    lookups: int
    hot_slots: int
    static_loads: int = 0  # the best boot map in hindsight, frozen: its cold lookups
    # "layer": hot_slots in each layer (a rowmap, bypass allowed); "cache": records in all,
    # any layer's (a cache cell, every miss admitted).
    scope: str = "layer"

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
def min_loads(
    sequence: I64, upcoming: I64, start: I64, slots: int, experts: int, bypass: bool = True
) -> int:
    """Belady's MIN over one stream of lookups: the fewest loads with ``slots`` slots holding
    ``start`` at first. ``upcoming`` is :func:`next_uses` of ``sequence``; ``experts`` bounds its
    values. With ``bypass`` a miss may be read in place; without it every miss takes a slot
    (a demand cache, which must admit what it fetches), evicting the one needed furthest ahead.
    A lazy max-heap of (next use, slot) finds that slot in O(log n), for caches of thousands."""
    n = sequence.size
    if slots <= 0:
        return n
    where = np.full(experts, -1, dtype=np.int64)  # slot of each expert, -1 when not held
    item = np.full(slots, -1, dtype=np.int64)
    due = np.full(slots, n + 1, dtype=np.int64)  # next use of each slot's expert; empty: n + 1
    first = np.full(experts, n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        first[sequence[i]] = i
    for s in range(min(slots, start.size)):
        if where[start[s]] >= 0:
            continue  # a repeated start entry holds one slot
        item[s] = start[s]
        where[start[s]] = s
        due[s] = first[start[s]]
    # Entries are valid while due[slot] still equals their due; stale ones are dropped on top.
    heap_due = np.empty(n + slots + 1, dtype=np.int64)
    heap_slot = np.empty(n + slots + 1, dtype=np.int64)
    size = 0
    for s in range(slots):
        size = _push(heap_due, heap_slot, size, due[s], s)
    loads = 0
    for i in range(n):
        expert = sequence[i]
        slot = where[expert]
        if slot >= 0:
            due[slot] = upcoming[i]
            size = _push(heap_due, heap_slot, size, upcoming[i], slot)
            continue
        loads += 1
        while due[heap_slot[0]] != heap_due[0]:
            size = _pop(heap_due, heap_slot, size)
        far = heap_slot[0]
        if bypass and due[far] <= upcoming[i]:
            continue  # read in place: every held expert is needed before this one again
        size = _pop(heap_due, heap_slot, size)
        if item[far] >= 0:
            where[item[far]] = -1
        item[far] = expert
        where[expert] = far
        due[far] = upcoming[i]
        size = _push(heap_due, heap_slot, size, upcoming[i], far)
    return loads


@jit
def _push(keys: I64, values: I64, size: int, key: int, value: int) -> int:
    """Push onto a max-heap kept in ``keys``/``values``; returns the new size."""
    i = size
    keys[i] = key
    values[i] = value
    while i > 0:
        parent = (i - 1) // 2
        if keys[parent] >= keys[i]:
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        values[parent], values[i] = values[i], values[parent]
        i = parent
    return size + 1


@jit
def _pop(keys: I64, values: I64, size: int) -> int:
    """Drop the max-heap's top; returns the new size."""
    size -= 1
    keys[0] = keys[size]
    values[0] = values[size]
    i = 0
    while True:
        left = 2 * i + 1
        largest = i
        if left < size and keys[left] > keys[largest]:
            largest = left
        if left + 1 < size and keys[left + 1] > keys[largest]:
            largest = left + 1
        if largest == i:
            return size
        keys[largest], keys[i] = keys[i], keys[largest]
        values[largest], values[i] = values[i], values[largest]
        i = largest


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


def cache_oracle_bound(
    keys: npt.ArrayLike, start: list[int], capacity: int, key_count: int
) -> OracleBound:
    """OPT's loads over a cache's lookups (``layer * experts + expert``, in the order it served
    them), with ``capacity`` records preloaded with ``start``; every miss admitted."""
    sequence = np.asarray(keys, dtype=np.int64).reshape(-1)
    sequence = sequence[sequence >= 0]
    preload = np.asarray(list(dict.fromkeys(start))[:capacity], dtype=np.int64)
    loads = int(min_loads(sequence, next_uses(sequence), preload, capacity, key_count, False))
    counts = np.sort(np.bincount(sequence, minlength=key_count))[::-1]
    static = int(counts[max(capacity, 0) :].sum())
    return OracleBound(loads, int(sequence.size), capacity, static, scope="cache")
