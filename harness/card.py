"""Campaign cards: the YAML a user writes, validated into a :class:`Card`.

Validation is two passes. The schema pass (pydantic, ``extra="forbid"``) checks shapes and types;
the semantic pass checks what needs the card as a whole or the disk: the control is a cell, files
exist, metrics and counters are known, phases name domains the pools have, and the held-out set
shares no prompt with the fit set. Every problem is reported at once, as
``file:line: path: message``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from harness.catalog import CACHE_STATES, COUNTERS, METRICS
from harness.errors import BadInput, CardError
from harness.profiles import BoxSpec, RuntimeProfile, Strict
from harness.prompts import Prompt, load_pool, normalise
from harness.yamlfile import Loc, YamlDoc, dotted, load_yaml

KnobValue = str | int | float | bool
CacheState = Literal["warm", "cold"]
_FRACTION = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_fraction(value: str | int) -> tuple[int, int | None]:
    """``"49/50"`` -> (49, 50); an int k -> (k, None) meaning "at least k"."""
    if isinstance(value, int):
        return value, None
    match = _FRACTION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not k/n")
    return int(match.group(1)), int(match.group(2))


def _check_fraction(value: str | int) -> str | int:
    k, n = parse_fraction(value)
    if n is not None and (k > n or n == 0):
        raise ValueError(f"{value!r}: k must be at most n and n positive")
    if k < 0:
        raise ValueError("k must not be negative")
    return value


class Split(Strict):
    """Which prompts of the pools form a set: those whose ``split`` field equals this."""

    split: str = Field(description="value of the prompts' `split` field")


class PromptsSpec(Strict):
    """Prompt pools and how they divide into fitting and scoring sets."""

    pools: list[str] = Field(min_length=1, description="JSONL pools, paths relative to the card")
    fit: Split | None = Field(None, description="prompts a map or hotlist may be fitted on")
    heldout: Split = Field(Split(split="heldout"), description="prompts that are scored")
    quality: str | None = Field(None, description="JSONL quality suite with `check` per prompt")


class Phase(Strict):
    """A stretch of the workload on some domains; ``shift: true`` marks a domain shift."""

    name: str = Field(description="phase name, also the ring's phase tag")
    domains: list[str] = Field(min_length=1, description="domains whose held-out prompts it uses")
    duration_s: float | None = Field(None, gt=0, description="run the phase this long")
    requests: int | None = Field(None, ge=1, description="or send this many requests")
    shift: bool = Field(False, description="a domain shift starts this phase (T90 is measured)")
    prompt_tokens: int | None = Field(
        None, ge=1, description="build each prompt to this many tokens from its domain's text"
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Phase:
        if self.duration_s is not None and self.requests is not None:
            raise ValueError("give `duration_s` or `requests`, not both")
        return self


class Workload(Strict):
    """What the driver sends in each run."""

    max_tokens: int = Field(64, ge=1, description="tokens generated per request")
    concurrency: int = Field(1, ge=1, le=64, description="concurrent requests (C1…C64)")
    warmup_requests: int = Field(1, ge=0, description="requests sent first and not scored")
    passes: int = Field(1, ge=1, description="passes over the held-out prompts when no phases")
    request_timeout_s: float = Field(300, gt=0, description="per-request timeout")
    temperature: float = Field(0.0, ge=0, description="0 = greedy, so outputs can be compared")
    phases: list[Phase] | None = Field(None, description="default: one pass over held-out prompts")

    @field_validator("phases")
    @classmethod
    def _unique_names(cls, phases: list[Phase] | None) -> list[Phase] | None:
        if phases is not None:
            names = [p.name for p in phases]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"phase names must be unique: {dupes}")
        return phases


class Cell(Strict):
    """One arm: knob settings applied to the runtime at boot (or live)."""

    description: str = Field("", description="what this cell changes")
    knobs: dict[str, KnobValue] = Field(default_factory=dict, description="named profile knobs")
    env: dict[str, KnobValue] = Field(default_factory=dict, description="raw environment")
    args: list[str] = Field(default_factory=list, description="extra command-line arguments")
    files: dict[str, str] = Field(default_factory=dict, description="knob files to upload")
    live: dict[str, KnobValue] = Field(default_factory=dict, description="live knobs after boot")


class Design(Strict):
    """The run order: mirrored cycles so drift cancels, repeats and cache states inside them."""

    order: Literal["abba", "ladder", "sequential"] = Field("abba", description="run order")
    cycles: int = Field(2, ge=1, description="mirrored cycles (ABBA, BAAB, …)")
    repeats: int = Field(1, ge=1, description="runs per block (one block = one boot of one arm)")
    cache_states: list[CacheState] = Field(["warm"], min_length=1, description="warm and/or cold")
    boot: Literal["per-block", "shared"] = Field("per-block", description="boot per block")
    seed: int = Field(0, description="seed for prompt order and synthetic prompts")
    retries: int = Field(1, ge=0, description="retries of a failed run before giving up")

    @field_validator("cache_states")
    @classmethod
    def _unique_states(cls, states: list[CacheState]) -> list[CacheState]:
        if len(set(states)) != len(states):
            raise ValueError("cache states must not repeat")
        return states


class AnalysisSpec(Strict):
    """Analysis parameters (DESIGN.md: Metrics and Statistics)."""

    window_s: float = Field(2.0, gt=0, description="cold-share window")
    margin_pct: float = Field(2.0, gt=0, description="δ: smallest effect worth calling")
    alpha: float = Field(0.05, gt=0, lt=1, description="significance level")
    converged_span_s: float = Field(10.0, gt=0, description="span whose median is converged")
    hold_s: float = Field(4.0, ge=0, description="how long a recovery must hold")


class _CellGate(Strict):
    cells: list[str] | None = Field(None, description="cells it applies to (default: all)")


class ExactOutputsGate(_CellGate):
    """Greedy outputs of each cell equal the control's on k of n held-out prompts."""

    kind: Literal["exact_outputs"]
    vs: str | None = Field(None, description="reference cell (default: the control)")
    min_match: str | int = Field("all", description="k/n, k, or 'all'")
    allow: list[str] = Field(default_factory=list, description="known-flaky prompt ids")

    @field_validator("min_match")
    @classmethod
    def _fraction(cls, value: str | int) -> str | int:
        return value if value == "all" else _check_fraction(value)


