"""The compiled core of the adaptive residency policy: the drain (fold, plan, apply).

One compiled function decides every swap, whoever asks: the reference runtime through
``ResidencyPolicy.observe``, the plain step-by-step replay through the same method, and the fast
replay from inside its own compiled loop (``harness.sim.fastloop``). Sharing the machine code, not
just the algorithm, is what makes "the simulator agrees with the runtime decision for decision" a
property of the build rather than of careful porting: the decay factor, the float products and
the tie-breaks are one implementation.

Written in the subset of Python that numba compiles; ``NUMBA_DISABLE_JIT=1`` runs it as plain
Python (slow, for debugging). Compiled on first use and cached on disk (``cache=True``), so a
runtime warms it up before it reports ready (:func:`warm_up`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "FLUSH_BELOW",
    "decay_factor",
    "drain",
    "drain_layer",
    "fold",
    "jit",
    "warm_up",
]

F = TypeVar("F", bound=Callable[..., Any])


def jit(function: F) -> F:
    """Compile ``function`` with numba (no Python fallback, IEEE math, cached); keeps its type."""
    return cast(F, numba.njit(cache=True, nogil=True)(function))


# Decayed counts below this read as zero. An expert unused for long decays towards zero
# geometrically and would sink into subnormal floats, whose arithmetic costs a hundred cycles
# or more; nothing near 1e-200 can ever meet a promotion threshold or outweigh a real count.
FLUSH_BELOW = 1e-200


@jit
def _decayed(value: float, factor: float, count: int) -> float:
    """One count after a read: the old value decayed plus the new integer count."""
    updated = value * factor + count
    return updated if updated >= FLUSH_BELOW else 0.0


@jit
def fold(
    ewma: npt.NDArray[np.float64],
    raw: npt.NDArray[np.int64],
    elapsed: int,
    rate: float,
) -> None:
    """Read the counters: ``ewma = ewma * exp(-elapsed * rate) + raw`` in place, ``raw = 0``.

    ``raw`` holds the integer route counts since the last read (exact, in any order); the decay
    applies once per read, over the host steps elapsed since the previous one.
    """
    factor = decay_factor(elapsed, rate)
    layers, experts = ewma.shape
    for layer in range(layers):
        for expert in range(experts):
            ewma[layer, expert] = _decayed(ewma[layer, expert], factor, raw[layer, expert])
            raw[layer, expert] = 0


@jit
def decay_factor(elapsed: int, rate: float) -> float:
    """The decay applied at a read, ``elapsed`` host steps after the previous one."""
    return math.exp(-elapsed * rate)


@jit
def drain(
    ewma: npt.NDArray[np.float64],
    raw: npt.NDArray[np.int64],
    hot: npt.NDArray[np.bool_],
    elapsed: int,
    rate: float,
    threshold: float,
    factor: float,
    budget: int,
    step: int,
    swaps: npt.NDArray[np.int64],
    n_swaps: int,
) -> tuple[int, int]:
    """Read the counters, plan and apply one drain; returns (n_swaps, saturated layers).

    Every layer in order through :func:`drain_layer`; swaps are written to ``swaps[n_swaps:]``
    in layer order then pair order (the caller leaves room for layers x budget rows).
    """
    decay = decay_factor(elapsed, rate)
    scratch = np.empty((4, budget + 1), dtype=np.float64)
    keys = np.empty((3, ewma.shape[1]), dtype=np.float64)
    saturated = 0
    for layer in range(ewma.shape[0]):
        applied, pinned = drain_layer(
            ewma[layer], raw[layer], hot[layer], decay, threshold, factor, budget, scratch, keys
        )
        for pair in range(applied):
            swaps[n_swaps, 0] = step
            swaps[n_swaps, 1] = layer
            swaps[n_swaps, 2] = int(scratch[0, pair])
            swaps[n_swaps, 3] = int(scratch[2, pair])
            n_swaps += 1
        saturated += pinned
    return n_swaps, saturated


# Keying the other tier out of a race: a cold expert's hot key is _MASK, far past _OUT_OF_RACE
# (counts are at most steps x top-k, nowhere near 1e299); a hot expert's cold key is -_MASK,
# below any threshold.
_MASK = 1e300
_OUT_OF_RACE = 1e299
_INT64_MAX = np.iinfo(np.int64).max


@jit
def drain_layer(
    row: npt.NDArray[np.float64],
    counts: npt.NDArray[np.int64],
    resident: npt.NDArray[np.bool_],
    decay: float,
    threshold: float,
    factor: float,
    budget: int,
    scratch: npt.NDArray[np.float64],
    keys: npt.NDArray[np.float64],
) -> tuple[int, int]:
    """One layer of a drain: read its counters, plan, apply; returns (swaps, saturated 0/1).

    The i-th strongest cold expert (highest count, ties the lowest id) pairs with the i-th
    weakest hot expert (lowest count, ties the highest id); pairs meet the rule while the cold
    count is at least ``threshold`` and exceeds the hot count times ``factor`` (1 +
    hysteresis). Cold counts fall and hot counts rise along the pairs, so the rule holds on a
    prefix; its first ``budget`` pairs apply, (promoted, evicted) ids left in ``scratch[0]``
    and ``scratch[2]``. A prefix longer than the budget means the layer is *saturated* (pinned
    at the budget: seed 000's recovery limit).

    Deciding needs only the ``keep = budget + 1`` weakest hot and strongest cold experts.
    Three passes, each shaped for the CPU (``keys``, ``[3, experts]``, is their scratch):

    1. Read the counters and key every expert into its race (``keys[0]`` hot, ``keys[1]``
       cold; the other tier keyed out by a select), in ``keep`` groups, taking each group's
       weakest hot and strongest cold key on the way. ``keep`` hot keys are at or below the
       largest of those minima, so the ``keep`` weakest all are: it bounds the hot race; the
       smallest of the maxima bounds the cold one. Min and max run on the keys' int64 bits
       (the same order for non-negative floats; -_MASK, the one negative key, sorts below
       them all), which the compiler vectorises where it would not vectorise float min/max.
    2. List, without a branch, the experts inside either bound, in descending ids.
    3. Keep the candidates in small sorted arrays (``scratch``, ``[4, keep]``): only a handful,
       and each entry is a mispredicted branch, which is why passes 1 and 2 exist.
    """
    keep = budget + 1
    hot_keys, cold_keys, listed = keys[0], keys[1], keys[2].view(np.int64)
    groups, hot_cut, cold_cut = _key_experts(
        row, counts, resident, decay, keep, hot_keys, cold_keys
    )
    # Hot keys enter below ``bound``, cold keys at or above ``floor``; a group without a hot
    # (cold) expert leaves that race unbounded.
    bound = _OUT_OF_RACE
    floor = threshold
    if groups:
        hot_bound = np.int64(hot_cut).view(np.float64)
        cold_bound = np.int64(cold_cut).view(np.float64)
        if hot_bound < _OUT_OF_RACE:
            bound = np.nextafter(hot_bound, np.inf)  # keys equal to it enter too
        if cold_bound > threshold:
            floor = cold_bound
    candidates = _list_inside(hot_keys, cold_keys, listed, bound, floor)
    n_hot, n_cold = _keep_extremes(hot_keys, cold_keys, listed, candidates, bound, floor, scratch)
    cold_ids, cold_values, hot_ids, hot_values = scratch[0], scratch[1], scratch[2], scratch[3]
    if n_hot == 0:
        return 0, 0  # no hot expert in this layer: nothing to evict
    pairs = min(n_cold, n_hot)
    prefix = 0
    while prefix < pairs and cold_values[prefix] > hot_values[prefix] * factor:
        prefix += 1
    applied = min(prefix, budget)
    for pair in range(applied):
        resident[int(cold_ids[pair])] = True
        resident[int(hot_ids[pair])] = False
    return applied, 1 if prefix > budget else 0


@jit
def _key_experts(
    row: npt.NDArray[np.float64],
    counts: npt.NDArray[np.int64],
    resident: npt.NDArray[np.bool_],
    decay: float,
    keep: int,
    hot_keys: npt.NDArray[np.float64],
    cold_keys: npt.NDArray[np.float64],
) -> tuple[int, np.int64, np.int64]:
    """Pass 1 of drain_layer: decay and read the counters, key every expert into its race, and
    bound each race by groups (the number of whole groups, the hot and cold cuts as int64)."""
    experts = row.shape[0]
    size = experts // keep
    groups = keep if size > 0 else 0
    hot_cut = np.int64(0)
    cold_cut = np.int64(_INT64_MAX)
    for group in range(groups + 1):
        start = group * size
        stop = start + size if group < groups else experts
        weakest = np.int64(_INT64_MAX)
        strongest = np.int64(-_INT64_MAX)
        for offset in range(stop - start):
            # Unsigned: numba then drops its negative-index wraparound branch.
            expert = np.uint64(start + offset)
            # _decayed, written out: as a call it keeps the compiler from vectorising the loop.
            value = row[expert] * decay + counts[expert]
            value = value if value >= FLUSH_BELOW else 0.0
            row[expert] = value
            counts[expert] = 0
            is_hot = resident[expert]
            hot_key = value if is_hot else _MASK
            cold_key = -_MASK if is_hot else value
            hot_keys[expert] = hot_key
            cold_keys[expert] = cold_key
            weakest = min(weakest, np.float64(hot_key).view(np.int64))
            strongest = max(strongest, np.float64(cold_key).view(np.int64))
        if group < groups:  # the remainder past the last whole group bounds nothing
            hot_cut = max(hot_cut, weakest)
            cold_cut = min(cold_cut, strongest)
    return groups, hot_cut, cold_cut


@jit
def _list_inside(
    hot_keys: npt.NDArray[np.float64],
    cold_keys: npt.NDArray[np.float64],
    listed: npt.NDArray[np.int64],
    bound: float,
    floor: float,
) -> int:
    """Pass 2: the experts inside either bound into ``listed``, in descending ids, no branch."""
    experts = hot_keys.shape[0]
    candidates = 0
    for step in range(experts):
        expert = experts - 1 - step
        listed[np.uint64(candidates)] = expert
        inside = (hot_keys[np.uint64(expert)] < bound) | (cold_keys[np.uint64(expert)] >= floor)
        candidates += inside
    return candidates


@jit
def _keep_extremes(
    hot_keys: npt.NDArray[np.float64],
    cold_keys: npt.NDArray[np.float64],
    listed: npt.NDArray[np.int64],
    candidates: int,
    bound: float,
    floor: float,
    scratch: npt.NDArray[np.float64],
) -> tuple[int, int]:
    """Pass 3: the ``keep`` weakest hot and strongest cold candidates, sorted, into ``scratch``
    (cold ids, cold values, hot ids, hot values); returns how many of each."""
    keep = scratch.shape[1]
    cold_ids, cold_values, hot_ids, hot_values = scratch[0], scratch[1], scratch[2], scratch[3]
    n_hot = 0
    n_cold = 0
    # Descending ids: an equal count met later has a lower id, so weaker-first hot keeps it out
    # (strict <) and stronger-first cold lets it in (>=) ahead of its equals.
    for index in range(candidates):
        expert = listed[np.uint64(index)]
        hot_key = hot_keys[np.uint64(expert)]
        cold_key = cold_keys[np.uint64(expert)]
        if hot_key < bound:
            at = min(n_hot, keep - 1)
            while at > 0 and hot_values[at - 1] > hot_key:
                hot_values[at] = hot_values[at - 1]
                hot_ids[at] = hot_ids[at - 1]
                at -= 1
            hot_values[at] = hot_key
            hot_ids[at] = expert
            n_hot = min(n_hot + 1, keep)
            if n_hot == keep:
                bound = hot_values[keep - 1]
        if cold_key >= floor:
            at = min(n_cold, keep - 1)
            while at > 0 and cold_values[at - 1] <= cold_key:
                cold_values[at] = cold_values[at - 1]
                cold_ids[at] = cold_ids[at - 1]
                at -= 1
            cold_values[at] = cold_key
            cold_ids[at] = expert
            n_cold = min(n_cold + 1, keep)
            if n_cold == keep:
                floor = cold_values[keep - 1]
    return n_hot, n_cold


def warm_up() -> None:
    """Compile (or load from the on-disk cache) before timing matters, e.g. at runtime boot."""
    ewma = np.zeros((1, 2), dtype=np.float64)
    raw = np.array([[0, 3]], dtype=np.int64)
    hot = np.array([[True, False]])
    swaps = np.zeros((1, 4), dtype=np.int64)
    drain(ewma, raw, hot, 0, 0.0, 1.0, 1.25, 1, 0, swaps, 0)
