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
  drains and calling the policy's compiled :func:`harness.policy_kernels.drain_layer` at each,
  the very function ``observe`` calls. Same integers in, same machine code, so the same
  decisions; ``tests/test_sim_replay.py`` checks the identity on random and recorded traces,
  and ``harness bench sim`` on a 1M-token trace.

Cache mode (seed 004) replays through :class:`ExpertCache`, every selection in runtime order.

The ring a replay writes has synthetic time (:class:`CostModel`): a step lasts
``step_ns + token_ns·tokens + cold_lookup_ns·cold_lookups + swap_ns·swaps``. Cold shares, swap
counts and decisions are exact; durations, and so T90 in seconds and tok/s, are only as good as
that model.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.errors import TraceError
from harness.policy import ExpertCache, PolicyKnobs, PolicyState, ResidencyPolicy, Swap
from harness.sim.fastloop import drain_schedule, merge_block, replay_layers
from harness.sim.traces import KnobChange, Trace
from harness.telemetry import RING_FIELDS, RingGeometry, RingWriter

__all__ = [
    "DEFAULT_RECORD_BYTES",
    "CostModel",
    "ReplayResult",
    "replay_cache",
    "replay_fast",
    "replay_reference",
]

IntArray = npt.NDArray[np.int64]
DEFAULT_RECORD_BYTES = 512 * 1024  # the reference runtime's --expert-bytes default
# A fast-replay block: at most this many host steps (its per-row buffers), and at most this
# many swap slots (drains x layers x swaps_per_layer: its swap buffers).
_BLOCK_STEPS = 1 << 18
_BLOCK_SLOTS = 1 << 20


@dataclass(frozen=True)
class CostModel:
    """Synthetic step durations for the simulated ring (defaults: a seed-000-like decode step)."""

    step_ns: int = 4_000_000
    token_ns: int = 1_000_000
    cold_lookup_ns: int = 50_000
    swap_ns: int = 2_000_000

    def durations(self, tokens: IntArray, cold: IntArray, swaps: IntArray) -> IntArray:
        """Duration of each host step in ns."""
        return (
            self.step_ns
            + self.token_ns * tokens
            + self.cold_lookup_ns * cold
            + self.swap_ns * swaps
        ).astype(np.int64)


