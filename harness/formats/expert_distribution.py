"""SGLang's expert-distribution files: recorder dumps, ``--init-expert-location`` and KT frequency
files, read without torch (:mod:`harness.formats.torchfile`).

A recorder dump is what ``POST /dump_expert_distribution_record`` writes into
``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`` as ``expert_distribution_recorder_<time>.pt``:

* mode ``stat`` (and ``stat_approx``): ``{"rank": 0, "logical_count": int [steps, layers,
  experts], "average_utilization_rate_over_window": float | None}``, one row per recorded
  forward pass (a circular buffer of ``--expert-distribution-recorder-buffer-size`` rows unless
  that is -1);
* KTransformers' SGLang build with ``--record-kt-gpu-expert-distribution`` writes
  ``gpu_expert_masks``, bool ``[steps, layers, experts]`` (which experts were on the GPU in each
  pass), to a file of its own beside the counts, ``gpu_expert_distribution_<time>.pt`` holding
  only that key (kvcache-ai/sglang, ``eplb/expert_distribution.py``: ``dump_record``); a file
  holding both keys is read too;
* modes ``per_pass`` / ``per_token`` write ``expert_distribution_recorder_<time>_<rank>.pt``:
  ``{"records": [{"global_physical_count": int [layers, physical], ...}, ...],
  "last_physical_to_logical_map": int [layers, physical]}``.

Counts are expert selections (top-k per token, every token of every recorded forward pass, prefill
included). GPU hits = Σ counts × masks over aligned passes; misses = the rest.

``--init-expert-location`` takes a ``.pt`` or a ``.json`` holding ``{"logical_count": [layers,
experts] or [steps, layers, experts]}``; KTransformers' frequency file (``--init-expert-location``
with ``--kt-expert-placement-strategy frequency``) is the same ``.pt``, or a bare tensor.
Multi-step counts are summed over steps, as both read them. Counts may be fractions (decayed
counts): both loaders take floats.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import BadInput, MapError
from harness.formats.safe_write import write_text_atomic
from harness.formats.textfile import parse_json, read_text
from harness.formats.torchfile import read_torch_file, write_torch_file

__all__ = [
    "DUMP_GLOB",
    "ExpertDistribution",
    "combine_dumps",
    "full_gpu_passes",
    "kt_frequency_refusal",
    "kt_text_config",
    "logical_count_shape",
    "read_dump",
    "read_logical_count",
    "write_logical_count",
    "write_stat_dump",
]

DUMP_GLOB = "expert_distribution_recorder_*.pt"

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


_MAX_TOTAL = 2.0**62  # headroom for the few dumps a fit combines


@dataclass(frozen=True)
class ExpertDistribution:
    """One dump's counts ``[steps, layers, experts]`` and GPU masks (same shape) if recorded."""

    counts: I64
    masks: npt.NDArray[np.bool_] | None
    mode: str  # "stat", "per_pass" or "masks" (a masks-only file)
    counts_from: str = ""  # the file(s) the counts were read from, for messages
    masks_from: str = ""  # the file the masks were read from


def _array(path: str, value: Any, key: str, ndim: tuple[int, ...]) -> npt.NDArray[Any]:
    if not isinstance(value, np.ndarray) or value.ndim not in ndim:
        dims = " or ".join(f"{n}-d" for n in ndim)
        raise BadInput(f"{path}: {key} must be a {dims} tensor, not {type(value).__name__}")
    return value


def _counts(path: str, value: Any, key: str, ndim: tuple[int, ...]) -> I64:
    """A tensor of counts as int64: finite and non-negative, else BadInput naming the file.
    Every reader of recorded counts comes through here (or ``_numbers``)."""
    return _numbers(path, value, key, ndim).astype(np.int64)


def _numbers(path: str, value: Any, key: str, ndim: tuple[int, ...]) -> npt.NDArray[Any]:
    """A tensor of counts as stored, checked: a NaN cast to int64 is a huge negative number,
    and a map fitted from it (or from negative counts) ranks experts by garbage."""
    array = _array(path, value, key, ndim)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise BadInput(f"{path}: {key} holds NaN or infinite counts")
    if array.dtype.kind in "fi" and (array < 0).any():
        raise BadInput(f"{path}: {key} holds negative counts")
    if array.dtype.kind not in "fiub":
        raise BadInput(f"{path}: {key} is not a tensor of numbers ({array.dtype})")
    # Summed over steps (and dumps) in int64, a total past 2^63 wraps negative and the hottest
    # expert ranks coldest; no recorder counts within orders of magnitude of this bound.
    if array.size and float(array.astype(np.float64).sum()) >= _MAX_TOTAL:
        raise BadInput(
            f"{path}: {key} adds up to 2^62 or more selections, past what the int64 sums of "
            "every reader hold (a recorder counts far fewer): the file is corrupt"
        )
    return array


