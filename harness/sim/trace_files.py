"""Reading routing trace files: every format the simulator reads, into one :class:`Trace`.

Formats (chosen by suffix, JSONL sniffed by its first record):

* reference runtime ``--route-trace`` JSONL (``harness.refbox.engine`` docstring);
* Megatron-style JSONL, one ``{"step", "layer", "top_indices"}`` record per step and layer
  (``top_indices`` one token's ``[top_k]`` or ``[[top_k] per token]``; optional ``prefill`` and
  ``phase``); records are grouped by step, steps must not go backwards;
* ``.npy`` / ``.npz`` arrays ``[tokens, layers, top_k]`` (vLLM's ``routed_experts``): every token
  is one decode step numbered 0..N-1; an ``.npz`` may carry ``phase``, ``prefill`` and ``step``
  arrays of length N beside ``routed_experts`` (or ``experts``).

The Trace type and the checks every format shares are in :mod:`harness.sim.traces`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError, TraceError
from harness.formats.npy import npy_header_problem
from harness.formats.records import UNSCORED_STEPS
from harness.formats.ring import ROUTE_TRACE_VERSION
from harness.formats.textfile import parse_json
from harness.policy.residency import PolicyKnobs
from harness.sim.traces import (
    MAX_EXPERTS,
    MAX_INT,
    MAX_LAYERS,
    KnobChange,
    RecordedSwap,
    Trace,
    trace_from_arrays,
)

__all__ = ["file_sha256", "load_trace"]

_KNOB_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyKnobs))
_ARRAY_KEYS = ("routed_experts", "experts")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes (to tell a held-out trace from the one a map was fitted on)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _knobs_from(raw: Any, where: str) -> tuple[PolicyKnobs, int]:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: 'knobs' must be an object")
    values = {k: raw[k] for k in _KNOB_FIELDS if k in raw}
    try:
        knobs = PolicyKnobs(**values)
        knobs.validate()
    except (TypeError, KnobError) as exc:
        raise TraceError(f"{where}: invalid recorded knobs: {exc}") from None
    # The replay's compiled loops hold these in int64.
    for name in ("drain_every", "swaps_per_layer"):
        if getattr(knobs, name) >= MAX_INT:
            raise TraceError(f"{where}: invalid recorded knobs: {name} is past 2^62")
    phase = raw.get("phase", 0)
    if not _is_int(phase):
        raise TraceError(f"{where}: knobs.phase must be an integer below 2^62, got {phase!r}")
    return knobs, phase


def _is_int(value: Any, low: int = -MAX_INT) -> TypeGuard[int]:
    """An integer (not a bool) that fits the int64 arrays it goes into, and at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < MAX_INT


def _ids(value: Any, where: str, what: str) -> npt.NDArray[Any]:
    """Nested JSON lists of expert ids as an integer array, or a TraceError naming the line."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        array = np.asarray(None)  # ragged lists: reported below as the wrong shape
    if array.ndim == 0 or (array.size and array.dtype.kind not in "iu"):
        raise TraceError(
            f"{where}: {what} must be nested lists of integer expert ids of one shape, "
            f"got {str(value)[:60]}"
        )
    return array


def _json_lines(path: str) -> list[tuple[int, dict[str, Any]]]:
    records: list[tuple[int, dict[str, Any]]] = []
    try:
        handle = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = parse_json(raw.decode("utf-8"), path, TraceError, first_line=number)
            except (TraceError, UnicodeDecodeError) as exc:
                if not raw.endswith(b"\n"):
                    break  # a torn last line (the runtime was killed mid-write): drop it
                if isinstance(exc, TraceError):
                    raise
                raise TraceError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); the trace "
                    "is binary or corrupt: record it again"
                ) from None
            if not isinstance(record, dict):
                raise TraceError(f"{path}:{number}: expected a JSON object per line")
            records.append((number, record))
    if not records:
        raise TraceError(f"{path}: the trace is empty; record some steps first")
    return records


class _Rows:
    """A JSONL trace's routing, gathered one host step at a time, with the per-row arrays."""

    def __init__(self) -> None:
        self.blocks: list[npt.NDArray[Any]] = []
        self.steps: list[int] = []
        self.prefill: list[bool] = []
        self.phases: list[int] = []
        self.step_lines: dict[int, int] = {}

    def add(self, block: npt.NDArray[Any], step: int, prefill: bool, phase: int, line: int) -> None:
        """One host step's ``[tokens, layers, top_k]`` routing, from trace line ``line``."""
        tokens = block.shape[0]
        self.blocks.append(block)
        self.steps.extend([step] * tokens)
        self.prefill.extend([prefill] * tokens)
        self.phases.extend([phase] * tokens)
        self.step_lines[step] = line

    def trace(self, path: str, fmt: str, experts_count: int | None) -> Trace:
        """The gathered steps as one checked Trace, each host step mapped to its line."""
        trace = trace_from_arrays(
            np.concatenate(self.blocks),
            prefill=self.prefill,
            phase=self.phases,
            steps=self.steps,
            experts_count=experts_count,
            path=path,
            fmt=fmt,
        )
        trace.step_lines = self.step_lines
        return trace


