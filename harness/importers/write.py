"""``harness import FORMAT FILES… --map MAPPING -o DIR``: a campaign directory from results files.

The directory has the layout ``harness run`` writes (docs/design.md#run-records), so
``analyze``, ``gate`` and ``report`` read it unchanged: ``card.yaml`` (made from the mapping:
its cells, control, cycles, analysis and gates), ``plan.json`` (one run per file, in the
mirrored order the files say), ``journal.jsonl``, and per run ``run.json`` (box, the block's
boot identity, the build the file names, the source's path and SHA-256), ``requests.parquet``
and ``chunks.parquet`` (the file's per-request rows, or none), an empty ``counters.json``, and
``imported.json``: the tool's own figures by catalog metric, the field each came from, and
whether the block is summary-only. An ``IMPORTED`` marker and ``sources/`` (a copy of every
file) make it self-contained.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.errors import CardError, RecordError, ResultFileError
from harness.formats.lock import LOCK_FILE, campaign_lock
from harness.formats.records import (
    RUN_OK,
    SCHEMA_VERSION,
    CampaignDir,
    RunRecord,
    write_json_atomic,
    write_parquet,
    write_text_atomic,
)
from harness.formats.safe_write import copy_file_atomic
from harness.importers.aiperf import read_aiperf
from harness.importers.common import SourceBlock
from harness.importers.ds4 import read_ds4
from harness.importers.knee import read_knee
from harness.importers.llamabench import read_llama_bench, read_llama_bench_blocks
from harness.importers.mapping import (
    Assigned,
    FileEntry,
    ImportMapping,
    assign_files,
    gate_metrics,
    load_mapping,
)
from harness.importers.sglang import read_sglang
from harness.importers.tables import Selector
from harness.importers.vllm import read_vllm

__all__ = ["FORMATS", "ImportResult", "import_results", "read_source"]

Reader = Callable[[Path, Selector], SourceBlock]


def _no_select(reader: Callable[[Path], SourceBlock], name: str) -> Reader:
    def read(path: Path, select: Selector) -> SourceBlock:
        if select:
            raise CardError(f"select: the {name} format has one record per file; drop `select`")
        return reader(path)

    return read


FORMATS: dict[str, Reader] = {
    "vllm": _no_select(read_vllm, "vllm"),
    "ds4": read_ds4,
    "llama-bench": read_llama_bench,
    "aiperf": _no_select(read_aiperf, "aiperf"),
    "sglang": read_sglang,
    "knee": read_knee,
}

_REQUEST_DTYPES = {
    "request": "int64", "cell": "object", "prompt_id": "object", "domain": "object",
    "phase": "object", "phase_index": "int64", "warmup": "bool", "ok": "bool",
    "error": "object", "first_after_boot": "bool", "t_start_s": "float64",
    "scheduling_delay_s": "float64", "ttft_s": "float64", "e2el_s": "float64",
    "completion_tokens": "int64", "prompt_tokens": "float64", "n_chunks": "int64",
    "output_text": "object", "output_sha256": "object",
}  # fmt: skip
_CHUNK_DTYPES = {"request": "int64", "chunk": "int64", "t_s": "float64", "chars": "int64"}


def read_source(fmt: str, path: Path, select: Selector | None = None) -> SourceBlock:
    """Read one results file of ``fmt``; an unknown format is bad input naming the choices."""
    reader = FORMATS.get(fmt)
    if reader is None:
        raise ResultFileError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    return reader(path, select or {})


@dataclass
class ImportResult:
    """What was written."""

    root: Path
    runs: int
    cycles: int
    summary_only: int


@dataclass(frozen=True)
class _Placed:
    assigned: Assigned
    block: SourceBlock
    comparison: str


def _empty(dtypes: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({k: pd.Series([], dtype=v) for k, v in dtypes.items()})


def _typed(frame: pd.DataFrame | None, dtypes: dict[str, str]) -> pd.DataFrame:
    if frame is None or frame.empty:
        return _empty(dtypes)
    return frame.astype({k: v for k, v in dtypes.items() if k in frame.columns})


def _cells(mapping: ImportMapping, assigned: list[Assigned], where: Path) -> list[str]:
    names = [mapping.control] + [n for n in mapping.cells if n != mapping.control]
    for item in assigned:
        if item.entry.cell not in names:
            names.append(item.entry.cell)
    if not any(a.entry.cell == mapping.control for a in assigned):
        raise CardError(f"{where}: control: no file is of cell {mapping.control!r}")
    if len(names) < 2:
        raise CardError(f"{where}: every file is of the control; an A/B needs another cell")
    return names


def _comparison(entry: Any, control: str, treatments: list[str], where: Path, path: Path) -> str:
    if entry.cell != control:
        return str(entry.cell)
    if entry.comparison is not None:
        if entry.comparison not in treatments:
            raise CardError(f"{path}: comparison {entry.comparison!r} is not a treatment cell")
        return str(entry.comparison)
    if len(treatments) == 1:
        return treatments[0]
    raise CardError(
        f"{path}: a control block in a ladder needs `comparison` (the treatment it was run "
        f"against), in {where}'s files or as a (?P<comparison>…) group"
    )


def _patterns(placed: list[_Placed], control: str) -> dict[tuple[int, str, str], str]:
    """ABBA or BAAB per (cycle, cache state, comparison), checked slot by slot."""
    groups: dict[tuple[int, str, str], dict[int, set[str]]] = {}
    for item in placed:
        e = item.assigned.entry
        groups.setdefault((e.cycle, e.cache_state, item.comparison), {}).setdefault(
            e.slot, set()
        ).add(e.cell)
    out: dict[tuple[int, str, str], str] = {}
    for (cycle, state, comparison), slots in sorted(groups.items()):
        name = f"cycle {cycle} ({state}, {comparison} vs {control})"
        lacking = [s for s in range(4) if s not in slots]
        if lacking:
            raise CardError(
                f"{name}: slot(s) {', '.join(map(str, lacking))} have no file; a mirrored "
                "cycle needs all four (ABBA or BAAB)"
            )
        mixed = [s for s, cells in slots.items() if len(cells) > 1]
        if mixed:
            raise CardError(f"{name}: slot {mixed[0]} holds files of {sorted(slots[mixed[0]])}")
        arms = "".join("A" if slots[s] == {control} else "B" for s in range(4))
        if arms not in ("ABBA", "BAAB"):
            raise CardError(
                f"{name}: the order is {arms}; the statistics need mirrored cycles, ABBA or BAAB "
                "(each cancels linear drift)"
            )
        out[(cycle, state, comparison)] = arms
    return out


def _card_text(mapping: ImportMapping, cells: list[str], fmt: str, cycles: int, repeats: int,
               states: list[str]) -> str:  # fmt: skip
    card: dict[str, Any] = {
        "campaign": mapping.campaign,
        "description": mapping.description or f"imported from {fmt} results",
        "box": mapping.box,
        "runtime": mapping.runtime,
        # No prompts were sent by the harness; the schema wants a pool, the report then reads
        # prompt counts from the recorded requests.
        "prompts": {"pools": [f"(imported {fmt} results: no prompt pool)"]},
        "cells": {c: {"description": mapping.cells.get(c, "")} for c in cells},
        "control": mapping.control,
        "design": {
            "order": "abba",
            "cycles": cycles,
            "repeats": repeats,
            "cache_states": states,
            # What the tool did, as the mapping declares it (a share of 1 when it washed out:
            # the requests are not ours to count).
            "washout": 1 if mapping.washout_requests else 0,
        },
        "analysis": mapping.analysis.model_dump(mode="json"),
        "gates": [g.model_dump(mode="json", exclude_none=True) for g in mapping.gates],
    }
    header = f"# written by harness import {fmt}: the card these results are read as\n"
    return header + yaml.safe_dump(card, sort_keys=False)


def _cell_name(field: str, value: str) -> str:
    """``n_cpu_moe-16``: a cell named by the field and its value, in a cell name's characters."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{field}-{value}")


