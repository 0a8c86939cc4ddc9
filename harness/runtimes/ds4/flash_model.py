"""A random-weight GGUF of the exact DeepSeek-V4-Flash shape, which the ds4 binaries load.

ds4 runs one fixed architecture: ``config_validate_model`` (ds4.c) checks every shape key of the
metadata against its compiled Flash shape and ``weights_validate_layout`` every tensor's type and
dimensions, so a "tiny" model is impossible. The real model's tensors are 86 GB; ds4 never checks
that tensors do not overlap, so :mod:`.gguf_writer` stores each (type, shape) once and
points every tensor of it there: about 2.8 GiB. Numbers it produces mean nothing; what the
harness tests with it (processes, streams, CSV columns, logit files, log lines) is ds4's own.

The tokenizer is GPT-2 byte-level BPE as ds4 reads it: the 256 byte pieces, merges of printable
ASCII pairs, ds4's seven special tokens (``vocab_configure_deepseek``) and filler pieces up to the
fixed vocabulary of 129280. Weights come from one seeded generator region by region, so one seed
gives one set of bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from harness.runtimes.ds4.gguf_writer import (
    ARRAY,
    BOOL,
    F32,
    I32,
    STRING,
    TENSOR_TYPES,
    U32,
    U64,
    Region,
    Value,
    write_gguf,
)


@dataclass(frozen=True)
class FlashShape:
    """DeepSeek V4 Flash as ds4.c's ``DS4_SHAPE_FLASH`` fixes it (nothing here may differ)."""

    n_layer: int = 43
    n_embd: int = 4096
    n_vocab: int = 129280
    n_head: int = 64
    n_head_kv: int = 1
    n_head_dim: int = 512
    n_rot: int = 64
    n_out_group: int = 8
    n_lora_q: int = 1024
    n_lora_o: int = 1024
    n_expert: int = 256
    n_expert_used: int = 6
    n_expert_shared: int = 1
    n_ff_exp: int = 2048
    n_hash_layer: int = 3
    n_swa: int = 128
    n_indexer_head: int = 64
    n_indexer_head_dim: int = 128
    n_indexer_top_k: int = 512
    n_hc: int = 4
    n_hc_sinkhorn_iter: int = 20
    context_length: int = 1048576

    def compress_ratio(self, layer: int) -> int:
        """``ds4_expected_layer_compress_ratio`` for Flash: dense first two, then 4 / 128."""
        if layer < 2:
            return 0
        return 4 if layer % 2 == 0 else 128


SPECIAL_TOKENS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
)


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table, in byte order: printable bytes stand for themselves, the
    rest are shifted past 255 so every byte is one visible character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return [table[b] for b in range(256)]