class CounterGate(_CellGate):
    """A counter delta per run stays within bounds (e.g. new swap-out pages == 0)."""

    kind: Literal["counter"]
    counter: str = Field(description="counter name")
    max: float | None = Field(None, description="upper bound (inclusive)")
    min: float | None = Field(None, description="lower bound (inclusive)")

    @model_validator(mode="after")
    def _bound(self) -> CounterGate:
        if self.max is None and self.min is None:
            raise ValueError("a counter gate needs `max` and/or `min`")
        return self


class BetterGate(_CellGate):
    """The cell is *better* than the reference on a metric, in the statistical sense."""

    kind: Literal["better"]
    metric: str = Field(description="metric name")
    vs: str | None = Field(None, description="reference cell (default: the control)")


class SurvivesGate(_CellGate):
    """The `better` results hold in every listed cache state, never averaged across them."""

    kind: Literal["survives"]
    cache_states: list[CacheState] = Field(min_length=1, description="states that must all pass")
    metrics: list[str] | None = Field(None, description="default: the metrics of better gates")


class QualityGate(_CellGate):
    """k of n quality-suite prompts pass their `check`."""

    kind: Literal["quality"]
    min_pass: str | int = Field(description="k/n or k")
    vs: str | None = Field(
        None, description="also pass at least as many prompts as this cell (no regression)"
    )

    @field_validator("min_pass")
    @classmethod
    def _fraction(cls, value: str | int) -> str | int:
        return _check_fraction(value)


