"""The fast replay's compiled loops: the drain schedule, then ranges of layers on threads.

They do what ``ResidencyPolicy.observe`` and ``count_cold`` do per host step, on the policy's
own arrays (``ResidencyPolicy.export_state``), and call the policy's compiled
:func:`harness.policy.kernels.drain_layer` at drain points, so decisions are the same machine
code on the same integers and floats as the plain replay and the reference runtime.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from harness.policy.kernels import decay_factor, drain_layer, jit

__all__ = ["drain_schedule", "merge_block", "replay_layers"]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
_U = np.uint64


@jit
def drain_schedule(
    prefill: npt.NDArray[np.bool_],
    starts: I64,
    steps: I64,
    first: int,
    last: int,
    scalars: I64,
    adaptive: bool,
    drain_every: int,
    rate: float,
    decay: npt.NDArray[np.float64],
) -> None:
    """Which host steps of ``first..last-1`` drain, and the decay each applies.

    Drains depend only on which host steps decode, not on any count, so the schedule is known
    before a single count is added: host step i drains when ``decay[i] >= 0`` (else -1).
    ``scalars`` = [fold_step, last_step, since_drain] of the policy, advanced to ``last`` in
    place.
    """
    fold_step, since_drain = scalars[0], scalars[2]
    for index in range(first, last):
        decay[index] = -1.0
        decode = False
        for row in range(starts[index], starts[index + 1]):
            if not prefill[row]:
                decode = True
                break
        if not decode:
            continue
        since_drain += 1
        if adaptive and since_drain >= drain_every:
            step = steps[index]
            decay[index] = decay_factor(0 if fold_step < 0 else step - fold_step, rate)
            fold_step = step
            since_drain = 0
    if last > first:
        scalars[1] = steps[last - 1]
    scalars[0], scalars[2] = fold_step, since_drain


@jit
def replay_layers(
    experts: npt.NDArray[np.integer],
    prefill: npt.NDArray[np.bool_],
    starts: I64,
    first: int,
    last: int,
    decay: npt.NDArray[np.float64],
    ewma: npt.NDArray[np.float64],
    raw: I64,
    hot: npt.NDArray[np.bool_],
    low: int,
    high: int,
    threshold: float,
    factor: float,
    budget: int,
    hits: npt.NDArray[np.int32],
    pinned: I64,
    applied: I64,
    promoted: I32,
    evicted: I32,
) -> None:
    """Replay host steps ``first..last-1`` for layers ``low..high-1``.

    Layers never interact in this policy (their counts, residency and drains are their own;
    only the drain schedule is shared), so a range of layers can run through the steps on its
    own, on its own thread. Host step i looks up under the residency it starts with, then
    counts its decode rows, then drains its layers when scheduled (``decay[i] >= 0``) through
    the policy's :func:`drain_layer`. Out, for the range only: ``hits[row - starts[first]]``
    hot lookups, ``pinned[d]`` saturated layers at the block's d-th drain, and at that drain
    per layer ``applied[d, layer]`` swaps, ``promoted[d, layer, pair]`` and ``evicted[d, layer,
    pair]``: fixed slots, so ranges on other threads fill the same arrays without a lock and
    :func:`merge_block` reads them back in the runtime's order.
    """
    top_k = experts.shape[2]
    count = hot.shape[1]
    base = starts[first]
    scratch = np.empty((4, budget + 1), dtype=np.float64)
    keys = np.empty((3, count), dtype=np.float64)
    # The range's routing is one contiguous run of each row; flat[row, j] + offset[j] indexes
    # the flattened residency and counters directly.
    flat = experts.reshape(experts.shape[0], -1)
    hot_flat = hot.reshape(-1)
    raw_flat = raw.reshape(-1)
    begin, width = low * top_k, (high - low) * top_k
    offset = np.empty(width, dtype=np.int64)
    for j in range(width):
        offset[j] = (low + j // top_k) * count
    drain = 0
    for index in range(first, last):
        for row in range(starts[index], starts[index + 1]):
            # Indices are made unsigned: numba then drops its negative-index wraparound
            # branch, which otherwise costs as much as the lookup itself.
            line = flat[_U(row)]
            # Hits are summed, not branched on: a hit or a miss is a coin flip to the CPU.
            found = 0
            if prefill[_U(row)]:
                for j in range(width):
                    found += hot_flat[_U(offset[j] + line[_U(begin + j)])]
            else:
                for j in range(width):
                    at = _U(offset[j] + line[_U(begin + j)])
                    found += hot_flat[at]
                    raw_flat[at] += 1
            hits[_U(row - base)] = found
        if decay[index] < 0.0:
            continue
        saturated = 0
        for layer in range(low, high):
            swaps, layer_pinned = drain_layer(
                ewma[layer],
                raw[layer],
                hot[layer],
                decay[index],
                threshold,
                factor,
                budget,
                scratch,
                keys,
            )
            saturated += layer_pinned
            applied[drain, layer] = swaps
            for pair in range(swaps):
                promoted[drain, layer, pair] = int(scratch[0, pair])
                evicted[drain, layer, pair] = int(scratch[2, pair])
        pinned[drain] = saturated
        drain += 1


@jit
def merge_block(
    starts: I64,
    first: int,
    last: int,
    decay: npt.NDArray[np.float64],
    steps: I64,
    lookups_per_row: int,
    hits: npt.NDArray[np.int32],
    pinned: I64,
    applied: I64,
    promoted: I32,
    evicted: I32,
    cold_steps: I64,
    saturated: I64,
    step_swaps: I64,
    swaps: I64,
) -> None:
    """Combine what the layer ranges of one block wrote (``hits[range, row]``, ``pinned[range,
    drain]`` and the shared swap slots): per host step of ``first..last-1`` its cold lookups,
    saturated layers (drains only) and swaps, in place; ``swaps`` rows (step, layer, promoted,
    evicted) in the runtime's order, step then layer then pair (the caller sizes it to the sum
    of ``applied``)."""
    base = starts[first]
    ranges = hits.shape[0]
    written = 0
    drain = 0
    for index in range(first, last):
        begin, end = _U(starts[index] - base), _U(starts[index + 1] - base)
        cold = lookups_per_row * int(end - begin)
        for part in range(ranges):
            for row in range(begin, end):
                cold -= hits[_U(part), row]
        cold_steps[index] = cold
        if decay[index] < 0.0:
            continue
        pinned_layers = 0
        for part in range(ranges):
            pinned_layers += pinned[part, drain]
        saturated[index] = pinned_layers
        before = written
        for layer in range(applied.shape[1]):
            for pair in range(applied[drain, layer]):
                swaps[written, 0] = steps[index]
                swaps[written, 1] = layer
                swaps[written, 2] = promoted[drain, layer, pair]
                swaps[written, 3] = evicted[drain, layer, pair]
                written += 1
        step_swaps[index] = written - before
        drain += 1