def read_dump(path: str | os.PathLike[str]) -> ExpertDistribution:
    """A recorder dump as counts (and masks); BadInput naming the file for any other shape."""
    name = os.fspath(path)
    data = read_torch_file(name)
    if not isinstance(data, dict):
        raise BadInput(f"{name}: a recorder dump is a dict, not {type(data).__name__}")
    masks = None
    if "gpu_expert_masks" in data:
        masks = _array(name, data["gpu_expert_masks"], "gpu_expert_masks", (3,)).astype(bool)
    if "logical_count" in data:
        counts = _counts(name, data["logical_count"], "logical_count", (2, 3))
        if counts.ndim == 2:
            counts = counts[None]
        if masks is not None and masks.shape[1:] != counts.shape[1:]:
            raise BadInput(
                f"{name}: gpu_expert_masks {list(masks.shape)} and logical_count "
                f"{list(counts.shape)} differ in layers or experts"
            )
        return ExpertDistribution(counts, masks, "stat", name, name if masks is not None else "")
    if "records" in data:
        counted = _per_pass_counts(name, data)
        return ExpertDistribution(
            counted, masks, "per_pass", name, name if masks is not None else ""
        )
    if masks is not None:
        empty = np.zeros((0, *masks.shape[1:]), np.int64)
        return ExpertDistribution(empty, masks, "masks", "", name)
    raise BadInput(
        f"{name}: not an expert-distribution dump (no logical_count, records or "
        f"gpu_expert_masks; keys: {', '.join(sorted(map(str, data)))})"
    )


def _per_pass_counts(name: str, data: dict[str, Any]) -> I64:
    """Per-pass physical counts mapped to logical experts with the dump's last map."""
    mapping = _array(
        name, data.get("last_physical_to_logical_map"), "last_physical_to_logical_map", (2,)
    ).astype(np.int64)
    records = data["records"]
    if not isinstance(records, list):
        raise BadInput(f"{name}: records must be a list")
    layers, physical = mapping.shape
    if mapping.size and not (int(mapping.min()) >= 0 and int(mapping.max()) < physical):
        raise BadInput(
            f"{name}: last_physical_to_logical_map must hold logical ids 0..{physical - 1} "
            "(there are never more logical experts than physical ones)"
        )
    logical = int(mapping.max()) + 1 if mapping.size else 0
    out = np.zeros((len(records), layers, logical), dtype=np.int64)
    rows = np.arange(layers)[:, None].repeat(physical, axis=1)
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise BadInput(f"{name}: records[{index}] must be a dict")
        where = f"records[{index}].global_physical_count"
        count = _array(name, record.get("global_physical_count"), where, (2,))
        if count.shape != mapping.shape:
            raise BadInput(
                f"{name}: records[{index}].global_physical_count {list(count.shape)} differs "
                f"from last_physical_to_logical_map {list(mapping.shape)}"
            )
        np.add.at(out[index], (rows, mapping), count.astype(np.int64))
    return out


def combine_dumps(dumps: list[ExpertDistribution], where: str) -> ExpertDistribution:
    """The dumps of one ``/dump_expert_distribution_record`` as one: count files summed (ranks of
    a per-pass dump; steps concatenated if their step counts differ), masks from the file that
    holds them (:func:`gpu_hits` pairs them pass by pass)."""
    counted = [d for d in dumps if d.mode != "masks"]
    if not counted:
        raise BadInput(f"{where}: the dump holds GPU masks but no counts")
    shape = counted[0].counts.shape[1:]
    if any(d.counts.shape[1:] != shape for d in counted):
        raise BadInput(f"{where}: the dump's files differ in layers or experts")
    steps = {d.counts.shape[0] for d in counted}
    if len(steps) == 1:
        counts = np.sum([d.counts for d in counted], axis=0)
    else:
        counts = np.concatenate([d.counts for d in counted])
    masked = [d for d in dumps if d.masks is not None]
    if len(masked) > 1:
        raise BadInput(f"{where}: more than one file of the dump holds gpu_expert_masks")
    return ExpertDistribution(
        counts,
        masked[0].masks if masked else None,
        counted[0].mode,
        ", ".join(d.counts_from for d in counted if d.counts_from) or where,
        masked[0].masks_from or where if masked else "",
    )