class SoakGate(_CellGate):
    """A soak reached its duration with no crash, no lost ring record and a bounded tail."""

    kind: Literal["soak"]
    min_duration_s: float = Field(gt=0, description="duration the soak must reach")
    itl_p99_ms_max: float | None = Field(None, gt=0, description="inter-token p99 bound")
    rss_growth_pct_max: float | None = Field(None, ge=0, description="memory growth bound")
    max_lost_records: int = Field(0, ge=0, description="ring records allowed to be lost")


class LockstepGate(_CellGate):
    """The simulator replays recorded routing with zero divergent decisions."""

    kind: Literal["lockstep"]
    max_divergent: int = Field(0, ge=0, description="divergent decisions allowed")


Gate = Annotated[
    ExactOutputsGate
    | CounterGate
    | BetterGate
    | SurvivesGate
    | QualityGate
    | SoakGate
    | LockstepGate,
    Field(discriminator="kind"),
]
GATE_KINDS = ("exact_outputs", "counter", "better", "survives", "quality", "soak", "lockstep")


class Card(Strict):
    """A campaign: cells of knob settings, a control, an order, prompts, phases and gates."""

    campaign: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", description="name, [a-z0-9-]+")
    description: str = Field("", description="one line for the report")
    box: str | BoxSpec = Field("local", description="box name or inline box")
    runtime: str | RuntimeProfile = Field("refbox", description="profile name or inline profile")
    prompts: PromptsSpec
    workload: Workload = Field(default_factory=lambda: Workload())
    cells: dict[str, Cell] = Field(min_length=1, description="arms by name")
    control: str | None = Field(None, description="the control cell")
    design: Design = Field(default_factory=lambda: Design())
    analysis: AnalysisSpec = Field(default_factory=lambda: AnalysisSpec())
    gates: list[Gate] = Field(default_factory=list, description="promotion gates")

    @field_validator("cells")
    @classmethod
    def _cell_names(cls, cells: dict[str, Cell]) -> dict[str, Cell]:
        for name in cells:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise ValueError(f"cell name {name!r}: use letters, digits, '_', '-', '.'")
        return cells

    @property
    def treatments(self) -> list[str]:
        """Cells other than the control, in card order."""
        return [name for name in self.cells if name != self.control]


@dataclass(frozen=True)
class LoadedCard:
    """A validated card with everything it names resolved and loaded."""

    path: Path
    card: Card
    box_name: str
    box: BoxSpec
    runtime: RuntimeProfile
    prompts: tuple[Prompt, ...]
    quality: tuple[Prompt, ...]
    text: str

    @property
    def directory(self) -> Path:
        """The card's folder: relative paths in the card start here."""
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        """A path named on the card, relative to the card's folder."""
        return (self.directory / Path(relative).expanduser()).resolve()

    def split(self, which: Literal["fit", "heldout"]) -> list[Prompt]:
        """The prompts of the fit or held-out split, in pool order."""
        selector = self.card.prompts.fit if which == "fit" else self.card.prompts.heldout
        if selector is None:
            return []
        return [p for p in self.prompts if p.split == selector.split]


def display_path(path: Path) -> Path:
    """``path`` normalised, and relative to the current directory when it lies below it."""
    normal = Path(os.path.normpath(path.absolute()))
    try:
        return normal.relative_to(Path.cwd())
    except ValueError:
        return normal


def scale_workload(loaded: LoadedCard, factor: float) -> LoadedCard:
    """The card with every phase's request count and duration (and ``passes``) scaled.

    For trying a campaign at a smaller size on a laptop, or a larger one on a real box; the
    design (cycles, repeats, cache states) is left alone so the statistics keep their meaning.
    """
    if factor <= 0:
        raise BadInput(f"--scale must be positive, got {factor:g}")
    workload = loaded.card.workload
    phases = None
    if workload.phases is None and factor != 1:
        # One pass over the held-out prompts becomes a phase of a scaled number of requests.
        heldout = loaded.split("heldout")
        domains = sorted({p.domain for p in heldout})
        count = max(1, round(len(heldout) * workload.passes * factor))
        phases = [Phase(name="main", domains=domains, requests=count)]
    elif workload.phases is not None:
        phases = [
            phase.model_copy(
                update={
                    "requests": None
                    if phase.requests is None
                    else max(1, round(phase.requests * factor)),
                    "duration_s": None
                    if phase.duration_s is None
                    else max(1.0, phase.duration_s * factor),
                }
            )
            for phase in workload.phases
        ]
    passes = max(1, round(workload.passes * factor))
    scaled = workload.model_copy(update={"phases": phases, "passes": passes})
    card = loaded.card.model_copy(update={"workload": scaled})
    return dataclasses.replace(loaded, card=card)


