"""The semantic pass over a schema-valid card: what needs the card as a whole or the disk.

The control is a cell, files and pools exist, knob, env and live values are valid for the
runtime profile, metrics, counters and gate references are known, phases name domains the pools
have, and the held-out set shares no prompt text with the fit set. Each check adds its findings
to :class:`Problems` instead of raising, so the user sees every problem at once.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from harness.card.inputs import Locator
from harness.card.resolve import (
    find_runtime_profile,
    known_runtime_names,
    load_boxes_file,
    load_boxes_with_sources,
    load_runtime_profile,
)
from harness.card.schema import (
    CONFIRMABLE_KINDS,
    BetterGate,
    Card,
    Cell,
    CounterGate,
    ExactOutputsGate,
    KnobValue,
    QualityGate,
    RegressionGate,
    SoakGate,
    SurvivesGate,
)
from harness.catalog import COUNTERS, METRICS, RING_ONLY
from harness.errors import BadInput, CardError
from harness.formats.prompts import Prompt, load_pool, normalise
from harness.formats.yamlfile import Loc, YamlDoc, dotted
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile


class Problems:
    """The problems found in one card document, each as ``file:line: path: message``."""

    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.lines: list[str] = []

    def add(self, loc: Loc, message: str) -> None:
        """Record ``message`` at the line of ``loc`` in the card."""
        self.lines.append(f"{self.doc.path}:{self.doc.line_of(loc)}: {dotted(loc)}: {message}")


def display_path(path: Path) -> Path:
    """``path`` normalised, and relative to the current directory when it lies below it."""
    normal = Path(os.path.normpath(path.absolute()))
    try:
        return normal.relative_to(Path.cwd())
    except ValueError:
        return normal


def _is_file(where: Locator, rel: str) -> bool:
    """Whether the path ``rel``, as written on the card, names a file.

    A name no file system takes (a NUL byte, too long, an unknown ``~user``) is no file: the
    caller reports it as not found instead of letting pathlib's error out.
    """
    try:
        return where.path(rel).is_file()
    except (OSError, ValueError, RuntimeError):
        return False


# Files made by a command rather than shipped: (file knob, suffix) -> the command, so a missing
# one says how to make it. "" matches any knob or suffix.
_MADE_BY = {
    ("", ".gguf"): "the tiny test MoE is made with `harness make-gguf -o {path} --seed 1` "
    "(or point the card at a real GGUF model)",
    ("rowmap", ""): "fit one with `harness collect CARD --split fit -o fit/` and "
    "`harness fit-map fit/counts.json --top K -o {path}`",
    ("hotlist", ""): "fit one with `harness collect CARD --split fit -o fit/` and "
    "`harness fit-map fit/counts.json --hotlist N -o {path}`",
}


def _missing_file(key: str, rel: str, card_dir: Path) -> str:
    """The message for a cell's missing file, with the command that makes it when we know one."""
    message = f"file not found: {rel} (relative to card)"
    suffix = Path(rel).suffix.lower()
    for (knob, ending), how in _MADE_BY.items():
        if knob in ("", key) and ending in ("", suffix):
            return f"{message}; {how.format(path=display_path(card_dir / rel))}"
    return message


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(options) or 'none'}"


def _resolve_one(
    entry: str | BoxSpec, field: tuple[str | int, ...], index: int, where: Locator, out: Problems
) -> tuple[str, BoxSpec | None, Path | None]:
    if isinstance(entry, BoxSpec):
        return (
            entry.name or entry.host or ("inline" if index == 0 else f"inline-{index + 1}"),
            entry,
            None,
        )
    try:
        if where.boxes_file is not None:
            boxes = {n: (b, where.boxes_file) for n, b in load_boxes_file(where.boxes_file).items()}
        else:
            boxes = load_boxes_with_sources(where.card_dir)
    except CardError as exc:
        out.lines.extend(exc.lines())
        return entry, None, None
    if entry not in boxes:
        if entry == "local":
            return "local", BoxSpec(), None
        out.add(field, f"unknown box {entry!r}{_did_you_mean(entry, sorted(boxes))}")
        return entry, None, None
    box, source = boxes[entry]
    return entry, box, source