def full_gpu_passes(
    dist: ExpertDistribution, threshold_tokens: int, top_k: int
) -> npt.NDArray[np.bool_]:
    """The passes KTransformers ran wholly on the GPU: with ``--kt-gpu-prefill-token-threshold``
    N > 0, a forward pass of N tokens or more loads each MoE layer whole onto the GPU and
    computes every expert there (sglang-kt 0.7.2, ``kt_ep_wrapper.py``, ``apply``:
    ``num_tokens >= self.gpu_prefill_token_threshold``), after recording the layer's mask of the
    partial placement, so the mask calls misses what ran on the GPU. A pass's tokens are its
    busiest layer's selections ÷ ``top_k`` (every token selects top_k experts in each MoE
    layer)."""
    if threshold_tokens <= 0 or dist.counts.shape[0] == 0:
        return np.zeros(dist.counts.shape[0], dtype=bool)
    selections = dist.counts.sum(axis=2).max(axis=1)
    return np.asarray(selections >= threshold_tokens * top_k, dtype=bool)


def gpu_hits(
    dist: ExpertDistribution, left_out: npt.NDArray[np.bool_] | None = None
) -> tuple[int, int] | None:
    """(hits, misses): selections of experts on the GPU in their pass, and the rest; None
    without masks. Pass ``i`` of the masks is pass ``i`` of the counts: KTransformers'
    recorder appends one of each at the end of every forward pass, into buffers of the same
    size (``_on_forward_pass_end``; ``expert_distribution_recorder_buffer_size``), and its
    dump writes both, so files of different lengths are not one dump's: refused, naming both.
    Passes ``left_out`` marks (:func:`full_gpu_passes`) count in neither."""
    if dist.masks is None:
        return None
    counts_from = dist.counts_from or "logical_count"
    masks_from = dist.masks_from or "gpu_expert_masks"
    if dist.masks.shape[0] != dist.counts.shape[0]:
        raise BadInput(
            f"{masks_from}: gpu_expert_masks holds {dist.masks.shape[0]} passes and "
            f"{counts_from}: logical_count {dist.counts.shape[0]}: KTransformers' recorder "
            "writes one mask per counted pass, so these are not one dump's; pair the two files "
            "of one /dump_expert_distribution_record"
        )
    if dist.masks.shape[1:] != dist.counts.shape[1:]:
        raise BadInput(
            f"{masks_from}: gpu_expert_masks {list(dist.masks.shape)} and {counts_from}: "
            f"logical_count {list(dist.counts.shape)} differ in layers or experts"
        )
    counts, masks = dist.counts, dist.masks
    if left_out is not None:
        counts, masks = counts[~left_out], masks[~left_out]
    hits = int((counts * masks).sum())
    return hits, int(counts.sum()) - hits


def write_stat_dump(
    path: str | os.PathLike[str],
    counts: npt.ArrayLike,
    masks: npt.ArrayLike | None = None,
    *,
    rank: int = 0,
) -> None:
    """A ``stat``-mode dump as SGLang writes it (int32 counts; bool masks when given)."""
    data: dict[str, Any] = {
        "rank": rank,
        "logical_count": np.asarray(counts, dtype=np.int32),
        "average_utilization_rate_over_window": None,
    }
    if masks is not None:
        data["gpu_expert_masks"] = np.asarray(masks, dtype=bool)
    write_torch_file(path, data)


def read_logical_count(path: str | os.PathLike[str]) -> F64:
    """Counts ``[layers, experts]`` from an ``--init-expert-location`` / KT frequency file
    (``.pt``: a dict with ``logical_count`` or a bare tensor; ``.json``: ``{"logical_count":
    ...}``), steps summed, as the values stored: a file ``fit-map`` wrote from decayed counts
    holds fractions, and its order is what the engine places by."""
    name = os.fspath(path)
    data: Any
    if Path(name).suffix.lower() == ".json":
        data = parse_json(read_text(name, MapError, "expert location"), name, MapError)
        if isinstance(data, dict) and "logical_count" in data:
            data = {"logical_count": _json_counts(name, data["logical_count"])}
    else:
        data = read_torch_file(name)
    if isinstance(data, dict):
        if "logical_count" not in data:
            keys = ", ".join(sorted(map(str, data)))
            raise BadInput(
                f"{name}: no logical_count (keys: {keys}); give SGLang's "
                '{"logical_count": [layers][experts]} or a recorder dump'
            )
        data = data["logical_count"]
    counts = _numbers(name, data, "logical_count", (2, 3)).astype(np.float64)
    if counts.ndim == 3:
        counts = counts.sum(axis=0)
    return counts