def _split_files(
    mapping: ImportMapping, fmt: str, files: list[Path], field: str, where: Path
) -> list[tuple[Assigned, SourceBlock]]:
    """Every file's blocks by ``field``, in the files' order, four to a mirrored cycle: one file
    of ``llama-bench -ncmoe 0,16,16,0``, or two of ``-ncmoe 0,16`` and ``-ncmoe 16,0``."""
    if fmt != "llama-bench":
        raise CardError(f"--cells-by splits llama-bench files; a {fmt} file holds one arm")
    if mapping.files is not None or mapping.pattern is not None:
        raise CardError(
            f"{where}: with --cells-by the files' order places their blocks (four a cycle); "
            "drop `files` and `pattern`"
        )
    blocks = [
        (path, value, load, block)
        for path in files
        for value, load, block in read_llama_bench_blocks(path, field, mapping.select)
    ]
    if len(blocks) % 4:
        values = ", ".join(value for _, value, _, _ in blocks)
        raise CardError(
            f"--cells-by {field}: {len(blocks)} blocks ({values}); a mirrored cycle is four, "
            "e.g. llama-bench -ncmoe 0,16,16,0 (or -ncmoe 0,16 then 16,0), so give a multiple "
            "of four"
        )
    out: list[tuple[Assigned, SourceBlock]] = []
    for first in range(0, len(blocks), 4):
        group = blocks[first : first + 4]
        cells = [_cell_name(field, value) for _, value, _, _ in group]
        others = [c for c in cells if c != mapping.control]
        for slot, ((path, _, load, block), cell) in enumerate(zip(group, cells, strict=True)):
            entry = FileEntry(
                cell=cell,
                cycle=first // 4,
                slot=slot,
                comparison=others[0] if cell == mapping.control and others else None,
                boot=f"{fmt}:{block.sha256[:16]}:load{load}",
            )
            out.append((Assigned(path, entry), block))
    return out


