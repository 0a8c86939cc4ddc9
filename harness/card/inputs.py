"""The files a card names, and where loading reads them from.

A card names files by paths relative to itself (pools, the quality suite, cell files) and a box
and a runtime by names that resolve along a search path (:mod:`.resolve`). A :class:`Locator`
says where to read each: beside the card, which is the default, or from a campaign directory's
frozen copies (:mod:`.frozen`), so a resumed campaign reads exactly the inputs it was run with
and nothing else in the loader needs to know which. Loading records every file it read as an
:class:`InputFile`, which is what a campaign directory freezes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

InputRole = Literal["card", "pool", "quality", "cell_file", "runtime", "boxes"]
# Roles named by a path on the card (the others are the card itself and names on a search path).
PATH_ROLES: tuple[InputRole, ...] = ("pool", "quality", "cell_file")


@dataclass(frozen=True)
class InputFile:
    """One file loading a card read."""

    role: InputRole
    written: str  # as the card names it: a path relative to the card, or a box/runtime name
    path: Path  # the file read
    fields: tuple[str, ...]  # the card fields naming it, e.g. ("cells.seed.files.rowmap",)


@dataclass(frozen=True)
class Locator:
    """Where the names on a card are read from.

    ``copies`` maps a path as written on the card to the file to read instead; ``runtime_file``
    and ``boxes_file`` replace the search for the card's runtime and box names. Empty, this is
    plain loading: paths relative to ``card_dir``, names along ``search_path(card_dir)``.
    """

    card_dir: Path
    copies: Mapping[str, Path] = field(default_factory=dict)
    runtime_file: Path | None = None
    boxes_file: Path | None = None
    # A campaign directory's frozen card: names checked when it was run are not looked up
    # again where this machine's files may differ (the box a failure must be confirmed on).
    frozen: bool = False

    def path(self, written: str) -> Path:
        """The file to read for a path as written on the card."""
        copy = self.copies.get(written)
        return copy if copy is not None else self.card_dir / Path(written).expanduser()


__all__ = ["PATH_ROLES", "InputFile", "InputRole", "Locator"]
