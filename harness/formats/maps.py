"""Rowmaps, hotlists and route-count dumps, in the real runtimes' own formats.

See docs/design.md#maps-hotlists-and-count-dumps.

* Rowmap JSON (seed 000's CUDA lane): per layer a ``hot`` and a ``cold`` list that must
  partition 0..E-1, plus free-form ``meta``.
* ds4 expert hotlist text (seed 004's Metal lane): a ``# ds4 expert hotlist v1`` header and
  ``layer expert hits weight`` rows, sorted by hits then weight, descending.
* Route-count dump JSON: cumulative counts per layer and the dump's epoch time.

A map fitted here boots there unchanged, and their history reads here. Files we write are
replaced atomically (temp file + ``os.replace``), because runtimes poll some of them.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import MapError
from harness.formats.safe_write import write_text_atomic
from harness.formats.textfile import parse_json, read_text

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "HOTLIST_MAGIC",
    "CountDump",
    "Hotlist",
    "Rowmap",
    "fit_hotlist",
    "fit_rowmap",
    "read_count_dump",
    "read_count_snapshot",
    "read_hotlist",
    "read_rowmap",
    "write_count_dump",
    "write_hotlist",
    "write_rowmap",
]

HOTLIST_MAGIC = "# ds4 expert hotlist v1"
_HOTLIST_COLUMNS = "# columns: layer expert hits weight"
_HOTLIST_INT_KEYS = ("layers", "experts", "layer_records", "selections")

HotlistEntry = tuple[int, int, int, float]
_MAX_COUNT = 2**63  # counts are int64 on both sides


@dataclass(frozen=True)
class Rowmap:
    """Hot expert ids per layer (file order kept), the expert count, and the map's ``meta``."""

    hot: list[list[int]]
    experts: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hotlist:
    """A ds4 hotlist: ``(layer, expert, hits, weight)`` rows in file (= preload rank) order."""

    entries: list[HotlistEntry]
    layers: int
    experts: int
    model: str = ""
    layer_records: int = 0
    selections: int = 0


@dataclass(frozen=True)
class CountDump:
    """A route-count snapshot: cumulative int64 counts ``[layers, experts]`` and its epoch time."""

    counts: npt.NDArray[np.int64]
    time_s: float


def _write_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_text_atomic(Path(path), text)


def _load_json(path: str | os.PathLike[str]) -> Any:
    name = os.fspath(path)
    return parse_json(read_text(name, MapError, "map"), name, MapError)


def _layer_table(name: str, document: Any) -> list[Any]:
    """The ``layers`` object as a list indexed by layer, checking the keys are 0..L-1."""
    if not isinstance(document, dict) or not isinstance(document.get("layers"), dict):
        raise MapError(f"{name}: expected a JSON object with a 'layers' object")
    layers: dict[str, Any] = document["layers"]
    if not layers:
        raise MapError(f"{name}: 'layers' is empty")
    expected = [str(index) for index in range(len(layers))]
    if sorted(layers, key=lambda key: (len(key), key)) != expected:
        raise MapError(f'{name}: layer keys must be "0".."{len(layers) - 1}", got {sorted(layers)}')
    return [layers[key] for key in expected]


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _partition_problems(hot: Sequence[Any], cold: Sequence[Any], experts: int) -> list[str]:
    problems: list[str] = []
    listed = [*hot, *cold]
    not_ids = [value for value in listed if not _is_id(value)]
    if not_ids:
        return [f"ids {not_ids} are not integers"]
    outside = sorted({value for value in listed if not 0 <= value < experts})
    if outside:
        problems.append(f"ids {outside} are not in 0..{experts - 1}")
    both = sorted(set(hot) & set(cold))
    if both:
        problems.append(f"ids {both} are both hot and cold")
    repeated = sorted({value for value, n in Counter(listed).items() if n > 1} - set(both))
    if repeated:
        problems.append(f"ids {repeated} are listed twice")
    missing = sorted(set(range(experts)) - set(listed))
    if missing:
        problems.append(f"ids {missing} are neither hot nor cold")
    return problems