def _check_failures(block: SourceBlock, allowed: float) -> None:
    """Fail closed on a file whose tool says requests failed: its figures then measure the
    requests that survived (200 errored requests once gated PASS on the rest)."""
    if block.failed <= 0:
        return
    sent = block.sent if block.sent and block.sent >= block.failed else None
    share = block.failed / sent if sent else 1.0
    if share <= allowed:
        block.notes.append(
            f"{block.failed} of {sent} requests failed ({block.failed_field}), within the "
            f"mapping's allow_failed {allowed:g}"
        )
        return
    of = f" of {sent}" if sent else ""
    raise ResultFileError(
        f"{block.path}: {block.failed}{of} requests failed or were cancelled "
        f"({block.failed_field}): its figures would measure only the requests that survived; "
        "rerun it, or set allow_failed in the mapping to the share you accept"
    )


def import_results(
    fmt: str, files: list[Path], mapping_path: Path, out: Path, *, cells_by: str | None = None
) -> ImportResult:
    """Read ``files`` as ``fmt``, place them by the mapping, and write the campaign at ``out``.

    With ``cells_by`` (llama-bench), each file's tests are split into blocks at every change of
    that field; a block's cell is ``FIELD-VALUE`` and every four blocks, in the files' order,
    are one mirrored cycle.
    """
    mapping = load_mapping(mapping_path)
    if fmt not in FORMATS:
        raise ResultFileError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    _check_out(out)
    names = [p.name for p in files]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CardError(f"files named alike ({', '.join(dupes)}): the mapping places by name")
    split = _split_files(mapping, fmt, files, cells_by, mapping_path) if cells_by else None
    if split is not None:
        assigned = [item for item, _ in split]
    else:
        assigned = assign_files(mapping, files, mapping_path)
    cells = _cells(mapping, assigned, mapping_path)
    treatments = [c for c in cells if c != mapping.control]
    needed = gate_metrics(mapping)
    placed: list[_Placed] = []
    for index, item in enumerate(assigned):
        if split is not None:
            block = split[index][1]
        else:
            block = read_source(fmt, item.path, mapping.select)
        _check_magnitudes(block)
        _check_failures(block, mapping.allow_failed)
        for metric in needed:
            if not block.provides(metric):
                raise ResultFileError(
                    f"{item.path}: {block.missing_field(metric)}: missing; the mapping's gate on "
                    f"{metric} needs it"
                )
        comparison = _comparison(item.entry, mapping.control, treatments, mapping_path, item.path)
        placed.append(_Placed(item, block, comparison))
    patterns = _patterns(placed, mapping.control)
    states: list[str] = sorted(
        {p.assigned.entry.cache_state for p in placed}, key=["warm", "cold"].index
    )
    cycles = max(p.assigned.entry.cycle for p in placed) + 1
    repeats = max(p.assigned.entry.repeat for p in placed) + 1
    seen: set[tuple[int, str, str, int, int]] = set()
    for p in placed:
        e = p.assigned.entry
        key = (e.cycle, e.cache_state, p.comparison, e.slot, e.repeat)
        if key in seen:
            raise CardError(
                f"{p.assigned.path}: a second file for cycle {e.cycle} slot {e.slot} repeat "
                f"{e.repeat}; give repeats distinct `repeat` numbers"
            )
        seen.add(key)
    placed.sort(
        key=lambda p: (
            p.assigned.entry.cycle,
            states.index(p.assigned.entry.cache_state),
            treatments.index(p.comparison),
            p.assigned.entry.slot,
            p.assigned.entry.repeat,
        )
    )
    out.mkdir(parents=True, exist_ok=True)
    with campaign_lock(out):
        _check_out(out)  # again, now that no other import can be writing into it
        _write(out, mapping, fmt, placed, patterns, cells, cycles, repeats, states)
    return ImportResult(out, len(placed), cycles, sum(p.block.summary_only for p in placed))


