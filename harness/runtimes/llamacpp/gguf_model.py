"""A tiny random-weight mixture-of-experts GGUF that llama.cpp loads, made here.

The model is a ``llama``-architecture transformer with ``expert_count`` experts per layer (the
Mixtral layout llama.cpp reads: ``ffn_gate_inp`` router, ``ffn_{gate,up,down}_exps`` stacks), its
tokenizer copied from a vocab-only GGUF the llama.cpp sources ship. Weights come from one seeded
generator in a fixed order and the file has no timestamps, so the same seed gives the same bytes.
The scales keep the residual stream near unit size and make the logits peaked but
context-dependent, so greedy output differs between prompts instead of repeating one token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import BadInput
from harness.formats.safe_write import atomic_path
from harness.runtimes.llamacpp.shape import TinyMoeShape

ARCH = "llama"
TOKENIZER_PREFIX = "tokenizer."


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:  # an optional dependency: say how to get it
        raise BadInput(
            "harness make-gguf needs the `gguf` package: pip install gguf "
            "(or install the harness with its llama-cpp extra)"
        ) from exc
    return gguf


def read_tokenizer(vocab_path: Path) -> tuple[int, list[tuple[str, Any, Any, Any]]]:
    """The vocabulary size and the ``tokenizer.*`` fields (key, value, type, sub-type) of a GGUF."""
    gguf = _gguf()
    if not vocab_path.is_file():
        raise BadInput(
            f"{vocab_path}: no such vocab GGUF; run `make llama-server` (it keeps the vocab files "
            "llama.cpp ships) or pass --vocab PATH to a ggml-vocab-*.gguf"
        )
    reader = gguf.GGUFReader(str(vocab_path))
    fields: list[tuple[str, Any, Any, Any]] = []
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith(TOKENIZER_PREFIX):
            continue
        types = list(field.types)
        vtype = types[0]
        sub_type = types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        fields.append((key, value, vtype, sub_type))
    if n_vocab == 0:
        raise BadInput(f"{vocab_path}: has no tokenizer.ggml.tokens; pick a ggml-vocab-*.gguf")
    return n_vocab, fields


def _weights(
    rng: np.random.Generator, shape: TinyMoeShape, n_vocab: int
) -> list[tuple[str, np.ndarray[Any, Any]]]:
    """Every tensor in GGUF order; numpy shapes are (rows=out, cols=in) as llama.cpp expects."""

    def normal(dims: tuple[int, ...], std: float) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    e, ff, n_exp = shape.n_embd, shape.n_ff, shape.n_expert
    head_dim = e // shape.n_head
    kv = head_dim * shape.n_head_kv
    ones = np.ones(e, dtype=np.float32)
    tensors: list[tuple[str, np.ndarray[Any, Any]]] = [
        ("token_embd.weight", normal((n_vocab, e), 1.0)),
    ]
    for layer in range(shape.n_layer):
        p = f"blk.{layer}."
        tensors += [
            (p + "attn_norm.weight", ones.copy()),
            (p + "attn_q.weight", normal((e, e), 1.0 / np.sqrt(e))),
            (p + "attn_k.weight", normal((kv, e), 1.0 / np.sqrt(e))),
            (p + "attn_v.weight", normal((kv, e), 1.0 / np.sqrt(e))),
            (p + "attn_output.weight", normal((e, e), 0.5 / np.sqrt(e))),
            (p + "ffn_norm.weight", ones.copy()),
            # A sharper router (std 2/sqrt(e)) spreads tokens over experts unevenly, as real
            # routers do, so expert-placement knobs and routing traces have something to show.
            (p + "ffn_gate_inp.weight", normal((n_exp, e), 2.0 / np.sqrt(e))),
            (p + "ffn_gate_exps.weight", normal((n_exp, ff, e), 1.0 / np.sqrt(e))),
            (p + "ffn_down_exps.weight", normal((n_exp, e, ff), 0.5 / np.sqrt(ff))),
            (p + "ffn_up_exps.weight", normal((n_exp, ff, e), 1.0 / np.sqrt(e))),
        ]
    tensors += [
        ("output_norm.weight", ones.copy()),
        # Logit std of about 4 after the final RMS norm: peaked enough for stable greedy picks,
        # yet the argmax still moves with the context.
        ("output.weight", normal((n_vocab, e), 4.0 / np.sqrt(e))),
    ]
    return tensors


def write_tiny_moe(
    out_path: Path, vocab_path: Path, seed: int, shape: TinyMoeShape | None = None
) -> dict[str, Any]:
    """Write the tiny MoE GGUF to ``out_path``; returns a summary (sizes, counts)."""
    gguf = _gguf()
    shape = shape or TinyMoeShape()
    problems = shape.problems()
    if problems:
        raise BadInput("tiny MoE shape: " + "; ".join(problems))
    n_vocab, tokenizer = read_tokenizer(vocab_path)
    rng = np.random.default_rng(seed)
    tensors = _weights(rng, shape, n_vocab)
    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name(f"harness tiny-moe seed {seed}")
        writer.add_context_length(shape.n_ctx)
        writer.add_embedding_length(shape.n_embd)
        writer.add_block_count(shape.n_layer)
        writer.add_feed_forward_length(shape.n_ff)
        writer.add_head_count(shape.n_head)
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
        writer.add_rope_freq_base(shape.rope_theta)
        writer.add_layer_norm_rms_eps(shape.rms_eps)
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
        writer.add_vocab_size(n_vocab)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        for key, value, vtype, sub_type in tokenizer:
            writer.add_key_value(key, value, vtype, sub_type)
        for name, array in tensors:
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return {
        "path": str(out_path),
        "bytes": out_path.stat().st_size,
        "seed": seed,
        "n_vocab": n_vocab,
        "n_tensors": len(tensors),
        "n_params": int(sum(a.size for _, a in tensors)),
        "shape": shape,
    }
