"""The import mapping: which results file is which cell, cycle and slot, the control, the gates.

A small YAML file, validated like a card (pydantic with ``extra="forbid"``, every problem as
``file:line: field: message``)::

    campaign: rowmap-ab              # the campaign name the directory and history use
    box: gh200-a                     # where the results were measured (compare refuses others)
    control: stale
    pattern: '(?P<cell>stale|seed)-c(?P<cycle>\\d+)-s(?P<slot>\\d)\\.json'
    # or, file by file (keyed by file name):
    # files: {a1.json: {cell: stale, cycle: 0, slot: 0}, ...}
    select: {ctx_tokens: 8192}       # table formats: keep the rows with these values
    analysis: {margin_pct: 2}
    gates: [{kind: better, metric: decode_tok_s}]

With ``harness import --cells-by FIELD`` neither ``files`` nor ``pattern`` is given: the files'
order places their blocks (see :func:`harness.importers.write.import_results`).

A pattern fullmatches each file's name; its named groups are ``cell``, ``cycle`` and ``slot``,
and optionally ``repeat``, ``state`` (warm/cold), ``comparison`` (which treatment a control block
was run against, in a ladder) and ``boot`` (the boot identity; default: one boot per file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from harness.card.checks import Problems
from harness.card.locate import pydantic_problems
from harness.card.schema import AnalysisSpec, BetterGate, CacheState, Gate, SurvivesGate
from harness.catalog import METRICS
from harness.errors import CardError
from harness.formats.textfile import compile_pattern
from harness.formats.yamlfile import load_yaml
from harness.profiles.base import Strict

__all__ = ["Assigned", "FileEntry", "ImportMapping", "assign_files", "load_mapping"]

Scalar = str | int | float | bool
_GROUPS = ("cell", "cycle", "slot")
_OPTIONAL = ("repeat", "state", "comparison", "boot")
_IMPORTABLE_GATES = ("better", "survives", "regression")


class FileEntry(Strict):
    """Where one results file sits in the mirrored order."""

    cell: str = Field(description="the arm the file measured")
    cycle: int = Field(ge=0, le=100_000, description="mirrored cycle, from 0")
    slot: int = Field(ge=0, le=3, description="position 0..3 in the cycle (ABBA or BAAB)")
    repeat: int = Field(0, ge=0, le=1000, description="repeat within the block")
    cache_state: CacheState = Field("warm", description="warm or cold")
    comparison: str | None = Field(None, description="the treatment this cycle compares")
    boot: str | None = Field(None, description="boot identity (default: one boot per file)")


class ImportMapping(Strict):
    """What ``harness import`` needs to know that the files themselves do not say."""

    campaign: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", description="name, [a-z0-9-]+")
    description: str = Field("", description="one line for the report")
    box: str = Field("imported", description="the machine the results were measured on")
    runtime: str = Field("imported", description="the runtime's name, for the record")
    control: str = Field(description="the control cell")
    cells: dict[str, str] = Field(default_factory=dict, description="cell -> description")
    files: dict[str, FileEntry] | None = Field(None, description="file name -> its place")
    pattern: str | None = Field(None, description="regex over file names, named groups")
    select: dict[str, Scalar] = Field(default_factory=dict, description="rows to keep")
    allow_failed: float = Field(
        0.0,
        ge=0,
        le=0.5,
        description="the share of a file's requests that may have failed or been cancelled "
        "(the tool's own count); 0: a file with any failed request is refused",
    )
    washout_requests: int = Field(
        0,
        ge=0,
        le=10**6,
        description="requests of each block's own cell the tool sent and did not score before "
        "it measured (declare it when every file's run began so): the blocks then read as "
        "washed; 0 (none known) leaves carry-over to the crossover model",
    )
    analysis: AnalysisSpec = Field(default_factory=lambda: AnalysisSpec())
    gates: list[Gate] = Field(default_factory=list, description="promotion gates")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:
            compiled = compile_pattern(pattern)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        lacking = [g for g in _GROUPS if g not in compiled.groupindex]
        if lacking:
            raise ValueError(f"needs the named groups {', '.join(f'(?P<{g}>…)' for g in lacking)}")
        extra = set(compiled.groupindex) - set(_GROUPS) - set(_OPTIONAL)
        if extra:
            raise ValueError(
                f"unknown group(s) {', '.join(sorted(extra))}; allowed: "
                f"{', '.join(_GROUPS + _OPTIONAL)}"
            )
        return pattern

    @model_validator(mode="after")
    def _one_way(self) -> ImportMapping:
        # Neither is allowed: `harness import --cells-by FIELD` places rows by the files' order.
        if self.files is not None and self.pattern is not None:
            raise ValueError("give `files` or `pattern` (one of them) to place the files")
        return self


@dataclass(frozen=True)
class Assigned:
    """One results file and its place."""

    path: Path
    entry: FileEntry


def load_mapping(path: Path) -> ImportMapping:
    """Parse and check a mapping; every problem at once as ``file:line: field: message``."""
    doc = load_yaml(path)
    if doc.problems:
        raise CardError(f"{path}: invalid import mapping", doc.problems)
    if not isinstance(doc.data, dict):
        raise CardError(f"{path}: invalid import mapping", [f"{path}:1: must be a mapping"])
    try:
        mapping = ImportMapping.model_validate(doc.data)
    except ValidationError as exc:
        lines = pydantic_problems(exc, doc, ImportMapping)
        raise CardError(f"{path}: invalid import mapping", lines) from None
    problems = Problems(doc)
    for index, gate in enumerate(mapping.gates):
        if gate.kind not in _IMPORTABLE_GATES:
            problems.add(
                ("gates", index, "kind"),
                f"{gate.kind!r} needs what imported results do not hold (outputs, counters, a "
                f"ring); an import may gate on {', '.join(_IMPORTABLE_GATES)}",
            )
        for metric in _gate_metrics(gate):
            if metric not in METRICS:
                problems.add(("gates", index), f"unknown metric {metric!r}")
    for name, entry in (mapping.files or {}).items():
        for cell in (entry.cell, entry.comparison):
            if cell is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", cell):
                problems.add(("files", name, "cell"), f"cell name {cell!r}: use [A-Za-z0-9_.-]")
    if problems.lines:
        raise CardError(f"{path}: invalid import mapping", problems.lines)
    return mapping


def _gate_metrics(gate: Gate) -> list[str]:
    if isinstance(gate, BetterGate):
        return [gate.metric]
    if isinstance(gate, SurvivesGate):
        return list(gate.metrics or [])
    metric = getattr(gate, "metric", None)
    return [metric] if isinstance(metric, str) else []


def gate_metrics(mapping: ImportMapping) -> list[str]:
    """Every metric a gate of the mapping decides on (survives defaults to the better ones)."""
    found: list[str] = []
    for gate in mapping.gates:
        for metric in _gate_metrics(gate):
            if metric not in found:
                found.append(metric)
    return found


def assign_files(mapping: ImportMapping, paths: list[Path], where: Path) -> list[Assigned]:
    """Each file's place, by name in ``files`` or by ``pattern``; unplaced files are errors."""
    out: list[Assigned] = []
    problems: list[str] = []
    if mapping.files is None and mapping.pattern is None:
        raise CardError(
            f"{where}: give `files` or `pattern` to place the files (or split llama-bench files "
            "into cells with --cells-by FIELD)"
        )
    if mapping.files is not None:
        by_name = {Path(k).name: v for k, v in mapping.files.items()}
        used: set[str] = set()
        for path in paths:
            entry = by_name.get(path.name)
            if entry is None:
                problems.append(f"{path}: not in {where}'s `files`; add it, or leave it out")
                continue
            used.add(path.name)
            out.append(Assigned(path, entry))
        unused = sorted(set(by_name) - used)
        if unused:
            problems.append(f"{where}: files: {', '.join(unused)}: named but not given")
    else:
        assert mapping.pattern is not None
        regex = compile_pattern(mapping.pattern)
        for path in paths:
            match = regex.fullmatch(path.name)
            if match is None:
                problems.append(f"{path}: its name does not match {where}'s `pattern`")
                continue
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            try:
                entry = FileEntry(
                    cell=groups["cell"],
                    cycle=int(groups["cycle"]),
                    slot=int(groups["slot"]),
                    repeat=int(groups.get("repeat", 0)),
                    cache_state=groups.get("state", "warm"),
                    comparison=groups.get("comparison"),
                    boot=groups.get("boot"),
                )
            except (ValidationError, ValueError) as exc:
                problems.append(f"{path}: pattern groups do not fit: {str(exc).splitlines()[-1]}")
                continue
            out.append(Assigned(path, entry))
    if problems:
        raise CardError(f"{where}: files do not fit the mapping", problems)
    return out
