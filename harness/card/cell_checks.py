"""The semantic checks of a card's cells: files, knobs, env and live values against the
runtime profile, and the engine-specific rules a knob's value brings (a KT frequency file's
shape, EPLB's recorder, DeepEP's all-to-all, Paged Experts' settings and model, vLLM's prefetch
offload; SGLang's other all-to-all backends are harness/card/sglang_checks.py, vLLM's other rules
between knobs harness/card/vllm_checks.py), each a named rule that adds its findings to
:class:`~harness.card.checks.Problems`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.card.checks import Problems, _did_you_mean, _is_file, _knob_text, _missing_file
from harness.card.inputs import Locator
from harness.card.schema import Card, Cell, KnobValue
from harness.card.sglang_checks import sglang_cell_refusals, sglang_model_refusals
from harness.card.vllm_checks import (
    vllm_cell_refusals,
    vllm_model_folder,
    vllm_model_refusals,
    vllm_problem_field,
)
from harness.errors import BadInput, MapError
from harness.formats.yamlfile import Loc
from harness.profiles.schema import KnobSpec, RuntimeProfile, switch_state


def check_cells(card: Card, runtime: RuntimeProfile | None, where: Locator, out: Problems) -> None:
    """The control and the order fit the cells; each cell's files and values fit the runtime."""
    if card.control is not None and card.control not in card.cells:
        out.add(
            ("control",),
            f"control {card.control!r} is not a cell"
            + _did_you_mean(card.control, list(card.cells)),
        )
    if card.control is None and card.design.order in ("abba", "ladder"):
        out.add(("control",), f"order {card.design.order!r} needs a `control` cell")
    if card.design.order in ("abba", "ladder") and len(card.cells) < 2:
        out.add(("cells",), f"order {card.design.order!r} needs the control and at least one cell")
    for name, cell in card.cells.items():
        if cell.lossy is not False and name == card.control:
            out.add(
                ("cells", name, "lossy"),
                "the control is the reference outputs are judged "
                "against: declare the treatment cells lossy, not the control",
            )
        if not isinstance(cell.lossy, bool) and card.workload.temperature > 0:
            out.add(
                ("cells", name, "lossy", "margin"),
                "an equivalence margin compares greedy "
                "outputs: set workload.temperature to 0, or declare `lossy: true`",
            )
        if (
            not isinstance(cell.lossy, bool)
            and cell.lossy.metric == "kl"
            and card.workload.logprobs < 1
        ):
            out.add(
                ("cells", name, "lossy", "metric"),
                "kl compares next-token distributions: set workload.logprobs (e.g. 5) so the "
                "runtime returns them, or use prefix_agreement",
            )
        for key, rel in cell.files.items():
            if not _is_file(where, rel):
                out.add(("cells", name, "files", key), _missing_file(key, rel, where.card_dir))
            elif key == "rowmap":
                _check_rowmap(where.path(rel), ("cells", name, "files", key), out)
            elif key == "init_expert_location" and kt_frequency_cell(cell):
                local_box = card.box == "local" and card.boxes is None
                _check_kt_frequency_shape(where.path(rel), cell, local_box, name, out)
        if runtime is not None:
            _check_cell_settings(name, cell, runtime, out)
            if card.box == "local" and card.boxes is None:
                # The model's own config, where it is on this machine (a remote box's is read
                # when the campaign starts: execute/engine_inputs.py).
                model = cell.knobs.get("model")
                config = _model_config(model) or {}
                refusals = paged_experts_model_refusals(cell, runtime, config)
                quant_file = bool(config) and _has_quant_file(model)
                refusals += sglang_model_refusals(cell, runtime, config, quant_file)
                vllm_config = _model_config(vllm_model_folder(cell, runtime)) or {}
                refusals += vllm_model_refusals(cell, runtime, vllm_config)
                for field, problem in refusals:
                    out.add(("cells", name, "knobs", field), problem)


