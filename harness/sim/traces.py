"""Routing traces in memory: the :class:`Trace` type, built and checked from arrays.

A :class:`Trace` holds one row per call the runtime made to its residency policy, in order:

* ``experts`` ``[rows, layers, top_k]``: the experts chosen in each layer;
* ``steps`` ``[rows]``: the host step of the row. A prefill step of the reference runtime is one
  host step with one row per prompt token (BOS first), all sharing the step number; a batched
  decode step has one row per decoding sequence. The policy sees one call per host step;
* ``prefill`` and ``phase`` ``[rows]``: prefill rows are not counted by the policy, and a host
  step with no decode row does not count towards a drain; ``phase`` is the workload phase tag the
  runtime wrote into its ring;
* from a reference-runtime trace also the header (knobs, starting hot sets, mode), the live knob
  changes (applied from the step they name on), the drain points and the swaps the runtime
  applied.

Every reader (:mod:`harness.sim.trace_files`) ends in :func:`trace_from_arrays`, so one function
checks what every format gives; :func:`concat_traces` and :func:`decode_counts` work on the type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import TraceError
from harness.policy.residency import PolicyKnobs

__all__ = [
    "IntArray",
    "KnobChange",
    "RecordedSwap",
    "Trace",
    "concat_traces",
    "decode_counts",
    "trace_from_arrays",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class KnobChange:
    """Live knobs that apply from host step ``step`` on (the next step the runtime ran)."""

    step: int
    knobs: PolicyKnobs
    phase: int
    line: int = 0


@dataclass(frozen=True)
class RecordedSwap:
    """A swap the runtime recorded, with the trace line it came from."""

    step: int
    layer: int
    promoted: int
    evicted: int
    line: int = 0


@dataclass
class Trace:
    """Routing rows in policy-call order, plus what the runtime recorded about its policy."""

    path: str
    format: str  # "refbox", "megatron", "npy", "npz" or "arrays"
    experts: npt.NDArray[np.integer[Any]]  # [rows, layers, top_k], smallest fitting int dtype
    steps: IntArray  # [rows] host step of each row, non-decreasing
    prefill: BoolArray  # [rows]
    phase: IntArray  # [rows]
    experts_count: int
    header: dict[str, Any] | None = None
    knobs: PolicyKnobs | None = None  # knobs in force at the start, when recorded
    hot: list[list[int]] | None = None  # starting hot sets, when recorded (rowmap mode)
    knob_changes: list[KnobChange] = field(default_factory=list)
    swaps: list[RecordedSwap] | None = None  # None: the format records no decisions
    drains: list[int] | None = None  # host steps the runtime drained at, when recorded
    step_lines: dict[int, int] = field(default_factory=dict)  # host step -> trace line
    phase_tagged: bool = True  # False when the format carried no phase tags
    # The model layer of each trace layer, where the trace left a model's dense layers out
    # (``moe_layers`` of a routes-from-responses .npz); None: trace layer i is model layer i.
    moe_layers: tuple[int, ...] | None = None
    # Host-step ranges [start, end) a run served but left out of its counters: the unscored
    # until_recovered extensions `collect --as-run` sent (its unscored.json beside the trace).
    unscored: tuple[tuple[int, int], ...] = ()
    model_layers: int | None = None  # the model's layers, dense ones included
    # step_bounds() of ``steps`` (the array object it was computed from, and the result).
    _bounds: tuple[IntArray, IntArray, IntArray] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def rows(self) -> int:
        """Policy calls (tokens) in the trace."""
        return int(self.experts.shape[0])

    @property
    def layers(self) -> int:
        """MoE layers."""
        return int(self.experts.shape[1])

    @property
    def top_k(self) -> int:
        """Experts chosen per token per layer."""
        return int(self.experts.shape[2])

    @property
    def mode(self) -> str:
        """``rowmap`` or ``cache`` as recorded (``rowmap`` when the format does not say)."""
        return str((self.header or {}).get("mode", "rowmap"))

    def step_bounds(self) -> tuple[IntArray, IntArray]:
        """Row index where each host step starts, and the step numbers (one per host step)."""
        # Computed once: a replay asks several times and a 1M-row trace takes ~20 ms each.
        if self._bounds is None or self._bounds[0] is not self.steps:
            starts = np.flatnonzero(np.r_[True, self.steps[1:] != self.steps[:-1]])
            bounds = (starts.astype(np.int64), self.steps[starts])
            for array in bounds:
                array.setflags(write=False)  # shared by every caller
            self._bounds = (self.steps, *bounds)
        return self._bounds[1], self._bounds[2]

    def where(self, step: int) -> str:
        """``file:line`` of a host step when the format has lines, else ``file: step N``."""
        line = self.step_lines.get(step)
        return f"{self.path}:{line}" if line else f"{self.path}: step {step}"


# Sanity bounds on a trace's geometry, far above any model's (256 experts, 61 layers for the
# largest shipped MoEs): a corrupt id or header past them would make the replay allocate
# layers x experts tables of terabytes; refusing names the file instead.
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
# Step numbers and tags are int64 in every array; a JSON integer past this does not fit.
MAX_INT = 2**62


def _int_dtype(max_id: int) -> type[np.integer[Any]]:
    # 1M tokens x 40 layers x top-6 is 240M ids: int16 keeps that at 480 MB.
    return np.int16 if max_id < 2**15 else np.int32


def trace_from_arrays(
    experts: npt.ArrayLike,
    *,
    prefill: npt.ArrayLike | None = None,
    phase: npt.ArrayLike | None = None,
    steps: npt.ArrayLike | None = None,
    experts_count: int | None = None,
    path: str = "<arrays>",
    fmt: str = "arrays",
) -> Trace:
    """Validate ``[rows, layers, top_k]`` routing (and optional per-row arrays) into a Trace.

    Rows default to one decode step each, numbered 0..N-1, phase 0. ``experts_count`` defaults to
    the largest id + 1.
    """
    array = np.asarray(experts)
    if array.ndim != 3:
        raise TraceError(
            f"{path}: routing must have shape [tokens, layers, top_k], got {list(array.shape)}; "
            "for one token per step reshape to [N, layers, top_k]"
        )
    if array.shape[0] == 0 or array.shape[1] == 0 or array.shape[2] == 0:
        raise TraceError(
            f"{path}: the trace is empty (shape {list(array.shape)}); record some steps"
        )
    if array.dtype.kind not in "iu":
        if (
            array.dtype.kind == "f"
            and np.all(np.isfinite(array))
            and np.all(array == np.rint(array))
        ):
            array = array.astype(np.int64)
        else:
            raise TraceError(f"{path}: expert ids must be integers, got dtype {array.dtype}")
    if array.shape[1] > MAX_LAYERS:
        raise TraceError(
            f"{path}: {array.shape[1]} layers, more than any model's ({MAX_LAYERS}); the "
            "trace is corrupt, or its axes are not [tokens, layers, top_k]"
        )
    lowest, highest = int(array.min()), int(array.max())
    count = highest + 1 if experts_count is None else int(experts_count)
    if experts_count is not None and not 1 <= count <= MAX_EXPERTS:
        raise TraceError(f"{path}: the expert count must be in 1..{MAX_EXPERTS}, got {count}")
    if experts_count is None and highest >= MAX_EXPERTS:
        where = np.argwhere(array == highest)[0].tolist()
        raise TraceError(
            f"{path}: token {where[0]}, layer {where[1]}: expert id {highest} is more than "
            f"any model has ({MAX_EXPERTS}); the trace is corrupt"
        )
    if lowest < 0 or highest >= count:
        bad = lowest if lowest < 0 else highest
        where = np.argwhere(array == bad)[0].tolist()
        raise TraceError(
            f"{path}: token {where[0]}, layer {where[1]}: expert id {bad} is not in "
            f"0..{count - 1}; pass the model's expert count, or fix the trace"
        )
    rows = array.shape[0]

    def per_row(values: npt.ArrayLike | None, name: str, default: Any, dtype: Any) -> Any:
        if values is None:
            return np.full(rows, default, dtype=dtype)
        out = np.asarray(values)
        if out.shape != (rows,):
            raise TraceError(f"{path}: {name} must have shape [{rows}], got {list(out.shape)}")
        too_big = out.size > 0 and (int(out.max()) >= MAX_INT or int(out.min()) <= -MAX_INT)
        if out.dtype.kind not in "biu" or too_big:
            raise TraceError(
                f"{path}: {name} must hold integers (or booleans) below 2^62, got dtype {out.dtype}"
            )
        return out.astype(dtype)

    step_array: IntArray = per_row(steps, "step", 0, np.int64)
    if steps is None:
        step_array = np.arange(rows, dtype=np.int64)
    backwards = np.flatnonzero(np.diff(step_array) < 0)
    if backwards.size:
        i = int(backwards[0]) + 1
        raise TraceError(
            f"{path}: row {i}: step {int(step_array[i])} comes after step "
            f"{int(step_array[i - 1])}; steps must not go backwards (sort the trace by step)"
        )
    prefill_array: BoolArray = per_row(prefill, "prefill", False, bool)
    return Trace(
        path=path,
        format=fmt,
        experts=np.ascontiguousarray(array, dtype=_int_dtype(count)),
        steps=step_array,
        prefill=prefill_array,
        phase=per_row(phase, "phase", 0, np.int64),
        experts_count=count,
        phase_tagged=phase is not None,
    )


def concat_traces(traces: list[Trace]) -> Trace:
    """Several traces as one stream: steps renumbered to follow on, geometry checked equal.

    Untagged traces get their position in the list as phase tag (one trace per phase).
    """
    if not traces:
        raise TraceError("no traces given; pass at least one trace file")
    first = traces[0]
    count = max(t.experts_count for t in traces)
    blocks, steps, prefill, phases = [], [], [], []
    offset = 0
    for index, trace in enumerate(traces):
        if (trace.layers, trace.top_k) != (first.layers, first.top_k):
            raise TraceError(
                f"{trace.path}: {trace.layers} layers x top-{trace.top_k}, but {first.path} has "
                f"{first.layers} x top-{first.top_k}; simulate traces of one model together"
            )
        blocks.append(trace.experts)
        steps.append(trace.steps - int(trace.steps[0]) + offset)
        offset = int(steps[-1][-1]) + 1
        prefill.append(trace.prefill)
        phases.append(trace.phase if trace.phase_tagged else np.full(trace.rows, index))
    joined = trace_from_arrays(
        np.concatenate(blocks),
        prefill=np.concatenate(prefill),
        phase=np.concatenate(phases),
        steps=np.concatenate(steps),
        experts_count=count,
        path=" + ".join(t.path for t in traces),
        fmt=first.format if len(traces) == 1 else "concat",
    )
    # Each trace's unscored ranges, renumbered as its steps were.
    shifted = []
    for trace, renumbered in zip(traces, steps, strict=True):
        moved = int(renumbered[0]) - int(trace.steps[0])
        shifted += [(a + moved, b + moved) for a, b in trace.unscored]
    joined.unscored = tuple(shifted)
    return joined


def decode_counts(trace: Trace, half_life_steps: float | None = None) -> npt.NDArray[np.float64]:
    """Selections per layer and expert over the decode rows, ``[layers, experts]``.

    With ``half_life_steps`` every selection is weighted ``0.5 ** ((last - step) / half_life)``
    (last = the trace's last step), the runtime's EWMA seen at the end of the trace.
    """
    decode = ~trace.prefill
    chosen = trace.experts[decode].astype(np.int64)
    layers, count = trace.layers, trace.experts_count
    flat = chosen + (np.arange(layers, dtype=np.int64) * count)[None, :, None]
    if half_life_steps is None:
        weights = None
    else:
        if not (half_life_steps > 0) or math.isnan(half_life_steps):
            raise TraceError(f"--decay-half-life-steps must be > 0, got {half_life_steps}")
        age = float(trace.steps[-1]) - trace.steps[decode].astype(np.float64)
        per_row = np.power(0.5, age / half_life_steps)
        weights = np.broadcast_to(per_row[:, None, None], chosen.shape).reshape(-1)
    totals = np.bincount(flat.reshape(-1), weights=weights, minlength=layers * count)
    return totals.astype(np.float64).reshape(layers, count)
