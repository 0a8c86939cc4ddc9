"""Map fitting and offline coverage: ``harness fit-map``.

Fit: from a route-count dump (``/admin/dump`` JSON, seed 000's ``MEGA_COUNT`` format) or from a
routing trace (its decode selections counted, optionally EWMA-weighted with a half-life), keep
the top K experts of every layer (a rowmap, ties to the lower id) or the global top N (layer,
expert) pairs (a ds4 hotlist). The files are written with ``maps.write_rowmap`` /
``maps.write_hotlist``, exactly what the runtimes boot from. Counts files (SGLang's
``--init-expert-location``, KT's frequency file) hold the counts made distinct in the harness's
order (``separate_ties``), so the engine places the set the harness scores.

Score: coverage = decode selections whose expert the map keeps hot (or the hotlist lists) ÷ all
decode selections of held-out traces, with the worst layer (seed 004: the built-in top 3,097
covered 41.94%, a workload-trained one 89.00%). Scoring on the trace a map was fitted on (same
path or same bytes) is refused unless asked for, and then labelled in-sample.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harness.errors import BadInput, MapError
from harness.formats.expert_distribution import combine_dumps, read_dump, read_logical_count
from harness.formats.maps import HotlistEntry, fit_hotlist, fit_rowmap, read_count_dump
from harness.formats.textfile import read_text
from harness.sim.trace_files import file_sha256, load_trace
from harness.sim.traces import Trace, decode_counts

__all__ = [
    "Coverage",
    "FitSource",
    "check_held_out",
    "coverage",
    "cut_ties",
    "fit_hotlist_entries",
    "fit_top_k",
    "frequency_hot",
    "load_counts",
    "separate_ties",
]

# fit-map --format values whose file holds counts, not a placement: SGLang's
# --init-expert-location (JSON or .pt) and KTransformers' frequency file (the same .pt).
COUNT_FORMATS = ("sglang-json", "sglang-pt", "kt-frequency")

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FitSource:
    """Counts to fit on, ``[layers, experts]``, and where they came from."""

    counts: FloatArray
    kind: str  # "count dump" or "trace"
    path: str
    sha256: str


def load_counts(
    path: str | os.PathLike[str],
    *,
    half_life_steps: float | None = None,
    experts: int | None = None,
) -> FitSource:
    """Counts from a count dump (``.json``), SGLang's counts (a recorder dump ``.pt``, an
    ``--init-expert-location`` ``.json``/``.pt``, a KT frequency file) or a routing trace (any
    other trace format)."""
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise BadInput(
            f"{name}: no such file (give a count dump .json, an SGLang .pt/.json with "
            "logical_count, or a routing trace)"
        )
    digest = file_sha256(name)
    suffix = Path(name).suffix.lower()
    if suffix in (".json", ".pt"):
        if half_life_steps is not None:
            raise BadInput(
                f"{name}: --decay-half-life-steps applies to traces; a count dump is already "
                "counted (the runtime's dump holds decayed counts by default)"
            )
        if suffix == ".pt":
            return FitSource(_pt_counts(name).astype(np.float64), "sglang counts", name, digest)
        if '"logical_count"' in read_text(name, MapError, "counts"):
            counts = read_logical_count(name).astype(np.float64)
            return FitSource(counts, "sglang counts", name, digest)
        counts = read_count_dump(name).astype(np.float64)
        return FitSource(counts, "count dump", name, digest)
    trace = load_trace(name, experts=experts)
    counts = decode_counts(trace, half_life_steps)
    if trace.moe_layers is not None and trace.model_layers is not None:
        # Routes from responses left the model's dense layers out: back as zero rows, so a
        # placement fitted from them has the model's num_hidden_layers rows.
        full = np.zeros((trace.model_layers, counts.shape[1]))
        full[list(trace.moe_layers)] = counts
        counts = full
    return FitSource(counts, "trace", name, digest)


def _pt_counts(name: str) -> FloatArray:
    """Counts ``[layers, experts]`` of a torch file: a recorder dump of any mode, or a
    ``{"logical_count": ...}`` / bare-tensor location or frequency file."""
    try:
        return read_logical_count(name)
    except BadInput:
        dump = combine_dumps([read_dump(name)], name)
        return np.asarray(dump.counts.sum(axis=0), dtype=np.float64)


def _placement_order(table: FloatArray) -> npt.NDArray[np.intp]:
    """Flat positions of the MoE rows (rows with any count), hottest first: count descending,
    ties to the lower layer, then the lower expert. A dense layer (a row of zeros: no router,
    nothing recorded) is left out."""
    experts = table.shape[1]
    positions = np.flatnonzero(np.repeat(table.any(axis=1), experts))
    flat = table.reshape(-1)[positions]
    return positions[np.lexsort((positions, -flat))]


def frequency_hot(counts: npt.ArrayLike, per_layer: int) -> list[list[int]]:
    """The experts KTransformers' ``frequency`` placement keeps on the GPU for
    ``--kt-num-gpu-experts per_layer``: the global top ``per_layer x MoE layers`` (layer,
    expert) positions by count (ties: lower layer, then lower expert), so a layer may get more
    or fewer than ``per_layer``. Ids ascending per layer. A dense layer (a row of zeros: no
    router, nothing recorded) takes no share of the budget and none of its places, as KT counts
    MoE layers only (``kt_num_gpu_experts * num_moe_layers``; it then puts a dense layer wholly
    on the GPU). KT breaks ties its own way (``torch.topk(sorted=False)``): a file written from
    :func:`separate_ties` has none, so KT places exactly this set."""
    table = np.asarray(counts, dtype=np.float64)
    layers, experts = table.shape
    if not 0 <= per_layer <= experts:
        raise MapError(f"--top {per_layer}: must be in 0..{experts} (GPU experts per layer)")
    moe_layers = int(table.any(axis=1).sum())
    order = _placement_order(table)[: per_layer * moe_layers]
    hot: list[list[int]] = [[] for _ in range(layers)]
    for position in sorted(int(p) for p in order):
        hot[position // experts].append(position % experts)
    return hot


def separate_ties(counts: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """The counts as a placement file holds them: float32 (KT compares in float32), every
    MoE-row value distinct and in :func:`frequency_hot`'s order, each raised by the fewest
    float32 steps that make it so. Any engine's top N is then the harness's top N, whatever its
    tie rule and for every N: KT's global ``torch.topk(sorted=False)``, SGLang's per-layer
    sort. A count under the smallest normal float32 (a zero, or a decayed count float32 rounds
    away) is raised to it, above a dense row's zeros, which stay 0. A count moves by a float32
    step (a relative 1.2e-7) per position it ties with."""
    table = np.asarray(counts, dtype=np.float64)
    order = _placement_order(table)
    values = table.reshape(-1)[order].astype(np.float32)
    written = np.empty_like(values)
    up = np.float32(np.inf)
    step = np.finfo(np.float32).tiny  # the least the coldest MoE position may hold
    for index in range(len(order) - 1, -1, -1):  # coldest first
        written[index] = max(values[index], step)
        step = np.nextafter(written[index], up)
    out = np.zeros(table.size, dtype=np.float32)
    out[order] = written
    return out.reshape(table.shape)


def cut_ties(counts: npt.ArrayLike, hot: Sequence[Sequence[int]]) -> int:
    """How many of ``hot``'s experts tie, as KT compares them (float32), with a position left
    out of it, dense rows included: KT's ``torch.topk`` breaks such ties its own way, so it may
    place others than :func:`frequency_hot` scored. 0 for a file :func:`separate_ties` wrote."""
    table = np.asarray(counts, dtype=np.float64).astype(np.float32)
    keep = np.zeros(table.shape, dtype=bool)
    for layer, ids in enumerate(hot):
        keep[layer, list(ids)] = True
    if keep.all() or not keep.any():
        return 0
    return int((table[keep] <= table[~keep].max()).sum())


def fit_top_k(counts: npt.ArrayLike, top_k: int) -> list[list[int]]:
    """Top ``top_k`` experts of each layer by count (ties: lower id), ids ascending."""
    table = np.asarray(counts, dtype=np.float64)
    if not 1 <= top_k <= table.shape[1]:
        raise MapError(f"--top {top_k}: must be in 1..{table.shape[1]} (experts per layer)")
    return fit_rowmap(table, top_k)


def fit_hotlist_entries(counts: npt.ArrayLike, records: int) -> list[HotlistEntry]:
    """Global top ``records`` (layer, expert) pairs as hotlist rows (hits = rounded counts)."""
    if records < 1:
        raise MapError(f"--hotlist {records}: must be a positive number of records")
    table = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64)
    return fit_hotlist(table, records)


@dataclass(frozen=True)
class Coverage:
    """Offline coverage of a map on one trace's decode selections."""

    trace: str
    covered: int
    selections: int
    per_layer: FloatArray  # share covered per layer
    in_sample: bool = False

    @property
    def share(self) -> float:
        """Covered ÷ all decode selections."""
        return self.covered / self.selections if self.selections else 0.0

    @property
    def worst_layer(self) -> int:
        """The layer with the lowest coverage."""
        return int(np.argmin(self.per_layer))

    def text(self) -> str:
        """One line: ``TRACE: covered 6,925 of 16,512 selections (41.94%); worst layer ...``."""
        label = " [in-sample]" if self.in_sample else ""
        worst = self.worst_layer
        return (
            f"{self.trace}{label}: covered {self.covered:,} of {self.selections:,} selections "
            f"({100 * self.share:.2f}%); worst layer {worst} "
            f"({100 * float(self.per_layer[worst]):.2f}%)"
        )