def resolve_fleet(
    card: Card, where: Locator, out: Problems
) -> list[tuple[str, BoxSpec, Path | None]]:
    """Every box of the card, named, in order: its ``boxes`` list, or its one ``box``.

    Empty (with the problems in ``out``) when any of them is unknown, two share a name, the
    card sets both ``box`` and ``boxes``, or named boxes come from two boxes files (a campaign
    directory keeps one copy of the file its boxes came from).
    """
    if card.boxes is None:
        name, box, source = _resolve_one(card.box, ("box",), 0, where, out)
        return [(name, box, source)] if box is not None else []
    if "box" in card.model_fields_set:
        out.add(("box",), "a card names its boxes once: `box` or `boxes`, not both; delete `box`")
        return []
    fleet: list[tuple[str, BoxSpec, Path | None]] = []
    failed = False
    for index, entry in enumerate(card.boxes):
        name, box, source = _resolve_one(entry, ("boxes", index), index, where, out)
        if box is None:
            failed = True
            continue
        if any(name == seen for seen, _, _ in fleet):
            out.add(
                ("boxes", index),
                f"box {name!r} is listed twice; a fleet runs each box once (to use one machine "
                "twice, define two boxes with their own names)",
            )
            failed = True
            continue
        fleet.append((name, box, source))
    files = sorted({str(source) for _, _, source in fleet if source is not None})
    if len(files) > 1:
        out.add(
            ("boxes",),
            f"the named boxes come from {len(files)} boxes files ({', '.join(files)}); define "
            "them in one boxes.yaml, or inline on the card",
        )
        failed = True
    return [] if failed else fleet


def check_confirm(card: Card, fleet: list[str], where: Locator, out: Problems) -> None:
    """``confirm.box`` names a known box other than the campaign's own, and the card has a gate
    it can confirm: a confirmation on the same box is not independent, and one with nothing to
    confirm would only look like a safeguard."""
    if card.confirm is None:
        return
    box = card.confirm.box
    if box in fleet:
        out.add(
            ("confirm", "box"),
            f"box {box!r} runs this campaign; a confirmation must come from a second, "
            "independent box: name another",
        )
    if not any(gate.kind in CONFIRMABLE_KINDS for gate in card.gates):
        out.add(
            ("confirm",),
            "no gate to confirm: confirmation applies to better, survives and regression "
            "gates; add one or delete `confirm`",
        )
    if where.frozen or box == "local":
        return  # checked when the campaign was run
    try:
        if where.boxes_file is not None:
            known = sorted(load_boxes_file(where.boxes_file))
        else:
            known = sorted(load_boxes_with_sources(where.card_dir))
    except CardError:
        return  # the card's own box reports the boxes file's problems
    if box not in known:
        out.add(("confirm", "box"), f"unknown box {box!r}{_did_you_mean(box, known)}")


def resolve_runtime(
    card: Card, where: Locator, out: Problems
) -> tuple[RuntimeProfile | None, Path | None]:
    """The runtime profile and the file it came from (None for an inline profile); the profile
    None (and a problem) when it is unknown or invalid."""
    if isinstance(card.runtime, RuntimeProfile):
        return card.runtime, None
    path = where.runtime_file or find_runtime_profile(card.runtime, where.card_dir)
    if path is None:
        names = known_runtime_names(where.card_dir)
        out.add(
            ("runtime",), f"unknown runtime {card.runtime!r}{_did_you_mean(card.runtime, names)}"
        )
        return None, None
    try:
        return load_runtime_profile(path), path
    except CardError as exc:
        out.lines.extend(exc.lines())
        return None, path


def check_shared_boot(card: Card, runtime: RuntimeProfile | None, out: Problems) -> None:
    """Cells that share a boot (``design.boot`` per-cycle or per-campaign) differ only in what
    the runtime takes live: a knob with a ``live`` key, a file knob in ``live.files``, ``live:``
    values. Anything else differs at boot only, so it is reported at its line."""
    if runtime is None:
        return
    for loc, message in shared_boot_problems(card, runtime):
        out.add(loc, message)