def _step_tags(record: dict[str, Any], where: str) -> tuple[bool, int]:
    """A step record's ``prefill`` flag and ``phase`` tag, checked."""
    prefill, phase = record.get("prefill", False), record.get("phase", 0)
    if not (isinstance(prefill, bool) or (isinstance(prefill, int) and prefill in (0, 1))):
        raise TraceError(f"{where}: 'prefill' must be true or false, got {prefill!r:.40}")
    if not _is_int(phase):
        raise TraceError(f"{where}: 'phase' must be an integer, got {phase!r:.40}")
    return bool(prefill), phase


def _refbox_trace(
    path: str, records: list[tuple[int, dict[str, Any]]], experts: int | None
) -> Trace:
    line0, header = records[0]
    where = f"{path}:{line0}"
    for key, most in (("layers", MAX_LAYERS), ("experts", MAX_EXPERTS), ("top_k", MAX_EXPERTS)):
        value = header.get(key)
        if not _is_int(value, 1) or value > most:
            raise TraceError(f"{where}: header.{key} must be an integer in 1..{most}")
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
    rows = _Rows()
    changes: list[KnobChange] = []
    swaps: list[RecordedSwap] = []
    drains: list[int] = []
    last_step = -1
    for number, record in records[1:]:
        here = f"{path}:{number}"
        kind = record.get("kind")
        if kind == "step":
            step = record.get("step")
            if not _is_int(step) or step <= last_step:
                raise TraceError(
                    f"{here}: step {step!r} after step {last_step}: host steps must increase"
                )
            last_step = step
            is_prefill, phase = _step_tags(record, here)
            routing = _ids(record.get("experts"), here, "experts")
            tokens = routing if is_prefill else routing[None, ...]
            if tokens.ndim != 3 or tokens.shape[1:] != (layers, top_k) or tokens.shape[0] < 1:
                expected = "[tokens, layers, top_k]" if is_prefill else "[layers, top_k]"
                raise TraceError(
                    f"{here}: experts must have shape {expected} with {layers} layers and "
                    f"top_k {top_k}, got {list(routing.shape)} (mixed top-k or a torn line?)"
                )
            rows.add(tokens, step, is_prefill, phase, number)
        elif kind == "swap":
            values = [record.get(k) for k in ("step", "layer", "promoted", "evicted")]
            if not all(_is_int(v) for v in values):
                raise TraceError(f"{here}: a swap needs integer step, layer, promoted, evicted")
            step_no, layer, promoted, evicted = (int(v) for v in values)  # type: ignore[arg-type]
            swaps.append(RecordedSwap(step_no, layer, promoted, evicted, line=number))
        elif kind == "drain":
            step = record.get("step")
            if not _is_int(step):
                raise TraceError(f"{here}: a drain line needs an integer step")
            drains.append(step)
        elif kind == "knobs":
            step = record.get("step")
            if not _is_int(step):
                raise TraceError(f"{here}: a knobs line needs an integer step")
            new, phase = _knobs_from(record.get("knobs"), here)
            changes.append(KnobChange(step, new, phase, number))
        elif kind == "header":
            raise TraceError(f"{here}: a second header; one trace per runtime boot")
        elif kind == "reset":
            raise TraceError(
                f"{here}: a reset: this is a whole shared boot's trace, its runs one after "
                "another; replay one run's own (runs/<run>/route-trace.jsonl of the campaign "
                "directory), which starts at its reset"
            )
        else:
            raise TraceError(f"{here}: unknown record kind {kind!r} (step, drain, swap or knobs)")
    if not rows.blocks:
        raise TraceError(f"{path}: the trace has a header but no steps; send some requests")
    trace = rows.trace(path, "refbox", count)
    hot = header.get("hot") or None
    if hot is not None and (
        not isinstance(hot, list)
        or len(hot) != layers
        or not all(isinstance(h, list) and all(_is_int(e, 0) and e < count for e in h) for h in hot)
    ):
        raise TraceError(
            f"{where}: header.hot must list the hot experts (ids in 0..{count - 1}) of each "
            f"of {layers} layers"
        )
    del phase0  # the step lines carry the phase of every row
    trace.header = header
    trace.knobs = knobs
    trace.hot = [list(map(int, h)) for h in hot] if hot is not None else None
    trace.knob_changes = changes
    # Version 1 drained on step % drain_every: its routing replays, its decisions do not.
    trace.swaps = swaps if version == ROUTE_TRACE_VERSION else None
    trace.drains = drains if version == ROUTE_TRACE_VERSION else None
    return trace