# What a run can measure: a figure outside it (1e308 tok/s, a denormal) is a damaged file, and
# would overflow the statistics (a ratio of 1e308 to 300 has no logarithm's exponential).
_FIGURE_RANGE = (1e-9, 1e9)
_SECONDS_MAX = 1e7  # a request or a token time: under four months


def _check_magnitudes(block: SourceBlock) -> None:
    low, high = _FIGURE_RANGE
    for metric, value in block.metrics.items():
        if value != 0 and not low <= abs(value) <= high:
            field = block.fields.get(metric, metric)
            raise ResultFileError(
                f"{block.path}: {field}: {value!r} is outside what a run measures ({low:g} to "
                f"{high:g}); the file is damaged"
            )
    tables = (
        (block.requests, ("ttft_s", "e2el_s")),
        (block.chunks, ("t_s",)),
    )
    for frame, columns in tables:
        if frame is None:
            continue
        for column in columns:
            if column in frame.columns and (frame[column].abs() > _SECONDS_MAX).any():
                raise ResultFileError(
                    f"{block.path}: {column}: a time over {_SECONDS_MAX:g} s; the file is damaged"
                )


def _check_out(out: Path) -> None:
    """``-o`` must be a new or empty folder: an import never writes over what is there. A
    symlink is judged by the folder it points to (it once let an import into a full one)."""
    if (out / "plan.json").exists():
        raise RecordError(f"{out}: already holds a campaign; pick an empty -o folder")
    if out.is_symlink() and not out.exists():
        raise RecordError(f"{out}: a symlink to nothing; give a new or empty folder itself")
    if out.is_dir() and any(p.name != LOCK_FILE for p in out.resolve().iterdir()):
        raise RecordError(
            f"{out}: not empty; an import writes a whole campaign directory and never over "
            "files already there: pick a new or empty -o folder"
        )