def shared_boot_problems(card: Card, runtime: RuntimeProfile) -> list[tuple[Loc, str]]:
    """Why the cells of ``card`` cannot share a boot as its ``design.boot`` says, each at the
    card field it is about; empty when they can (or each run boots its own)."""
    design = card.design
    found: list[tuple[Loc, str]] = []

    def add(loc: Loc, message: str) -> None:
        found.append((loc, message))

    if design.boot == "per-block":
        return found
    where: Loc = ("design", "boot")
    if runtime.driver is not None:
        add(where, f"runtime {runtime.name!r} is a command driver: there is no boot to share")
        return found
    if runtime.live_apply() is None:
        add(
            where,
            f"runtime {runtime.name!r} declares no live contract (`live:` in its profile), so "
            f"cells cannot share a boot; use boot: per-block",
        )
        return found
    if any(p.duration_s is not None for p in card.workload.phases or []):
        add(where, "a checkpointed soak (a timed phase) boots its runs alone: use per-block")
    reference = card.control if card.control in card.cells else next(iter(card.cells), None)
    if reference is None:
        return found
    live_files = runtime.live.files if runtime.live is not None else {}
    fix = (
        f"cells sharing a boot (design.boot: {design.boot}) may differ only in what runtime "
        f"{runtime.name!r} takes live; use design.boot: per-block"
    )

    def defaults(cell: Cell) -> dict[str, str]:
        values = {n: s.default for n, s in runtime.knobs.items() if s.default is not None}
        values.update({n: _knob_text(v) for n, v in cell.knobs.items()})
        return values

    base = card.cells[reference]
    base_knobs = defaults(base)
    applied = {check.knob for check in runtime.telemetry.applied}
    for name, cell in card.cells.items():
        if name == reference:
            continue
        knobs = defaults(cell)
        for knob in sorted(set(knobs) | set(base_knobs)):
            spec = runtime.knobs.get(knob)
            if spec is None or knobs.get(knob) == base_knobs.get(knob):
                continue
            if spec.live and (knob not in knobs or knob not in base_knobs):
                # Live, but unset in one cell: after a reset that cell would run on whatever
                # the boot's first cell set, not on the runtime's own default.
                unset = name if knob not in knobs else reference
                owner = reference if unset == name else name
                add(
                    ("cells", owner, "knobs", knob),
                    f"{knob} is live but {unset} leaves it unset (the profile gives no "
                    f"default): on a shared boot {unset} would run on the value the boot "
                    f"started with; set {knob} in every cell (design.boot: {design.boot})",
                )
                continue
            if spec.live and knob in applied:
                # The applied-policy line is printed at boot: on a shared boot it would describe
                # the boot's first cell, and a build that ignored the change would pass.
                add(
                    ("cells", name if knob in cell.knobs else reference, "knobs", knob),
                    f"{knob} differs between {name} and {reference} and the profile checks it "
                    f"from the line the runtime logs at boot (telemetry.applied), which a live "
                    f"change does not reprint: on a shared boot the check could not see it; "
                    f"use design.boot: per-block",
                )
                continue
            if spec.live:
                continue
            owner = name if knob in cell.knobs else reference
            add(
                ("cells", owner, "knobs", knob),
                f"{knob} is {knobs.get(knob, 'unset')} in {name} and "
                f"{base_knobs.get(knob, 'unset')} in {reference}, and it is not live (no `live:` "
                f"key in the profile): {fix}, or declare it live",
            )
        for key in sorted(set(cell.files) | set(base.files)):
            if cell.files.get(key) == base.files.get(key):
                continue
            if key in live_files and f"files.{key}" in applied:
                add(
                    ("cells", name if key in cell.files else reference, "files", key),
                    f"file knob {key} differs from {reference}'s and the profile checks it from "
                    f"the line the runtime logs at boot (telemetry.applied), which a live "
                    f"change does not reprint; use design.boot: per-block",
                )
                continue
            if key in live_files:
                continue
            owner = name if key in cell.files else reference
            add(
                ("cells", owner, "files", key),
                f"file knob {key} differs from {reference}'s and is not live (not in the "
                f"profile's live.files): {fix}",
            )
        for field, mine, theirs in (
            ("env", cell.env, base.env),
            ("args", cell.args, base.args),
        ):
            if mine != theirs:
                owner = name if mine else reference
                add(
                    ("cells", owner, field),
                    f"{field} differs from {reference}'s and only reaches a runtime at boot: {fix}",
                )
    return found


