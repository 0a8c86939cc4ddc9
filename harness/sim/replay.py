"""Replaying a routing trace through the runtime's own policy code.

Two implementations that must make identical decisions:

* :func:`replay_reference`, the plain one: every host step exactly as the reference runtime's
  ``Engine._step`` runs it: cold lookups of all the step's tokens under the residency in force
  when the step starts, then ``ResidencyPolicy.observe(step, token_experts, prefill=...)`` once
  per token, live knob changes applied with ``set_knobs`` before the step they name.
* :func:`replay_fast`, vectorised between drain points. The hot set only changes at a drain, so
  the cold lookups of a whole span are one gather; the counts of a span are added with one
  ``np.add.at`` in row order, which performs the very same floating-point additions, element by
  element and in the same order, as the per-step ``np.add.at`` of ``observe`` (same weights from
  ``math.exp`` of the same exponents, same rebase points). At a drain step the fast path calls
  the real ``ResidencyPolicy.observe``, so the decision is the policy's own code on bit-identical
  counts. ``tests/test_sim_replay.py`` checks the identity on random and recorded traces.

Cache mode (seed 004) replays through :class:`ExpertCache`, every selection in runtime order.

The ring a replay writes has synthetic time (:class:`CostModel`): a step lasts
``step_ns + token_ns·tokens + cold_lookup_ns·cold_lookups + swap_ns·swaps``. Cold shares, swap
counts and decisions are exact; durations, and so T90 in seconds and tok/s, are only as good as
that model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.errors import TraceError
from harness.policy import _REBASE_EXPONENT, ExpertCache, PolicyKnobs, ResidencyPolicy, Swap
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
_CHUNK_ROWS = 16384  # rows per vectorised block: bounds the temporaries at ~16k x L x K


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
    swaps: list[Swap] = field(default_factory=list)
    drain_steps: list[int] = field(default_factory=list)  # one entry per drain (policy call)
    saturated: list[int] = field(default_factory=list)  # layers at the budget, per drain
    final_hot: list[list[int]] = field(default_factory=list)
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    @property
    def lookups(self) -> IntArray:
        """Expert lookups per host step."""
        return self.tokens * self.layers * self.top_k

    def decisions(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """Swaps applied per (step, layer) at drain points, ``(promoted, evicted)`` in order."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for swap in self.swaps:
            out.setdefault((swap.step, swap.layer), []).append((swap.promoted, swap.evicted))
        return out

    def counters(self, record_bytes: int = DEFAULT_RECORD_BYTES) -> dict[str, int]:
        """Totals named like the reference runtime's ``/counters``."""
        lookups = int(self.lookups.sum())
        cold = int(self.cold_lookups.sum())
        swaps = int(self.step_swaps.sum())
        loads = cold + swaps if self.mode == "rowmap" else self.misses
        prefill_tokens = int(self.tokens[self.prefill].sum())
        decode_tokens = int(self.tokens[~self.prefill].sum())
        return {
            "tokens": prefill_tokens + decode_tokens,
            "steps": len(self.steps),
            "lookups": lookups,
            "cold_lookups": cold,
            "hits": self.hits if self.mode == "cache" else lookups - cold,
            "misses": self.misses if self.mode == "cache" else cold,
            "expert_loads": loads,
            "bytes_read": loads * record_bytes,
            "swaps": swaps,
            "evictions": self.evictions if self.mode == "cache" else swaps,
            "prefill_tokens": prefill_tokens,
            "decode_tokens": decode_tokens,
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


def _result(trace: Trace, mode: Literal["rowmap", "cache"], cold_rows: IntArray) -> ReplayResult:
    starts, steps = trace.step_bounds()
    tokens = np.diff(np.r_[starts, trace.rows]).astype(np.int64)
    return ReplayResult(
        mode=mode,
        steps=steps,
        tokens=tokens,
        prefill=trace.prefill[starts].copy(),
        phase=trace.phase[starts].copy(),
        cold_lookups=np.add.reduceat(cold_rows, starts).astype(np.int64),
        step_swaps=np.zeros(len(steps), dtype=np.int64),
        layers=trace.layers,
        top_k=trace.top_k,
    )


def _count_swaps(result: ReplayResult) -> None:
    if result.swaps:
        at = np.array([s.step for s in result.swaps], dtype=np.int64)
        index = np.searchsorted(result.steps, at)
        result.step_swaps = np.bincount(index, minlength=len(result.steps)).astype(np.int64)


def _is_drain(knobs: PolicyKnobs, step: int, prefill: bool) -> bool:
    return not prefill and knobs.policy == "adaptive" and step % knobs.drain_every == 0


def replay_reference(
    trace: Trace,
    knobs: PolicyKnobs | None = None,
    hot: Sequence[Sequence[int]] | None = None,
    *,
    changes: Sequence[KnobChange] | None = None,
) -> ReplayResult:
    """Replay step by step, exactly as the reference runtime feeds its policy.

    ``knobs``/``hot`` default to what the trace recorded; the trace's live knob changes are
    replayed when ``knobs`` is not given (``changes`` overrides either way).
    """
    start_knobs, hot_sets, live = _start(trace, knobs, hot, changes)
    policy = ResidencyPolicy(start_knobs, hot_sets, trace.experts_count)
    starts, steps = trace.step_bounds()
    ends = np.r_[starts[1:], trace.rows]
    cold_rows = np.zeros(trace.rows, dtype=np.int64)
    swaps: list[Swap] = []
    drains: list[int] = []
    saturated: list[int] = []
    change = 0
    experts = trace.experts
    for begin, end, step in zip(starts.tolist(), ends.tolist(), steps.tolist(), strict=True):
        while change < len(live) and live[change].step <= step:
            policy.set_knobs(live[change].knobs)
            change += 1
        # Engine._step: the forward pass of every token of the step looks experts up first...
        for row in range(begin, end):
            cold_rows[row] = policy.count_cold(experts[row])
        # ...then the policy observes each token (prefill tokens are not counted).
        for row in range(begin, end):
            prefill = bool(trace.prefill[row])
            drain = _is_drain(policy.knobs, step, prefill)
            swaps.extend(policy.observe(step, experts[row], prefill=prefill))
            if drain:
                drains.append(step)
                saturated.append(policy.saturated_layers())
    result = _result(trace, "rowmap", cold_rows)
    result.swaps, result.drain_steps, result.saturated = swaps, drains, saturated
    result.final_hot = policy.hot_sets()
    _count_swaps(result)
    return result


class _SpanPolicy(ResidencyPolicy):
    """The runtime's policy plus one bulk method for rows that contain no drain point."""

    def observe_span(self, steps: IntArray, flat: IntArray, prefill: npt.NDArray[np.bool_]) -> None:
        """Same state as ``observe`` on each row in turn, when no row is a drain point.

        ``flat`` holds each row's ``experts + layer * experts_count`` indices, ``[rows, L*K]``.
        Exponents are computed with the same int-to-float conversion and product as ``observe``,
        weights with the same ``math.exp``, rebases at the same steps, and ``np.add.at`` over the
        rows in order adds to every count in the same order as the per-row calls.
        """
        if len(steps) == 0:
            return
        self._last_step = int(steps[-1])
        decode = ~prefill
        d_steps = steps[decode]
        d_flat = flat[decode]
        width = flat.shape[1]
        while len(d_steps):
            exponents = (d_steps - self._ref_step) * self._rate
            over = np.flatnonzero(exponents > _REBASE_EXPONENT)
            cut = int(over[0]) if over.size else len(d_steps)
            if cut:
                weights = np.array([math.exp(x) for x in exponents[:cut].tolist()])
                np.add.at(self._flat_scaled, d_flat[:cut].reshape(-1), np.repeat(weights, width))
            if not over.size:
                return
            self._rebase(int(d_steps[cut]))
            d_steps, d_flat = d_steps[cut:], d_flat[cut:]


def replay_fast(
    trace: Trace,
    knobs: PolicyKnobs | None = None,
    hot: Sequence[Sequence[int]] | None = None,
    *,
    changes: Sequence[KnobChange] | None = None,
) -> ReplayResult:
    """Replay vectorised between drain points; the same decisions as :func:`replay_reference`."""
    start_knobs, hot_sets, live = _start(trace, knobs, hot, changes)
    policy = _SpanPolicy(start_knobs, hot_sets, trace.experts_count)
    layers, count = trace.layers, trace.experts_count
    offsets = (np.arange(layers, dtype=np.int64) * count)[None, :, None]
    lookups_per_row = layers * trace.top_k
    steps, prefill, experts = trace.steps, trace.prefill, trace.experts
    cold_rows = np.zeros(trace.rows, dtype=np.int64)
    swaps: list[Swap] = []
    drains: list[int] = []
    saturated: list[int] = []
    # Counting only matters if some drain can still read the counts.
    frozen_to_end = [False] * (len(live) + 1)
    later_adaptive = False
    for index in range(len(live), -1, -1):
        current = start_knobs if index == 0 else live[index - 1].knobs
        later_adaptive = later_adaptive or current.policy == "adaptive"
        frozen_to_end[index] = not later_adaptive

    def span(begin: int, end: int, count_it: bool) -> None:
        hot_flat = policy.hot_mask.reshape(-1)
        for lo in range(begin, end, _CHUNK_ROWS):
            hi = min(end, lo + _CHUNK_ROWS)
            flat = (experts[lo:hi].astype(np.int64) + offsets).reshape(hi - lo, -1)
            cold_rows[lo:hi] = lookups_per_row - np.count_nonzero(hot_flat[flat], axis=1)
            if count_it:
                policy.observe_span(steps[lo:hi], flat, prefill[lo:hi])
            else:
                policy._last_step = int(steps[hi - 1])

    bounds = [int(np.searchsorted(steps, c.step, side="left")) for c in live]
    segment_starts = [0, *bounds]
    segment_ends = [*bounds, trace.rows]
    for index, (seg_lo, seg_hi) in enumerate(zip(segment_starts, segment_ends, strict=True)):
        if index:
            policy.set_knobs(live[index - 1].knobs)
        if seg_hi <= seg_lo:
            continue
        current = policy.knobs
        count_it = not frozen_to_end[index]
        cursor = seg_lo
        if current.policy == "adaptive":
            seg_steps = steps[seg_lo:seg_hi]
            mask = ~prefill[seg_lo:seg_hi] & (seg_steps % current.drain_every == 0)
            drain_steps = np.unique(seg_steps[mask])
        else:
            drain_steps = np.empty(0, dtype=np.int64)
        for drain_step in drain_steps.tolist():
            first = int(np.searchsorted(steps, drain_step, side="left"))
            last = int(np.searchsorted(steps, drain_step, side="right"))
            span(cursor, first, count_it)
            # The whole drain step looks up under the residency it started with.
            hot_flat = policy.hot_mask.reshape(-1)
            block = (experts[first:last].astype(np.int64) + offsets).reshape(last - first, -1)
            cold_rows[first:last] = lookups_per_row - np.count_nonzero(hot_flat[block], axis=1)
            for row in range(first, last):
                row_prefill = bool(prefill[row])
                swaps.extend(policy.observe(drain_step, experts[row], prefill=row_prefill))
                if not row_prefill:
                    drains.append(drain_step)
                    saturated.append(policy.saturated_layers())
            cursor = last
        span(cursor, seg_hi, count_it)
    result = _result(trace, "rowmap", cold_rows)
    result.swaps, result.drain_steps, result.saturated = swaps, drains, saturated
    result.final_hot = policy.hot_sets()
    _count_swaps(result)
    return result


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
    result = _result(trace, "cache", cold_rows)
    result.hits, result.misses, result.evictions = cache.hits, cache.misses, cache.evictions
    result.final_hot = []
    return result


DECISION_DEFINITION = (
    "a decision = one layer at one drain point (a decode step with step % drain_every == 0 "
    "while the policy is adaptive, under the recorded knobs or the replayed ones): the ordered "
    'list of swaps applied there, "no swap" included'
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


def _recorded_drain_steps(trace: Trace, start: PolicyKnobs, live: list[KnobChange]) -> set[int]:
    starts, steps = trace.step_bounds()
    decode = ~trace.prefill[starts]
    out: set[int] = set()
    edges = [c.step for c in live]
    knobs_list = [start, *[c.knobs for c in live]]
    lows = [-(2**62), *edges]
    highs = [*edges, 2**62]
    for knobs, lo, hi in zip(knobs_list, lows, highs, strict=True):
        if knobs.policy != "adaptive":
            continue
        pick = decode & (steps >= lo) & (steps < hi) & (steps % knobs.drain_every == 0)
        out.update(steps[pick].tolist())
    return out


def _describe(swaps: list[tuple[int, int]]) -> str:
    if not swaps:
        return "no swap"
    return ", ".join(f"promote {p} evict {e}" for p, e in swaps)


def lockstep(
    trace: Trace, overrides: dict[str, Any] | None = None, *, fast: bool = True
) -> Lockstep:
    """Replay a reference-runtime trace with its recorded knobs and hot sets and compare every
    decision (see ``DECISION_DEFINITION``) with the swaps the runtime recorded."""
    replace = dataclasses.replace
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
    drain_steps = _recorded_drain_steps(trace, trace.knobs, list(trace.knob_changes))
    drain_steps |= set(result.drain_steps)
    keys = {(step, layer) for step in drain_steps for layer in range(trace.layers)}
    keys |= set(recorded) | set(replayed)
    divergent = sorted(k for k in keys if recorded.get(k, []) != replayed.get(k, []))
    first: dict[str, Any] | None = None
    if divergent:
        step, layer = divergent[0]
        first = {
            "step": step,
            "layer": layer,
            "where": trace.where(step),
            "recorded": [list(s) for s in recorded.get((step, layer), [])],
            "replayed": [list(s) for s in replayed.get((step, layer), [])],
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
            f"  recorded: {_describe([(s[0], s[1]) for s in first['recorded']])}",
            f"  replayed: {_describe([(s[0], s[1]) for s in first['replayed']])}",
            f"  recorded knobs at that step: {first['recorded_knobs']}",
            f"  replayed knobs at that step: {first['replayed_knobs']}",
        ]
    return "\n".join(lines) + "\n"
