"""The vLLM CLI verb ``harness make-vllm-model``.

``harness/cli.py`` calls :func:`register` with its sub-parsers; handlers take ``(args, out)`` and
return the exit code, raising harness errors for bad input.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK
from harness.runtimes.vllm import build
from harness.runtimes.vllm.shape import TinyQwen3MoeShape

__all__ = ["register"]


def _cmd_make_model(args: argparse.Namespace, out: TextIO) -> int:
    from harness.runtimes.vllm.model import write_tiny_qwen3_moe  # numpy: loaded when used

    shape = TinyQwen3MoeShape(layers=args.layers, experts=args.experts, top_k=args.experts_used)
    target = Path(args.output) if args.output else build.model_dir()
    summary = write_tiny_qwen3_moe(target, args.seed, shape)
    digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
    out.write(
        f"wrote {summary['path']}: {summary['n_params']:,} parameters, "
        f"{shape.layers} layers x {shape.experts} experts (top {shape.top_k}), "
        f"vocab {summary['n_vocab']}, seed {args.seed}, model.safetensors sha256 {digest}\n"
    )
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``make-vllm-model`` to the harness CLI."""
    make = verbs.add_parser(
        "make-vllm-model",
        help="write a tiny random-weight Qwen3-MoE model directory that vLLM serves",
    )
    make.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help=f"model directory (default: the one the vllm profile serves, {build.model_dir()})",
    )
    make.add_argument(
        "--seed", type=int, default=build.DEFAULT_SEED, help="weights seed (same seed, same bytes)"
    )
    make.add_argument("--layers", type=int, default=TinyQwen3MoeShape.layers, help="layer count")
    make.add_argument("--experts", type=int, default=TinyQwen3MoeShape.experts, help="per layer")
    make.add_argument(
        "--experts-used", type=int, default=TinyQwen3MoeShape.top_k, help="top-k per token"
    )
    make.set_defaults(handler=_cmd_make_model)