_M = TypeVar("_M", bound=BaseModel)


# ---- name resolution -------------------------------------------------------------------------

PACKAGE_DATA = Path(__file__).resolve().parent / "data"


def search_path(card_dir: Path) -> list[Path]:
    """Where box and runtime names resolve: beside the card, ./campaigns, then the package."""
    roots = [card_dir, Path.cwd() / "campaigns", PACKAGE_DATA]
    unique: list[Path] = []
    for root in roots:
        resolved = root.resolve()
        if resolved not in unique:
            unique.append(resolved)
    return unique


def find_runtime_profile(name: str, card_dir: Path) -> Path | None:
    """The first ``runtimes/<name>.yaml`` along the search path."""
    for root in search_path(card_dir):
        candidate = root / "runtimes" / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None


def known_runtime_names(card_dir: Path) -> list[str]:
    """Every profile name reachable from ``card_dir``."""
    names: set[str] = set()
    for root in search_path(card_dir):
        names.update(p.stem for p in (root / "runtimes").glob("*.yaml"))
    return sorted(names)


def _load_model(path: Path, model: type[_M], what: str) -> _M:
    """Parse a YAML file into ``model``, every problem as ``file:line: field: message``."""
    doc = load_yaml(path)
    if doc.problems:
        raise CardError(f"{path}: invalid {what}", doc.problems)
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise CardError(f"{path}: invalid {what}", _pydantic_problems(exc, doc, model)) from None


def load_runtime_profile(path: Path) -> RuntimeProfile:
    """Read and validate a runtime profile file."""
    return _load_model(path, RuntimeProfile, "runtime profile")


def load_boxes_file(path: Path) -> dict[str, BoxSpec]:
    """The boxes of one ``boxes.yaml``, every problem reported as ``file:line: box.field``."""
    doc = load_yaml(path)
    problems = list(doc.problems)
    if not isinstance(doc.data, dict):
        raise CardError(f"{path}: must map box names to box settings")
    boxes: dict[str, BoxSpec] = {}
    for name, raw in doc.data.items():
        try:
            boxes[str(name)] = BoxSpec.model_validate(raw)
        except ValidationError as exc:
            problems.extend(_pydantic_problems(exc, doc, BoxSpec, prefix=(name,)))
    if problems:
        raise CardError(f"{path}: invalid boxes file", problems)
    return boxes


def load_boxes(card_dir: Path) -> dict[str, BoxSpec]:
    """Every named box along the search path; earlier files win over later ones."""
    boxes: dict[str, BoxSpec] = {}
    for root in reversed(search_path(card_dir)):
        path = root / "boxes.yaml"
        if path.is_file():
            boxes.update(load_boxes_file(path))
    return boxes


# ---- pydantic errors to file:line messages -----------------------------------------------------


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(_unwrap(arg))
        return out
    return [annotation]


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that owns the fields at ``loc`` (for did-you-mean on unknown keys)."""
    current: list[Any] = [root]
    for part in loc:
        following: list[Any] = []
        for candidate in current:
            origin = typing.get_origin(candidate)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                field = candidate.model_fields.get(str(part))
                if field is not None:
                    following.extend(_unwrap(field.annotation))
            elif origin in (list, dict):
                following.extend(_unwrap(typing.get_args(candidate)[-1]))
        current = following
    models = [c for c in current if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None


def _data_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Drop pydantic's union tags from ``loc`` so it names a real place in the YAML."""
    out: list[str | int] = []
    current = data
    for part in loc:
        in_dict = isinstance(current, dict) and part in current
        in_list = isinstance(current, list) and isinstance(part, int) and part < len(current)
        if in_dict or in_list:
            current = current[part]
            out.append(part)
        elif isinstance(current, dict) and isinstance(part, str) and not _looks_like_tag(part):
            # A missing field; union tags (`better`, `str`, `BoxSpec`) are skipped.
            out.append(part)
        # anything else is a tag pydantic added; skip it
    return tuple(out)