def _knob_text(value: KnobValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def check_gates(card: Card, out: Problems) -> None:
    """Gates name known cells, metrics, counters and cache states, and have what they need."""
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
        if isinstance(gate, BetterGate | RegressionGate) and gate.metric not in METRICS:
            out.add((*loc, "metric"), f"unknown metric{_did_you_mean(gate.metric, list(METRICS))}")
        if isinstance(gate, RegressionGate):
            _check_anchor(gate, loc, out)
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


def _check_anchor(gate: RegressionGate, loc: Loc, out: Problems) -> None:
    """A regression gate's fields fit what it compares with: a release, or previous campaigns
    (a field the other comparison reads would be silently ignored)."""
    if gate.release is not None and gate.against != "release":
        out.add(
            (*loc, "release"),
            "names a release, but the gate compares with the previous "
            "campaigns: add `against: release`, or drop `release`",
        )
    if gate.against == "release" and "last" in gate.model_fields_set:
        out.add(
            (*loc, "last"),
            "counts previous campaigns, but the gate compares with one "
            "release (`against: release`): drop `last`, or add a second gate for them",
        )


def check_runtime_needs(card: Card, runtime: RuntimeProfile | None, out: Problems) -> None:
    """What the design and gates need from the runtime: a ring for ring-only figures and soaks,
    files to evict for cold runs. Caught here, before any box is touched, because at run time
    the missing data would only show up as a gate that can never pass (or, worse, a 0)."""
    if runtime is None:
        return
    if "cold" in card.design.cache_states and not runtime.cache_files:
        out.add(
            ("design", "cache_states"),
            f"cold runs need the runtime's files evicted, and runtime {runtime.name!r} declares no "
            "`cache_files`: add `cache_files` (globs of the files it reads, e.g. the model) to "
            "the profile, or drop `cold`",
        )
    _check_washed_by_boot(card, runtime, out)
    unavailable = runtime.telemetry.unavailable
    for index, gate in enumerate(card.gates):
        named: list[tuple[str, str]] = []  # (field, counter or metric) the gate decides on
        if isinstance(gate, CounterGate):
            named.append(("counter", gate.counter))
        if isinstance(gate, BetterGate | RegressionGate):
            named.append(("metric", gate.metric))
        if isinstance(gate, SurvivesGate):
            named.extend(("metrics", metric) for metric in gate.metrics or [])
        for field, name in named:
            if name in unavailable:
                out.add(
                    ("gates", index, field),
                    f"{name} cannot exist in runtime {runtime.name!r}: {unavailable[name]}; "
                    "drop the gate, or use a build or profile that has it",
                )
    if runtime.telemetry.ring is not None:
        return
    needs = (
        f"needs a telemetry ring, and runtime {runtime.name!r} declares none (`telemetry.ring`): "
        "drop the gate, or use a profile whose runtime writes a ring"
    )
    for index, gate in enumerate(card.gates):
        loc: Loc = ("gates", index)
        if isinstance(gate, CounterGate) and gate.counter in RING_ONLY:
            out.add((*loc, "counter"), f"{gate.counter} {needs}")
        if isinstance(gate, BetterGate) and gate.metric in RING_ONLY:
            out.add((*loc, "metric"), f"{gate.metric} {needs}")
        if isinstance(gate, SurvivesGate):
            for metric in gate.metrics or []:
                if metric in RING_ONLY:
                    out.add((*loc, "metrics"), f"{metric} {needs}")
        if isinstance(gate, SoakGate):
            out.add(
                loc,
                "a soak gate needs a telemetry ring (duration, lost records and inter-token p99 "
                f"come from it), and runtime {runtime.name!r} declares none (`telemetry.ring`): "
                "use a profile whose runtime writes a ring",
            )


def _check_washed_by_boot(card: Card, runtime: RuntimeProfile, out: Problems) -> None:
    """A fresh boot clears the runtime, not the box: washed_by: boot stands on probes of what
    the box keeps across boots, so every cell must be read by at least one."""
    if card.design.washed_by != "boot":
        return
    loc: Loc = ("design", "washed_by")
    if runtime.driver is not None:
        out.add(loc, f"runtime {runtime.name!r} is a command driver: it has no boot of its own")
        return
    if not runtime.box_state:
        out.add(
            loc,
            f"washed_by: boot needs probes of what the box keeps across boots, and runtime "
            f"{runtime.name!r} declares none (`box_state` in its profile): add one (e.g. the "
            "page cache of its model files through fincore, a GPU's temperature through "
            "nvidia-smi), or use washed_by: washout with design.washout: 1",
        )
        return
    for name, cell in card.cells.items():
        if not runtime.probes_reading(cell.knobs):
            needs = "; ".join(f"{p.name} needs {', '.join(p.needs)}" for p in runtime.box_state)
            out.add(
                loc,
                f"no box_state probe of runtime {runtime.name!r} reads cell {name!r} ({needs}): "
                "set those knobs, or use washed_by: washout",
            )


def check_prompts(card: Card, where: Locator, out: Problems) -> tuple[list[Prompt], list[Prompt]]:
    """The pools and quality suite, loaded; ids unique, splits present and apart, phases served.

    Returns the pool prompts and the quality prompts, as far as they could be read.
    """
    prompts: list[Prompt] = []
    for index, rel in enumerate(card.prompts.pools):
        if not _is_file(where, rel):
            out.add(("prompts", "pools", index), f"prompt pool not found: {rel} (relative to card)")
            continue
        path = display_path(where.path(rel))
        try:
            prompts.extend(load_pool(path))
        except BadInput as exc:
            out.lines.extend(exc.lines())
    quality: list[Prompt] = []
    if card.prompts.quality is not None:
        if not _is_file(where, card.prompts.quality):
            out.add(("prompts", "quality"), f"quality pool not found: {card.prompts.quality}")
        else:
            path = display_path(where.path(card.prompts.quality))
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
