"""A replay's result: per-host-step counts and decisions, and the runtime's views of them.

:class:`ReplayResult` is what every replay in :mod:`harness.sim.replay` returns, assembled here
from the trace's host steps; it reads back as the runtime's ``/counters``, a run's
``counters.json`` and its telemetry ring.

The ring a replay writes has synthetic time (:class:`CostModel`): a step lasts
``step_ns + token_ns·tokens + cold_lookup_ns·cold_lookups + swap_ns·swaps``. Cold shares, swap
counts and decisions are exact; durations, and so T90 in seconds and tok/s, are only as good as
that model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.formats.ring import RING_FIELDS, RingGeometry, RingWriter
from harness.sim.cost import CostModel
from harness.sim.traces import IntArray, Trace

__all__ = [
    "DEFAULT_RECORD_BYTES",
    "CostModel",
    "ReplayResult",
    "rowmap_result",
    "step_result",
]

DEFAULT_RECORD_BYTES = 512 * 1024  # the reference runtime's --expert-bytes default


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
    # Lookups per host step when not every selection is one (llama.cpp's expert cache looks up
    # each distinct expert of a cached layer once per step); None: tokens x layers x top_k.
    step_lookups: IntArray | None = None
    # Host-step ranges [start, end) the run served but left out of its counters (the trace's
    # unscored until_recovered extensions): in the ring, not in run_counters' delta.
    unscored: tuple[tuple[int, int], ...] = ()

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
        if self.step_lookups is not None:
            return self.step_lookups
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

    def unscored_positions(self) -> list[tuple[int, int]]:
        """The unscored extensions as [first, last) positions into the replay's host steps
        (``unscored`` holds host-step numbers, which start where the trace does)."""
        spans = []
        for start, end in self.unscored:
            first, last = np.searchsorted(self.steps, [start, end], side="left")
            spans.append((int(first), int(last)))
        return spans

    def run_counters(self, record_bytes: int = DEFAULT_RECORD_BYTES) -> dict[str, dict[str, int]]:
        """``before``/``after``/``delta`` as a run's ``counters.json``: ``before`` is read after
        the warmup (leading host steps tagged phase -1), so the delta leaves it out."""
        measured = np.flatnonzero(self.phase >= 0)
        warmup = int(measured[0]) if len(measured) else len(self.steps)
        before = self.counters(record_bytes, warmup)
        after = self.counters(record_bytes)
        delta = {key: after[key] - before[key] for key in after}
        unscored = {key: 0 for key in after}
        for first, last in self.unscored_positions():  # as the runner: counters either side
            grew_from = self.counters(record_bytes, first)
            grew_to = self.counters(record_bytes, last)
            for key in after:
                unscored[key] += grew_to[key] - grew_from[key]
        out: dict[str, dict[str, int]] = {
            "before": before,
            "after": after,
            "delta": {key: delta[key] - unscored[key] for key in after},
        }
        if self.unscored:
            out["unscored"] = unscored
        return out

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


def rowmap_result(
    trace: Trace,
    cold_steps: IntArray,
    final_hot: list[list[int]],
    swaps: IntArray,
    saturated: IntArray,
    step_swaps: IntArray | None = None,
) -> ReplayResult:
    """A rowmap replay's result from its cold lookups per host step, swaps, per-step drains and
    final hot sets (and swaps per host step, when the replay counted them)."""
    result = step_result(trace, "rowmap", cold_steps)
    result.swaps = swaps
    drained = saturated >= 0
    result.drain_steps = result.steps[drained]
    result.saturated = saturated[drained]
    result.final_hot = final_hot
    if step_swaps is not None:
        result.step_swaps = step_swaps
    elif len(swaps):
        index = np.searchsorted(result.steps, swaps[:, 0])
        result.step_swaps = np.bincount(index, minlength=len(result.steps)).astype(np.int64)
    return result


def step_result(
    trace: Trace, mode: Literal["rowmap", "cache"], cold_steps: IntArray
) -> ReplayResult:
    """A replay's result from its cold lookups per host step, before any decisions are added."""
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