def _megatron_trace(
    path: str, records: list[tuple[int, dict[str, Any]]], experts: int | None
) -> Trace:
    by_step: list[tuple[int, int, dict[int, Any], bool, int]] = []  # step, line, layers, ...
    for number, record in records:
        here = f"{path}:{number}"
        step, layer, top = record.get("step"), record.get("layer"), record.get("top_indices")
        if not _is_int(step) or not _is_int(layer, 0) or layer >= MAX_LAYERS:
            raise TraceError(f"{here}: needs integer 'step' and 'layer' in 0..{MAX_LAYERS - 1}")
        if top is None:
            raise TraceError(f"{here}: missing 'top_indices'")
        if by_step and step < by_step[-1][0]:
            raise TraceError(
                f"{here}: step {step} comes after step {by_step[-1][0]}; steps must not go "
                "backwards (sort the records by step)"
            )
        if not by_step or step != by_step[-1][0]:
            by_step.append((step, number, {}, *_step_tags(record, here)))
        layers = by_step[-1][2]
        if layer in layers:
            raise TraceError(f"{here}: step {step} lists layer {layer} twice")
        layers[layer] = (number, top)
    n_layers = max(max(entry[2]) for entry in by_step) + 1
    rows = _Rows()
    top_k: int | None = None
    for step, number, layers, is_prefill, phase in by_step:
        missing = sorted(set(range(n_layers)) - set(layers))
        if missing:
            raise TraceError(f"{path}:{number}: step {step} has no record for layers {missing}")
        per_layer: list[npt.NDArray[Any]] = []
        for layer in range(n_layers):
            line, top = layers[layer]
            array = _ids(top, f"{path}:{line}", "top_indices")
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
        rows.add(block, step, is_prefill, phase, number)
    trace = rows.trace(path, "megatron", experts)
    trace.phase_tagged = any("phase" in record for _, record in records)
    return trace


def _npy_header_problem(path: str) -> str | None:
    """What is wrong with a ``.npy`` file's header, checked before numpy allocates its shape."""
    with open(path, "rb") as handle:
        return npy_header_problem(handle, os.fstat(handle.fileno()).st_size)


