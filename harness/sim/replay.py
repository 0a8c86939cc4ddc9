"""Replaying a routing trace through the runtime's own policy code.

Two implementations that must make identical decisions:

* :func:`replay_reference`, the plain one: every host step exactly as the reference runtime's
  ``Engine._step`` runs it: cold lookups of all the step's tokens under the residency in force
  when the step starts, then one ``ResidencyPolicy.observe`` call with the step's decode tokens
  (a step with none is a prefill step), live knob changes applied with ``set_knobs`` before the
  step they name.
* :func:`replay_fast`, compiled loops (:mod:`harness.sim.fastloop`) over the policy's own
  arrays. Drains depend only on which host steps decode, so their schedule comes first; then,
  layers being independent, ranges of layers replay on threads, adding integer counts between
  drains and calling the policy's compiled :func:`harness.policy.kernels.drain_layer` at each,
  the very function ``observe`` calls. Same integers in, same machine code, so the same
  decisions; ``tests/sim/test_sim_replay.py`` checks the identity on random and recorded traces,
  and ``harness bench sim`` on a 1M-token trace.

Cache mode (seed 004) replays through :class:`ExpertCache`, every selection in runtime order.

The two rowmap replays stay in this one module, beside the cache replay, because they are one
job done twice: they share the start, segment and per-step helpers, and their agreement is
easiest to check side by side. What they return is :mod:`harness.sim.results`; comparing a
replay with the decisions a runtime recorded is :mod:`harness.sim.decisions`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from harness.errors import TraceError
from harness.policy.lru import GlobalLruCache
from harness.policy.residency import ExpertCache, PolicyKnobs, PolicyState, ResidencyPolicy, Swap
from harness.sim.fastloop import drain_schedule, merge_block, replay_layers
from harness.sim.results import ReplayResult, rowmap_result, step_result
from harness.sim.traces import IntArray, KnobChange, Trace

__all__ = ["replay_cache", "replay_fast", "replay_reference"]

# A fast-replay block: at most this many host steps (its per-row buffers), and at most this
# many swap slots (drains x layers x swaps_per_layer: its swap buffers).
_BLOCK_STEPS = 1 << 18
_BLOCK_SLOTS = 1 << 20


def _start(
    trace: Trace,
    knobs: PolicyKnobs | None,
    hot: Sequence[Sequence[int]] | None,
    changes: Sequence[KnobChange] | None,
) -> tuple[PolicyKnobs, list[list[int]], list[KnobChange]]:
    """Knobs, hot sets and live changes of a replay: given ones, else what the trace recorded."""
    if knobs is None:
        start_knobs = trace.knobs or PolicyKnobs()
        live = list(trace.knob_changes) if changes is None else list(changes)
    else:
        start_knobs = knobs
        live = [] if changes is None else list(changes)
    if hot is None:
        if trace.hot is None:
            raise TraceError(f"{trace.path}: the trace records no starting hot sets; give a rowmap")
        hot = trace.hot
    hot_sets = [list(map(int, h)) for h in hot]
    if len(hot_sets) != trace.layers:
        raise TraceError(
            f"{trace.path}: the map has {len(hot_sets)} layers, the trace {trace.layers}"
        )
    return start_knobs, hot_sets, sorted(live, key=lambda c: c.step)


def _per_step(trace: Trace, per_row: IntArray) -> IntArray:
    """Row counts summed over each host step."""
    starts, _ = trace.step_bounds()
    return np.add.reduceat(per_row, starts).astype(np.int64)


def _segments(steps: IntArray, live: Sequence[KnobChange]) -> list[tuple[int, int]]:
    """Host-step index ranges between live knob changes (a change applies from its step on)."""
    bounds = [int(np.searchsorted(steps, change.step, side="left")) for change in live]
    return list(zip([0, *bounds], [*bounds, len(steps)], strict=True))


def replay_reference(
    trace: Trace,
    knobs: PolicyKnobs | None = None,
    hot: Sequence[Sequence[int]] | None = None,
    *,
    changes: Sequence[KnobChange] | None = None,
    pause: tuple[int, Callable[[], None]] | None = None,
) -> ReplayResult:
    """Replay host step by host step, exactly as the reference runtime feeds its policy.

    ``knobs``/``hot`` default to what the trace recorded; the trace's live knob changes are
    replayed when ``knobs`` is not given (``changes`` overrides either way). ``pause`` =
    (N, call): call() after every N host steps (``harness bench sim`` times the fast replay
    there, so both see the same machine while the reference runs for half a minute).
    """
    pause_every, pause_call = pause or (0, None)
    start_knobs, hot_sets, live = _start(trace, knobs, hot, changes)
    policy = ResidencyPolicy(start_knobs, hot_sets, trace.experts_count)
    starts, steps = trace.step_bounds()
    ends = np.r_[starts[1:], trace.rows]
    cold_rows = np.zeros(trace.rows, dtype=np.int64)
    swaps: list[Swap] = []
    saturated = np.full(len(steps), -1, dtype=np.int64)
    experts, prefill_rows = trace.experts, trace.prefill
    for segment, (first, last) in enumerate(_segments(steps, live)):
        if segment:
            policy.set_knobs(live[segment - 1].knobs)
        for index in range(first, last):
            if pause_call is not None and index and index % pause_every == 0:
                pause_call()
            begin, end, step = int(starts[index]), int(ends[index]), int(steps[index])
            # Engine._step: the forward pass of every token of the step looks experts up first...
            for row in range(begin, end):
                cold_rows[row] = policy.count_cold(experts[row])
            # ...then the policy observes the step: its decode tokens, or nothing to count.
            decode = ~prefill_rows[begin:end]
            if not decode.any():
                policy.observe(step, experts[begin], prefill=True)
                continue
            drains = policy.drain_due()
            swaps.extend(policy.observe(step, experts[begin:end][decode]))
            if drains:
                saturated[index] = policy.saturated_layers()
    swap_rows = np.array([[s.step, s.layer, s.promoted, s.evicted] for s in swaps], np.int64)
    swap_array = swap_rows.reshape(-1, 4)
    return rowmap_result(
        trace, _per_step(trace, cold_rows), policy.hot_sets(), swap_array, saturated
    )


@dataclass
class _Block:
    """A block of host steps of one knob segment, replayed by ranges of layers on threads.

    The ranges write into arrays allocated here, each into its own rows or slots, and
    :func:`merge_block` combines them into the replay's per-step arrays.
    """

    trace: Trace
    bounds: IntArray  # row where each host step starts, then the row count
    decay: npt.NDArray[np.float64]  # the drain schedule: decay at host step i, -1 if no drain
    state: PolicyState
    knobs: PolicyKnobs
    first: int
    last: int
    ranges: list[tuple[int, int]]  # layer ranges, one per thread

    def __post_init__(self) -> None:
        drains = int(np.count_nonzero(self.decay[self.first : self.last] >= 0.0))
        rows = int(self.bounds[self.last] - self.bounds[self.first])
        layers, budget = self.trace.layers, self.knobs.swaps_per_layer
        self.hits = np.empty((len(self.ranges), rows), dtype=np.int32)
        self.pinned = np.empty((len(self.ranges), drains), dtype=np.int64)
        self.applied = np.empty((drains, layers), dtype=np.int64)
        self.promoted = np.empty((drains, layers, budget), dtype=np.int32)
        self.evicted = np.empty((drains, layers, budget), dtype=np.int32)

    def replay(self, part: int) -> None:
        """Replay the block for the ``part``-th range of layers."""
        low, high = self.ranges[part]
        knobs, state = self.knobs, self.state
        replay_layers(
            self.trace.experts,
            self.trace.prefill,
            self.bounds,
            self.first,
            self.last,
            self.decay,
            state.ewma,
            state.raw,
            state.hot,
            low,
            high,
            float(knobs.promote_threshold),
            1.0 + knobs.hysteresis,
            knobs.swaps_per_layer,
            self.hits[part],
            self.pinned[part],
            self.applied,
            self.promoted,
            self.evicted,
        )

    def merge(
        self, steps: IntArray, cold_steps: IntArray, saturated: IntArray, step_swaps: IntArray
    ) -> IntArray:
        """Cold lookups, saturated layers and swaps per host step, in place; the block's swaps
        in the runtime's order (step, layer, pair) with step numbers."""
        trace = self.trace
        swaps = np.empty((int(self.applied.sum()), 4), dtype=np.int64)
        merge_block(
            self.bounds,
            self.first,
            self.last,
            self.decay,
            steps,
            trace.layers * trace.top_k,
            self.hits,
            self.pinned,
            self.applied,
            self.promoted,
            self.evicted,
            cold_steps,
            saturated,
            step_swaps,
            swaps,
        )
        return swaps