def read_rowmap(path: str | os.PathLike[str], *, experts: int | None = None) -> Rowmap:
    """Read a rowmap; every layer's hot and cold must partition 0..E-1 or it is refused.

    ``experts`` defaults to the size of layer 0's partition; pass it to check the model's.
    """
    name = os.fspath(path)
    document = _load_json(name)
    table = _layer_table(name, document)
    meta = document.get("meta", {})
    if not isinstance(meta, dict):
        raise MapError(f"{name}: 'meta' must be an object")
    hot_sets: list[list[int]] = []
    problems: list[str] = []
    for layer, entry in enumerate(table):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("hot"), list)
            or not isinstance(entry.get("cold"), list)
        ):
            raise MapError(f"{name}: layer {layer}: expected an object with 'hot' and 'cold' lists")
        hot, cold = entry["hot"], entry["cold"]
        if experts is None:
            experts = len(hot) + len(cold)
        for problem in _partition_problems(hot, cold, experts):
            problems.append(f"{name}: layer {layer}: {problem}")
        hot_sets.append(list(hot))
    if problems:
        raise MapError(
            f"{name}: hot and cold do not partition the experts of every layer", problems
        )
    assert experts is not None  # set from layer 0: the table is never empty
    return Rowmap(hot=hot_sets, experts=experts, meta=meta)


def write_rowmap(
    path: str | os.PathLike[str],
    hot: Sequence[Sequence[int]],
    experts: int,
    meta: dict[str, Any] | None = None,
) -> None:
    """Write a rowmap: hot ids in the given order, cold = the rest ascending."""
    name = os.fspath(path)
    layers: dict[str, dict[str, list[int]]] = {}
    problems: list[str] = []
    for layer, ids in enumerate(hot):
        hot_ids = [int(value) for value in ids]
        cold_ids = sorted(set(range(experts)) - set(hot_ids))
        for problem in _partition_problems(hot_ids, cold_ids, experts):
            problems.append(f"{name}: layer {layer}: {problem}")
        layers[str(layer)] = {"hot": hot_ids, "cold": cold_ids}
    if problems:
        raise MapError(f"{name}: refusing to write an invalid rowmap", problems)
    body = {"layers": layers, "meta": dict(meta or {})}
    _write_atomic(name, json.dumps(body, separators=(",", ":")) + "\n")


def read_hotlist(path: str | os.PathLike[str]) -> Hotlist:
    """Read a ds4 hotlist, rows in file order; zero-hit rows are skipped, as ds4 does."""
    name = os.fspath(path)
    lines = read_text(name, MapError, "hotlist").splitlines()
    if not lines or lines[0].strip() != HOTLIST_MAGIC:
        raise MapError(f"{name}:1: expected the header line {HOTLIST_MAGIC!r}")
    header: dict[str, str] = {}
    rows: list[tuple[int, list[str]]] = []
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            key, _, value = line[1:].strip().partition(" ")
            header[key.rstrip(":")] = value.strip()
            continue
        rows.append((number, line.split()))
    values: dict[str, int] = {}
    for key in _HOTLIST_INT_KEYS:
        text = header.get(key)
        if key in ("layers", "experts") and text is None:
            raise MapError(f"{name}: missing header line '# {key} <N>'")
        try:
            values[key] = int(text) if text is not None else 0
        except ValueError:
            raise MapError(
                f"{name}: header '# {key}' is not an integer: {str(text)[:24]!r}"
            ) from None
    layers, experts = values["layers"], values["experts"]
    entries: list[HotlistEntry] = []
    for number, tokens in rows:
        where = f"{name}:{number}"
        if len(tokens) != 4:
            raise MapError(
                f"{where}: expected 'layer expert hits weight', got {len(tokens)} fields"
            )
        try:
            layer, expert, hits = int(tokens[0]), int(tokens[1]), int(tokens[2])
            weight = float(tokens[3])
        except ValueError:
            shown = [token[:24] for token in tokens]
            raise MapError(f"{where}: expected integers and a number, got {shown}") from None
        if not 0 <= layer < layers or not 0 <= expert < experts:
            raise MapError(
                f"{where}: (layer {layer}, expert {expert}) is outside "
                f"{layers} layers x {experts} experts"
            )
        if hits < 0 or not math.isfinite(weight) or weight < 0:
            raise MapError(f"{where}: hits and weight must be >= 0, got {hits} and {weight}")
        if hits == 0:
            continue
        entries.append((layer, expert, hits, weight))
    return Hotlist(
        entries=entries,
        layers=layers,
        experts=experts,
        model=header.get("model", ""),
        layer_records=values["layer_records"],
        selections=values["selections"],
    )


