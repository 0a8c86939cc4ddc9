"""Engine inputs judged against the model on the box, before a campaign boots anything.

A KTransformers frequency file must have the model's ``num_hidden_layers`` rows and experts per
layer, or its loader raises at boot (``_init_kt_gpu_experts_masks``): after minutes of weights
loading, on every frequency cell. SGLang's Paged Experts refuses fewer resident experts than
the model's router top-k, and DeepSeek-V3's fused shared expert
(:func:`~harness.card.cell_checks.paged_experts_model_refusals`). ``validate`` checks what it
can read on this machine (the file's dimensions, and a local box's model); the model on a
remote box is read here, over the box's shell, when a campaign starts.

KTransformers runs a prefill of ``kt_gpu_prefill_token_threshold`` tokens or more wholly on the
GPU; the recorder tells such passes by the router's top-k in the model's ``config.json`` and,
without it, gives the run no hit rate rather than a wrong one. A cell that sets a threshold on a
model whose ``config.json`` cannot be read is warned of here, before its runs are spent.
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
from harness.runtimes.recorder import full_gpu_threshold, model_config_on_box

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


def _threshold_cells(loaded: LoadedCard) -> list[tuple[str, str, int]]:
    """(cell, model, threshold) of every cell whose recorder leaves full-GPU prefill passes out
    of the hit rate (a positive ``full_gpu_prefill_knob``)."""
    recorder = loaded.runtime.telemetry.expert_recorder
    if recorder is None or recorder.full_gpu_prefill_knob is None:
        return []
    knob = recorder.full_gpu_prefill_knob
    spec = loaded.runtime.knobs.get(knob)
    default = spec.default if spec is not None and spec.default is not None else ""
    found = []
    for name, cell in loaded.card.cells.items():
        knobs = {knob: str(cell.knobs.get(knob, default))}
        threshold = full_gpu_threshold(recorder, knobs)
        if threshold > 0:
            found.append((name, str(cell.knobs.get("model") or ""), threshold))
    return found


def check_engine_inputs(loaded: LoadedCard) -> list[str]:
    """Raise BadInput (exit 2) naming the cell, the file and the model when an engine would
    refuse a cell's input at boot. A box that cannot be reached, a Slurm box (no shell) or a
    model folder without a readable ``config.json`` is left to the boot, which says why.
    Returns warnings: cells whose runs will have no hit rate (see the module's docstring)."""
    cells = _frequency_cells(loaded)
    paged = _paged_cells(loaded)
    thresholds = _threshold_cells(loaded)
    warnings: list[str] = []
    if not cells and not paged and not thresholds:
        return warnings
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
            for cell, model, threshold in thresholds:
                config_path, config = model_config_on_box(box, model) if model else ("", None)
                if config is None:
                    where = f"{config_path} on box {box_name}" if model else "no model folder"
                    warnings.append(
                        f"cells.{cell}: kt_gpu_prefill_token_threshold {threshold} and no "
                        f"readable config.json ({where}): the recorder tells a prefill run "
                        "wholly on the GPU by the router's top-k, read from it, so these runs "
                        "will have no hit rate; point knobs.model at the model's folder on the "
                        "box, or set the threshold to 0"
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
    return list(dict.fromkeys(warnings))  # one warning per cell and box, said once