def vocabulary(n_vocab: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): specials first (type 3, control), bytes, merged pairs of
    printable ASCII, then distinct filler pieces of two or three byte characters."""
    alphabet = byte_alphabet()
    tokens = list(SPECIAL_TOKENS)
    tokens += alphabet
    printable = [alphabet[b] for b in range(0x20, 0x7F)]
    merges = [f"{a} {b}" for a in printable for b in printable]
    seen = set(tokens)
    for merge in merges:
        piece = merge.replace(" ", "")
        if piece not in seen:
            tokens.append(piece)
            seen.add(piece)
    filler = _filler(alphabet)
    while len(tokens) < n_vocab:
        piece = next(filler)
        if piece not in seen:
            tokens.append(piece)
            seen.add(piece)
    types = [3] * len(SPECIAL_TOKENS) + [1] * (n_vocab - len(SPECIAL_TOKENS))
    return tokens, merges, types


def _filler(alphabet: list[str]) -> Iterator[str]:
    for a in alphabet:
        for b in alphabet:
            yield a + b
    for a in alphabet:
        for b in alphabet:
            for c in alphabet:
                yield a + b + c


def metadata(shape: FlashShape, name: str) -> list[tuple[str, Value]]:
    """Every key ``config_validate_deepseek4_model`` and the tokenizer read, with Flash's values."""
    s = shape
    u32 = {
        "block_count": s.n_layer,
        "context_length": s.context_length,
        "embedding_length": s.n_embd,
        "vocab_size": s.n_vocab,
        "attention.head_count": s.n_head,
        "attention.head_count_kv": s.n_head_kv,
        "attention.key_length": s.n_head_dim,
        "attention.value_length": s.n_head_dim,
        "rope.dimension_count": s.n_rot,
        "attention.q_lora_rank": s.n_lora_q,
        "attention.output_lora_rank": s.n_lora_o,
        "attention.output_group_count": s.n_out_group,
        "expert_count": s.n_expert,
        "expert_used_count": s.n_expert_used,
        "expert_feed_forward_length": s.n_ff_exp,
        "expert_shared_count": s.n_expert_shared,
        "hash_layer_count": s.n_hash_layer,
        "expert_group_count": 0,
        "expert_group_used_count": 0,
        "attention.sliding_window": s.n_swa,
        "attention.indexer.head_count": s.n_indexer_head,
        "attention.indexer.key_length": s.n_indexer_head_dim,
        "attention.indexer.top_k": s.n_indexer_top_k,
        "hyper_connection.count": s.n_hc,
        "hyper_connection.sinkhorn_iterations": s.n_hc_sinkhorn_iter,
    }
    f32 = {
        "rope.freq_base": 10000.0,
        "rope.scaling.factor": 16.0,
        "rope.scaling.yarn_beta_fast": 32.0,
        "rope.scaling.yarn_beta_slow": 1.0,
        "attention.compress_rope_freq_base": 160000.0,
        "expert_weights_scale": 1.5,
        "attention.layer_norm_rms_epsilon": 1.0e-6,
        "hyper_connection.epsilon": 1.0e-6,
    }
    tokens, merges, types = vocabulary(s.n_vocab)
    kv: list[tuple[str, Value]] = [
        ("general.architecture", Value(STRING, "deepseek4")),
        ("general.name", Value(STRING, name)),
        ("general.alignment", Value(U32, 32)),
    ]
    kv += [(f"deepseek4.{k}", Value(U32, v)) for k, v in u32.items()]
    kv += [(f"deepseek4.{k}", Value(F32, v)) for k, v in f32.items()]
    kv += [
        ("deepseek4.rope.scaling.original_context_length", Value(U64, 65536)),
        ("deepseek4.expert_weights_norm", Value(BOOL, True)),
        (
            "deepseek4.attention.compress_ratios",
            Value(ARRAY, [s.compress_ratio(i) for i in range(s.n_layer)], U32),
        ),
        ("deepseek4.swiglu_clamp_exp", Value(ARRAY, [10.0] * s.n_layer, F32)),
        ("tokenizer.ggml.model", Value(STRING, "gpt2")),
        ("tokenizer.ggml.pre", Value(STRING, "joyai-llm")),
        ("tokenizer.ggml.tokens", Value(ARRAY, tokens, STRING)),
        ("tokenizer.ggml.token_type", Value(ARRAY, types, I32)),
        ("tokenizer.ggml.merges", Value(ARRAY, merges, STRING)),
        ("tokenizer.ggml.bos_token_id", Value(U32, 0)),
        ("tokenizer.ggml.eos_token_id", Value(U32, 1)),
        ("tokenizer.ggml.padding_token_id", Value(U32, 1)),
        ("tokenizer.ggml.add_bos_token", Value(BOOL, True)),
    ]
    return kv


