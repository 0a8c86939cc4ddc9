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
    saturated = 0
    for layer in range(ewma.shape[0]):
        applied, pinned = drain_layer(
            ewma[layer], raw[layer], hot[layer], decay, threshold, factor, budget, scratch
        )
        for pair in range(applied):
            swaps[n_swaps, 0] = step
            swaps[n_swaps, 1] = layer
            swaps[n_swaps, 2] = int(scratch[0, pair])
            swaps[n_swaps, 3] = int(scratch[2, pair])
            n_swaps += 1
        saturated += pinned
    return n_swaps, saturated


# Keying the other tier out by arithmetic: adding _MASK lifts a count far past _OUT_OF_RACE
# (counts are at most steps x top-k, nowhere near 1e299), subtracting it sinks it below any
# threshold; adding 0.0 leaves a count exactly as it is.
_MASK = 1e300
_OUT_OF_RACE = 1e299


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
) -> tuple[int, int]:
    """One layer of a drain: read its counters, plan, apply; returns (swaps, saturated 0/1).

    The i-th strongest cold expert (highest count, ties the lowest id) pairs with the i-th
    weakest hot expert (lowest count, ties the highest id); pairs meet the rule while the cold
    count is at least ``threshold`` and exceeds the hot count times ``factor`` (1 +
    hysteresis). Cold counts fall and hot counts rise along the pairs, so the rule holds on a
    prefix; its first ``budget`` pairs apply, (promoted, evicted) ids left in ``scratch[0]``
    and ``scratch[2]``. A prefix longer than the budget means the layer is *saturated* (pinned
    at the budget: seed 000's recovery limit).

    Deciding needs only the ``budget + 1`` weakest hot and strongest cold experts, kept in
    small sorted arrays (``scratch``, ``[4, budget + 1]``) during one pass that also reads the
    counters. The other tier is keyed out by arithmetic, not a branch (residency is a coin flip
    to the branch predictor), so the branches left, "enters a small array", are rarely taken.
    """
    experts = row.shape[0]
    keep = budget + 1
    cold_ids, cold_values, hot_ids, hot_values = scratch[0], scratch[1], scratch[2], scratch[3]
    n_hot = 0
    n_cold = 0
    bound = _OUT_OF_RACE
    floor = threshold
    # One pass in descending ids, reading the counters as it goes. An equal count met later has
    # a lower id: weaker-first hot keeps it out (strict <), stronger-first cold lets it in (>=)
    # ahead of its equals.
    for expert in range(experts - 1, -1, -1):
        value = _decayed(row[expert], decay, counts[expert])
        row[expert] = value
        counts[expert] = 0
        is_hot = resident[expert]
        hot_key = value + (1 - is_hot) * _MASK
        cold_key = value - is_hot * _MASK
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


def warm_up() -> None:
    """Compile (or load from the on-disk cache) before timing matters, e.g. at runtime boot."""
    ewma = np.zeros((1, 2), dtype=np.float64)
    raw = np.array([[0, 3]], dtype=np.int64)
    hot = np.array([[True, False]])
    swaps = np.zeros((1, 4), dtype=np.int64)
    drain(ewma, raw, hot, 0, 0.0, 1.0, 1.25, 1, 0, swaps, 0)
