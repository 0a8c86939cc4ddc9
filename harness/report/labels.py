"""Section titles that say what the campaign varied, not which seed the table's shape is from.

A campaign may reuse a seed table's shape over another question (a ladder of hot-slot counts
with adaptation on, in the frozen-map table's shape): the title names the settings the cells
differ in and whether adaptation was frozen or on, where the cells' knobs say so, and keeps the
seed section as a reference only.
"""

from __future__ import annotations

from harness.card import Card, Cell

# Knob values that mean "adaptation off" (refbox's policy knob); any other value of the knob is
# adaptive. A card without the knob says nothing about adaptation, and neither does the title.
POLICY_KNOB = "policy"
FROZEN = frozenset({"frozen", "off", "static"})


def _flat(cell: Cell) -> dict[str, str]:
    flat: dict[str, str] = {}
    for group in ("knobs", "env", "files", "live"):
        for key, value in getattr(cell, group).items():
            flat[f"{group}.{key}"] = str(value)
    if cell.args:
        flat["args"] = " ".join(cell.args)
    return flat


def varied_settings(card: Card) -> list[str]:
    """The settings whose value is not the same in every cell, in sorted order."""
    flats = [_flat(cell) for cell in card.cells.values()]
    keys = sorted({k for flat in flats for k in flat})
    return [k for k in keys if len({flat.get(k) for flat in flats}) > 1]


def adaptation(card: Card) -> str | None:
    """ "adaptation frozen", "adaptation on", "frozen and adaptive cells", or None (not stated)."""
    values = [cell.knobs.get(POLICY_KNOB) for cell in card.cells.values()]
    if any(v is None for v in values):
        return None
    frozen = [str(v) in FROZEN for v in values]
    if all(frozen):
        return "adaptation frozen"
    if not any(frozen):
        return "adaptation on"
    return "frozen and adaptive cells"


def section_title(what: str, card: Card, seed: str) -> str:
    """``what``, then what the cells varied and the adaptation state, then the seed's shape."""
    parts = []
    varied = varied_settings(card)
    if varied:
        parts.append("varied: " + ", ".join(varied))
    else:
        parts.append("cells alike in every setting")
    state = adaptation(card)
    if state:
        parts.append(state)
    return f"{what} — {'; '.join(parts)} (in the shape of {seed})"


__all__ = ["adaptation", "section_title", "varied_settings"]
