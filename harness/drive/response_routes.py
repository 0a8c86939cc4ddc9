"""Routing returned in whole responses (vLLM's ``--enable-return-routed-experts``), as a trace.

``harness collect --routes-from-responses`` boots the cell with the profile's switch knob on and
sends the split's prompts one at a time, greedy and not streamed (vLLM returns the routing only
in a whole response). Each response carries ``[prompt + completion tokens - 1, layers, top_k]``:
the prompt's tokens, then every generated token but the last, which is never forwarded. Its
prompt rows become one prefill step and each later row one decode step, in request order; the
rows are written as ``route-trace.npz`` (``routed_experts``, ``prefill``, ``step``), the array
trace ``harness simulate`` and ``fit-map --score`` read, and every row's selections counted as
``counts.json`` for ``harness fit-map`` (prefill included, as vLLM's route plugin and SGLang's
recorder count).
"""

from __future__ import annotations

import base64
import binascii
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.drive.client import DriveSpec, WorkItem, request_body
from harness.errors import InfrastructureError
from harness.formats.maps import write_count_dump
from harness.profiles.telemetry import ResponseRoutesSpec
from harness.runtimes.boot import http_json


def field_value(body: Any, dotted: str) -> Any:
    """``body`` at the dotted path (``choices.0.routed_experts``); None where any step is absent."""
    value = body
    for part in dotted.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value


def decode_routes(body: Any, spec: ResponseRoutesSpec, rows: int, where: str) -> npt.NDArray[Any]:
    """The routing array of one response, checked to have ``rows`` rows of ``[layers, top_k]``."""
    raw = field_value(body, spec.field)
    if raw is None:
        raise InfrastructureError(
            f"{where}: the response has no `{spec.field}`; was the runtime booted with routing "
            f"on (knob `{spec.knob}`)? A streamed request never carries it"
        )
    if not isinstance(raw, str):
        raise InfrastructureError(f"{where}: `{spec.field}` is {type(raw).__name__}, not base64")
    try:
        loaded = np.load(io.BytesIO(base64.b64decode(raw, validate=True)), allow_pickle=False)
        array: npt.NDArray[Any] = np.asarray(loaded)
    except (binascii.Error, ValueError, EOFError, OSError) as exc:
        raise InfrastructureError(
            f"{where}: `{spec.field}` is not base64 of .npy bytes ({str(exc)[:120]})"
        ) from None
    if array.ndim != 3 or array.dtype.kind not in "iu" or array.shape[0] != rows:
        raise InfrastructureError(
            f"{where}: `{spec.field}` has shape {list(array.shape)} and dtype {array.dtype}; "
            f"expected {rows} integer rows (prompt + completion tokens - 1) of [layers, top_k]"
        )
    return array


@dataclass
class RouteRows:
    """Every response's routing, in request order, as trace rows."""

    experts: list[npt.NDArray[Any]] = field(default_factory=list)
    prefill: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    steps: list[npt.NDArray[np.int64]] = field(default_factory=list)
    next_step: int = 0

    def add(self, routes: npt.NDArray[Any], prompt_tokens: int) -> None:
        """One response: its first ``prompt_tokens`` rows are one prefill step, the rest one
        decode step each."""
        prompt_rows = min(prompt_tokens, routes.shape[0])  # no token generated: one row short
        decode = routes.shape[0] - prompt_rows
        self.experts.append(routes)
        self.prefill.append(np.arange(routes.shape[0]) < prompt_rows)
        self.steps.append(
            np.concatenate(
                [np.full(prompt_rows, self.next_step), self.next_step + 1 + np.arange(decode)]
            ).astype(np.int64)
        )
        self.next_step += 1 + decode

    def write(self, out_dir: Path) -> tuple[Path, Path]:
        """``route-trace.npz`` and ``counts.json`` (every row; experts up to the highest id)."""
        experts = np.concatenate(self.experts)
        prefill = np.concatenate(self.prefill)
        trace = out_dir / "route-trace.npz"
        np.savez_compressed(
            trace, routed_experts=experts, prefill=prefill, step=np.concatenate(self.steps)
        )
        counts = np.zeros((experts.shape[1], int(experts.max()) + 1), dtype=np.int64)
        for layer in range(experts.shape[1]):
            np.add.at(counts[layer], experts[:, layer, :].ravel(), 1)
        counts_path = out_dir / "counts.json"
        write_count_dump(counts_path, counts, time.time())
        return counts_path, trace


def collect_response_routes(
    spec: DriveSpec, items: list[WorkItem], routes: ResponseRoutesSpec
) -> tuple[RouteRows, int]:
    """Send each item whole (not streamed), in order; returns the routing rows and the tokens
    generated. A failed request or a response without routing stops the collection."""
    rows = RouteRows()
    tokens = 0
    for index, item in enumerate(items):
        path, body = request_body(spec, item)
        body["stream"] = False
        body.pop("stream_options", None)
        where = f"request {index + 1} of {len(items)} (prompt {item.prompt_id})"
        status, answer = http_json(spec.base_url + path, body, timeout_s=spec.timeout_s)
        if status != 200 or not isinstance(answer, dict):
            raise InfrastructureError(f"{where}: HTTP {status}: {str(answer)[:300]}")
        usage = answer.get("usage") or {}
        prompt_tokens, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt_tokens, int) or not isinstance(completion, int):
            raise InfrastructureError(f"{where}: the response has no usage token counts")
        array = decode_routes(answer, routes, prompt_tokens + completion - 1, where)
        rows.add(array, prompt_tokens)
        tokens += completion
    return rows, tokens