def _blocks(decay: npt.NDArray[np.float64], first: int, last: int, slots: int) -> list[int]:
    """Block edges over host steps ``first..last``: at most ``_BLOCK_STEPS`` steps and at most
    ``_BLOCK_SLOTS // slots`` drains each (``slots`` swap slots per drain), so a block's
    buffers stay bounded whatever the drain interval."""
    drains_before = np.r_[0, np.cumsum(decay[first:last] >= 0.0)]
    most = max(1, _BLOCK_SLOTS // max(1, slots))
    edges = [first]
    while edges[-1] < last:
        start = edges[-1]
        end = min(last, start + _BLOCK_STEPS)
        limit = drains_before[start - first] + most
        if drains_before[end - first] > limit:
            # The step holding the (most+1)-th drain starts the next block.
            end = first + int(np.searchsorted(drains_before, limit, side="right")) - 1
        edges.append(end)
    return edges


def replay_fast(
    trace: Trace,
    knobs: PolicyKnobs | None = None,
    hot: Sequence[Sequence[int]] | None = None,
    *,
    changes: Sequence[KnobChange] | None = None,
    threads: int | None = None,
) -> ReplayResult:
    """Replay in compiled loops over the policy's own arrays; the same decisions as
    :func:`replay_reference`, because the loops call the policy's own compiled drain.

    Layers are independent in this policy, so ranges of layers replay on ``threads`` threads
    (default: one per CPU, at most one per layer); the result does not depend on the count.
    """
    start_knobs, hot_sets, live = _start(trace, knobs, hot, changes)
    policy = ResidencyPolicy(start_knobs, hot_sets, trace.experts_count)
    starts, steps = trace.step_bounds()
    bounds = np.r_[starts, trace.rows].astype(np.int64)
    cold_steps = np.zeros(len(steps), dtype=np.int64)
    saturated = np.full(len(steps), -1, dtype=np.int64)
    decay = np.full(len(steps), -1.0)
    step_swaps = np.zeros(len(steps), dtype=np.int64)
    swap_blocks: list[IntArray] = []
    workers = max(1, min(threads or os.cpu_count() or 1, trace.layers))
    edges = np.linspace(0, trace.layers, workers + 1).round().astype(int).tolist()
    ranges = list(itertools.pairwise(edges))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for segment, (first, last) in enumerate(_segments(steps, live)):
            if segment:
                policy.set_knobs(live[segment - 1].knobs)
            current = policy.knobs
            state = policy.export_state()
            scalars = np.array([state.fold_step, state.last_step, state.since_drain], np.int64)
            drain_schedule(
                trace.prefill,
                bounds,
                steps,
                first,
                last,
                scalars,
                current.policy == "adaptive",
                current.drain_every,
                current.decay_rate(),
                decay,
            )
            slots = trace.layers * current.swaps_per_layer
            for block_first, block_last in itertools.pairwise(_blocks(decay, first, last, slots)):
                block = _Block(
                    trace, bounds, decay, state, current, block_first, block_last, ranges
                )
                list(pool.map(block.replay, range(len(ranges))))
                swap_blocks.append(block.merge(steps, cold_steps, saturated, step_swaps))
            fold_step, last_step, since_drain = scalars.tolist()
            drains_at = first + np.flatnonzero(decay[first:last] >= 0.0)
            policy.import_state(
                dataclasses.replace(
                    state,
                    fold_step=fold_step,
                    last_step=last_step,
                    since_drain=since_drain,
                    saturated=int(saturated[drains_at[-1]]) if len(drains_at) else state.saturated,
                )
            )
    swaps = np.concatenate(swap_blocks) if swap_blocks else np.zeros((0, 4), np.int64)
    return rowmap_result(trace, cold_steps, policy.hot_sets(), swaps, saturated, step_swaps)


def replay_cache(
    trace: Trace,
    capacity: int,
    hotlist: Sequence[tuple[int, int]],
    priority: Literal["legacy", "adaptive"] | int,
) -> ReplayResult:
    """Replay through seed 004's expert cache: every selection, prefill included, in the order
    the runtime's forward pass fetches them (token, then layer, then the listed experts)."""
    cache = ExpertCache(capacity, list(hotlist), priority, trace.layers, trace.experts_count)
    cold_rows = np.zeros(trace.rows, dtype=np.int64)
    experts = trace.experts
    for row in range(trace.rows):
        _, misses = cache.access_step(experts[row])
        cold_rows[row] = misses
    result = step_result(trace, "cache", _per_step(trace, cold_rows))
    result.evictions = cache.evictions
    result.final_hot = []
    return result


def replay_lru(
    trace: Trace,
    budget_bytes: int,
    expert_bytes: int,
    cached_layers: Sequence[int] | None = None,
    trail: list[int] | None = None,
) -> ReplayResult:
    """Replay through llama.cpp's expert cache (:class:`~harness.policy.lru.GlobalLruCache`):
    host step by host step, each cached layer's distinct experts once per step. Lookups count
    only the cached layers' fetches, as the cache's own hit rate does. ``trail``, when given,
    receives the (layer × experts + expert) keys in the order the cache served them."""
    cache = GlobalLruCache(
        budget_bytes, expert_bytes, trace.layers, trace.experts_count, cached_layers
    )
    cache.trail = trail
    starts, _ = trace.step_bounds()
    ends = np.r_[starts[1:], trace.rows]
    lookups = np.zeros(len(starts), dtype=np.int64)
    misses = np.zeros(len(starts), dtype=np.int64)
    experts = trace.experts
    for index, (first, last) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        lookups[index], misses[index] = cache.access_step(experts[first:last])
    result = step_result(trace, "cache", misses)
    result.step_lookups = lookups
    result.evictions = cache.evictions
    result.final_hot = []
    return result
