"""Loading a card: YAML to a :class:`LoadedCard`, through the schema and the semantic pass.

Also the card as stored in a campaign directory (schema only), and a card's workload rescaled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from harness.card.checks import (
    Problems,
    check_cells,
    check_gates,
    check_prompts,
    check_runtime_needs,
    resolve_box,
    resolve_runtime,
)
from harness.card.locate import pydantic_problems
from harness.card.resolve import load_model
from harness.card.schema import Card, Phase
from harness.errors import BadInput, CardError
from harness.profiles import BoxSpec, RuntimeProfile
from harness.prompts import Prompt
from harness.yamlfile import YamlDoc, load_yaml


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


def validate_card(doc: YamlDoc) -> LoadedCard:
    """Validate a parsed card document; raise CardError listing every problem."""
    problems = Problems(doc)
    problems.lines.extend(doc.problems)
    if not isinstance(doc.data, dict):
        raise CardError(
            f"{doc.path}: a card is a YAML mapping", [f"{doc.path}:1: must be a mapping"]
        )
    try:
        card = Card.model_validate(doc.data)
    except ValidationError as exc:
        problems.lines.extend(pydantic_problems(exc, doc, Card))
        raise CardError(f"{doc.path}: invalid card", problems.lines) from None
    card_dir = doc.path.resolve().parent
    box_name, box = resolve_box(card, card_dir, problems)
    runtime = resolve_runtime(card, card_dir, problems)
    check_cells(card, runtime, card_dir, problems)
    check_gates(card, problems)
    check_runtime_needs(card, runtime, problems)
    prompts, quality = check_prompts(card, card_dir, problems)
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


def read_card_schema(path: Path) -> Card:
    """The card of a campaign directory, schema-checked only (its files may live elsewhere)."""
    return load_model(path, Card, "card")