def _check_rowmap(path: Path, field: tuple[str | int, ...], out: Problems) -> None:
    """A rowmap read as the runtime's loader reads it, so a bad one fails here, not at boot."""
    from harness.formats.maps import read_rowmap

    try:
        read_rowmap(path)
    except MapError as exc:
        for line in exc.lines():
            out.add(field, line)


def _check_cell_settings(name: str, cell: Cell, runtime: RuntimeProfile, out: Problems) -> None:
    """File knobs, knobs, env and live values of one cell against the runtime's declarations."""
    for key in cell.files:
        if key not in runtime.files:
            out.add(
                ("cells", name, "files", key),
                f"runtime {runtime.name!r} takes no file knob {key!r}"
                + _did_you_mean(key, sorted(runtime.files)),
            )
    _check_values(
        out,
        ("cells", name, "knobs"),
        cell.knobs,
        runtime.knobs,
        lambda knob: (
            f"runtime {runtime.name!r} has no knob {knob!r}"
            + _did_you_mean(knob, sorted(runtime.knobs))
        ),
    )
    _check_kt_frequency_file(name, cell, out)
    _check_eplb_recorder(name, cell, runtime, out)
    _check_eplb_needs_ep(name, cell, runtime, out)
    _check_dispatch_needs_a2a(name, cell, runtime, out)
    _check_paged_experts(name, cell, runtime, out)
    _check_prefetch_offload(name, cell, runtime, out)
    _check_ds4_bench_frontiers(name, cell, runtime, out)
    _check_fault_state_files(name, cell, runtime, out)
    # What SGLang's all-to-all backends refuse of the knobs alone (the GPU's part: at `run`).
    for knob, problem in sglang_cell_refusals(cell, runtime):
        out.add(("cells", name, "knobs", knob), problem)
    # What vLLM's config refuses between knobs (the box's platform and GPU: at `run`).
    for knob, problem in vllm_cell_refusals(cell, runtime):
        out.add(("cells", name, *vllm_problem_field(knob)), problem)
    for knob, spec in runtime.knobs.items():
        if spec.required and spec.default is None and knob not in cell.knobs:
            out.add(
                ("cells", name, "knobs"),
                f"runtime {runtime.name!r} needs knob {knob!r} set ({spec.help or 'no default'})",
            )
    # An env variable no knob declares is passed through raw, so only declared ones are checked.
    env_specs = {var: found[1] for var in cell.env if (found := runtime.knob_for_env(var))}
    _check_values(out, ("cells", name, "env"), cell.env, env_specs, None)
    if not cell.live:
        return
    if runtime.live_apply() is None:
        out.add(("cells", name, "live"), f"runtime {runtime.name!r} has no live knobs")
        return
    live_specs = {s.live: s for s in runtime.knobs.values() if s.live}
    _check_values(
        out,
        ("cells", name, "live"),
        cell.live,
        live_specs,
        lambda knob: f"unknown live knob{_did_you_mean(knob, sorted(live_specs))}",
    )


def kt_frequency_cell(cell: Cell) -> bool:
    """Whether KTransformers places this cell's GPU experts from a frequency file."""
    return str(cell.knobs.get("kt_expert_placement_strategy", "")) == "frequency"


def _model_config(model: object) -> dict[str, Any] | None:
    """A model folder's ``config.json`` on this machine, or None where there is none to read."""
    if not isinstance(model, str) or not model:
        return None
    path = Path(model).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _has_quant_file(model: object) -> bool:
    """Whether a ModelOpt ``hf_quant_config.json`` is beside the model's config.json here."""
    return isinstance(model, str) and (Path(model).expanduser() / "hf_quant_config.json").is_file()