@dataclass
class ReplayResult:
    """What a replay decided and counted, per host step and in total."""

    mode: Literal["rowmap", "cache"]
    steps: IntArray  # host step numbers
    tokens: IntArray  # rows (tokens) per host step
    prefill: npt.NDArray[np.bool_]
    phase: IntArray
    cold_lookups: IntArray  # per host step
    step_swaps: IntArray  # swaps applied per host step
    layers: int
    top_k: int
    # Applied swaps, one row each: step, layer, promoted, evicted, in the policy's order.
    swaps: IntArray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.int64))
    drain_steps: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    saturated: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per drain
    final_hot: list[list[int]] = field(default_factory=list)
    evictions: int = 0  # cache mode: records evicted over the whole replay

    @property
    def hits(self) -> int:
        """Lookups served from the fast tier (cache hits, or hot lookups), over the replay."""
        return int(self.lookups.sum() - self.cold_lookups.sum())

    @property
    def misses(self) -> int:
        """Lookups that went to the slow tier (cache misses, or cold lookups)."""
        return int(self.cold_lookups.sum())

    @property
    def lookups(self) -> IntArray:
        """Expert lookups per host step."""
        return self.tokens * self.layers * self.top_k

    def decisions(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """Swaps applied per (step, layer) at drain points, ``(promoted, evicted)`` in order."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for step, layer, promoted, evicted in self.swaps.tolist():
            out.setdefault((step, layer), []).append((promoted, evicted))
        return out

    def counters(
        self, record_bytes: int = DEFAULT_RECORD_BYTES, upto: int | None = None
    ) -> dict[str, int]:
        """Totals named like the reference runtime's ``/counters``, over the first ``upto`` host
        steps (all by default), as the runtime would have reported them then."""
        span = slice(0, len(self.steps) if upto is None else upto)
        tokens, prefill = self.tokens[span], self.prefill[span]
        lookups = int(self.lookups[span].sum())
        cold = int(self.cold_lookups[span].sum())
        swaps = int(self.step_swaps[span].sum())
        # Cache mode counts misses per host step (cold lookups); evictions only in total, and
        # every miss into a full cache evicts, so the evictions up to a step are known too.
        misses = cold
        evictions = swaps
        if self.mode == "cache":
            evictions = max(0, self.evictions - (int(self.cold_lookups.sum()) - cold))
        loads = cold + swaps if self.mode == "rowmap" else misses
        prefill_tokens = int(tokens[prefill].sum())
        decode_tokens = int(tokens[~prefill].sum())
        return {
            "tokens": prefill_tokens + decode_tokens,
            "steps": span.stop,
            "lookups": lookups,
            "cold_lookups": cold,
            "hits": lookups - misses,
            "misses": misses,
            "expert_loads": loads,
            "bytes_read": loads * record_bytes,
            "swaps": swaps,
            "evictions": evictions,
            "prefill_tokens": prefill_tokens,
            "decode_tokens": decode_tokens,
        }

    def run_counters(self, record_bytes: int = DEFAULT_RECORD_BYTES) -> dict[str, dict[str, int]]:
        """``before``/``after``/``delta`` as a run's ``counters.json``: ``before`` is read after
        the warmup (leading host steps tagged phase -1), so the delta leaves it out."""
        measured = np.flatnonzero(self.phase >= 0)
        warmup = int(measured[0]) if len(measured) else len(self.steps)
        before = self.counters(record_bytes, warmup)
        after = self.counters(record_bytes)
        return {
            "before": before,
            "after": after,
            "delta": {key: after[key] - before[key] for key in after},
        }

    def ring_frame(
        self, cost: CostModel | None = None, record_bytes: int = DEFAULT_RECORD_BYTES
    ) -> pd.DataFrame:
        """One ring record per host step (columns ``seq`` + RING_FIELDS, as ``read_ring``)."""
        cost = cost or CostModel()
        dur = cost.durations(self.tokens, self.cold_lookups, self.step_swaps)
        reads = self.cold_lookups + (self.step_swaps if self.mode == "rowmap" else 0)
        columns: dict[str, Any] = {
            "seq": np.arange(1, len(self.steps) + 1, dtype=np.int64),
            "t_ns": np.cumsum(dur),  # the runtime stamps the end of each step
            "dur_ns": dur,
            "tokens": self.tokens,
            "lookups": self.lookups,
            "cold_lookups": self.cold_lookups,
            "swaps": self.step_swaps,
            "bytes_read": reads * record_bytes,
            "phase": self.phase,
        }
        return pd.DataFrame({k: np.asarray(v, dtype=np.int64) for k, v in columns.items()})

    def write_ring(
        self,
        path: str,
        cost: CostModel | None = None,
        record_bytes: int = DEFAULT_RECORD_BYTES,
        hot_slots: int = 0,
        experts: int = 0,
    ) -> None:
        """Write the replay as a real telemetry ring file (capacity = steps, nothing lost)."""
        frame = self.ring_frame(cost, record_bytes)
        geometry = RingGeometry(self.layers, experts, self.top_k, hot_slots)
        with RingWriter(path, max(len(frame), 1), geometry) as writer:
            writer.extend(frame[list(RING_FIELDS)].to_numpy(dtype=np.int64))


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


def _result(
    trace: Trace,
    cold_steps: IntArray,
    policy: ResidencyPolicy,
    swaps: IntArray,
    saturated: IntArray,
    step_swaps: IntArray | None = None,
) -> ReplayResult:
    """A rowmap replay's result from its cold lookups per host step, swaps and per-step drains
    (and swaps per host step, when the replay counted them)."""
    result = _base_result(trace, "rowmap", cold_steps)
    result.swaps = swaps
    drained = saturated >= 0
    result.drain_steps = result.steps[drained]
    result.saturated = saturated[drained]
    result.final_hot = policy.hot_sets()
    if step_swaps is not None:
        result.step_swaps = step_swaps
    elif len(swaps):
        index = np.searchsorted(result.steps, swaps[:, 0])
        result.step_swaps = np.bincount(index, minlength=len(result.steps)).astype(np.int64)
    return result


def _base_result(
    trace: Trace, mode: Literal["rowmap", "cache"], cold_steps: IntArray
) -> ReplayResult:
    starts, steps = trace.step_bounds()
    tokens = np.diff(np.r_[starts, trace.rows]).astype(np.int64)
    return ReplayResult(
        mode=mode,
        steps=steps,
        tokens=tokens,
        prefill=trace.prefill[starts],
        phase=trace.phase[starts],
        cold_lookups=cold_steps,
        step_swaps=np.zeros(len(steps), dtype=np.int64),
        layers=trace.layers,
        top_k=trace.top_k,
    )


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
    return _result(trace, _per_step(trace, cold_rows), policy, swap_array, saturated)


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
    return _result(trace, cold_steps, policy, swaps, saturated, step_swaps)


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
    result = _base_result(trace, "cache", _per_step(trace, cold_rows))
    result.evictions = cache.evictions
    result.final_hot = []
    return result


DECISION_DEFINITION = (
    "a decision = one layer at one drain point (the decode step completing drain_every decode "
    "steps since the last drain while the policy is adaptive, recorded or replayed): the "
    'ordered list of swaps applied there, "no swap" included'
)


@dataclass
class Lockstep:
    """Recorded vs replayed decisions of one reference-runtime route trace."""

    trace: str
    decisions: int
    divergent: int
    recorded_swaps: int
    replayed_swaps: int
    first: dict[str, Any] | None
    overrides: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The ``lockstep.json`` payload (the ``lockstep`` gate reads decisions/divergent)."""
        return {
            "trace": self.trace,
            "decisions": self.decisions,
            "divergent": self.divergent,
            "first": self.first,
            "recorded_swaps": self.recorded_swaps,
            "replayed_swaps": self.replayed_swaps,
            "overrides": self.overrides,
            "definition": DECISION_DEFINITION,
        }


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``KNOB=VALUE`` strings into typed PolicyKnobs fields (validated)."""
    out: dict[str, Any] = {}
    types = {f.name: f.type for f in dataclasses.fields(PolicyKnobs)}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or name not in types:
            raise TraceError(
                f"--override {pair!r}: expected KNOB=VALUE with KNOB one of {sorted(types)}"
            )
        try:
            if name == "policy":
                out[name] = text
            elif name in ("drain_every", "swaps_per_layer"):
                out[name] = int(text)
            else:
                out[name] = float(text)
        except ValueError:
            raise TraceError(f"--override {pair!r}: {text!r} is not a number") from None
    dataclasses.replace(PolicyKnobs(), **out).validate()
    return out


def _describe(swaps: list[list[int]], drained: bool) -> str:
    if not drained:
        return "no drain at this step"
    if not swaps:
        return "drain, no swap"
    return ", ".join(f"promote {p} evict {e}" for p, e in swaps)


def lockstep(
    trace: Trace, overrides: dict[str, Any] | None = None, *, fast: bool = True
) -> Lockstep:
    """Replay a reference-runtime trace with its recorded knobs and hot sets and compare every
    decision (see ``DECISION_DEFINITION``) with the swaps the runtime recorded."""
    replace = dataclasses.replace
    version = (trace.header or {}).get("version")
    if trace.format == "refbox" and version == 1:
        raise TraceError(
            f"{trace.path}: a version 1 route trace, recorded when drains fell on "
            "step % drain_every; this policy drains every drain_every decode steps, so the "
            "recorded decisions cannot be checked. Record it again (simulate and fit-map still "
            "read its routing)"
        )
    if trace.swaps is None or trace.knobs is None:
        raise TraceError(
            f"{trace.path}: a {trace.format} trace records no decisions; lockstep needs a "
            "reference-runtime --route-trace"
        )
    if trace.mode != "rowmap" or trace.hot is None:
        raise TraceError(
            f"{trace.path}: a cache-mode trace has no residency decisions to check; lockstep "
            "needs a rowmap-mode route trace (use `harness simulate` for cache mode)"
        )
    overrides = dict(overrides or {})
    start = replace(trace.knobs, **overrides)
    live = [replace(c, knobs=replace(c.knobs, **overrides)) for c in trace.knob_changes]
    run = replay_fast if fast else replay_reference
    result = run(trace, start, trace.hot, changes=live)
    recorded: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for swap in trace.swaps:
        recorded.setdefault((swap.step, swap.layer), []).append((swap.promoted, swap.evicted))
    replayed = result.decisions()
    recorded_drains = set(trace.drains or [])
    replayed_drains = set(result.drain_steps.tolist())
    keys = {
        (step, layer) for step in recorded_drains | replayed_drains for layer in range(trace.layers)
    }
    keys |= set(recorded) | set(replayed)
    # A drain one side made and the other did not diverges even when neither swapped.
    divergent = sorted(
        k
        for k in keys
        if recorded.get(k, []) != replayed.get(k, [])
        or ((k[0] in recorded_drains) != (k[0] in replayed_drains))
    )
    first: dict[str, Any] | None = None
    if divergent:
        step, layer = divergent[0]
        first = {
            "step": step,
            "layer": layer,
            "where": trace.where(step),
            "recorded": [list(s) for s in recorded.get((step, layer), [])],
            "replayed": [list(s) for s in replayed.get((step, layer), [])],
            "recorded_drain": step in recorded_drains,
            "replayed_drain": step in replayed_drains,
            "recorded_knobs": _knobs_at(trace.knobs, trace.knob_changes, step),
            "replayed_knobs": _knobs_at(start, live, step),
        }
    return Lockstep(
        trace=trace.path,
        decisions=len(keys),
        divergent=len(divergent),
        recorded_swaps=len(trace.swaps),
        replayed_swaps=len(result.swaps),
        first=first,
        overrides=overrides,
    )


def _knobs_at(start: PolicyKnobs, live: Sequence[KnobChange], step: int) -> dict[str, Any]:
    knobs = start
    for change in live:
        if change.step <= step:
            knobs = change.knobs
    return dataclasses.asdict(knobs)


def lockstep_text(result: Lockstep) -> str:
    """What ``harness simulate --lockstep`` prints."""
    lines = [
        f"lockstep {result.trace}: {result.decisions:,} decisions, {result.divergent:,} divergent",
        f"  ({DECISION_DEFINITION})",
        f"  swaps recorded {result.recorded_swaps:,}, replayed {result.replayed_swaps:,}",
    ]
    if result.overrides:
        changed = ", ".join(f"{k}={v}" for k, v in result.overrides.items())
        lines.append(f"  replayed with overrides: {changed}")
    first = result.first
    if first is not None:
        lines += [
            f"first divergence: step {first['step']} ({first['where']}), layer {first['layer']}",
            f"  recorded: {_describe(first['recorded'], first['recorded_drain'])}",
            f"  replayed: {_describe(first['replayed'], first['replayed_drain'])}",
            f"  recorded knobs at that step: {first['recorded_knobs']}",
            f"  replayed knobs at that step: {first['replayed_knobs']}",
        ]
    return "\n".join(lines) + "\n"
