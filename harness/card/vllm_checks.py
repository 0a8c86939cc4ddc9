"""What vLLM refuses between a cell's knobs before it loads a weight, judged here.

vLLM 0.32 (the release ``make vllm`` pins) builds its whole engine config before it loads a
weight, and refuses there what a card can get wrong between knobs: EPLB without expert
parallelism or on one GPU, redundant experts without EPLB (``config/parallel.py``,
``ParallelConfig``), a token budget under the batch or, with chunked prefill off, under the
context (``config/scheduler.py``, ``verify_max_model_len``), routed experts in responses
without Model Runner V2 or prefix caching (``config/vllm.py``,
``_verify_aux_output_compatibility``), Model Runner V2 without Triton
(``_validate_v2_model_runner``), a context past the model's (``config/model.py``,
``_get_and_verify_max_len``) and a speculative config it cannot build (``config/speculative.py``).
Each is said at ``validate`` where the knobs decide it, at ``validate`` for a local model and when
a campaign starts for a box's (its ``config.json``), and when a campaign starts where the box
decides it: vLLM's default token budget (``engine/arg_utils.py``, ``get_batch_defaults``) follows
its platform and the first GPU's memory and name, and its CPU build has neither Triton (Model
Runner V2) nor EPLB.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.card.schema import Cell, KnobValue
from harness.profiles.schema import RuntimeProfile, switch_state

__all__ = [
    "VllmBox",
    "boots_vllm",
    "default_token_budget",
    "model_max_len",
    "vllm_box_refusals",
    "vllm_cell_refusals",
    "vllm_model_folder",
    "vllm_model_refusals",
    "vllm_problem_field",
]

MIB_PER_GIB = 1024
# get_batch_defaults' OpenAI-server budgets: CPU 2048 per rank of pp x tp; a GPU under 70 GiB
# (or an A100) 2048, from 70 GiB 8192, from 160 GiB 16384.
CPU_BUDGET_PER_RANK = 2048
GPU_BUDGETS = ((160 * MIB_PER_GIB, 16384), (70 * MIB_PER_GIB, 8192), (0, 2048))
# vLLM reads the memory in bytes from torch, a little under nvidia-smi's memory.total: a GPU
# within this fraction of a threshold is not judged.
_MEMORY_MARGIN = 0.02
# Arguments that change what is judged here (argparse takes the last, and a cell's raw args
# come after its knobs): a cell passing one raw is left to the engine.
_DECIDING_ARGS = frozenset(
    {"--enable-eplb", "--no-enable-eplb", "--enable-expert-parallel", "-ep",
     "--no-enable-expert-parallel", "--tensor-parallel-size", "-tp", "--data-parallel-size",
     "-dp", "--pipeline-parallel-size", "-pp", "--prefill-context-parallel-size", "-pcp",
     "--eplb-config", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
     "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--performance-mode",
     "--all2all-backend", "--enable-return-routed-experts", "--aux-output-config",
     "--enable-prefix-caching", "--no-enable-prefix-caching", "--speculative-config", "-sc",
     "--spec-method", "--spec-model", "--spec-tokens", "--hf-overrides", "--hf-config-path",
     "--runner", "--convert"}
)  # fmt: skip
# SpeculativeConfig's fields (0.32, config/speculative.py: its dataclass's init fields), which
# it is built from as SpeculativeConfig(**json): another key is a TypeError.
SPECULATIVE_FIELDS = frozenset(
    {"attention_backend", "code_revision", "disable_eagle_block_drop",
     "disable_padded_drafter_batch", "draft_load_config", "draft_model_config",
     "draft_parallel_config", "draft_sample_method", "draft_tensor_parallel_size",
     "dspark_draft_topk", "enable_adaptive_verification", "enforce_eager",
     "index_share_for_mtp_iteration", "kv_cache_dtype", "max_model_len", "method", "model",
     "moe_backend", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
     "parallel_drafting", "prompt_lookup_max", "prompt_lookup_min", "quantization",
     "rejection_sample_method", "revision", "suffix_decoding_max_cached_requests",
     "suffix_decoding_max_spec_factor", "suffix_decoding_max_tree_depth",
     "suffix_decoding_min_token_prob", "synthetic_acceptance_length",
     "synthetic_acceptance_rates", "target_model_config", "target_parallel_config",
     "tensor_parallel_size", "use_heterogeneous_vocab", "use_local_argmax_reduction"}
)  # fmt: skip
# Methods with no draft model: num_speculative_tokens has no config to come from.
_MODELLESS_METHODS = frozenset({"ngram", "ngram_gpu"})
# Methods that find their own model where none is given (SpeculativeConfig.__post_init__): the
# MTP family (renamed mtp), dspark, ngram, suffix, extract_hidden_states, custom_class.
_SELF_MODEL_METHODS = frozenset(
    {"mtp", "dspark", "ngram", "ngram_gpu", "suffix", "extract_hidden_states", "custom_class"}
)
# The keys _get_and_verify_max_len reads the model's context from (derive_max_model_len_and_key:
# the smallest; model_max_length, where set, wins), and the RoPE types whose factor is not
# applied again.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")  # fmt: skip
_UNSCALED_ROPE = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)


@dataclass(frozen=True)
class VllmBox:
    """What vLLM's platform defaults read of a box: whether it may run vLLM's CPU build (no
    Triton, a budget of 2048 per rank), and its first GPU's total memory in MiB and name
    (``nvidia-smi``'s ``memory.total`` and ``name``; None: no GPU read)."""

    cpu: bool
    gpu_mib: float | None = None
    gpu_name: str = ""

    def describe(self) -> str:
        """The box as a refusal names it."""
        if self.gpu_mib is None:
            return "a CPU-only box (nvidia-smi reads no GPU)"
        return f"{self.gpu_name or 'the box GPU'} ({self.gpu_mib:.0f} MiB)"


def boots_vllm(runtime: RuntimeProfile) -> bool:
    """Whether the profile boots vLLM's server (these rules are its, not a knob name's)."""
    return any(re.search(r"\bvllm\"?\s+serve\b", word) for word in runtime.boot.command)


def vllm_model_folder(cell: Cell, runtime: RuntimeProfile) -> str | None:
    """The folder the cell's vLLM reads its model from: the ``model`` knob, or cuda-lane's
    ``model_dir`` (mounted as /model); None where neither is set."""
    if not boots_vllm(runtime):
        return None
    for knob in ("model", "model_dir"):
        value = cell.knobs.get(knob)
        if knob in runtime.knobs and isinstance(value, str) and value:
            return value
    return None


def vllm_problem_field(knob: str) -> tuple[str, str]:
    """Where a refusal's ``knob`` lives in a cell: ``("knobs", NAME)``, or ``("env", VAR)`` for
    an ``env.VAR`` one."""
    section, _, var = knob.partition(".")
    return ("env", var) if section == "env" and var else ("knobs", knob)


def _text(value: KnobValue) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class _Settings:
    """The cell's values the rules read: the cell's knob, else the profile's default (None:
    unset, or not a value its knob takes, which the knob's own check reports)."""

    cell: Cell
    runtime: RuntimeProfile

    def has(self, *knobs: str) -> bool:
        return all(knob in self.runtime.knobs for knob in knobs)

    def text(self, knob: str) -> str | None:
        if knob in self.cell.knobs:
            return _text(self.cell.knobs[knob])
        spec = self.runtime.knobs.get(knob)
        return spec.default if spec is not None else None

    def switch(self, knob: str) -> bool | None:
        text = self.text(knob)
        return None if text is None else switch_state(text)

    def number(self, knob: str) -> int | None:
        text = self.text(knob)
        return int(text) if text is not None and re.fullmatch(r"[0-9]+", text) else None

    def env(self, var: str) -> str | None:
        """A VLLM_* variable as the boot sets it: the cell's env wins over a knob's."""
        if var in self.cell.env:
            return _text(self.cell.env[var])
        found = self.runtime.knob_for_env(var)
        return self.text(found[0]) if found is not None else None

    def json_object(self, knob: str) -> dict[str, Any] | None:
        text = self.text(knob)
        try:
            value = json.loads(text) if text is not None else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def world_size(self) -> int:
        """The pipeline x tensor ranks get_batch_defaults multiplies the CPU budget by."""
        return self.number("tensor_parallel_size") or 1


def _raw_args(cell: Cell) -> bool:
    """Whether the cell passes raw an argument these rules read (then left to the engine)."""
    flags = (arg.split("=", 1)[0] for arg in cell.args if arg.startswith("-"))
    return any(flag.replace("_", "-") in _DECIDING_ARGS for flag in flags)


def _settings(cell: Cell, runtime: RuntimeProfile) -> _Settings | None:
    if not boots_vllm(runtime) or _raw_args(cell):
        return None
    return _Settings(cell, runtime)


def _v2_runner(value: str | None) -> bool | None:
    """VLLM_USE_V2_MODEL_RUNNER as vLLM reads it (envs.py: bool(int(value))); None: unset or
    no integer."""
    if value is None or not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        return None
    return int(value) != 0


def _eplb_refusals(s: _Settings) -> list[tuple[str, str]]:
    """ParallelConfig's EPLB rules (config/parallel.py, ``_validate_parallel_config``)."""
    if not s.has("eplb", "expert_parallel"):
        return []
    out = []
    if s.switch("eplb"):
        if not s.switch("expert_parallel"):
            out.append(
                (
                    "eplb",
                    "vLLM refuses EPLB without expert parallelism (enable_expert_"
                    "parallel must be True to use EPLB): set expert_parallel: true",
                )
            )
        tp, dp = s.number("tensor_parallel_size") or 1, s.number("data_parallel_size") or 1
        if s.has("tensor_parallel_size", "data_parallel_size") and tp * dp <= 1:
            out.append(
                (
                    "eplb",
                    "vLLM refuses EPLB on one rank (EPLB requires tensor, "
                    f"prefill-context, or data parallelism; here TP={tp}, DP={dp}): set "
                    "tensor_parallel_size or data_parallel_size so their product is 2 or "
                    "more",
                )
            )
    elif s.has("eplb_config"):
        redundant = (s.json_object("eplb_config") or {}).get("num_redundant_experts", 0)
        if isinstance(redundant, int) and not isinstance(redundant, bool) and redundant > 0:
            out.append(
                (
                    "eplb_config",
                    f"vLLM refuses num_redundant_experts {redundant} without "
                    "EPLB (num_redundant_experts is set … but EPLB is not enabled): set "
                    "eplb: true, or drop num_redundant_experts",
                )
            )
    return out


def default_token_budget(box: VllmBox, world_size: int) -> int | None:
    """vLLM's OpenAI-server max_num_batched_tokens where a cell sets none (``get_batch_defaults``),
    before chunked prefill off raises it to max_model_len: the largest of what the box's
    possible platforms give (None: a GPU too near a memory threshold to tell)."""
    budgets = [CPU_BUDGET_PER_RANK * world_size] if box.cpu else []
    if box.gpu_mib is not None:
        for floor, budget in GPU_BUDGETS:
            if floor and abs(box.gpu_mib - floor) <= floor * _MEMORY_MARGIN:
                return None
            if box.gpu_mib >= floor:
                a100 = floor == 70 * MIB_PER_GIB and "a100" in box.gpu_name.lower()
                budgets.append(GPU_BUDGETS[-1][1] if a100 else budget)
                break
    return max(budgets) if budgets else None


def _context_refusals(
    s: _Settings, context: int | None, box: VllmBox | None, whose: str
) -> list[tuple[str, str]]:
    """SchedulerConfig.verify_max_model_len: the token budget under the context with chunked
    prefill off, and under max_num_seqs. ``context`` is the max_model_len vLLM runs (None: not
    known); ``box`` None judges an unset budget by the largest default any box gives."""
    if not s.has("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        return []
    out = []
    budget, seqs = s.number("max_num_batched_tokens"), s.number("max_num_seqs")
    chunked = s.switch("chunked_prefill") if s.has("chunked_prefill") else None
    if budget is not None:
        if chunked is False and context is not None and budget < context:
            out.append(
                (
                    "max_num_batched_tokens",
                    f"vLLM refuses max_num_batched_tokens {budget} "
                    f"under max_model_len {context}{whose} with chunked prefill off (it "
                    "is smaller than max_model_len): raise max_num_batched_tokens to "
                    f"{context} or more, lower max_model_len, or turn chunked_prefill on",
                )
            )
        if seqs is not None and budget < seqs:
            out.append(
                (
                    "max_num_seqs",
                    f"vLLM refuses max_num_seqs {seqs} over "
                    f"max_num_batched_tokens {budget} (it must be greater than or equal "
                    "to max_num_seqs): lower max_num_seqs, or raise max_num_batched_tokens",
                )
            )
        return out
    if seqs is None:
        return out
    if box is None:  # every default vLLM picks: the largest GPU's, or the CPU's per rank
        default: int | None = max(GPU_BUDGETS[0][1], CPU_BUDGET_PER_RANK * s.world_size())
        where = "the largest default vLLM picks on any box"
    else:
        default = default_token_budget(box, s.world_size())
        where = f"vLLM's default on {box.describe()}"
    if default is None or (chunked is False and context is None):
        return out  # chunked prefill off raises the default to the context
    if chunked is False:
        default = max(default, context or 0)
    if seqs > default:
        out.append(
            (
                "max_num_seqs",
                f"vLLM refuses max_num_seqs {seqs} over its token budget "
                f"{default} ({where}; max_num_batched_tokens must be greater than or equal "
                f"to max_num_seqs): set max_num_batched_tokens to {seqs} or more, or lower "
                "max_num_seqs",
            )
        )
    return out


def _routed_refusals(s: _Settings) -> list[tuple[str, str]]:
    """``_verify_aux_output_compatibility`` (config/vllm.py): routed experts come only from
    Model Runner V2 and need prefix caching. vLLM 0.32 runs V2 by default only where Triton is
    and no feature V2 lacks is on, and runs V1 on a CPU box, so a cell asks for V2 itself."""
    value = s.env("VLLM_USE_V2_MODEL_RUNNER")
    out = []
    if value is not None and _v2_runner(value) is None:
        out.append(
            (
                "env.VLLM_USE_V2_MODEL_RUNNER",
                f"vLLM reads VLLM_USE_V2_MODEL_RUNNER as an "
                f"integer (bool(int(value))) and fails on {value!r}: set it to 1 or 0",
            )
        )
    if not s.has("return_routed_experts") or not s.switch("return_routed_experts"):
        return out
    if _v2_runner(value) is not True:
        out.append(
            (
                "return_routed_experts",
                "vLLM returns routed experts only from Model "
                "Runner V2 (AuxOutput Connector requires Model Runner V2), which it picks "
                "unasked only on a CUDA build with Triton: set env "
                'VLLM_USE_V2_MODEL_RUNNER: "1" in this cell (a CUDA box), or drop '
                "return_routed_experts",
            )
        )
    if s.has("prefix_caching") and s.switch("prefix_caching") is False:
        out.append(
            (
                "return_routed_experts",
                "vLLM refuses routed experts without prefix "
                "caching (AuxOutput Connector requires prefix caching): drop "
                "prefix_caching: false, or return_routed_experts",
            )
        )
    return out


def _speculative_refusals(s: _Settings) -> list[tuple[str, str]]:
    """What ``SpeculativeConfig(**json)`` refuses of the keys alone (config/speculative.py). A
    draft or MTP model that may supply num_speculative_tokens (its n_predict, or the target's
    num_nextn_predict_layers) is left to the boot, which reads its config."""
    setting = s.json_object("speculative_config") if s.has("speculative_config") else None
    if setting is None:
        return []
    problems = []
    unknown = sorted(set(setting) - SPECULATIVE_FIELDS)
    if unknown:
        problems.append(
            f"vLLM's SpeculativeConfig has no field {', '.join(unknown)} (it fails "
            "with an unexpected keyword argument): use its fields, e.g. method, "
            "model, num_speculative_tokens, prompt_lookup_max"
        )
    if setting.get("tensor_parallel_size") is not None:
        problems.append(
            "vLLM refuses tensor_parallel_size in speculative_config: use "
            "draft_tensor_parallel_size"
        )
    method, model = setting.get("method"), setting.get("model")
    tokens = setting.get("num_speculative_tokens")
    modelless = method in _MODELLESS_METHODS or (method is None and model in (None, "ngram"))
    if tokens is None and modelless:
        problems.append(
            "vLLM needs num_speculative_tokens here (num_speculative_tokens must be "
            "provided …): no draft model's config can supply it; set it (e.g. 2)"
        )
    mtp = isinstance(method, str) and method.endswith("_mtp")
    if tokens is not None and model is None and method not in _SELF_MODEL_METHODS and not mtp:
        problems.append(
            f"vLLM refuses num_speculative_tokens with method {method or 'unset'} "
            "and no model (num_speculative_tokens was provided but without "
            "speculative model): set model to the draft, or method ngram"
        )
    return [("speculative_config", problem) for problem in problems]


def vllm_cell_refusals(cell: Cell, runtime: RuntimeProfile) -> list[tuple[str, str]]:
    """(knob, problem) for what vLLM refuses of the cell's knobs alone: EPLB, the token budget
    against a context and batch the knobs set (an unset budget against the largest default any
    box gives), routed experts and Model Runner V2, and the speculative config's keys. A cell
    passing a deciding argument raw is left to the engine."""
    s = _settings(cell, runtime)
    if s is None:
        return []
    out = _eplb_refusals(s)
    out += _context_refusals(s, s.number("max_model_len"), None, "")
    out += _routed_refusals(s)
    out += _speculative_refusals(s)
    return out


def model_max_len(config: Mapping[str, Any]) -> tuple[float, str] | None:
    """The context vLLM derives from a model's ``config.json`` (``_get_and_verify_max_len``) and
    the key it comes from, for a text-only config: the smallest length key (model_max_length,
    where set, wins), times a RoPE scaling factor YaRN-like types leave out. None where the
    config has none of the keys (vLLM's class defaults then decide), a nested text config, or
    per-layer RoPE parameters."""
    if any(isinstance(value, dict) and key.endswith("_config") and key != "quantization_config"
           and key != "compression_config" for key, value in config.items()):  # fmt: skip
        return None
    found = [
        (float(value), key)
        for key in _LENGTH_KEYS
        if isinstance(value := config.get(key), (int, float)) and not isinstance(value, bool)
    ]
    if not found:
        return None
    length, key = min(found)
    if config.get("model_max_length"):
        length, key = float(config["model_max_length"]), "model_max_length"
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    if isinstance(rope, dict) and rope and "gemma3" not in str(config.get("model_type", "")):
        if any(isinstance(value, dict) for value in rope.values()):
            return None  # per layer type
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor", 1.0)
        if kind not in _UNSCALED_ROPE:
            if factor is not None and not isinstance(factor, (int, float)):
                return None
            length *= float(factor or 1.0)
    return length, key


def vllm_model_refusals(
    cell: Cell, runtime: RuntimeProfile, config: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(knob, problem) for what vLLM refuses of the cell given its model's ``config.json``
    (empty: nothing to judge by): max_model_len past the model's context unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN is set, and where max_model_len is unset, the token budget
    against the model's own context."""
    s = _settings(cell, runtime)
    derived = model_max_len(config) if config else None
    if s is None or derived is None or not s.has("max_model_len"):
        return []
    length, key = derived
    context = s.number("max_model_len")
    if context is None:  # only what the model's context adds to the knobs' judgement
        known = _context_refusals(s, None, None, "")
        found = _context_refusals(s, int(length), None, f" (the model's {key})")
        return [refusal for refusal in found if refusal not in known]
    allow = (s.env("VLLM_ALLOW_LONG_MAX_MODEL_LEN") or "0").strip().lower() in ("1", "true")
    if context <= length or allow:
        return []
    longest = f"{length:g}" if length != int(length) else str(int(length))
    return [
        (
            "max_model_len",
            f"vLLM refuses max_model_len {context} past the model's "
            f"{key} {longest} (is greater than the derived max_model_len): set max_model_len "
            f'to {longest} or less, or env VLLM_ALLOW_LONG_MAX_MODEL_LEN: "1" (positions past '
            "it give NaN or out-of-bounds errors)",
        )
    ]


def vllm_box_refusals(
    cell: Cell, runtime: RuntimeProfile, box: VllmBox, config: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(knob, problem) for what vLLM refuses on this box: max_num_seqs over the default token
    budget its platform and GPU give where the cell sets none, and on a box that can only run
    vLLM's CPU build, Model Runner V2, which needs Triton the CPU build lacks (config/vllm.py,
    ``_validate_v2_model_runner``), and EPLB, which needs a CUDA, ROCm or XPU platform
    (config/parallel.py, ``_validate_parallel_config``)."""
    s = _settings(cell, runtime)
    if s is None:
        return []
    out = []
    cpu_only = box.cpu and box.gpu_mib is None
    if cpu_only and s.has("eplb") and s.switch("eplb"):
        out.append(
            (
                "eplb",
                "vLLM refuses EPLB off CUDA, ROCm and XPU (Expert parallelism load balancing "
                f"is only supported on CUDA devices …), and this is {box.describe()}: run this "
                "cell on a CUDA box, or drop eplb",
            )
        )
    if s.number("max_num_batched_tokens") is None:
        derived = model_max_len(config) if config else None
        context = s.number("max_model_len") or (int(derived[0]) if derived else None)
        out += _context_refusals(s, context, box, "")
    if cpu_only and _v2_runner(s.env("VLLM_USE_V2_MODEL_RUNNER")):
        out.append(
            (
                "env.VLLM_USE_V2_MODEL_RUNNER",
                "vLLM refuses Model Runner V2 without "
                f"Triton (Model Runner V2 requires Triton), and this is {box.describe()}, "
                "where vLLM's CPU build has none: run this cell on a CUDA box, or drop "
                "VLLM_USE_V2_MODEL_RUNNER (and return_routed_experts)",
            )
        )
    return out
