"""Loading a card: YAML to a :class:`LoadedCard`, through the schema and the semantic pass.

Also the card as stored in a campaign directory (schema only), and a card's workload rescaled.
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from harness.card.cell_checks import check_cells
from harness.card.checks import (
    Problems,
    check_confirm,
    check_gates,
    check_prompts,
    check_runtime_needs,
    check_shared_boot,
    resolve_fleet,
    resolve_runtime,
)
from harness.card.inputs import PATH_ROLES, InputFile, Locator
from harness.card.locate import pydantic_problems
from harness.card.resolve import load_model
from harness.card.schema import Card, Phase, build_card_schema
from harness.errors import BadInput, CardError
from harness.formats.prompts import Prompt
from harness.formats.yamlfile import YamlDoc, load_yaml
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile


@dataclass(frozen=True)
class LoadedCard:
    """A validated card with everything it names resolved and loaded."""

    path: Path
    card: Card
    box_name: str  # the card's box; a fleet's first box
    box: BoxSpec
    runtime: RuntimeProfile
    prompts: tuple[Prompt, ...]
    quality: tuple[Prompt, ...]
    text: str
    # Every file loading read (the card, pools, quality suite, cell files, the runtime profile
    # and boxes file its names resolved to): what a campaign directory freezes (card/frozen.py).
    inputs: tuple[InputFile, ...] = ()
    # A fleet's boxes by name, in the card's order; empty for a card with one box.
    fleet: tuple[tuple[str, BoxSpec], ...] = ()

    @property
    def boxes(self) -> tuple[tuple[str, BoxSpec], ...]:
        """Every box of the campaign by name: the fleet, or the one box."""
        return self.fleet or ((self.box_name, self.box),)

    @property
    def directory(self) -> Path:
        """The card's folder: relative paths in the card start here."""
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        """The file a path named on the card was read from: beside the card, or the frozen copy
        of a campaign directory the card was loaded from."""
        for item in self.inputs:
            if item.role in PATH_ROLES and item.written == relative:
                return item.path
        return (self.directory / Path(relative).expanduser()).resolve()

    def split(self, which: Literal["fit", "heldout"]) -> list[Prompt]:
        """The prompts of the fit or held-out split, in pool order."""
        selector = self.card.prompts.fit if which == "fit" else self.card.prompts.heldout
        if selector is None:
            return []
        return [p for p in self.prompts if p.split == selector.split]


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


def validate_card(doc: YamlDoc, where: Locator | None = None) -> LoadedCard:
    """Validate a parsed card document; raise CardError listing every problem.

    ``where`` says where the card's files and names are read from (default: beside the card).
    """
    problems = Problems(doc)
    problems.lines.extend(doc.problems)
    if not isinstance(doc.data, dict):
        raise CardError(
            f"{doc.path}: a card is a YAML mapping", [f"{doc.path}:1: must be a mapping"]
        )
    build_card_schema()
    where = where or Locator(doc.path.resolve().parent)
    try:
        card = Card.model_validate(doc.data)
    except ValidationError as exc:
        problems.lines.extend(pydantic_problems(exc, doc, Card))
        # Every problem at once: the card again without the fields the schema refused (their
        # defaults in their place), through the checks that need a whole card, so that a typo
        # in `design` does not hide a knob the runtime lacks or a missing file.
        repaired = _without(doc.data, [error["loc"] for error in exc.errors()])
        with contextlib.suppress(ValidationError):
            _check_whole(Card.model_validate(repaired), where, problems)
        raise CardError(f"{doc.path}: invalid card", problems.lines) from None
    fleet, runtime, runtime_file, prompts, quality = _check_whole(card, where, problems)
    box_name, box, box_file = fleet[0] if fleet else ("local", None, None)
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
        text=doc.text,
        inputs=_inputs(doc.path, card, where, runtime_file, box_file, fleet),
        fleet=tuple((name, spec) for name, spec, _ in fleet) if card.boxes is not None else (),
    )


