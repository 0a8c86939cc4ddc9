"""Routing traces: every format the simulator reads, in one in-memory form.

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

Formats (chosen by suffix, JSONL sniffed by its first record):

* reference runtime ``--route-trace`` JSONL (``harness.refbox.model`` docstring);
* Megatron-style JSONL, one ``{"step", "layer", "top_indices"}`` record per step and layer
  (``top_indices`` one token's ``[top_k]`` or ``[[top_k] per token]``; optional ``prefill`` and
  ``phase``); records are grouped by step, steps must not go backwards;
* ``.npy`` / ``.npz`` arrays ``[tokens, layers, top_k]`` (vLLM's ``routed_experts``): every token
  is one decode step numbered 0..N-1; an ``.npz`` may carry ``phase``, ``prefill`` and ``step``
  arrays of length N beside ``routed_experts`` (or ``experts``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError, TraceError
from harness.policy import PolicyKnobs
from harness.telemetry import ROUTE_TRACE_VERSION

__all__ = [
    "KnobChange",
    "RecordedSwap",
    "Trace",
    "concat_traces",
    "decode_counts",
    "file_sha256",
    "load_trace",
    "trace_from_arrays",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_KNOB_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyKnobs))
_ARRAY_KEYS = ("routed_experts", "experts")


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


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes (to tell a held-out trace from the one a map was fitted on)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    lowest, highest = int(array.min()), int(array.max())
    count = highest + 1 if experts_count is None else int(experts_count)
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


def _knobs_from(raw: Any, where: str) -> tuple[PolicyKnobs, int]:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: 'knobs' must be an object")
    values = {k: raw[k] for k in _KNOB_FIELDS if k in raw}
    try:
        knobs = PolicyKnobs(**values)
        knobs.validate()
    except (TypeError, KnobError) as exc:
        raise TraceError(f"{where}: invalid recorded knobs: {exc}") from None
    phase = raw.get("phase", 0)
    if isinstance(phase, bool) or not isinstance(phase, int):
        raise TraceError(f"{where}: knobs.phase must be an integer, got {phase!r}")
    return knobs, phase


def _json_lines(path: str) -> list[tuple[int, dict[str, Any]]]:
    records: list[tuple[int, dict[str, Any]]] = []
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if raw.endswith("\n"):
                    raise TraceError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
                break  # a torn last line (the runtime was killed mid-write): drop it
            if not isinstance(record, dict):
                raise TraceError(f"{path}:{number}: expected a JSON object per line")
            records.append((number, record))
    if not records:
        raise TraceError(f"{path}: the trace is empty; record some steps first")
    return records


def _refbox_trace(
    path: str, records: list[tuple[int, dict[str, Any]]], experts: int | None
) -> Trace:
    line0, header = records[0]
    where = f"{path}:{line0}"
    for key in ("layers", "experts", "top_k"):
        if not isinstance(header.get(key), int) or header[key] < 1:
            raise TraceError(f"{where}: header.{key} must be a positive integer")
    version = header.get("version")
    if version not in (1, ROUTE_TRACE_VERSION):
        raise TraceError(
            f"{where}: route trace version {version!r} is not {ROUTE_TRACE_VERSION}; this harness "
            "reads the version its own reference runtime writes"
        )
    layers, count, top_k = header["layers"], header["experts"], header["top_k"]
    if experts is not None and experts != count:
        raise TraceError(f"{where}: the trace has {count} experts per layer, not {experts}")
    knobs, phase0 = _knobs_from(header.get("knobs", {}), where)
    rows: list[Any] = []
    steps: list[int] = []
    prefill: list[bool] = []
    phases: list[int] = []
    changes: list[KnobChange] = []
    swaps: list[RecordedSwap] = []
    drains: list[int] = []
    step_lines: dict[int, int] = {}
    last_step = -1
    for number, record in records[1:]:
        here = f"{path}:{number}"
        kind = record.get("kind")
        if kind == "step":
            step = record.get("step")
            if not isinstance(step, int) or step <= last_step:
                raise TraceError(
                    f"{here}: step {step!r} after step {last_step}: host steps must increase"
                )
            last_step = step
            step_lines[step] = number
            is_prefill = bool(record.get("prefill", False))
            routing = np.asarray(record.get("experts"))
            tokens = routing if is_prefill else routing[None, ...]
            if tokens.ndim != 3 or tokens.shape[1:] != (layers, top_k) or tokens.shape[0] < 1:
                expected = "[tokens, layers, top_k]" if is_prefill else "[layers, top_k]"
                raise TraceError(
                    f"{here}: experts must have shape {expected} with {layers} layers and "
                    f"top_k {top_k}, got {list(routing.shape)} (mixed top-k or a torn line?)"
                )
            rows.append(tokens)
            steps.extend([step] * tokens.shape[0])
            prefill.extend([is_prefill] * tokens.shape[0])
            phases.extend([int(record.get("phase", 0))] * tokens.shape[0])
        elif kind == "swap":
            values = [record.get(k) for k in ("step", "layer", "promoted", "evicted")]
            if not all(isinstance(v, int) for v in values):
                raise TraceError(f"{here}: a swap needs integer step, layer, promoted, evicted")
            step_no, layer, promoted, evicted = (int(v) for v in values)  # type: ignore[arg-type]
            swaps.append(RecordedSwap(step_no, layer, promoted, evicted, line=number))
        elif kind == "drain":
            step = record.get("step")
            if not isinstance(step, int):
                raise TraceError(f"{here}: a drain line needs an integer step")
            drains.append(step)
        elif kind == "knobs":
            step = record.get("step")
            if not isinstance(step, int):
                raise TraceError(f"{here}: a knobs line needs an integer step")
            new, phase = _knobs_from(record.get("knobs"), here)
            changes.append(KnobChange(step, new, phase, number))
        elif kind == "header":
            raise TraceError(f"{here}: a second header; one trace per runtime boot")
        else:
            raise TraceError(f"{here}: unknown record kind {kind!r} (step, drain, swap or knobs)")
    if not rows:
        raise TraceError(f"{path}: the trace has a header but no steps; send some requests")
    trace = trace_from_arrays(
        np.concatenate(rows),
        prefill=prefill,
        phase=phases,
        steps=steps,
        experts_count=count,
        path=path,
        fmt="refbox",
    )
    hot = header.get("hot") or None
    if hot is not None and (len(hot) != layers or not all(isinstance(h, list) for h in hot)):
        raise TraceError(
            f"{where}: header.hot must list the hot experts of each of {layers} layers"
        )
    del phase0  # the step lines carry the phase of every row
    trace.header = header
    trace.knobs = knobs
    trace.hot = [list(map(int, h)) for h in hot] if hot is not None else None
    trace.knob_changes = changes
    # Version 1 drained on step % drain_every: its routing replays, its decisions do not.
    trace.swaps = swaps if version == ROUTE_TRACE_VERSION else None
    trace.drains = drains if version == ROUTE_TRACE_VERSION else None
    trace.step_lines = step_lines
    return trace


def _megatron_trace(
    path: str, records: list[tuple[int, dict[str, Any]]], experts: int | None
) -> Trace:
    by_step: list[tuple[int, int, dict[int, Any], bool, int]] = []  # step, line, layers, ...
    for number, record in records:
        here = f"{path}:{number}"
        step, layer, top = record.get("step"), record.get("layer"), record.get("top_indices")
        if not isinstance(step, int) or not isinstance(layer, int) or layer < 0:
            raise TraceError(f"{here}: needs integer 'step' and 'layer' >= 0")
        if top is None:
            raise TraceError(f"{here}: missing 'top_indices'")
        if by_step and step < by_step[-1][0]:
            raise TraceError(
                f"{here}: step {step} comes after step {by_step[-1][0]}; steps must not go "
                "backwards (sort the records by step)"
            )
        if not by_step or step != by_step[-1][0]:
            by_step.append((step, number, {}, bool(record.get("prefill", False)),
                            int(record.get("phase", 0))))  # fmt: skip
        layers = by_step[-1][2]
        if layer in layers:
            raise TraceError(f"{here}: step {step} lists layer {layer} twice")
        layers[layer] = (number, top)
    n_layers = max(max(entry[2]) for entry in by_step) + 1
    blocks: list[Any] = []
    steps: list[int] = []
    prefill: list[bool] = []
    phases: list[int] = []
    top_k: int | None = None
    step_lines: dict[int, int] = {}
    for step, number, layers, is_prefill, phase in by_step:
        missing = sorted(set(range(n_layers)) - set(layers))
        if missing:
            raise TraceError(f"{path}:{number}: step {step} has no record for layers {missing}")
        per_layer: list[npt.NDArray[Any]] = []
        for layer in range(n_layers):
            line, top = layers[layer]
            array = np.asarray(top)
            if array.ndim == 1:
                array = array[None, :]
            if array.ndim != 2 or array.shape[1] == 0:
                raise TraceError(
                    f"{path}:{line}: top_indices must be [top_k] or [[top_k] per token], got "
                    f"shape {list(array.shape)}"
                )
            if top_k is None:
                top_k = array.shape[1]
            if array.shape[1] != top_k:
                raise TraceError(
                    f"{path}:{line}: top_indices has {array.shape[1]} experts, earlier records "
                    f"have {top_k}: mixed top-k in one trace"
                )
            if per_layer and array.shape[0] != per_layer[0].shape[0]:
                raise TraceError(f"{path}:{line}: step {step} has different token counts by layer")
            per_layer.append(array)
        block = np.stack(per_layer, axis=1)  # [tokens, layers, top_k]
        blocks.append(block)
        steps.extend([step] * block.shape[0])
        prefill.extend([is_prefill] * block.shape[0])
        phases.extend([phase] * block.shape[0])
        step_lines[step] = number
    trace = trace_from_arrays(
        np.concatenate(blocks),
        prefill=prefill,
        phase=phases,
        steps=steps,
        experts_count=experts,
        path=path,
        fmt="megatron",
    )
    trace.step_lines = step_lines
    trace.phase_tagged = any("phase" in record for _, record in records)
    return trace


def _array_trace(path: str, experts: int | None) -> Trace:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a readable .npy/.npz array file: {exc}") from None
    if isinstance(loaded, np.ndarray):
        return trace_from_arrays(loaded, experts_count=experts, path=path, fmt="npy")
    with loaded:
        names = list(loaded.files)
        key = next((k for k in _ARRAY_KEYS if k in names), names[0] if len(names) == 1 else None)
        if key is None:
            raise TraceError(
                f"{path}: no routing array; name it one of {list(_ARRAY_KEYS)} (found {names})"
            )
        extra = {k: loaded[k] for k in ("phase", "prefill", "step") if k in names}
        trace = trace_from_arrays(
            loaded[key],
            prefill=extra.get("prefill"),
            phase=extra.get("phase"),
            steps=extra.get("step"),
            experts_count=experts,
            path=path,
            fmt="npz",
        )
    return trace


def load_trace(path: str | os.PathLike[str], *, experts: int | None = None) -> Trace:
    """Read a routing trace in any supported format (see the module docstring).

    ``experts`` is the model's expert count; formats that do not record it default to the
    largest id + 1. Raises :class:`TraceError` naming ``file:line`` and the fix.
    """
    name = os.fspath(path)
    suffix = Path(name).suffix.lower()
    if not os.path.isfile(name):
        raise TraceError(f"{name}: no such trace file")
    if suffix in (".npy", ".npz"):
        return _array_trace(name, experts)
    records = _json_lines(name)
    first = records[0][1]
    if first.get("kind") == "header":
        return _refbox_trace(name, records, experts)
    if "top_indices" in first:
        return _megatron_trace(name, records, experts)
    raise TraceError(
        f"{name}:{records[0][0]}: unknown trace format: expected a refbox route trace (a "
        "'header' line first), Megatron-style records with 'top_indices', or .npy/.npz arrays"
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