def _looks_like_tag(part: str) -> bool:
    return part in GATE_KINDS or part[:1].isupper() or part in ("str", "int", "float", "bool")


def _pydantic_problems(
    exc: ValidationError, doc: YamlDoc, model: type[BaseModel], prefix: Loc = ()
) -> list[str]:
    problems: list[str] = []
    seen: set[tuple[Loc, str]] = set()
    data_root: Any = doc.data
    for part in prefix:
        data_root = data_root[part]
    for error in exc.errors(include_url=False):
        loc = _data_loc(error["loc"], data_root)
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            message = "unknown key"
            if owner is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(owner.model_fields), n=1)
                if close:
                    message += f"; did you mean `{close[0]}`?"
                else:
                    message += f"; allowed: {', '.join(owner.model_fields)}"
        elif error["type"] == "union_tag_invalid":
            message = f"unknown gate kind; must be one of {', '.join(GATE_KINDS)}"
        elif error["type"] == "union_tag_not_found":
            message = f"missing `kind`; one of {', '.join(GATE_KINDS)}"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        key = (loc, message)
        if key in seen:
            continue
        seen.add(key)
        full = (*prefix, *loc)
        problems.append(f"{doc.path}:{doc.line_of(full)}: {dotted(full)}: {message}")
    return problems


# ---- the semantic pass -------------------------------------------------------------------------


class _Problems:
    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.lines: list[str] = []

    def add(self, loc: Loc, message: str) -> None:
        self.lines.append(f"{self.doc.path}:{self.doc.line_of(loc)}: {dotted(loc)}: {message}")


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(options) or 'none'}"


def _resolve_box(card: Card, card_dir: Path, out: _Problems) -> tuple[str, BoxSpec | None]:
    if isinstance(card.box, BoxSpec):
        return card.box.host or "inline", card.box
    try:
        boxes = load_boxes(card_dir)
    except CardError as exc:
        out.lines.extend(exc.lines())
        return card.box, None
    if card.box not in boxes:
        if card.box == "local":
            return "local", BoxSpec()
        out.add(("box",), f"unknown box {card.box!r}{_did_you_mean(card.box, sorted(boxes))}")
        return card.box, None
    return card.box, boxes[card.box]


def _resolve_runtime(card: Card, card_dir: Path, out: _Problems) -> RuntimeProfile | None:
    if isinstance(card.runtime, RuntimeProfile):
        return card.runtime
    path = find_runtime_profile(card.runtime, card_dir)
    if path is None:
        names = known_runtime_names(card_dir)
        out.add(
            ("runtime",), f"unknown runtime {card.runtime!r}{_did_you_mean(card.runtime, names)}"
        )
        return None
    try:
        return load_runtime_profile(path)
    except CardError as exc:
        out.lines.extend(exc.lines())
        return None


