"""Routing traces from llama.cpp: llama-eval-callback output as the JSONL `harness simulate` reads.

``llama-eval-callback`` evaluates a prompt and prints every tensor of the graph; for an MoE layer
``il`` the tensor ``ffn_moe_topk-<il>`` (i32, ``{top_k, n_tokens, 1, 1}``) holds the experts each
token was routed to. It elides the middle of any dimension longer than 6 (``...``), so the
recorder runs it with ``-ub 1``: every prompt token is then its own graph evaluation with a
one-row tensor, printed whole. Each evaluation becomes one step, written as Megatron-style records
``{"step", "layer", "top_indices", "phase"}`` (:mod:`harness.sim.trace_files`). These are the
routings of prompt tokens (teacher-forced), not of generated ones: llama-eval-callback does not
generate.

llama.cpp computes the last layer only for tokens whose logits are wanted (the prompt's last one),
so for every other token ``ffn_moe_topk-<last>`` is empty. A trace keeps only the layers routed
for every token (all but the last), and says which layers it dropped, rather than invent them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InfrastructureError, TraceError
from harness.formats.safe_write import atomic_writer

# ggml_debug:          ffn_moe_topk-3 = (i32)       VIEW(...) = {2, 1, 1, 1}   (0.3.16's)
# common_debug_cb_eval:           ffn_moe_topk-0 = (i32)       VIEW(...) = {2, 1, 1, 1}  (0.3.36's)
_HEADER = re.compile(
    r"^(?:ggml_debug|common_debug_cb_eval):\s+(?P<name>\S+)\s+=\s+\((?P<type>\w+)\)"
)
_TOPK = re.compile(r"ffn_moe_topk-(?P<layer>\d+)$")
_ROW = re.compile(r"^\s*\[(?P<values>[^\[\]]*)\],?\s*$")


@dataclass
class EvalRouting:
    """The routings parsed from one llama-eval-callback output."""

    steps: list[dict[int, list[list[int]]]] = field(default_factory=list)  # layer -> tokens×k
    elided: int = 0  # tensors whose middle rows the tool left out (run it with -ub 1)
    empty: int = 0  # tensors with no tokens (a last layer skipped for non-output tokens)


def parse_eval_callback(text: str, *, source: str = "llama-eval-callback output") -> EvalRouting:
    """Every ``ffn_moe_topk-N`` tensor of ``text``, grouped into graph evaluations (steps).

    A new step starts whenever a layer repeats, i.e. at the next evaluation's first MoE layer.
    """
    routing = EvalRouting()
    lines = text.splitlines()
    index = 0
    current: dict[int, list[list[int]]] = {}
    while index < len(lines):
        header = _HEADER.search(lines[index])
        index += 1
        if header is None:
            continue
        topk = _TOPK.search(header.group("name"))
        if topk is None:
            continue
        layer = int(topk.group("layer"))
        rows: list[list[int]] = []
        elided = False
        while index < len(lines) and "sum =" not in lines[index]:
            line = lines[index]
            index += 1
            if "..." in line:
                elided = True
                line = line.replace("...,", "").replace("...", "")
            row = _ROW.match(line)
            if row is None or not row.group("values").strip():
                continue
            try:
                rows.append([round(float(v)) for v in row.group("values").split(",") if v.strip()])
            except ValueError:
                raise TraceError(
                    f"{source}: line {index}: cannot read expert ids from {line.strip()!r}"
                ) from None
        if elided:
            routing.elided += 1
        if not rows:
            routing.empty += 1
        if layer in current:
            routing.steps.append(current)
            current = {}
        current[layer] = rows
    if current:
        routing.steps.append(current)
    return routing


def complete_layers(routings: Sequence[EvalRouting]) -> list[int]:
    """The layers routed for every token of every step: 0..n-1 (TraceError if none or a gap)."""
    common: set[int] | None = None
    for routing in routings:
        for layers in routing.steps:
            routed = {layer for layer, rows in layers.items() if rows}
            common = routed if common is None else common & routed
    if not common:
        raise TraceError(
            "no layer was routed for every token: is the model a mixture of experts, and was "
            "llama-eval-callback run with -ub 1?"
        )
    kept = sorted(common)
    if kept != list(range(len(kept))):
        raise TraceError(f"layers routed for every token are {kept}, not 0..n-1: cannot trace")
    return kept


def trace_records(
    routings: Sequence[tuple[EvalRouting, int]], *, prefill: bool = False, first_step: int = 0
) -> list[dict[str, Any]]:
    """Megatron-style records, one per step and :func:`complete_layers` layer, steps numbered on.

    Each routing comes with its workload phase (e.g. the index of its prompt's domain).
    """
    records: list[dict[str, Any]] = []
    keep = complete_layers([routing for routing, _ in routings])
    step = first_step
    for routing, phase in routings:
        for layers in routing.steps:
            for layer in keep:
                rows = layers[layer]
                record: dict[str, Any] = {
                    "step": step,
                    "layer": layer,
                    "top_indices": rows[0] if len(rows) == 1 else rows,
                    "phase": phase,
                }
                if prefill:
                    record["prefill"] = True
                records.append(record)
            step += 1
    return records


def write_jsonl(records: Sequence[dict[str, Any]], out_path: Path) -> None:
    """Write records one JSON object a line (atomically: a temp file renamed into place)."""
    with atomic_writer(out_path) as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")


def run_eval_callback(
    binary: Path, model: Path, prompt: str, *, threads: int = 1, timeout_s: float = 300
) -> str:
    """Run ``llama-eval-callback`` on one prompt with one token per evaluation; its output."""
    if not binary.is_file():
        raise InfrastructureError(
            f"{binary}: no llama-eval-callback there; run `make llama-server` first"
        )
    argv = [
        str(binary),
        "-m",
        str(model),
        "-p",
        prompt,
        "-t",
        str(threads),
        "-ub",
        "1",  # one token per graph evaluation: every topk tensor printed whole
        "-b",
        "2048",
        "-c",
        "2048",
    ]
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"{binary} timed out after {timeout_s:g} s") from None
    output = result.stdout + result.stderr
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise InfrastructureError(
            f"{binary} exited {result.returncode} on model {model}; its output ends:\n{tail}"
        )
    return output