def _json_counts(name: str, value: Any) -> npt.NDArray[Any]:
    """A JSON ``logical_count``: integers as int64, fractional counts as float64."""
    try:
        array = np.asarray(value)
        return array if array.dtype.kind == "f" else np.asarray(value, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        raise BadInput(
            f"{name}: logical_count must be a rectangular array of integers (each under 2^63), "
            "or of fractional counts"
        ) from None


def write_logical_count(path: str | os.PathLike[str], counts: npt.ArrayLike) -> None:
    """Counts ``[layers, experts]`` as an ``--init-expert-location`` file, one pass deep:
    ``[1, layers, experts]``. KTransformers' frequency placement (``_init_kt_gpu_experts_masks``
    in its SGLang build's ``kt_ep_wrapper.py``) refuses anything but 3-D with the model's
    ``num_hidden_layers`` rows, dense layers included; SGLang's ``init_by_eplb`` takes 2-D or
    3-D. ``.json`` writes ``{"logical_count": [[[...]]]}``, anything else a torch file
    ``{"logical_count": tensor}`` (KT reads only a ``.pt``).

    Integer counts are written as int64, fractional ones (decayed counts, or counts
    :func:`harness.sim.fitmap.separate_ties` made distinct) as float32, never truncated: both
    loaders take floats (KT sums the passes and compares in float32, ``.sum(dim=0).float()``;
    SGLang's EPLB algorithms sort ``weight.float()`` and divide it by replica counts), and a
    fraction truncated to 0 ties with every other one."""
    table = np.asarray(counts)
    table = table.astype(np.float32 if table.dtype.kind == "f" else np.int64)
    if table.ndim == 2:
        table = table[None]
    if Path(path).suffix.lower() == ".json":
        write_text_atomic(Path(path), json.dumps({"logical_count": table.tolist()}) + "\n")
    else:
        write_torch_file(path, {"logical_count": table})


def logical_count_shape(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """The shape of a ``.pt`` location or frequency file's counts as stored (a dict's
    ``logical_count``, or a bare tensor): what KTransformers' loader checks before it sums."""
    name = os.fspath(path)
    data = read_torch_file(name)
    if isinstance(data, dict):
        if "logical_count" not in data:
            raise BadInput(f"{name}: no logical_count (keys: {', '.join(sorted(map(str, data)))})")
        data = data["logical_count"]
    if not isinstance(data, np.ndarray):
        raise BadInput(f"{name}: logical_count is not a tensor")
    return tuple(int(n) for n in data.shape)


# The attributes KTransformers reads for the experts per layer, in its order of preference.
_KT_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def kt_frequency_refusal(shape: tuple[int, ...], config: dict[str, Any]) -> str | None:
    """Why KTransformers' frequency placement refuses counts of ``shape`` for a model whose
    ``config.json`` is ``config`` (None: it takes them). Its SGLang build's
    ``_init_kt_gpu_experts_masks`` (kt_ep_wrapper.py) raises at boot unless the tensor is 3-D
    ``[passes, num_hidden_layers, experts]``, read as :func:`kt_text_config` reads them. A
    config without them is not judged here (KT then gives up on its own, before placing
    anything)."""
    if len(shape) != 3:
        return (
            f"KTransformers refuses a {len(shape)}-D frequency tensor {list(shape)}: it wants "
            "[passes, layers, experts]"
        )
    text = kt_text_config(config)
    layers = text.get("num_hidden_layers")
    experts = next((text[k] for k in _KT_EXPERT_KEYS if text.get(k) is not None), None)
    if not isinstance(layers, int) or not isinstance(experts, int):
        return None
    where = " of its text_config" if text is not config else ""
    _, file_layers, file_experts = shape
    if file_layers != layers:
        return (
            f"the file has {file_layers} layers and the model {layers} (num_hidden_layers"
            f"{where}, dense layers included): KTransformers refuses it at boot"
        )
    if file_experts != experts:
        return (
            f"the file has {file_experts} experts per layer and the model {experts}{where}: "
            "KTransformers refuses it at boot"
        )
    return None


def kt_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a ``config.json`` KTransformers reads the model's shape from: a VL model's
    ``text_config`` when it has one (Kimi-K2.5's layout: ``if getattr(hf_config, "text_config",
    None) is not None: hf_config = hf_config.text_config`` in ``_init_kt_gpu_experts_masks``),
    else the config itself. Layers from ``num_hidden_layers``, experts per layer from the first
    of num_local_experts, num_experts, n_routed_experts it sets. A ``text_config`` that is not
    an object is returned as an empty one: nothing to judge by."""
    text = config.get("text_config")
    if text is None:
        return config
    return text if isinstance(text, dict) else {}