def _check_kt_frequency_shape(
    path: Path, cell: Cell, local_box: bool, name: str, out: Problems
) -> None:
    """The frequency file as KTransformers' loader judges it at boot: 3-D always, and the model's
    layers and experts where its config.json is readable here (a card on the local box); a
    remote model's is read from its box when the campaign starts (execute/engine_inputs.py)."""
    from harness.formats.expert_distribution import kt_frequency_refusal, logical_count_shape

    if path.suffix.lower() != ".pt":
        return  # _check_kt_frequency_file says what is wrong with it
    field = ("cells", name, "files", "init_expert_location")
    try:
        shape = logical_count_shape(path)
    except BadInput as exc:
        out.add(field, str(exc))
        return
    config = _model_config(cell.knobs.get("model")) if local_box else None
    refusal = kt_frequency_refusal(shape, config or {})
    if refusal is not None:
        out.add(
            field,
            f"{path.name}: {refusal}; record the model's own counts on the fit split and write "
            "them with `harness fit-map COUNTS --format kt-frequency -o FILE.pt`",
        )


def _check_kt_frequency_file(name: str, cell: Cell, out: Problems) -> None:
    """KTransformers' frequency placement reads its counts only from a ``.pt``
    (``init_loc.endswith(".pt")`` in its SGLang build's kt_ep_wrapper.py): handed a ``.json``
    it logs a warning and places experts uniformly, so the cell would measure the control."""
    if not kt_frequency_cell(cell):
        return
    path = cell.files.get("init_expert_location")
    if path is not None and not str(path).endswith(".pt"):
        out.add(
            ("cells", name, "files", "init_expert_location"),
            f"KTransformers' frequency placement reads only a .pt (given {path}): with any "
            "other file it silently falls back to uniform placement; write the counts with "
            "`harness fit-map SOURCE --format kt-frequency -o FILE.pt`",
        )


def _check_eplb_recorder(name: str, cell: Cell, runtime: RuntimeProfile, out: Problems) -> None:
    """SGLang's EPLB rebalances from the same expert-distribution recorder the harness starts
    and dumps around each run: every rebalance dumps and resets it (the run keeps only the
    passes after the last one) and the harness's start wipes EPLB's window each run. Refused
    rather than measured wrong."""
    if runtime.telemetry.expert_recorder is None:
        return
    if not _switched_on(cell, "enable_eplb"):
        return
    out.add(
        ("cells", name, "knobs", "enable_eplb"),
        f"runtime {runtime.name!r} records routing through SGLang's expert-distribution recorder, "
        "which EPLB shares: each rebalance dumps and resets it, and each run's start wipes "
        "EPLB's window, so neither the run's counts nor EPLB's balance would be what they "
        "claim; drop enable_eplb here, or run EPLB on a profile without `expert_recorder`",
    )


def _check_eplb_needs_ep(name: str, cell: Cell, runtime: RuntimeProfile, out: Problems) -> None:
    """SGLang asserts ``ep_size > 1`` with EPLB (0.5.23, ``srt/arg_groups/parallel_hook.py``,
    ``handle_eplb_and_dispatch``): an AssertionError at boot, said here instead. Where the
    profile drives the recorder, :func:`_check_eplb_recorder` refuses EPLB already."""
    if runtime.telemetry.expert_recorder is not None or "ep_size" not in runtime.knobs:
        return
    if _switched_on(cell, "enable_eplb") and str(cell.knobs.get("ep_size", "1")) in ("", "1"):
        out.add(
            ("cells", name, "knobs", "enable_eplb"),
            "SGLang refuses EPLB without expert parallelism (it asserts ep_size > 1 at boot): "
            "set ep_size to the GPUs the experts spread over (2 or more)",
        )