def _write(
    out: Path,
    mapping: ImportMapping,
    fmt: str,
    placed: list[_Placed],
    patterns: dict[tuple[int, str, str], str],
    cells: list[str],
    cycles: int,
    repeats: int,
    states: list[str],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        out / "card.yaml", _card_text(mapping, cells, fmt, cycles, repeats, list(states))
    )
    runs: list[dict[str, Any]] = []
    for index, p in enumerate(placed):
        e = p.assigned.entry
        pattern = patterns[(e.cycle, e.cache_state, p.comparison)]
        run_id = f"{index:04d}-{e.cell}-c{e.cycle}-{e.cache_state}-s{e.slot}-r{e.repeat}"
        runs.append(
            {
                "run_id": run_id, "cell": e.cell, "cycle": e.cycle, "slot": e.slot,
                "repeat": e.repeat, "cache_state": e.cache_state, "box": mapping.box,
                "pattern": pattern, "arm": pattern[e.slot], "comparison": p.comparison,
                "block": f"c{e.cycle}-{e.cache_state}-{p.comparison}-s{e.slot}",
            }
        )  # fmt: skip
    plan = {"schema_version": SCHEMA_VERSION, "campaign": mapping.campaign, "scale": 1.0,
            "cycles": cycles, "estimated_total_s": 0.0, "runs": runs}  # fmt: skip
    write_json_atomic(out / "plan.json", plan)
    sources = out / "sources"
    sources.mkdir(exist_ok=True)
    lines = [f"imported by harness import {fmt}: no runtime was booted by the harness"]
    campaign = CampaignDir(out)
    campaign.journal.append("campaign_start", campaign=mapping.campaign, runs=len(runs),
                            imported=fmt)  # fmt: skip
    for run, p in zip(runs, placed, strict=True):
        block = p.block
        copy_file_atomic(block.path, sources / block.path.name)
        lines.append(f"{block.path.name} sha256 {block.sha256} -> {run['run_id']}")
        run_dir = campaign.run_dir(run["run_id"])
        requests = block.requests.assign(cell=run["cell"]) if block.requests is not None else None
        write_parquet(_typed(requests, _REQUEST_DTYPES), run_dir / "requests.parquet")
        write_parquet(_typed(block.chunks, _CHUNK_DTYPES), run_dir / "chunks.parquet")
        write_json_atomic(run_dir / "counters.json", {"before": {}, "after": {}, "delta": {}})
        source = {
            "format": fmt,
            "path": str(block.path.resolve()),
            "copy": f"sources/{block.path.name}",
            "sha256": block.sha256,
            "summary_only": block.summary_only,
            "metrics": block.metrics,
            "fields": block.fields,
            "identity": block.identity,
            "notes": block.notes,
        }
        write_json_atomic(run_dir / "imported.json", source)
        mtime = block.path.stat().st_mtime
        version = block.identity.get("build_commit") or block.identity.get("version")
        record = RunRecord(
            **{
                k: run[k]
                for k in (
                    "run_id",
                    "cell",
                    "cycle",
                    "slot",
                    "repeat",
                    "cache_state",
                    "pattern",
                    "comparison",
                    "block",
                )
            },
            status=RUN_OK,
            reason=f"imported from {fmt}: {block.path.name}",
            box=mapping.box,
            boot_id=p.assigned.entry.boot or f"{fmt}:{block.sha256[:16]}",
            runtime={
                "name": mapping.runtime,
                "version": str(version) if version is not None else None,
                "imported": fmt,
                "source": block.path.name,
                "source_sha256": block.sha256,
                "identity": block.identity,
                "washout_requests": mapping.washout_requests,
            },
            started_at=mtime,
            ended_at=mtime,
        )
        write_json_atomic(run_dir / "run.json", record.to_json())
        campaign.journal.append("run_done", run_id=run["run_id"])
    write_text_atomic(out / "IMPORTED", "\n".join(lines) + "\n")
    for path in [out / "IMPORTED", *sorted(sources.iterdir())]:
        campaign.journal.seal_file(path)
    campaign.journal.append("campaign_end", done=len(runs), failed=0)
