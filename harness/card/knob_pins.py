"""Knobs a cell should pin when it sets others: said at ``validate`` and ``plan`` as warnings.

A runtime profile's ``knob_pins`` name them (llama.cpp's ``fit``: builds with ``--fit`` rewrite
the GPU layer count and tensor placement a cell did not pin). A cell sets a knob by name or by
the environment variable the knob routes to; a pin is satisfied only by setting the pinned knob.
"""

from __future__ import annotations

from harness.card.checks import display_path
from harness.card.load import LoadedCard

__all__ = ["knob_pin_warnings"]


def _set_knobs(loaded: LoadedCard, cell_name: str) -> set[str]:
    cell = loaded.card.cells[cell_name]
    names = set(cell.knobs) | set(cell.live)
    for var in cell.env:
        found = loaded.runtime.knob_for_env(var)
        if found is not None:
            names.add(found[0])
    return names


def knob_pin_warnings(loaded: LoadedCard) -> list[str]:
    """One warning per cell and pin: the cell sets a ``when_set`` knob but not the pinned one."""
    out: list[str] = []
    for pin in loaded.runtime.knob_pins:
        for name in loaded.card.cells:
            knobs = _set_knobs(loaded, name)
            setting = sorted(knobs & set(pin.when_set))
            if not setting or pin.knob in knobs:
                continue
            out.append(
                f"{display_path(loaded.path)}: cells.{name}.knobs: sets {', '.join(setting)} "
                f"but not {pin.knob} (runtime {loaded.runtime.name}): {pin.why}"
            )
    return out