def coverage(
    trace: Trace,
    *,
    hot: Sequence[Sequence[int]] | None = None,
    records: Sequence[tuple[int, int]] | None = None,
    in_sample: bool = False,
) -> Coverage:
    """Decode selections of ``trace`` covered by a rowmap's ``hot`` sets or hotlist ``records``."""
    layers, experts = trace.layers, trace.experts_count
    keep = np.zeros((layers, experts), dtype=bool)
    if hot is not None and trace.moe_layers is not None and len(hot) == trace.model_layers:
        hot = [hot[layer] for layer in trace.moe_layers]  # the map's rows of the routed layers
    if hot is not None:
        if len(hot) != layers:
            raise MapError(f"the map has {len(hot)} layers, {trace.path} has {layers}")
        for layer, ids in enumerate(hot):
            keep[layer, [i for i in ids if 0 <= i < experts]] = True
    elif records is not None:
        for layer, expert in records:
            if 0 <= layer < layers and 0 <= expert < experts:
                keep[layer, expert] = True
    else:
        raise MapError("coverage needs hot sets or hotlist records")
    chosen = trace.experts[~trace.prefill].astype(np.int64)
    rows = np.arange(layers)[None, :, None]
    hit = keep[rows, chosen]  # [tokens, layers, top_k]
    per_layer_hits = hit.sum(axis=(0, 2))
    per_layer_all = np.full(layers, chosen.shape[0] * trace.top_k)
    share = per_layer_hits / np.maximum(per_layer_all, 1)
    return Coverage(
        trace.path, int(hit.sum()), int(chosen.size), share.astype(np.float64), in_sample
    )


def check_held_out(
    score_paths: Sequence[str], fitted_on: Sequence[tuple[str, str]], in_sample: bool
) -> list[bool]:
    """Per score path, whether it is in-sample (same path or same bytes as a fit source).

    Raises BadInput for an in-sample path unless ``in_sample`` is given.
    """
    flags = []
    for path in score_paths:
        real = os.path.realpath(path)
        digest = file_sha256(path) if os.path.isfile(path) else ""
        same = [
            src
            for src, sha in fitted_on
            if os.path.realpath(src) == real or (sha and sha == digest)
        ]
        if same and not in_sample:
            raise BadInput(
                f"{path}: the map was fitted on {same[0]} (same file or same bytes); scores on "
                "it are in-sample and do not count: score on held-out traces, or pass "
                "--in-sample to print them labelled as such"
            )
        flags.append(bool(same))
    return flags
