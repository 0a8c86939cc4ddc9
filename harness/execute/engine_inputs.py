"""Engine inputs judged against the model on the box, before a campaign boots anything.

A KTransformers frequency file must have the model's ``num_hidden_layers`` rows and experts per
layer, or its loader raises at boot (``_init_kt_gpu_experts_masks``): after minutes of weights
loading, on every frequency cell. SGLang's Paged Experts refuses fewer resident experts than
the model's router top-k, and DeepSeek-V3's fused shared expert
(:func:`~harness.card.cell_checks.paged_experts_model_refusals`). ``validate`` checks what it
can read on this machine (the file's dimensions, and a local box's model); the model on a
remote box is read here, over the box's shell, when a campaign starts.
"""

from __future__ import annotations

from pathlib import Path

from harness.boxes.boxes import open_box
from harness.card import LoadedCard
from harness.card.cell_checks import (
    kt_frequency_cell,
    paged_experts_cell,
    paged_experts_model_refusals,
)
from harness.errors import BadInput, HarnessError
from harness.formats.expert_distribution import kt_frequency_refusal, logical_count_shape
from harness.runtimes.recorder import model_config_on_box

__all__ = ["check_engine_inputs"]


def _frequency_cells(loaded: LoadedCard) -> list[tuple[str, Path, str]]:
    """(cell, frequency file here, model folder on the box) of every KT frequency cell."""
    found = []
    for name, cell in loaded.card.cells.items():
        relative = cell.files.get("init_expert_location")
        model = cell.knobs.get("model")
        frequency = kt_frequency_cell(cell) and str(relative or "").endswith(".pt")
        if frequency and relative and isinstance(model, str) and model:
            found.append((name, loaded.resolve(str(relative)), model))
    return found


def _paged_cells(loaded: LoadedCard) -> list[tuple[str, str]]:
    """(cell, model folder on the box) of every Paged Experts cell."""
    found = []
    for name, cell in loaded.card.cells.items():
        model = cell.knobs.get("model")
        if paged_experts_cell(cell, loaded.runtime) and isinstance(model, str) and model:
            found.append((name, model))
    return found


def check_engine_inputs(loaded: LoadedCard) -> None:
    """Raise BadInput (exit 2) naming the cell, the file and the model when an engine would
    refuse a cell's input at boot. A box that cannot be reached, a Slurm box (no shell) or a
    model folder without a readable ``config.json`` is left to the boot, which says why."""
    cells = _frequency_cells(loaded)
    paged = _paged_cells(loaded)
    if not cells and not paged:
        return
    shapes = [logical_count_shape(path) for _, path, _ in cells]  # read once, not per box
    for box_name, spec in loaded.boxes:
        if spec.kind == "slurm":
            continue
        try:
            box = open_box(box_name, spec)
        except HarnessError:
            continue
        try:
            for (cell, path, model), shape in zip(cells, shapes, strict=True):
                config_path, config = model_config_on_box(box, model)
                if config is None:
                    continue
                refusal = kt_frequency_refusal(shape, config)
                if refusal is not None:
                    raise BadInput(
                        f"cells.{cell}.files.init_expert_location: {path.name}: {refusal} "
                        f"(the model's {config_path} on box {box_name}); record the model's "
                        "own counts on the fit split and write them with `harness fit-map "
                        "COUNTS --format kt-frequency -o FILE.pt`"
                    )
            for cell, model in paged:
                config_path, config = model_config_on_box(box, model)
                refusals = paged_experts_model_refusals(
                    loaded.card.cells[cell], loaded.runtime, config or {}
                )
                if refusals:
                    raise BadInput(
                        "\n".join(
                            f"cells.{cell}.knobs.{knob}: {problem} (the model's {config_path} "
                            f"on box {box_name})"
                            for knob, problem in refusals
                        )
                    )
        finally:
            box.close()
