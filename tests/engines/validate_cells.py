"""What `harness validate` refuses of a card's cells, for the tests that hold it to an engine.

Each engine's parser test (``test_*_parsers.py``) writes every cell it judges into one card and
reads `validate`'s problem lines back per cell, so that each verdict of the engine's own code
has validate's beside it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.card import load_card
from harness.errors import CardError

# `card.yaml:LINE: cells.NAME.FIELD: message`
_CELL_LINE = re.compile(r": cells\.(c\d+)\.(\S+): (.*)")


def validate_refusals(card: dict[str, Any], folder: Path) -> dict[str, list[str]]:
    """The problems `validate` finds with each cell of ``card`` (written to
    ``folder/card.yaml``), by cell name; a cell it takes is absent. Every problem line must
    name a cell: a card-level problem is the test's own mistake."""
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(card), encoding="utf-8")
    refused: dict[str, list[str]] = {}
    try:
        load_card(path)
    except CardError as exc:
        for line in exc.lines():
            found = _CELL_LINE.search(line)
            assert found, line
            refused.setdefault(found.group(1), []).append(found.group(3))
    return refused
