"""A tiny random-weight Qwen3-MoE checkpoint that vLLM serves, made here with numpy alone.

``harness make-vllm-model -o DIR --seed S`` writes a Hugging Face model directory vLLM loads as
``Qwen3MoeForCausalLM``: ``config.json``, ``model.safetensors`` (written by hand: an 8-byte
little-endian header length, the JSON header, the raw tensors), ``tokenizer.json`` and
``tokenizer_config.json``. No download and no ``transformers`` or ``tokenizers`` on our side.

The tokenizer is a character-level BPE over printable pieces (no byte-level tokens): vLLM holds a
byte token back while streaming until it completes a character, which over random weights would
turn a stream into one burst at the end. Every piece here is text on its own. Weights come from
one seeded generator in a fixed order, files carry no timestamps, so one seed gives one set of
bytes. Scales keep the residual stream near unit size and make the logits peaked (greedy output
stable under the small numerical differences of eager vs compiled kernels) yet context-dependent.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import BadInput
from harness.formats.safe_write import atomic_binary_writer, write_text_atomic
from harness.runtimes.vllm.shape import TinyQwen3MoeShape

ARCHITECTURE = "Qwen3MoeForCausalLM"
UNK, EOS = "<unk>", "<|endoftext|>"
SPACE = "\u2581"  # the Metaspace replacement for " "


def vocabulary() -> list[str]:
    """The token pieces in id order: the two specials, the space piece, printable characters."""
    printable = [c for c in string.printable if c not in " \x0b\x0c\r"]
    return [UNK, EOS, SPACE, *printable]


def tokenizer_json() -> dict[str, Any]:
    """A Hugging Face ``tokenizer.json``: a BPE model without merges (one piece per character)."""
    pieces = vocabulary()
    specials = [
        {
            "id": index,
            "content": piece,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for index, piece in enumerate(pieces[:2])
    ]
    metaspace = {
        "type": "Metaspace",
        "replacement": SPACE,
        "prepend_scheme": "never",
        "split": False,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": metaspace,
        "post_processor": None,
        "decoder": metaspace,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": UNK,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {piece: index for index, piece in enumerate(pieces)},
            "merges": [],
        },
    }


def config_json(shape: TinyQwen3MoeShape, vocab_size: int) -> dict[str, Any]:
    """The model's ``config.json`` (every layer sparse; top-k weights renormalised)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3_moe",
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.expert_ff * 2,
        "moe_intermediate_size": shape.expert_ff,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_experts": shape.experts,
        "num_experts_per_tok": shape.top_k,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _tensors(
    shape: TinyQwen3MoeShape, vocab_size: int, seed: int
) -> list[tuple[str, npt.NDArray[np.float32]]]:
    """Every weight in a fixed order, drawn from one generator."""
    rng = np.random.default_rng(seed)
    h, hd = shape.hidden, shape.head_dim

    def normal(rows: int, cols: int, std: float) -> npt.NDArray[np.float32]:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    ones = np.ones(h, dtype=np.float32)
    out: list[tuple[str, npt.NDArray[np.float32]]] = [
        ("model.embed_tokens.weight", normal(vocab_size, h, 1.0))
    ]
    for layer in range(shape.layers):
        p = f"model.layers.{layer}"
        out += [
            (f"{p}.input_layernorm.weight", ones.copy()),
            (f"{p}.post_attention_layernorm.weight", ones.copy()),
            (f"{p}.self_attn.q_proj.weight", normal(shape.heads * hd, h, h**-0.5)),
            (f"{p}.self_attn.k_proj.weight", normal(shape.kv_heads * hd, h, h**-0.5)),
            (f"{p}.self_attn.v_proj.weight", normal(shape.kv_heads * hd, h, h**-0.5)),
            (
                f"{p}.self_attn.o_proj.weight",
                normal(h, shape.heads * hd, 0.5 * (shape.heads * hd) ** -0.5),
            ),
            (f"{p}.self_attn.q_norm.weight", np.ones(hd, dtype=np.float32)),
            (f"{p}.self_attn.k_norm.weight", np.ones(hd, dtype=np.float32)),
            # A strong router: expert choice depends visibly on the token and its context.
            (f"{p}.mlp.gate.weight", normal(shape.experts, h, 3.0 * h**-0.5)),
        ]
        for expert in range(shape.experts):
            e = f"{p}.mlp.experts.{expert}"
            out += [
                (f"{e}.gate_proj.weight", normal(shape.expert_ff, h, h**-0.5)),
                (f"{e}.up_proj.weight", normal(shape.expert_ff, h, h**-0.5)),
                (f"{e}.down_proj.weight", normal(h, shape.expert_ff, 0.5 * shape.expert_ff**-0.5)),
            ]
    out += [
        ("model.norm.weight", ones.copy()),
        # Peaked logits: a greedy choice is rarely a near-tie that kernel order could flip.
        ("lm_head.weight", normal(vocab_size, h, 4.0 * h**-0.5)),
    ]
    return out


def write_safetensors(path: Path, tensors: list[tuple[str, npt.NDArray[np.float32]]]) -> None:
    """The safetensors layout: u64 header size, JSON header (dtype, shape, offsets), data."""
    header: dict[str, Any] = {}
    offset = 0
    for name, array in tensors:
        size = array.nbytes
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    with atomic_binary_writer(path) as handle:
        handle.write(len(raw).to_bytes(8, "little"))
        handle.write(raw)
        for _, array in tensors:
            handle.write(np.ascontiguousarray(array, dtype="<f4").tobytes())


def _write_json(path: Path, document: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(document, indent=1, sort_keys=True) + "\n")


def write_tiny_qwen3_moe(
    out_dir: Path, seed: int, shape: TinyQwen3MoeShape | None = None
) -> dict[str, Any]:
    """Write the model directory; returns a summary (path, parameters, bytes, vocab size)."""
    shape = shape or TinyQwen3MoeShape()
    problems = shape.problems()
    if problems:
        raise BadInput(f"make-vllm-model: {'; '.join(problems)}")
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"{out_dir}: exists and is not a directory; give a directory for the model")
    out_dir.mkdir(parents=True, exist_ok=True)
    pieces = vocabulary()
    tensors = _tensors(shape, len(pieces), seed)
    write_safetensors(out_dir / "model.safetensors", tensors)
    _write_json(out_dir / "config.json", config_json(shape, len(pieces)))
    _write_json(out_dir / "tokenizer.json", tokenizer_json())
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": UNK,
            "eos_token": EOS,
            "bos_token": None,
            "pad_token": EOS,
            "model_max_length": shape.max_positions,
            "clean_up_tokenization_spaces": False,
        },
    )
    _write_json(out_dir / "generation_config.json", {"eos_token_id": 1, "do_sample": False})
    return {
        "path": str(out_dir),
        "n_params": sum(int(a.size) for _, a in tensors),
        "bytes": (out_dir / "model.safetensors").stat().st_size,
        "n_vocab": len(pieces),
        "shape": shape,
    }