def write_hotlist(
    path: str | os.PathLike[str],
    entries: Sequence[HotlistEntry],
    layers: int,
    experts: int,
    model: str = "refbox",
    *,
    layer_records: int | None = None,
    selections: int | None = None,
) -> None:
    """Write a ds4 hotlist, rows sorted by hits then weight, descending (ties by layer, expert).

    ``selections`` defaults to the sum of hits and ``layer_records`` to the number of rows.
    """
    name = os.fspath(path)
    for index, (layer, expert, hits, weight) in enumerate(entries):
        if not (0 <= layer < layers and 0 <= expert < experts) or hits < 0 or weight < 0:
            raise MapError(
                f"{name}: entry {index} ({layer}, {expert}, {hits}, {weight}) is outside "
                f"{layers} layers x {experts} experts or negative"
            )
    ordered = sorted(entries, key=lambda row: (-row[2], -row[3], row[0], row[1]))
    lines = [
        HOTLIST_MAGIC,
        f"# model {model}",
        f"# layers {layers}",
        f"# experts {experts}",
        f"# layer_records {len(ordered) if layer_records is None else layer_records}",
        f"# selections {sum(row[2] for row in ordered) if selections is None else selections}",
        _HOTLIST_COLUMNS,
    ]
    lines.extend(f"{layer} {expert} {hits} {weight:.6g}" for layer, expert, hits, weight in ordered)
    _write_atomic(name, "\n".join(lines) + "\n")


def read_count_snapshot(path: str | os.PathLike[str]) -> CountDump:
    """Read a route-count dump with its time (per-phase counts are differences of two)."""
    import numpy as np  # here, so reading a map (as validate does) needs no numpy

    name = os.fspath(path)
    document = _load_json(name)
    table = _layer_table(name, document)
    widths = {len(row) if isinstance(row, list) else -1 for row in table}
    if len(widths) != 1 or -1 in widths or 0 in widths:
        raise MapError(f"{name}: every layer must hold a non-empty list of the same length")
    if not all(_is_id(value) and 0 <= value < _MAX_COUNT for row in table for value in row):
        raise MapError(
            f"{name}: counts must be non-negative integers below 2^63 (int64, as the runtime "
            "keeps them)"
        )
    time_s = document.get("time")
    if isinstance(time_s, bool) or not isinstance(time_s, int | float) or abs(time_s) > 1e300:
        raise MapError(f"{name}: 'time' must be an epoch time in seconds, got {time_s!r}")
    return CountDump(counts=np.array(table, dtype=np.int64), time_s=float(time_s))


def read_count_dump(path: str | os.PathLike[str]) -> npt.NDArray[np.int64]:
    """Read a route-count dump's counts, int64 ``[layers, experts]``."""
    return read_count_snapshot(path).counts


def write_count_dump(path: str | os.PathLike[str], counts: npt.ArrayLike, time_s: float) -> None:
    """Write a route-count dump atomically (temp file + ``os.replace``), as the lane does."""
    import numpy as np

    table = np.asarray(counts)
    if table.ndim != 2 or table.size == 0 or (table < 0).any():
        raise MapError(
            f"{os.fspath(path)}: counts must be a non-empty non-negative [layers, experts] array"
        )
    body = {
        "layers": {str(layer): row for layer, row in enumerate(table.astype(np.int64).tolist())},
        "time": float(time_s),
    }
    _write_atomic(path, json.dumps(body, separators=(",", ":")) + "\n")


def fit_rowmap(counts: npt.ArrayLike, hot_slots: int) -> list[list[int]]:
    """Top ``hot_slots`` experts of each layer by count (ties: lower id), ids ascending."""
    import numpy as np

    table = np.asarray(counts)
    if table.ndim != 2 or not 0 <= hot_slots <= table.shape[1]:
        raise MapError(
            f"fit_rowmap: need counts [layers, experts] and 0 <= hot_slots <= experts, "
            f"got shape {list(table.shape)} and hot_slots={hot_slots}"
        )
    # A stable sort of -count keeps ascending ids among equal counts.
    order = np.argsort(-table, axis=1, kind="stable")[:, :hot_slots]
    return [sorted(row) for row in order.tolist()]


def fit_hotlist(counts: npt.ArrayLike, records: int) -> list[HotlistEntry]:
    """Global top ``records`` (layer, expert) pairs by count, as hotlist rows in file order.

    weight = the pair's share of its layer's selections. Zero counts are never listed; ties go
    to the higher weight, then the lower (layer, expert).
    """
    import numpy as np

    table = np.asarray(counts, dtype=np.int64)
    if table.ndim != 2 or records < 0:
        raise MapError(
            f"fit_hotlist: need counts [layers, experts] and records >= 0, "
            f"got shape {list(table.shape)} and records={records}"
        )
    totals = table.sum(axis=1, keepdims=True)
    weights = table / np.where(totals == 0, 1, totals)
    layer_ids, expert_ids = np.nonzero(table > 0)
    hits = table[layer_ids, expert_ids]
    shares = weights[layer_ids, expert_ids]
    # lexsort: last key is primary -> hits desc, weight desc, layer asc, expert asc.
    order = np.lexsort((expert_ids, layer_ids, -shares, -hits))[:records]
    return [(int(layer_ids[i]), int(expert_ids[i]), int(hits[i]), float(shares[i])) for i in order]
