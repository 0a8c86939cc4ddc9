"""Engine inputs judged against the model on the box, before a campaign boots anything.

A KTransformers frequency file must have the model's ``num_hidden_layers`` rows and experts per
layer, or its loader raises at boot (``_init_kt_gpu_experts_masks``): after minutes of weights
loading, on every frequency cell. SGLang's Paged Experts refuses fewer resident experts than
the model's router top-k, and DeepSeek-V3's fused shared expert
(:func:`~harness.card.cell_checks.paged_experts_model_refusals`). ``validate`` checks what it
can read on this machine (the file's dimensions, and a local box's model); the model on a
remote box is read here, over the box's shell, when a campaign starts.

SGLang's all-to-all and attention backends refuse what the model's checkpoint or the GPU decides
(:mod:`harness.card.sglang_checks`): the checkpoint is read as above, and the GPU's compute
capability and memory (from which SGLang picks the chunked prefill size and decode CUDA-graph
batch a cell leaves unset) with ``nvidia-smi`` on the box; a box without it is left to the boot.

vLLM refuses what its platform and the model decide (:mod:`harness.card.vllm_checks`): a
max_num_seqs over the default token budget it picks from the first GPU's memory and name (or
the CPU build's, on a ``linux-cpu`` box with no GPU), Model Runner V2 on a box only its CPU build
(no Triton) can run, and a context past the model's, read from its ``config.json`` on the box.

KTransformers runs a prefill of ``kt_gpu_prefill_token_threshold`` tokens or more wholly on the
GPU; the recorder tells such passes by the router's top-k in the model's ``config.json`` and,
without it, gives the run no hit rate rather than a wrong one. A cell that sets a threshold on a
model whose ``config.json`` cannot be read is warned of here, before its runs are spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.boxes.base import Box
from harness.boxes.boxes import open_box
from harness.card import LoadedCard
from harness.card.cell_checks import (
    kt_frequency_cell,
    paged_experts_cell,
    paged_experts_model_refusals,
)
from harness.card.schema import Cell
from harness.card.sglang_checks import (
    GpuFacts,
    boots_sglang,
    sglang_cell_refusals,
    sglang_model_refusals,
)
from harness.card.vllm_checks import (
    VllmBox,
    boots_vllm,
    default_token_budget,
    vllm_box_refusals,
    vllm_model_folder,
    vllm_model_refusals,
    vllm_problem_field,
)
from harness.errors import BadInput, HarnessError
from harness.formats.expert_distribution import kt_frequency_refusal, logical_count_shape
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.recorder import full_gpu_threshold, model_config_on_box

__all__ = [
    "check_engine_inputs",
    "gpu_facts_on_box",
    "parse_gpu_facts",
    "parse_vllm_gpus",
    "vllm_box_on",
]

GPU_QUERY = "nvidia-smi --query-gpu=compute_cap,memory.total --format=csv,noheader,nounits"
# What vLLM's default token budget reads of the first GPU (get_batch_defaults: its memory, and
# its name, since an A100 keeps the small budget).
VLLM_GPU_QUERY = "nvidia-smi --query-gpu=memory.total,name --format=csv,noheader,nounits"
# The backends whose refusal the GPU or the model decides (harness/card/sglang_checks.py).
_GPU_BACKENDS = {
    "moe_a2a_backend": ("mori", "pplx", "deepep_v2", "flashinfer_megamoe"),
    "attention_backend": ("trtllm_mha", "trtllm_mla"),
}
_MODEL_BACKENDS = ("deepep_v2", "flashinfer_megamoe", "flashinfer")


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


def parse_gpu_facts(text: str) -> GpuFacts | None:
    """The GPUs of :data:`GPU_QUERY`'s output (``9.0, 81559`` a line): the first one's compute
    capability and the smallest memory; None where a line does not read (MIG's ``[N/A]``)."""
    capabilities, memories = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        capability, _, memory = line.partition(",")
        major, _, minor = capability.strip().partition(".")
        try:
            capabilities.append((int(major), int(minor or 0)))
            memories.append(float(memory))
        except ValueError:
            return None
    return GpuFacts(capabilities[0], min(memories)) if capabilities else None


def gpu_facts_on_box(box: Box) -> GpuFacts | None:
    """The box's GPUs as SGLang reads them; None without ``nvidia-smi`` or a reading."""
    try:
        result = box.sh(GPU_QUERY, timeout_s=60, check=False)
    except HarnessError:
        return None
    return parse_gpu_facts(result.stdout) if result.code == 0 else None


def parse_vllm_gpus(text: str) -> list[tuple[float, str]] | None:
    """The GPUs of :data:`VLLM_GPU_QUERY`'s output (``81559, NVIDIA H100 80GB HBM3`` a line),
    as (memory MiB, name); None where a line does not read (MIG's ``[N/A]``)."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        memory, _, name = line.partition(",")
        try:
            gpus.append((float(memory), name.strip()))
        except ValueError:
            return None
    return gpus


def vllm_box_on(box: Box, runtime: RuntimeProfile) -> VllmBox | None:
    """What vLLM's platform defaults read of the box. A box that says ``linux-cpu`` (and a
    profile that runs there) may run vLLM's CPU build; ``nvidia-smi`` gives its first GPU. None
    where nothing is known: no GPU read on a box that is not ``linux-cpu``, an unreadable
    reading, or GPUs whose defaults differ (vLLM reads device 0 in CUDA's order, not
    nvidia-smi's)."""
    cpu = box.spec.platform == "linux-cpu" and bool({"any", "linux-cpu"} & set(runtime.platforms))
    try:
        result = box.sh(VLLM_GPU_QUERY, timeout_s=60, check=False)
    except HarnessError:
        return None
    gpus = parse_vllm_gpus(result.stdout) if result.code == 0 else []
    if gpus is None or (not gpus and not cpu):
        return None
    if not gpus:
        return VllmBox(cpu=True)
    defaults = {default_token_budget(VllmBox(False, mib, name), 1) for mib, name in gpus}
    if len(defaults) > 1:
        return None
    return VllmBox(cpu=cpu, gpu_mib=gpus[0][0], gpu_name=gpus[0][1])


def _vllm_refusals(box: Box, box_name: str, loaded: LoadedCard) -> list[str]:
    """Problem lines for what vLLM would refuse on this box, given its model and platform."""
    runtime = loaded.runtime
    device = vllm_box_on(box, runtime)
    configs: dict[str, tuple[str, dict[str, Any] | None]] = {}
    lines: list[str] = []
    for name, cell in loaded.card.cells.items():
        folder = vllm_model_folder(cell, runtime)
        if folder and folder not in configs:
            configs[folder] = model_config_on_box(box, folder)
        config_path, config = configs[folder] if folder else ("", None)
        lines += [
            f"cells.{name}.{'.'.join(vllm_problem_field(knob))}: {problem} (the model's "
            f"{config_path} on box {box_name})"
            for knob, problem in vllm_model_refusals(cell, runtime, config or {})
        ]
        if device is not None:
            lines += [
                f"cells.{name}.{'.'.join(vllm_problem_field(knob))}: {problem} (box {box_name})"
                for knob, problem in vllm_box_refusals(cell, runtime, device, config or {})
            ]
    return lines


def _sglang_cells(loaded: LoadedCard) -> list[tuple[str, bool, str]]:
    """(cell, whether the GPU decides, model folder to read or "") of every cell whose SGLang
    backend the box's GPU or model decides."""
    runtime = loaded.runtime
    found: list[tuple[str, bool, str]] = []
    if not boots_sglang(runtime):
        return found
    for name, cell in loaded.card.cells.items():
        chosen = {knob: str(cell.knobs.get(knob, "")) for knob in _GPU_BACKENDS}
        gpu = any(chosen[knob] in values for knob, values in _GPU_BACKENDS.items()
                  if knob in runtime.knobs)  # fmt: skip
        model = cell.knobs.get("model")
        read = chosen["moe_a2a_backend"] in _MODEL_BACKENDS and "moe_a2a_backend" in runtime.knobs
        model_text = model if read and isinstance(model, str) else ""
        if gpu or model_text:
            found.append((name, gpu, model_text))
    return found


def _sglang_refusals(
    box: Box, box_name: str, cells: list[tuple[str, bool, str]], loaded: LoadedCard
) -> list[str]:
    """Problem lines for what SGLang would refuse on this box, given its model and GPU."""
    lines: list[str] = []
    gpu = gpu_facts_on_box(box) if any(needs for _, needs, _ in cells) else None
    runtime: RuntimeProfile = loaded.runtime
    for name, needs_gpu, model in cells:
        cell: Cell = loaded.card.cells[name]
        if model:
            config_path, config = model_config_on_box(box, model)
            quant_file = config is not None and _exists(
                box, f"{model.rstrip('/')}/hf_quant_config.json"
            )
            lines += [
                f"cells.{name}.knobs.{knob}: {problem} (the model's {config_path} on box "
                f"{box_name})"
                for knob, problem in sglang_model_refusals(cell, runtime, config or {}, quant_file)
            ]
        if needs_gpu and gpu is not None:
            lines += [
                f"cells.{name}.knobs.{knob}: {problem} (box {box_name})"
                for knob, problem in sglang_cell_refusals(cell, runtime, gpu)
            ]
    return lines


def _exists(box: Box, path: str) -> bool:
    try:
        return box.exists(path)
    except HarnessError:
        return False


def check_engine_inputs(loaded: LoadedCard) -> list[str]:
    """Raise BadInput (exit 2) naming the cell, the file and the model when an engine would
    refuse a cell's input at boot. A box that cannot be reached, a Slurm box (no shell) or a
    model folder without a readable ``config.json`` is left to the boot, which says why.
    Returns warnings: cells whose runs will have no hit rate (see the module's docstring)."""
    cells = _frequency_cells(loaded)
    paged = _paged_cells(loaded)
    thresholds = _threshold_cells(loaded)
    sglang = _sglang_cells(loaded)
    vllm = boots_vllm(loaded.runtime)
    warnings: list[str] = []
    if not cells and not paged and not thresholds and not sglang and not vllm:
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
            refused = _sglang_refusals(box, box_name, sglang, loaded) if sglang else []
            refused += _vllm_refusals(box, box_name, loaded) if vllm else []
            if refused:
                raise BadInput("\n".join(dict.fromkeys(refused)))
        finally:
            box.close()
    return list(dict.fromkeys(warnings))  # one warning per cell and box, said once