def _check_dispatch_needs_a2a(
    name: str, cell: Cell, runtime: RuntimeProfile, out: Problems
) -> None:
    """SGLang refuses ``--ep-dispatch-algorithm static`` (or ``lp``) without an all-to-all
    backend (0.5.23, ``srt/arg_groups/parallel_hook.py``, ``handle_eplb_and_dispatch``: a
    ValueError at boot), since each rank would pick a different replica of an expert. Said
    here, not after a boot on a GPU box."""
    if "ep_dispatch_algorithm" not in runtime.knobs or "moe_a2a_backend" not in runtime.knobs:
        return
    algorithm = str(cell.knobs.get("ep_dispatch_algorithm", ""))
    backend = str(cell.knobs.get("moe_a2a_backend", "none"))
    if algorithm in ("static", "lp") and backend == "none":
        out.add(
            ("cells", name, "knobs", "ep_dispatch_algorithm"),
            f"{algorithm} dispatch needs an all-to-all backend: SGLang refuses it at boot with "
            "moe_a2a_backend none (each rank would pick a different replica); set "
            "moe_a2a_backend (e.g. deepep), or use ep_dispatch_algorithm dynamic",
        )


def paged_experts_cell(cell: Cell, runtime: RuntimeProfile) -> bool:
    """Whether the cell turns on SGLang's Paged Experts."""
    return "enable_paged_experts" in runtime.knobs and _switched_on(cell, "enable_paged_experts")


def _check_paged_experts(name: str, cell: Cell, runtime: RuntimeProfile, out: Problems) -> None:
    """SGLang's Paged Experts refuses at boot what it does not support (0.5.23,
    ``srt/layers/moe/paged_experts/method.py``, ``check_paged_experts_compat``): more than one
    GPU, EPLB, speculative decoding, and no resident count. Said here, before a GPU box is
    booted; what the model decides (its router's top-k, fused shared experts) is
    :func:`paged_experts_model_refusals`. Its CUDA-graph backends, ``--load-format dummy``,
    ``--enable-fused-moe-sum-all-reduce`` and the experts' quantization are left to the boot:
    no knob of the profile sets them."""
    if not paged_experts_cell(cell, runtime):
        return
    loc: Loc = ("cells", name, "knobs", "enable_paged_experts")
    if "paged_experts_num_resident" not in cell.knobs:
        out.add(loc, "needs paged_experts_num_resident (experts per layer kept on the GPU)")
    for knob in ("tp_size", "ep_size", "pp_size", "dp_size"):
        if str(cell.knobs.get(knob, "1")) != "1":
            out.add(loc, f"runs on a single GPU only: SGLang refuses it with {knob} > 1")
    if _switched_on(cell, "enable_eplb"):
        out.add(loc, "SGLang refuses it with enable_eplb")
    speculative = [a for a in cell.args if a.split("=", 1)[0] == "--speculative-algorithm"]
    if speculative or cell.knobs.get("speculative_algorithm") not in (None, ""):
        out.add(
            loc,
            "SGLang refuses it with speculative decoding (--speculative-algorithm): drop "
            "speculative decoding from this cell, or Paged Experts",
        )


# DeepSeek-V3/R1's checkpoints, whose shared expert SGLang fuses into the routed experts unless
# told not to (0.5.23, srt/models/deepseek_v2.py: shared_experts_fusion_disable_reason lets it
# fuse only for this architecture, 256 routed experts and one shared one, on a CUDA GPU of
# compute capability 8.0 or more, without expert parallelism or DeepEP), and Paged Experts
# refuses fused shared experts.
_FUSED_SHARED_EXPERTS = {"architecture": "DeepseekV3ForCausalLM", "routed": 256, "shared": 1}


