"""Box and runtime names on a card: where they resolve, and reading the files they name.

A name is looked up beside the card, then in ./campaigns, then in the package's own data, so a
card works from anywhere on disk. Every problem in a box or runtime file is reported at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from harness.card.locate import pydantic_problems
from harness.errors import CardError
from harness.formats.yamlfile import load_yaml
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile

_M = TypeVar("_M", bound=BaseModel)

# harness/data: this module sits one package below it.
PACKAGE_DATA = Path(__file__).resolve().parent.parent / "profiles" / "data"


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
        try:
            if candidate.is_file():
                return candidate
        except (OSError, ValueError):  # a name no file system takes (too long, a NUL) is unknown
            return None
    return None


def known_runtime_names(card_dir: Path) -> list[str]:
    """Every profile name reachable from ``card_dir``."""
    names: set[str] = set()
    for root in search_path(card_dir):
        names.update(p.stem for p in (root / "runtimes").glob("*.yaml"))
    return sorted(names)


def load_model(path: Path, model: type[_M], what: str) -> _M:
    """Parse a YAML file into ``model``, every problem as ``file:line: field: message``."""
    doc = load_yaml(path)
    if doc.problems:
        raise CardError(f"{path}: invalid {what}", doc.problems)
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise CardError(f"{path}: invalid {what}", pydantic_problems(exc, doc, model)) from None


def load_runtime_profile(path: Path) -> RuntimeProfile:
    """Read and validate a runtime profile file."""
    return load_model(path, RuntimeProfile, "runtime profile")


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
            problems.extend(pydantic_problems(exc, doc, BoxSpec, prefix=(name,)))
    if problems:
        raise CardError(f"{path}: invalid boxes file", problems)
    return boxes


def load_boxes_with_sources(card_dir: Path) -> dict[str, tuple[BoxSpec, Path]]:
    """Every named box along the search path with the file defining it; earlier files win."""
    boxes: dict[str, tuple[BoxSpec, Path]] = {}
    for root in reversed(search_path(card_dir)):
        path = root / "boxes.yaml"
        if path.is_file():
            boxes.update({name: (box, path) for name, box in load_boxes_file(path).items()})
    return boxes


def load_boxes(card_dir: Path) -> dict[str, BoxSpec]:
    """Every named box along the search path; earlier files win over later ones."""
    return {name: box for name, (box, _) in load_boxes_with_sources(card_dir).items()}