def tensor_layout(shape: FlashShape) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, type, dims in GGUF order) for every tensor ``weights_validate_layout`` checks."""
    s = shape
    hc_dim = s.n_embd * s.n_hc
    hc_mix = 2 * s.n_hc + s.n_hc * s.n_hc
    q_dim = s.n_head * s.n_head_dim
    out_low = s.n_out_group * s.n_lora_o
    out: list[tuple[str, str, tuple[int, ...]]] = [
        ("token_embd.weight", "F16", (s.n_embd, s.n_vocab)),
        ("output_hc_base.weight", "F32", (s.n_hc,)),
        ("output_hc_fn.weight", "F16", (hc_dim, s.n_hc)),
        ("output_hc_scale.weight", "F32", (1,)),
        ("output_norm.weight", "F32", (s.n_embd,)),
        ("output.weight", "Q8_0", (s.n_embd, s.n_vocab)),
    ]
    for il in range(s.n_layer):
        ratio = s.compress_ratio(il)
        layer: list[tuple[str, str, tuple[int, ...]]] = [
            ("hc_attn_fn", "F16", (hc_dim, hc_mix)),
            ("hc_attn_scale", "F32", (3,)),
            ("hc_attn_base", "F32", (hc_mix,)),
            ("attn_norm", "F32", (s.n_embd,)),
            ("attn_q_a", "Q8_0", (s.n_embd, s.n_lora_q)),
            ("attn_q_a_norm", "F32", (s.n_lora_q,)),
            ("attn_q_b", "Q8_0", (s.n_lora_q, q_dim)),
            ("attn_kv", "Q8_0", (s.n_embd, s.n_head_dim)),
            ("attn_kv_a_norm", "F32", (s.n_head_dim,)),
            ("attn_sinks", "F32", (s.n_head,)),
            ("attn_output_a", "Q8_0", (s.n_head_dim * (s.n_head // s.n_out_group), out_low)),
            ("attn_output_b", "Q8_0", (out_low, s.n_embd)),
        ]
        if ratio:
            width = (2 if ratio == 4 else 1) * s.n_head_dim
            layer += [
                ("attn_compressor_ape", "F16", (width, ratio)),
                ("attn_compressor_kv", "F16", (s.n_embd, width)),
                ("attn_compressor_gate", "F16", (s.n_embd, width)),
                ("attn_compressor_norm", "F32", (s.n_head_dim,)),
            ]
        if ratio == 4:
            index_width = 2 * s.n_indexer_head_dim
            layer += [
                ("indexer.attn_q_b", "Q8_0", (s.n_lora_q, s.n_indexer_head * s.n_indexer_head_dim)),
                ("indexer.proj", "F16", (s.n_embd, s.n_indexer_head)),
                ("indexer_compressor_ape", "F16", (index_width, ratio)),
                ("indexer_compressor_kv", "F16", (s.n_embd, index_width)),
                ("indexer_compressor_gate", "F16", (s.n_embd, index_width)),
                ("indexer_compressor_norm", "F32", (s.n_indexer_head_dim,)),
            ]
        layer += [
            ("hc_ffn_fn", "F16", (hc_dim, hc_mix)),
            ("hc_ffn_scale", "F32", (3,)),
            ("hc_ffn_base", "F32", (hc_mix,)),
            ("ffn_norm", "F32", (s.n_embd,)),
            ("ffn_gate_inp", "F16", (s.n_embd, s.n_expert)),
            ("ffn_gate_exps", "IQ2_XXS", (s.n_embd, s.n_ff_exp, s.n_expert)),
            ("ffn_up_exps", "IQ2_XXS", (s.n_embd, s.n_ff_exp, s.n_expert)),
            ("ffn_down_exps", "Q2_K", (s.n_ff_exp, s.n_embd, s.n_expert)),
            ("ffn_gate_shexp", "Q8_0", (s.n_embd, s.n_ff_exp)),
            ("ffn_up_shexp", "Q8_0", (s.n_embd, s.n_ff_exp)),
            ("ffn_down_shexp", "Q8_0", (s.n_ff_exp, s.n_embd)),
        ]
        if il < s.n_hash_layer:
            layer.append(("ffn_gate_tid2eid", "I32", (s.n_expert_used, s.n_vocab)))
        out += [(f"blk.{il}.{n}.weight", t, d) for n, t, d in layer]
        out.append((f"blk.{il}.exp_probs_b.bias", "F32", (s.n_expert,)))
    return out


_CHUNK = 1 << 24  # elements or blocks per generated chunk: bounded memory for the big regions


def _floats(rng: np.random.Generator, dtype: str, std: float, mean: float) -> Callable[..., None]:
    def fill(handle: BinaryIO, nbytes: int) -> None:
        count = nbytes // np.dtype(dtype).itemsize
        for start in range(0, count, _CHUNK):
            n = min(_CHUNK, count - start)
            chunk = rng.standard_normal(n, dtype=np.float32) * std + mean
            handle.write(chunk.astype(dtype).tobytes())

    return fill


def _blocks(
    rng: np.random.Generator, block_bytes: int, scale_offsets: tuple[int, ...], scale: float
) -> Callable[..., None]:
    """Random quantized blocks whose fp16 scale fields are set to ``scale`` (random scale bits
    would give infinities and NaNs)."""
    scale_bytes = np.array([scale], dtype="<f2").tobytes()

    def fill(handle: BinaryIO, nbytes: int) -> None:
        count = nbytes // block_bytes
        for start in range(0, count, _CHUNK // 8):
            n = min(_CHUNK // 8, count - start)
            blocks = np.frombuffer(rng.bytes(n * block_bytes), dtype=np.uint8).copy()
            blocks = blocks.reshape(n, block_bytes)
            for offset in scale_offsets:
                blocks[:, offset : offset + 2] = np.frombuffer(scale_bytes, dtype=np.uint8)
            handle.write(blocks.tobytes())

    return fill


def _tid2eid(shape: FlashShape) -> Callable[..., None]:
    """Hash-routed layers' token-to-expert table: six distinct valid experts per token."""

    def fill(handle: BinaryIO, nbytes: int) -> None:
        tokens = np.arange(shape.n_vocab, dtype=np.int64)[:, None]
        k = np.arange(shape.n_expert_used, dtype=np.int64)[None, :]
        table = ((tokens * 7 + k * 41) % shape.n_expert).astype("<i4")
        assert table.nbytes == nbytes
        handle.write(table.tobytes())

    return fill