def _check_whole(
    card: Card, where: Locator, problems: Problems
) -> tuple[
    list[tuple[str, BoxSpec, Path | None]],
    RuntimeProfile | None,
    Path | None,
    list[Prompt],
    list[Prompt],
]:
    """The checks of a card the schema took: boxes, runtime, cells, gates, prompts."""
    fleet = resolve_fleet(card, where, problems)
    check_confirm(card, [name for name, _, _ in fleet], where, problems)
    runtime, runtime_file = resolve_runtime(card, where, problems)
    check_cells(card, runtime, where, problems)
    check_shared_boot(card, runtime, problems)
    check_gates(card, problems)
    check_runtime_needs(card, runtime, problems)
    prompts, quality = check_prompts(card, where, problems)
    return fleet, runtime, runtime_file, prompts, quality


def _without(data: dict[str, Any], locations: list[tuple[int | str, ...]]) -> dict[str, Any]:
    """A deep copy of ``data`` without the mapping keys the schema's errors point at (a
    location's parts that name no key, such as a union's tag, are passed over; an error at a
    list item leaves the item, so that later problems keep their indices)."""
    copy = copy_module.deepcopy(data)
    for location in locations:
        parent: Any = None
        key: int | str | None = None
        node: Any = copy
        for part in location:
            in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
            if in_list or (isinstance(node, dict) and part in node):
                parent, key, node = node, part, node[part]
        if isinstance(parent, dict) and key in parent:
            del parent[key]
    return copy


def _inputs(
    card_path: Path,
    card: Card,
    where: Locator,
    runtime_file: Path | None,
    box_file: Path | None,
    fleet: list[tuple[str, BoxSpec, Path | None]],
) -> tuple[InputFile, ...]:
    """The files a valid card was loaded from, one entry per file, with the fields naming it."""
    named: dict[str, tuple[InputFile, list[str]]] = {}

    def add(role: Literal["pool", "quality", "cell_file"], written: str, field: str) -> None:
        if written not in named:
            named[written] = (InputFile(role, written, where.path(written).resolve(), ()), [])
        named[written][1].append(field)

    for index, pool in enumerate(card.prompts.pools):
        add("pool", pool, f"prompts.pools[{index}]")
    if card.prompts.quality is not None:
        add("quality", card.prompts.quality, "prompts.quality")
    for name, cell in card.cells.items():
        for key, rel in cell.files.items():
            add("cell_file", rel, f"cells.{name}.files.{key}")
    found = [InputFile("card", str(card_path.resolve()), card_path.resolve(), ())]
    found += [dataclasses.replace(item, fields=tuple(fields)) for item, fields in named.values()]
    if runtime_file is not None and isinstance(card.runtime, str):
        found.append(InputFile("runtime", card.runtime, runtime_file.resolve(), ("runtime",)))
    if box_file is not None and isinstance(card.box, str) and card.boxes is None:
        found.append(InputFile("boxes", card.box, box_file.resolve(), ("box",)))
    from_file = [(i, name, src) for i, (name, _, src) in enumerate(fleet) if src is not None]
    if card.boxes is not None and from_file:
        # One boxes file for the whole fleet (resolve_fleet refuses two): one frozen copy.
        fields = tuple(f"boxes[{i}]" for i, _, _ in from_file)
        names = ", ".join(name for _, name, _ in from_file)
        found.append(InputFile("boxes", names, from_file[0][2].resolve(), fields))
    return tuple(found)


def load_card(path: Path, where: Locator | None = None) -> LoadedCard:
    """Parse and validate the card at ``path`` (its files read as ``where`` says)."""
    return validate_card(load_yaml(path), where)


def read_card_schema(path: Path) -> Card:
    """The card of a campaign directory, schema-checked only (its files may live elsewhere)."""
    build_card_schema()
    return load_model(path, Card, "card")
