"""What SGLang refuses at boot of a cell's MoE all-to-all or attention backend, judged here.

SGLang 0.5.23 resolves ``--moe-a2a-backend`` against the cell's parallel layout, its chunked
prefill, per-backend dispatch-token budgets read from the environment, the model's checkpoint
and the GPU (``srt/arg_groups/moe_hook.py``, ``handle_a2a_moe`` and
``validate_deepep_v2_dispatch_token_budget``; ``validate_flashinfer_a2a_token_budget``), and
sglang-kt 0.7.2 refuses its TensorRT-LLM attention backends off Blackwell (``server_args.py``,
``_handle_attention_backend_compatibility``). Each raises before the model loads, so a boot on a
GPU box is spent to learn it; here each is said at ``validate`` where the knobs decide it, at
``validate`` for a local model and when a campaign starts for a box's (its ``config.json``), and
when a campaign starts where the box's GPU decides it: its compute capability, or its memory,
from which SGLang picks the chunked prefill size and decode CUDA-graph batch a cell leaves unset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.card.schema import Cell
from harness.profiles.schema import RuntimeProfile, switch_state

__all__ = [
    "GpuFacts",
    "boots_sglang",
    "sglang_cell_refusals",
    "sglang_model_refusals",
    "unquantized_checkpoint",
]


@dataclass(frozen=True)
class GpuFacts:
    """What SGLang reads of a box's GPUs: the first one's compute capability (``torch.cuda.
    get_device_capability()``) and the smallest total memory in MiB (``nvidia-smi``'s
    ``memory.total``, ``get_nvgpu_memory_capacity``)."""

    capability: tuple[int, int]
    memory_mib: float

    def describe(self) -> str:
        """The GPU as a refusal names it."""
        major, minor = self.capability
        return f"compute capability {major}.{minor}, {self.memory_mib:.0f} MiB"


# The per-rank dispatch budgets (0.5.23, srt/environ.py: the variable and its default), each
# read when the backend resolves.
MORI_BUDGET = ("SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 4096)
PPLX_BUDGET = ("SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128)
DEEPEP_V2_BUDGET = ("SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128)
# max_prefill_tokens' default, DeepEP v2's prefill ceiling when chunked prefill is off.
MAX_PREFILL_TOKENS = 16384
# Arguments that change what is judged here: a cell passing one raw is left to the engine.
_DECIDING_ARGS = frozenset(
    {"--attn-dp-size", "--attention-data-parallel-size", "--dp-size", "--data-parallel-size",
     "--chunked-prefill-size", "--max-prefill-tokens", "--moe-runner-backend", "--deepep-mode",
     "--cuda-graph-max-bs-decode", "--disable-cuda-graph", "--disable-decode-cuda-graph",
     "--cuda-graph-backend-decode", "--cuda-graph-bs-decode", "--disaggregation-mode",
     "--quantization", "--tp-size", "--tensor-parallel-size", "--max-running-requests",
     "--enable-layernorm-sp", "--speculative-algorithm"}
)  # fmt: skip
# FlashInfer MegaMoE's validated architectures (0.5.23, validate_flashinfer_megamoe_model).
MEGAMOE_ARCHITECTURES = frozenset(
    {"BeamForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
     "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
     "GlmMoeDsaForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
     "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "KimiK3ForConditionalGeneration",
     "KimiK3LinearForCausalLM"}
)  # fmt: skip
# DeepEP v2's registered architectures (0.5.23, srt/configs/moe_model_registry.py).
DEEPEP_V2_ARCHITECTURES = frozenset(
    {"DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Qwen3MoeForCausalLM",
     "Glm5NextForConditionalGeneration", "GlmMoeDsaForCausalLM", "MiMoV2ForCausalLM",
     "MiMoV2FlashForCausalLM"}
)  # fmt: skip
# Architectures whose unquantized checkpoint leaves the MoE runner on `auto` under FlashInfer's
# all-to-all: no model override picks one (Qwen3-MoE's picks flashinfer_trtllm only with
# moe_a2a_backend none, on SM100; srt/arg_groups/model_overrides/qwen3_moe.py).
AUTO_RUNNER_ARCHITECTURES = frozenset(
    {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"}
)
_FLASHINFER_RUNNERS = (
    "flashinfer_cutlass, flashinfer_cutedsl, flashinfer_trtllm(_routed) or deep_gemm"
)


def boots_sglang(runtime: RuntimeProfile) -> bool:
    """Whether the profile boots SGLang's server (these rules are its, not a knob name's)."""
    return any("sglang.launch_server" in word for word in runtime.boot.command)


def _raw_args(cell: Cell) -> bool:
    """Whether the cell passes raw an argument these rules read (then left to the engine)."""
    return any(arg.split("=", 1)[0] in _DECIDING_ARGS for arg in cell.args)


def _setting(cell: Cell, runtime: RuntimeProfile, knob: str) -> str | None:
    """The cell's value of a knob, else the profile's default (None: neither)."""
    if knob in cell.knobs:
        value = cell.knobs[knob]
        if isinstance(value, bool):
            return "1" if value else "0"
        return str(value)
    spec = runtime.knobs.get(knob)
    return spec.default if spec is not None else None


def _number(cell: Cell, runtime: RuntimeProfile, knob: str, default: int | None) -> int | None:
    """A knob's integer value (``default`` where unset; None where it is no integer: its own
    check says so)."""
    text = _setting(cell, runtime, knob)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return None


def _budget(cell: Cell, runtime: RuntimeProfile, budget: tuple[str, int]) -> int | None:
    """A dispatch budget as the engine reads it: the cell's raw env (it wins at boot), else
    the knob that sets the variable, else SGLang's default."""
    var, default = budget
    found = runtime.knob_for_env(var)
    text = cell.env.get(var)
    if text is None and found is not None:
        text = _setting(cell, runtime, found[0])
    try:
        return default if text is None else int(str(text))
    except ValueError:
        return None


