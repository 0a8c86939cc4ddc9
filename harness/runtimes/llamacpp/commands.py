"""The llama.cpp CLI verbs, ``harness make-gguf`` and ``harness llama-trace``.

``harness/cli.py`` calls :func:`register` with its sub-parsers; handlers take ``(args, out)`` and
return the exit code, raising harness errors for bad input.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from harness.errors import EXIT_OK, BadInput
from harness.runtimes.llamacpp import build
from harness.runtimes.llamacpp.shape import TinyMoeShape

if TYPE_CHECKING:
    from harness.runtimes.llamacpp.traces import EvalRouting

__all__ = ["register"]


def _cmd_make_gguf(args: argparse.Namespace, out: TextIO) -> int:
    from harness.runtimes.llamacpp.gguf_model import (
        write_tiny_moe,  # numpy and gguf: loaded when used
    )

    shape = TinyMoeShape(
        n_layer=args.layers, n_expert=args.experts, n_expert_used=args.experts_used
    )
    vocab = Path(args.vocab) if args.vocab else build.default_vocab()
    summary = write_tiny_moe(Path(args.output), vocab, args.seed, shape)
    digest = hashlib.sha256(Path(args.output).read_bytes()).hexdigest()
    out.write(
        f"wrote {summary['path']}: {summary['bytes']:,} bytes, {summary['n_params']:,} parameters, "
        f"{shape.n_layer} layers x {shape.n_expert} experts (top {shape.n_expert_used}), "
        f"vocab {summary['n_vocab']:,}, seed {args.seed}, sha256 {digest}\n"
    )
    return EXIT_OK


def _phase_of(domain: str, phases: list[list[str]]) -> int:
    for index, domains in enumerate(phases):
        if domain in domains:
            return index
    return 0


def _cmd_llama_trace(args: argparse.Namespace, out: TextIO) -> int:
    from harness.runtimes.llamacpp.traces import (
        complete_layers,
        parse_eval_callback,
        run_eval_callback,
        trace_records,
        write_jsonl,
    )

    routings: list[tuple[EvalRouting, int]] = []
    if args.from_log:
        for path in args.from_log:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            routings.append((parse_eval_callback(text, source=path), 0))
    else:
        if args.card is None or args.model is None:
            raise BadInput("give CARD --model GGUF to record a trace, or --from-log LOG...")
        from harness.card import load_card

        loaded = load_card(Path(args.card))
        prompts = loaded.split(args.split)
        if not prompts:
            raise BadInput(f"{args.card}: the {args.split} split has no prompts")
        phases = [list(p.domains) for p in loaded.card.workload.phases or []]
        binary = build.binary("llama-eval-callback")
        for prompt in prompts[: args.limit] if args.limit else prompts:
            text = run_eval_callback(binary, Path(args.model), prompt.text, threads=args.threads)
            routings.append(
                (parse_eval_callback(text, source=prompt.id), _phase_of(prompt.domain, phases))
            )
    records = trace_records(routings, prefill=args.prefill)
    write_jsonl(records, Path(args.output))
    steps = sum(len(r.steps) for r, _ in routings)
    elided = sum(r.elided for r, _ in routings)
    layers = complete_layers([r for r, _ in routings])
    seen = max(max(s) for r, _ in routings for s in r.steps) + 1
    out.write(
        f"wrote {args.output}: {steps:,} steps x {len(layers)} layers, {len(records):,} records\n"
    )
    if len(layers) < seen:
        out.write(
            f"note: layers {len(layers)}..{seen - 1} left out: llama.cpp routes them only for "
            "tokens whose logits it computes (the last of each prompt)\n"
        )
    if elided:
        out.write(
            f"warning: {elided} tensors had their middle rows elided by llama-eval-callback; "
            "record with -ub 1 (harness llama-trace does) to keep every token\n"
        )
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``make-gguf`` and ``llama-trace`` to the harness CLI."""
    make = verbs.add_parser(
        "make-gguf", help="write a tiny random-weight MoE GGUF that llama.cpp loads"
    )
    make.add_argument("-o", "--output", required=True, metavar="FILE", help="the .gguf to write")
    make.add_argument("--seed", type=int, default=0, help="weights seed (same seed, same bytes)")
    make.add_argument(
        "--vocab",
        metavar="GGUF",
        help="vocab-only GGUF (default: the one `make llama-server` kept)",
    )
    make.add_argument("--layers", type=int, default=TinyMoeShape.n_layer, help="block count")
    make.add_argument("--experts", type=int, default=TinyMoeShape.n_expert, help="experts/layer")
    make.add_argument(
        "--experts-used", type=int, default=TinyMoeShape.n_expert_used, help="top-k per token"
    )
    make.set_defaults(handler=_cmd_make_gguf)

    trace = verbs.add_parser(
        "llama-trace",
        help="record llama.cpp routing (ffn_moe_topk) as a trace `harness simulate` reads",
    )
    trace.add_argument("card", nargs="?", metavar="CARD", help="card whose prompts are routed")
    trace.add_argument("--model", metavar="GGUF", help="the MoE GGUF to route with")
    trace.add_argument("--split", choices=["fit", "heldout"], default="fit", help="prompt split")
    trace.add_argument("--limit", type=int, metavar="N", help="first N prompts only")
    trace.add_argument("--threads", type=int, default=1, help="llama-eval-callback threads")
    trace.add_argument(
        "--from-log", nargs="+", metavar="LOG", help="convert saved llama-eval-callback output"
    )
    trace.add_argument(
        "--prefill", action="store_true", help="mark steps as prefill (the policy skips them)"
    )
    trace.add_argument("-o", "--output", required=True, metavar="FILE", help="trace .jsonl")
    trace.set_defaults(handler=_cmd_llama_trace)