def _region_fill(
    rng: np.random.Generator, norm: bool, type_name: str, shape: FlashShape
) -> Callable[..., None]:
    if type_name == "I32":
        return _tid2eid(shape)
    if type_name == "F32":
        if norm:
            return _floats(rng, "<f4", 0.0, 1.0)  # RMS norm weights: identity
        return _floats(rng, "<f4", 0.1, 0.0)
    if type_name == "F16":
        return _floats(rng, "<f2", 0.02, 0.0)
    if type_name == "Q8_0":
        return _blocks(rng, 34, (0,), 1.0e-3)
    if type_name == "IQ2_XXS":
        return _blocks(rng, 66, (0,), 1.0e-3)
    if type_name == "Q2_K":
        return _blocks(rng, 84, (80, 82), 1.0e-3)
    raise AssertionError(f"no fill for {type_name}")


def write_flash_model(path: Path, seed: int, shape: FlashShape | None = None) -> dict[str, object]:
    """Write the GGUF at ``path``; returns a summary (path, bytes, tensors, regions)."""
    shape = shape or FlashShape()
    rng = np.random.default_rng(seed)
    layout = tensor_layout(shape)
    regions: dict[str, Region] = {}
    tensors: list[tuple[str, str]] = []
    for name, type_name, dims in layout:
        assert type_name in TENSOR_TYPES
        norm = "norm" in name  # RMS norm weights get their own region (ones, not noise)
        key = f"{type_name}:{'x'.join(map(str, dims))}{':norm' if norm else ''}"
        if key not in regions:
            regions[key] = Region(type_name, dims, _region_fill(rng, norm, type_name, shape))
        tensors.append((name, key))
    path.parent.mkdir(parents=True, exist_ok=True)
    size = write_gguf(path, metadata(shape, f"ds4flash-random-seed{seed}"), tensors, regions)
    return {"path": str(path), "bytes": size, "tensors": len(tensors), "regions": len(regions)}