def default_chunked_prefill(gpu: GpuFacts) -> int:
    """SGLang 0.5.23's chunked prefill size for a GPU of this memory when none is given
    (``srt/arg_groups/memory_hook.py``, ``handle_gpu_memory_settings``)."""
    mib = gpu.memory_mib
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    return 8192 if mib < 160 * 1024 else 16384


def default_decode_graph_bs(gpu: GpuFacts, tp_size: int) -> int:
    """SGLang 0.5.23's largest decode CUDA-graph batch for a GPU of this memory when none is
    given (``handle_gpu_memory_settings``)."""
    mib, small_tp = gpu.memory_mib, tp_size < 4
    if mib < 20 * 1024:
        return 8
    if mib < 35 * 1024:
        return 48 if small_tp else 160
    if mib < 60 * 1024:
        return 32 if small_tp else 160
    if mib < 160 * 1024:
        return 256 if small_tp else 512
    return 512


@dataclass(frozen=True)
class _Layout:
    """The cell's settings the backends' rules read (None: SGLang picks it from the GPU, and
    no GPU is known here)."""

    tp: int
    attn_dp: int
    chunked: int | None  # per attention-DP rank, as handle_data_parallelism divides it
    running: int | None
    graphs: bool


def _layout(cell: Cell, runtime: RuntimeProfile, gpu: GpuFacts | None) -> _Layout | None:
    tp = _number(cell, runtime, "tp_size", 1)
    attn_dp = _number(cell, runtime, "attn_dp_size", 1)
    chunked = _number(cell, runtime, "chunked_prefill_size", 0)
    running = _number(cell, runtime, "max_running_requests", 0)
    if tp is None or attn_dp is None or chunked is None or running is None:
        return None
    if chunked == 0:  # unset: the GPU's memory decides
        chunked = default_chunked_prefill(gpu) if gpu is not None else None
    if chunked is not None and attn_dp > 1:
        chunked //= attn_dp
    graphs = switch_state(_setting(cell, runtime, "disable_cuda_graph") or "0") is not True
    return _Layout(tp, attn_dp, chunked, running or None, graphs)