def _check_cells(
    card: Card, runtime: RuntimeProfile | None, card_dir: Path, out: _Problems
) -> None:
    if card.control is not None and card.control not in card.cells:
        out.add(
            ("control",),
            f"control {card.control!r} is not a cell"
            + _did_you_mean(card.control, list(card.cells)),
        )
    if card.control is None and card.design.order in ("abba", "ladder"):
        out.add(("control",), f"order {card.design.order!r} needs a `control` cell")
    if card.design.order in ("abba", "ladder") and len(card.cells) < 2:
        out.add(("cells",), f"order {card.design.order!r} needs the control and at least one cell")
    for name, cell in card.cells.items():
        for key, rel in cell.files.items():
            if not (card_dir / Path(rel).expanduser()).is_file():
                out.add(("cells", name, "files", key), f"file not found: {rel} (relative to card)")
        if runtime is None:
            continue
        for key in cell.files:
            if key not in runtime.files:
                known = sorted(runtime.files)
                out.add(
                    ("cells", name, "files", key),
                    f"runtime {runtime.name!r} takes no file knob {key!r}"
                    + _did_you_mean(key, known),
                )
        for knob, value in cell.knobs.items():
            spec = runtime.knobs.get(knob)
            if spec is None:
                known = sorted(runtime.knobs)
                out.add(
                    ("cells", name, "knobs", knob),
                    f"runtime {runtime.name!r} has no knob {knob!r}{_did_you_mean(knob, known)}",
                )
                continue
            problem = spec.check(_knob_text(value))
            if problem:
                out.add(("cells", name, "knobs", knob), problem)
        for var, value in cell.env.items():
            declared = runtime.knob_for_env(var)
            if declared is not None:
                problem = declared[1].check(_knob_text(value))
                if problem:
                    out.add(("cells", name, "env", var), problem)
        for knob, value in cell.live.items():
            live_specs = {s.live: s for s in runtime.knobs.values() if s.live}
            if runtime.telemetry.live_knobs_http is None:
                out.add(("cells", name, "live"), f"runtime {runtime.name!r} has no live knobs")
                break
            spec_for_live = live_specs.get(knob)
            if spec_for_live is None:
                out.add(
                    ("cells", name, "live", knob),
                    f"unknown live knob{_did_you_mean(knob, sorted(live_specs))}",
                )
                continue
            problem = spec_for_live.check(_knob_text(value))
            if problem:
                out.add(("cells", name, "live", knob), problem)