def _array_trace(path: str, experts: int | None) -> Trace:
    # numpy's loaders raise a dozen unrelated types on a corrupt file (ValueError, EOFError,
    # BadZipFile, zlib.error, SyntaxError from the header's dict, MemoryError from a huge
    # shape...); every one is the file's fault, so every one becomes a TraceError naming it.
    fix = "write it again with np.save / np.savez"
    try:
        problem = _npy_header_problem(path) if path.lower().endswith(".npy") else None
    except Exception as exc:
        raise TraceError(f"{path}: not a readable .npy file ({str(exc)[:120]}); {fix}") from None
    if problem is not None:
        raise TraceError(f"{path}: corrupt .npy file: {problem}; {fix}")
    try:
        # Our own handle, closed however numpy fails: np.load leaks the one it opens when a
        # corrupt .npz fails inside its constructor.
        with open(path, "rb") as handle:
            loaded = np.load(handle, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                arrays: dict[str, Any] = {"": loaded}
                key: str | None = ""
            else:
                with loaded:
                    names = list(loaded.files)
                    only = names[0] if len(names) == 1 else None
                    key = next((k for k in _ARRAY_KEYS if k in names), only)
                    extra = ("phase", "prefill", "step", "moe_layers", "dense_layers")
                    wanted = [k for k in (key, *extra) if k and k in names]
                    arrays = {k: loaded[k] for k in wanted}
    except Exception as exc:
        raise TraceError(
            f"{path}: not a readable .npy/.npz array file ({str(exc)[:120]}); {fix}"
        ) from None
    if key is None:
        raise TraceError(
            f"{path}: no routing array; name it one of {list(_ARRAY_KEYS)} (found {names})"
        )
    if key == "":
        return trace_from_arrays(arrays[""], experts_count=experts, path=path, fmt="npy")
    trace = trace_from_arrays(
        arrays[key],
        prefill=arrays.get("prefill"),
        phase=arrays.get("phase"),
        steps=arrays.get("step"),
        experts_count=experts,
        path=path,
        fmt="npz",
    )
    if "moe_layers" in arrays:
        trace.moe_layers, trace.model_layers = _moe_layers(arrays, trace.layers, path)
    return trace


def _moe_layers(arrays: dict[str, Any], layers: int, path: str) -> tuple[tuple[int, ...], int]:
    """The model layer of each trace layer and the model's layer count, from ``moe_layers``
    and ``dense_layers`` (routes from responses left the dense layers out)."""
    moe = np.asarray(arrays["moe_layers"]).reshape(-1)
    dense = np.asarray(arrays.get("dense_layers", np.zeros(0, np.int64))).reshape(-1)
    if moe.dtype.kind not in "iu" or moe.size != layers or (moe.size and moe.min() < 0):
        raise TraceError(
            f"{path}: moe_layers must list the model layer of each of its {layers} routed "
            f"layers, got {moe.tolist()[:8]}"
        )
    total = int(moe.max(initial=-1)) + 1
    if dense.size:
        total = max(total, int(dense.max()) + 1)
    return tuple(int(x) for x in moe), total


def _unscored(path: Path) -> tuple[tuple[int, int], ...]:
    """The host-step ranges ``collect --as-run`` recorded as unscored extensions, if any."""
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        spans = tuple((int(a), int(b)) for a, b in data["host_steps"])
    except (OSError, ValueError, TypeError, KeyError):
        raise TraceError(
            f"{path}: not the unscored ranges `collect --as-run` writes "
            '({"host_steps": [[start, end], ...]}); collect the trace again'
        ) from None
    if any(b < a for a, b in spans):
        raise TraceError(f"{path}: a range ends before it starts; collect the trace again")
    return spans


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
        trace = _refbox_trace(name, records, experts)
        trace.unscored = _unscored(Path(name).parent / UNSCORED_STEPS)
        return trace
    if "top_indices" in first:
        return _megatron_trace(name, records, experts)
    raise TraceError(
        f"{name}:{records[0][0]}: unknown trace format: expected a refbox route trace (a "
        "'header' line first), Megatron-style records with 'top_indices', or .npy/.npz arrays"
    )