def _deepep_v2_decode_tokens(layout: _Layout, gpu: GpuFacts | None) -> int | None:
    """The decode CUDA graph's largest batch on one rank (``_decode_graph_dispatch_tokens_per_
    rank``; one token a request without speculative decoding)."""
    if not layout.graphs:
        return 0
    if gpu is None:
        return None
    graph_bs = default_decode_graph_bs(gpu, layout.tp)
    if layout.running is not None:
        graph_bs = min(graph_bs, layout.running, max(1, layout.running // layout.attn_dp))
    return graph_bs


def _attn_dp_problems(backend: str, layout: _Layout) -> list[str]:
    if backend in ("flashinfer", "flashinfer_megamoe") and not (
        layout.attn_dp > 1 and layout.attn_dp == layout.tp
    ):
        return [
            f"SGLang refuses moe_a2a_backend {backend} without attention data parallelism "
            f"across the whole TP group (it needs --attn-dp-size equal to --tp-size, here "
            f"attn_dp_size {layout.attn_dp}, tp_size {layout.tp}): set attn_dp_size to tp_size "
            "(2 or more)"
        ]
    if backend == "pplx" and layout.attn_dp < 2:
        return [
            "SGLang refuses moe_a2a_backend pplx without attention data parallelism (it needs "
            "--attn-dp-size 2 or more): set attn_dp_size (dividing tp_size) to 2 or more"
        ]
    return []


def _budget_problems(
    backend: str, cell: Cell, runtime: RuntimeProfile, layout: _Layout, gpu: GpuFacts | None
) -> list[str]:
    """The per-rank dispatch budgets the release checks against the chunked prefill."""
    out = []
    chunk = layout.chunked
    where = "per attention-DP rank" if layout.attn_dp > 1 else "per rank"
    picked = "" if "chunked_prefill_size" in cell.knobs else f" (SGLang's default on {gpu_of(gpu)})"
    rules = {"mori": MORI_BUDGET, "pplx": PPLX_BUDGET}
    if backend in rules and chunk is not None and chunk > 0:
        var, _ = rules[backend]
        capacity = _budget(cell, runtime, rules[backend])
        if capacity is not None and chunk > capacity:
            out.append(
                f"SGLang refuses moe_a2a_backend {backend} when the chunked prefill size "
                f"{where}, {chunk}{picked}, exceeds {var} ({capacity}): "
                f"{_raise(runtime, var, chunk)}, or lower chunked_prefill_size"
            )
    if backend == "flashinfer" and chunk is not None and chunk <= 0:
        out.append(
            "SGLang refuses moe_a2a_backend flashinfer without chunked prefill (its all-to-all "
            "workspace is sized by it): set chunked_prefill_size to a positive size"
        )
    if backend == "deepep_v2":
        out += _deepep_v2_problems(cell, runtime, layout, gpu)
    return out


def _deepep_v2_problems(
    cell: Cell, runtime: RuntimeProfile, layout: _Layout, gpu: GpuFacts | None
) -> list[str]:
    """``validate_deepep_v2_dispatch_token_budget``: the prefill chunk scattered over the ranks
    of an attention-DP group, and the decode CUDA graph's batch, each within the budget."""
    var, _ = DEEPEP_V2_BUDGET
    capacity = _budget(cell, runtime, DEEPEP_V2_BUDGET)
    if capacity is None:
        return []
    out = []
    if layout.chunked is not None:
        ceiling = layout.chunked if layout.chunked > 0 else MAX_PREFILL_TOKENS
        prefill = math.ceil(ceiling / max(1, layout.tp // layout.attn_dp))
        if prefill > capacity:
            out.append(
                f"SGLang refuses moe_a2a_backend deepep_v2 when a rank's prefill dispatch, "
                f"{prefill} tokens, exceeds {var} ({capacity}): "
                f"{_raise(runtime, var, prefill)}, or lower chunked_prefill_size"
            )
    decode = _deepep_v2_decode_tokens(layout, gpu)
    if decode is not None and decode > capacity:
        out.append(
            f"SGLang refuses moe_a2a_backend deepep_v2 when its decode CUDA graph's batch, "
            f"{decode} on {gpu_of(gpu)}, exceeds {var} ({capacity}): "
            f"{_raise(runtime, var, decode)}, lower max_running_requests, or set "
            "disable_cuda_graph"
        )
    return out


def _raise(runtime: RuntimeProfile, var: str, tokens: int) -> str:
    """The fix that raises a dispatch budget: its knob, else the raw environment variable."""
    found = runtime.knob_for_env(var)
    return f"set {found[0] if found else 'env ' + var} to {tokens} or more"


def gpu_of(gpu: GpuFacts | None) -> str:
    """The GPU as a message names it."""
    return f"a GPU of {gpu.describe()}" if gpu is not None else "the box's GPU"


def _attention_problems(cell: Cell, runtime: RuntimeProfile, gpu: GpuFacts) -> list[str]:
    """sglang-kt 0.7.2's TensorRT-LLM attention backends: trtllm_mha on SM100 only
    (``is_sm100_supported``: major 10), trtllm_mla on Blackwell (``is_blackwell_supported``:
    major 10, 11 or 12)."""
    backend = _setting(cell, runtime, "attention_backend")
    majors = {"trtllm_mha": (10,), "trtllm_mla": (10, 11, 12)}.get(backend or "")
    if majors is None or gpu.capability[0] in majors:
        return []
    family = "SM100" if majors == (10,) else "Blackwell (SM100, SM110, SM120)"
    return [
        f"SGLang refuses attention_backend {backend} off {family} GPUs, and this box's is "
        f"{gpu.describe()}: use another attention_backend (e.g. flashinfer, fa3 or triton)"
    ]


def sglang_cell_refusals(
    cell: Cell, runtime: RuntimeProfile, gpu: GpuFacts | None = None
) -> list[tuple[str, str]]:
    """(knob, problem) for what SGLang refuses of the cell's all-to-all or attention backend
    given its knobs; with ``gpu`` None, only what the knobs decide alone, with a box's GPU also
    what SGLang picks from it (a chunked prefill size or decode batch left unset) and what it
    allows only on Blackwell. A cell passing a deciding argument raw is left to the engine."""
    if not boots_sglang(runtime) or _raw_args(cell):
        return []
    out: list[tuple[str, str]] = []
    layout = _layout(cell, runtime, gpu)
    if layout is None:
        return out
    if "attn_dp_size" in runtime.knobs and layout.attn_dp > 1 and layout.tp % layout.attn_dp:
        out.append(
            (
                "attn_dp_size",
                f"SGLang refuses attn_dp_size {layout.attn_dp} that does not divide tp_size "
                f"{layout.tp} (each attention-DP group is a slice of the TP group): set "
                "tp_size to a multiple of it",
            )
        )
        return out
    backend = _setting(cell, runtime, "moe_a2a_backend") or "none"
    if "moe_a2a_backend" in runtime.knobs:
        problems = _attn_dp_problems(backend, layout)
        problems += _budget_problems(backend, cell, runtime, layout, gpu)
        if backend == "flashinfer_megamoe" and gpu is not None and gpu.capability[0] != 10:
            problems.append(
                "SGLang refuses moe_a2a_backend flashinfer_megamoe off SM100-family GPUs, and "
                f"this box's is {gpu.describe()}: use another moe_a2a_backend (e.g. deepep)"
            )
        out += [("moe_a2a_backend", problem) for problem in problems]
    if gpu is not None and "attention_backend" in runtime.knobs:
        out += [("attention_backend", p) for p in _attention_problems(cell, runtime, gpu)]
    return out


def unquantized_checkpoint(config: Mapping[str, Any], quant_file: bool) -> bool:
    """Whether SGLang finds no quantization in the checkpoint: no ``quantization_config`` or
    ``compression_config`` in its config.json and no ``hf_quant_config.json`` beside it
    (``ModelConfig._parse_quant_hf_config``)."""
    keys = ("quantization_config", "compression_config")
    return not quant_file and not any(config.get(key) for key in keys)


def _megamoe_checkpoint(config: Mapping[str, Any], quant_file: bool) -> str | None:
    """Why FlashInfer MegaMoE refuses the checkpoint, or None where it takes it or only the
    engine can tell (a ModelOpt or DeepSeek-V4 layout). 0.5.23's rule: an MXFP8 or ModelOpt
    NVFP4 quantization, MXFP4 routed experts, or a mixed-precision NVFP4 MoE."""
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    if quant_file or "DeepseekV4ForCausalLM" in (config.get("architectures") or []):
        return None
    if (
        quant.get("routed_experts_quant_method") == "mxfp4"
        or str(quant.get("store_dtype") or "").lower() == "mxfp4"
        or str(quant.get("moe_quant_algo", "")).upper() == "NVFP4"
    ):
        return None
    method = str(quant.get("quant_method", "modelopt" if quant else "")).lower()
    if method in ("mxfp8", "modelopt", "modelopt_fp4"):
        return None
    if not method and config.get("compression_config"):
        method = "compressed-tensors"
    return f"{method} quantization" if method else "no quantization (an unquantized checkpoint)"


def sglang_model_refusals(
    cell: Cell, runtime: RuntimeProfile, config: Mapping[str, Any], quant_file: bool
) -> list[tuple[str, str]]:
    """(knob, problem) for what SGLang refuses of the cell's all-to-all backend given its
    model's ``config.json`` (empty: nothing to judge by) and whether ``hf_quant_config.json``
    is beside it."""
    if not config or "moe_a2a_backend" not in runtime.knobs:
        return []
    if not boots_sglang(runtime) or _raw_args(cell):
        return []
    backend = _setting(cell, runtime, "moe_a2a_backend") or "none"
    architectures = config.get("architectures") or []
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    problems = []
    if backend == "deepep_v2" and first not in DEEPEP_V2_ARCHITECTURES:
        problems.append(
            f"SGLang refuses moe_a2a_backend deepep_v2 for {first!r}: only "
            f"{', '.join(sorted(DEEPEP_V2_ARCHITECTURES))} are registered; use deepep"
        )
    if backend == "flashinfer_megamoe":
        if not any(arch in MEGAMOE_ARCHITECTURES for arch in architectures):
            problems.append(
                f"SGLang refuses moe_a2a_backend flashinfer_megamoe for {architectures}: "
                f"it is validated only for {', '.join(sorted(MEGAMOE_ARCHITECTURES))}"
            )
        else:
            found = _megamoe_checkpoint(config, quant_file)
            if found is not None:
                problems.append(
                    f"SGLang refuses moe_a2a_backend flashinfer_megamoe for a checkpoint of "
                    f"{found}: it takes only MXFP8, ModelOpt NVFP4, MXFP4-expert or hybrid "
                    "NVFP4-MoE checkpoints; use another moe_a2a_backend (e.g. deepep)"
                )
    if (
        backend == "flashinfer"
        and first in AUTO_RUNNER_ARCHITECTURES
        and unquantized_checkpoint(config, quant_file)
    ):
        problems.append(
            f"SGLang refuses moe_a2a_backend flashinfer with the MoE runner it picks for an "
            f"unquantized {first} (auto): the all-to-all needs {_FLASHINFER_RUNNERS}, and "
            "this profile has no moe_runner_backend knob; use another moe_a2a_backend "
            "(e.g. deepep)"
        )
    return [("moe_a2a_backend", problem) for problem in problems]