def _knob_text(value: KnobValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _check_gates(card: Card, out: _Problems) -> None:
    cells = list(card.cells)
    for index, gate in enumerate(card.gates):
        loc: Loc = ("gates", index)
        for cell in gate.cells or []:
            if cell not in card.cells:
                out.add((*loc, "cells"), f"unknown cell {cell!r}{_did_you_mean(cell, cells)}")
        vs = getattr(gate, "vs", None)
        if vs is not None and vs not in card.cells:
            out.add((*loc, "vs"), f"unknown cell {vs!r}{_did_you_mean(vs, cells)}")
        if isinstance(gate, ExactOutputsGate | BetterGate) and vs is None and not card.control:
            out.add((*loc, "vs"), "no control on the card: name the reference cell with `vs`")
        if isinstance(gate, BetterGate) and vs is not None and vs != card.control:
            out.add(
                (*loc, "vs"),
                f"comparisons are made against the control ({card.control!r}); "
                "drop `vs` or make that cell the control",
            )
        if isinstance(gate, BetterGate) and gate.metric not in METRICS:
            out.add((*loc, "metric"), f"unknown metric{_did_you_mean(gate.metric, list(METRICS))}")
        if isinstance(gate, SurvivesGate):
            for metric in gate.metrics or []:
                if metric not in METRICS:
                    out.add(
                        (*loc, "metrics"), f"unknown metric{_did_you_mean(metric, list(METRICS))}"
                    )
            missing = [s for s in gate.cache_states if s not in card.design.cache_states]
            if missing:
                out.add(
                    (*loc, "cache_states"),
                    f"{missing} not in design.cache_states {card.design.cache_states}: "
                    "add them there or the gate cannot pass",
                )
        if isinstance(gate, CounterGate) and gate.counter not in COUNTERS:
            out.add(
                (*loc, "counter"), f"unknown counter{_did_you_mean(gate.counter, list(COUNTERS))}"
            )
        if isinstance(gate, QualityGate) and card.prompts.quality is None:
            out.add(loc, "a quality gate needs `prompts.quality` (a pool with `check` per prompt)")


def _check_prompts(card: Card, card_dir: Path, out: _Problems) -> tuple[list[Prompt], list[Prompt]]:
    prompts: list[Prompt] = []
    for index, rel in enumerate(card.prompts.pools):
        path = display_path(card_dir / Path(rel).expanduser())
        if not path.is_file():
            out.add(("prompts", "pools", index), f"prompt pool not found: {rel} (relative to card)")
            continue
        try:
            prompts.extend(load_pool(path))
        except BadInput as exc:
            out.lines.extend(exc.lines())
    quality: list[Prompt] = []
    if card.prompts.quality is not None:
        path = display_path(card_dir / Path(card.prompts.quality).expanduser())
        if not path.is_file():
            out.add(("prompts", "quality"), f"quality pool not found: {card.prompts.quality}")
        else:
            try:
                quality = load_pool(path)
            except BadInput as exc:
                out.lines.extend(exc.lines())
            for prompt in quality:
                if prompt.check is None:
                    out.lines.append(
                        f"{prompt.source}: quality prompt {prompt.id!r} has no `check`"
                    )
    if not prompts:
        return prompts, quality
    seen_ids: dict[str, str] = {}
    for prompt in prompts:
        if prompt.id in seen_ids:
            out.add(("prompts", "pools"), f"prompt id {prompt.id!r} in two pools")
        seen_ids[prompt.id] = prompt.source
    heldout = [p for p in prompts if p.split == card.prompts.heldout.split]
    if not heldout:
        out.add(("prompts", "heldout"), f"no prompt has split {card.prompts.heldout.split!r}")
    if card.prompts.fit is not None:
        fit = [p for p in prompts if p.split == card.prompts.fit.split]
        if not fit:
            out.add(("prompts", "fit"), f"no prompt has split {card.prompts.fit.split!r}")
        fit_texts = {normalise(p.text): p for p in fit}
        for prompt in heldout:
            twin = fit_texts.get(normalise(prompt.text))
            if twin is not None:
                out.add(
                    ("prompts", "heldout"),
                    f"held-out prompt {prompt.id!r} ({prompt.source}) is the same text as fit "
                    f"prompt {twin.id!r} ({twin.source}): scores on it would be in-sample",
                )
    domains = sorted({p.domain for p in heldout})
    for index, phase in enumerate(card.workload.phases or []):
        for domain in phase.domains:
            if domain not in domains:
                out.add(
                    ("workload", "phases", index, "domains"),
                    f"no held-out prompt of domain {domain!r}{_did_you_mean(domain, domains)}",
                )
    return prompts, quality


def validate_card(doc: YamlDoc) -> LoadedCard:
    """Validate a parsed card document; raise CardError listing every problem."""
    problems = _Problems(doc)
    problems.lines.extend(doc.problems)
    if not isinstance(doc.data, dict):
        raise CardError(
            f"{doc.path}: a card is a YAML mapping", [f"{doc.path}:1: must be a mapping"]
        )
    try:
        card = Card.model_validate(doc.data)
    except ValidationError as exc:
        problems.lines.extend(_pydantic_problems(exc, doc, Card))
        raise CardError(f"{doc.path}: invalid card", problems.lines) from None
    card_dir = doc.path.resolve().parent
    box_name, box = _resolve_box(card, card_dir, problems)
    runtime = _resolve_runtime(card, card_dir, problems)
    _check_cells(card, runtime, card_dir, problems)
    _check_gates(card, problems)
    prompts, quality = _check_prompts(card, card_dir, problems)
    if problems.lines or box is None or runtime is None:
        raise CardError(f"{doc.path}: invalid card", problems.lines)
    return LoadedCard(
        path=doc.path.resolve(),
        card=card,
        box_name=box_name,
        box=box,
        runtime=runtime,
        prompts=tuple(prompts),
        quality=tuple(quality),
        text=doc.path.read_text(encoding="utf-8"),
    )


def load_card(path: Path) -> LoadedCard:
    """Parse and validate the card at ``path``."""
    return validate_card(load_yaml(path))


__all__ = ["CACHE_STATES", "Card", "Cell", "LoadedCard", "load_card", "validate_card"]


def read_card_schema(path: Path) -> Card:
    """The card of a campaign directory, schema-checked only (its files may live elsewhere)."""
    return _load_model(path, Card, "card")