def paged_experts_model_refusals(
    cell: Cell, runtime: RuntimeProfile, config: dict[str, Any]
) -> list[tuple[str, str]]:
    """(knob, problem) for what SGLang's Paged Experts refuses of a cell given its model's
    ``config.json`` (an empty dict: nothing to judge by): fewer resident experts than the
    router's top-k (``num_experts_per_tok`` of the text config SGLang reads), and DeepSeek-V3/R1's
    fused shared expert unless ``disable_shared_experts_fusion`` is on (0.5.23,
    ``check_paged_experts_compat``)."""
    if not paged_experts_cell(cell, runtime) or not config:
        return []
    from harness.formats.expert_distribution import kt_text_config

    text = kt_text_config(config)
    out = []
    top_k = text.get("num_experts_per_tok")
    resident = _knob_text(cell.knobs.get("paged_experts_num_resident", ""))
    if isinstance(top_k, int) and resident.isdigit() and int(resident) < top_k:
        out.append(
            (
                "paged_experts_num_resident",
                f"{resident} resident experts per layer, fewer than the model's router top-k "
                f"{top_k} (num_experts_per_tok): SGLang refuses it at boot; keep at least {top_k}",
            )
        )
    architectures = text.get("architectures") or config.get("architectures") or [None]
    fused = _FUSED_SHARED_EXPERTS
    if (
        isinstance(architectures, list)
        and architectures[0] == fused["architecture"]
        and text.get("n_routed_experts") == fused["routed"]
        and text.get("n_shared_experts") == fused["shared"]
        and not _switched_on(cell, "disable_shared_experts_fusion")
    ):
        out.append(
            (
                "enable_paged_experts",
                f"SGLang fuses {fused['architecture']}'s shared expert into the routed experts, "
                "which Paged Experts refuses at boot: set disable_shared_experts_fusion: true",
            )
        )
    return out


def _check_prefetch_offload(name: str, cell: Cell, runtime: RuntimeProfile, out: Problems) -> None:
    """vLLM refuses at config what its OffloadConfig's validator refuses (0.32,
    ``config/offload.py``, ``validate_offload_config``): with ``--offload-backend prefetch`` or
    an offload group size set, ``offload_num_in_group`` (default 1) above
    ``offload_group_size`` (default 0, so prefetch alone) or ``offload_prefetch_step`` (default
    1) under 1. A value that does not fit its knob is reported by the knob's own check."""
    needed = ("offload_backend", "offload_group_size", "offload_num_in_group")
    if not all(knob in runtime.knobs for knob in (*needed, "offload_prefetch_step")):
        return
    backend = _knob_text(cell.knobs.get("offload_backend", "auto"))
    numbers = {}
    for knob, default in (
        ("offload_group_size", 0),
        ("offload_num_in_group", 1),
        ("offload_prefetch_step", 1),
    ):
        text = _knob_text(cell.knobs.get(knob, default))
        if runtime.knobs[knob].check(text) is not None:
            return
        numbers[knob] = int(text)
    group = numbers["offload_group_size"]
    if backend != "prefetch" and group == 0:
        return
    knobs: Loc = ("cells", name, "knobs")
    loc: Loc = (
        *knobs,
        "offload_group_size" if "offload_group_size" in cell.knobs else "offload_backend",
    )
    in_group = numbers["offload_num_in_group"]
    if in_group > group:
        out.add(
            loc,
            f"vLLM refuses prefetch offload with offload_num_in_group {in_group} over "
            f"offload_group_size {group}: set offload_group_size N (of every N layers the last "
            "offload_num_in_group are kept in host memory), at least offload_num_in_group",
        )
    if numbers["offload_prefetch_step"] < 1:
        out.add(
            (*knobs, "offload_prefetch_step"),
            "vLLM refuses prefetch offload with offload_prefetch_step 0: prefetch at least 1 "
            "layer ahead",
        )


# ds4-bench's own defaults (ds4_bench.c, parse_options), where neither cell nor profile sets one.
_DS4_BENCH_DEFAULTS = {"ctx_start": 2048, "ctx_max": 32768, "gen_tokens": 128, "ctx_alloc": 0}
_INT_MAX = 2**31 - 1


