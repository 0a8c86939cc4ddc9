"""Section titles that say what the campaign varied, not which seed the table's shape is from.

A campaign may reuse a seed table's shape over another question (a ladder of hot-slot counts
with adaptation on, in the frozen-map table's shape): the title names the settings each
comparison varies against the control and whether adaptation was frozen or on, where the cells'
knobs say so; the seed a table's shape comes from is not named (it describes another campaign).
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


def varied_against(card: Card, cell: str) -> list[str]:
    """The settings in which ``cell`` differs from the card's control, in sorted order."""
    if card.control is None:
        return []
    mine, control = _flat(card.cells[cell]), _flat(card.cells[card.control])
    return sorted(k for k in mine.keys() | control.keys() if mine.get(k) != control.get(k))


def varied_settings(card: Card) -> list[str]:
    """What the comparisons vary: the settings in which some cell differs from the control (a
    companion that differs in a map does not make every comparison a map comparison); without
    a control, the settings not the same in every cell. Sorted."""
    if card.control is not None:
        return sorted({k for cell in card.treatments for k in varied_against(card, cell)})
    flats = [_flat(cell) for cell in card.cells.values()]
    keys = sorted({k for flat in flats for k in flat})
    return [k for k in keys if len({flat.get(k) for flat in flats}) > 1]


def frozen_cells(card: Card) -> set[str]:
    """Cells whose policy knob freezes adaptation: nothing in them can recover from a shift."""
    return {name for name, cell in card.cells.items() if str(cell.knobs.get(POLICY_KNOB)) in FROZEN}


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


def section_title(what: str, card: Card) -> str:
    """``what``, then what the comparisons vary and the adaptation state (per comparison where
    they vary different settings)."""
    parts = []
    per_cell = {cell: varied_against(card, cell) for cell in card.treatments}
    kinds = {tuple(v) for v in per_cell.values()}
    if card.control is not None and len(kinds) > 1:
        parts.append(
            "against the control, "
            + "; ".join(f"{c} varies {', '.join(v) or 'nothing'}" for c, v in per_cell.items())
        )
    else:
        varied = varied_settings(card)
        parts.append("varied: " + ", ".join(varied) if varied else "cells alike in every setting")
    state = adaptation(card)
    if state:
        parts.append(state)
    return f"{what} — {'; '.join(parts)}"


__all__ = ["adaptation", "section_title", "varied_against", "varied_settings"]