def _check_ds4_bench_frontiers(
    name: str, cell: Cell, runtime: RuntimeProfile, out: Problems
) -> None:
    """What ds4-bench refuses between its knobs before it opens the model (ds4_bench.c,
    ``parse_options``, exit 2): a first frontier past the last, a context past INT_MAX, an
    allocation that cannot hold the last frontier and its generated tokens, and no prompt."""
    if not set(_DS4_BENCH_DEFAULTS) <= set(runtime.knobs) or "prompt" not in runtime.files:
        return
    knobs: Loc = ("cells", name, "knobs")
    if "prompt_file" not in cell.knobs and "prompt" not in cell.files:
        out.add(
            (*knobs, "prompt_file"),
            "ds4-bench needs a prompt (it exits: specify exactly one of --prompt-file or "
            "--chat-prompt-file): set the prompt_file knob to a path on the box, or upload one "
            "with files: {prompt: FILE}",
        )
    value: dict[str, int] = {}
    for knob, fallback in _DS4_BENCH_DEFAULTS.items():
        text = _knob_text(cell.knobs.get(knob, runtime.knobs[knob].default or fallback))
        if not text.isdigit():
            return  # the knob's own check says what is wrong with it
        value[knob] = int(text)
    start, last, generated, alloc = (value[k] for k in _DS4_BENCH_DEFAULTS)
    if start > last:
        where = "ctx_start" if "ctx_start" in cell.knobs else "ctx_max"
        out.add(
            (*knobs, where),
            f"ds4-bench refuses ctx_start {start} above ctx_max {last} (--ctx-start must be <= "
            "--ctx-max; its defaults are 2048 and 32768): set both",
        )
    if last > _INT_MAX - generated - 1:
        out.add(
            (*knobs, "ctx_max"),
            f"ds4-bench refuses ctx_max {last} with gen_tokens {generated} (requested context is "
            f"too large): their sum must stay below {_INT_MAX}",
        )
    elif alloc and alloc <= last + generated:
        out.add(
            (*knobs, "ctx_alloc"),
            f"ds4-bench refuses ctx_alloc {alloc}: it must be greater than ctx_max + gen_tokens "
            f"({last} + {generated}); leave it unset for {last + generated + 1}",
        )


# The reference runtime's box-state faults, and the knob naming the file each is carried in
# between boots (harness/refbox/options.py refuses a nonzero size without it).
_FAULT_STATE_FILES = {
    "carry_over_pct": "carry_over_state",
    "carry_over_leaves_pct": "carry_over_state",
    "heat_source": "heat_state",
    "heat_slowdown_pct": "heat_state",
}


def _check_fault_state_files(name: str, cell: Cell, runtime: RuntimeProfile, out: Problems) -> None:
    """A box-state fault of the reference runtime needs the file that holds the state across
    the box's boots: refused at startup without it, so refused here."""
    for knob, state in _FAULT_STATE_FILES.items():
        if knob not in runtime.knobs or state not in runtime.knobs or state in cell.knobs:
            continue
        try:
            size = float(_knob_text(cell.knobs.get(knob, "0")))
        except ValueError:
            continue  # the knob's own check says what is wrong with it
        if size != 0:
            out.add(
                ("cells", name, "knobs", knob),
                f"{knob} {size:g} needs {state}: the absolute path of the file the box's boots "
                "share (the same file in every cell of the campaign)",
            )


def _check_values(
    out: Problems,
    loc: Loc,
    values: Mapping[str, KnobValue],
    specs: Mapping[str, KnobSpec],
    unknown: Callable[[str], str] | None,
) -> None:
    """Each value against the spec of its key; ``unknown`` words the problem of a key with no
    spec (None: such keys are allowed)."""
    for key, value in values.items():
        spec = specs.get(key)
        if spec is None:
            if unknown is not None:
                out.add((*loc, key), unknown(key))
            continue
        problem = spec.check(_knob_text(value))
        if problem:
            out.add((*loc, key), problem)


def _switched_on(cell: Cell, knob: str) -> bool:
    """Whether the cell turns a switch knob on (true, 1, on; a YAML boolean included)."""
    value = cell.knobs.get(knob)
    return value is not None and switch_state(_knob_text(value)) is True
