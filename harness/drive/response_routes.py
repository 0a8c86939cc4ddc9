"""Routing returned in whole responses (vLLM's and SGLang's ``--enable-return-routed-experts``),
as a trace.

``harness collect --routes-from-responses`` boots the cell with the profile's switch knob on and
sends the split's prompts one at a time, greedy and not streamed (the engines return the routing
only in a whole response), each body carrying the profile's ``request_fields`` (SGLang asks per
request). vLLM puts ``.npy`` bytes in each choice; SGLang flat int32 in the response's
``sglext``, which ``--top-k`` reshapes. Both hold ``[prompt + completion tokens - 1, layers,
top_k]``: the prompt's tokens, then every generated token but the last, which is never
forwarded. The prompt rows become one prefill step and each later row one decode step, in
request order. The rows are written as ``route-trace.npz`` (``routed_experts``, ``prefill``,
``step``), the array trace ``harness simulate`` and ``fit-map --score`` read, and every row's
selections counted as ``counts.json`` for ``harness fit-map`` (prefill included, as vLLM's
route plugin and SGLang's recorder count).

Models with a dense prefix (DeepSeek, Kimi, GLM: their first layers have no router) come back
with every row of those layers zeros: both engines size the array by the model's hidden layers.
A layer that is zeros in every row of every response (top-k above 1, where real routing picks
distinct experts) is such a placeholder: it is left out of the trace, whose ``dense_layers``
array names it (and ``moe_layers`` the model layer of each trace layer), and kept in
``counts.json`` as a row of zeros, so a placement fitted from it has the model's
``num_hidden_layers`` rows, as SGLang's and KTransformers' loaders want.
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
from harness.errors import BadInput, InfrastructureError
from harness.formats.maps import write_count_dump
from harness.formats.npy import npy_header_problem
from harness.formats.safe_write import atomic_binary_writer
from harness.profiles.telemetry import ResponseRoutesSpec
from harness.runtimes.boot import http_json

# Rows (tokens) one response may route, far above any context window; and the routed experts
# per layer past any model's (the simulator's trace bound, harness.sim.traces.MAX_EXPERTS).
MAX_ROWS = 10_000_000
MAX_EXPERTS = 4096


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


def _npy_array(data: bytes) -> npt.NDArray[Any]:
    """``.npy`` bytes as an array, the header held to the bytes before numpy allocates its
    shape (a header claiming 64 PiB reached the last-resort handler as a MemoryError)."""
    problem = npy_header_problem(io.BytesIO(data), len(data))
    if problem is not None:
        raise ValueError(problem)
    return np.asarray(np.load(io.BytesIO(data), allow_pickle=False))


def decode_routes(
    body: Any, spec: ResponseRoutesSpec, rows: int, where: str, top_k: int | None = None
) -> npt.NDArray[Any]:
    """The routing array of one response, checked to have ``rows`` rows of ``[layers, top_k]``
    and only real routing: ids >= 0, distinct within a token's layer, except in layers that
    are zeros throughout (a dense layer's placeholder, :func:`placeholder_layers`).

    ``top_k`` reshapes SGLang's flat int32 (required there) and is checked against vLLM's .npy.
    """
    raw = field_value(body, spec.field)
    if raw is None:
        raise InfrastructureError(
            f"{where}: the response has no `{spec.field}`; was the runtime booted with routing "
            f"on (knob `{spec.knob}`)? A streamed request never carries it"
        )
    if not isinstance(raw, str):
        raise InfrastructureError(f"{where}: `{spec.field}` is {type(raw).__name__}, not base64")
    try:
        data = base64.b64decode(raw, validate=True)
        if spec.encoding == "int32-base64":
            array = _flat_int32(data, rows, top_k, f"{where}: `{spec.field}`")
        else:
            array = _npy_array(data)
    except (binascii.Error, ValueError, EOFError, OSError) as exc:
        what = "flat int32" if spec.encoding == "int32-base64" else ".npy"
        raise InfrastructureError(
            f"{where}: `{spec.field}` is not base64 of {what} bytes ({str(exc)[:160]})"
        ) from None
    if array.ndim != 3 or array.dtype.kind not in "iu" or array.shape[0] != rows:
        raise InfrastructureError(
            f"{where}: `{spec.field}` has shape {list(array.shape)} and dtype {array.dtype}; "
            f"expected {rows} integer rows (prompt + completion tokens - 1) of [layers, top_k]"
        )
    if top_k is not None and array.shape[2] != top_k:
        raise BadInput(
            f"{where}: `{spec.field}` has {array.shape[2]} experts per token, not --top-k {top_k}"
        )
    dense = placeholder_layers(array)
    _check_real_routing(np.delete(array, dense, axis=1), f"{where}: `{spec.field}`")
    return array


def _flat_int32(data: bytes, rows: int, top_k: int | None, where: str) -> npt.NDArray[Any]:
    """SGLang's routing: ``rows × layers × top_k`` little-endian int32, token-major."""
    if top_k is None:
        raise BadInput(f"{where}: flat int32 routing needs --top-k to find its layers")
    if len(data) % 4:
        raise ValueError(f"{len(data)} bytes is not a whole number of int32")
    flat = np.frombuffer(data, dtype="<i4")
    if rows == 0 or flat.size % (rows * top_k):
        raise BadInput(
            f"{where}: {flat.size} ids do not split into {rows} rows (prompt + completion "
            f"tokens - 1) of top_k {top_k}: is --top-k the model's num_experts_per_tok?"
        )
    return flat.reshape(rows, flat.size // (rows * top_k), top_k).astype(np.int32)


def _check_real_routing(array: npt.NDArray[Any], where: str) -> None:
    """Refuse placeholder rows: a negative id, or one id twice among a token's top-k (SGLang
    leaves a dense layer's rows as zeros; real routing picks distinct experts)."""
    if array.size and int(array.min()) < 0:
        row, layer, _ = np.argwhere(array < 0)[0].tolist()
        raise InfrastructureError(
            f"{where}: row {row}, layer {layer} holds {array[row, layer].tolist()}: a negative "
            "id is no routed expert (a dense layer's placeholder), which a trace cannot hold"
        )
    if array.shape[2] > 1:
        ordered = np.sort(array, axis=2)
        repeated = (ordered[:, :, 1:] == ordered[:, :, :-1]).any(axis=2)
        if repeated.any():
            row, layer = np.argwhere(repeated)[0].tolist()
            layers = sorted(set(np.nonzero(repeated.any(axis=0))[0].tolist()))
            raise InfrastructureError(
                f"{where}: row {row}, layer {layer} picks {array[row, layer].tolist()}, an "
                f"expert twice; layers {layers} repeat ids. Real routing picks distinct experts, "
                "and a dense layer's placeholder is zeros in every row: this is neither"
            )


def placeholder_layers(array: npt.NDArray[Any]) -> tuple[int, ...]:
    """The layers whose every row is zeros (vLLM's and SGLang's buffers) or -1 (sglang-jax's):
    a dense layer's placeholder. Real routing of top-k > 1 picks distinct experts, so it is
    never one id throughout; with top-k 1 nothing tells a placeholder from routing."""
    if array.ndim != 3 or array.shape[2] < 2 or array.shape[0] == 0:
        return ()
    zeros = ~array.any(axis=(0, 2))
    minus_one = (array == -1).all(axis=(0, 2))
    return tuple(int(layer) for layer in np.flatnonzero(zeros | minus_one))


def check_ids(array: npt.NDArray[Any], experts: int | None, where: str) -> None:
    """Every routed id below ``experts`` (the model's), or, without it, below any model's: the
    counts are sized by the largest id, and one id of 2**62 once asked for GiBs."""
    if not array.size:
        return
    highest = int(array.max())
    if experts is not None and highest >= experts:
        raise BadInput(
            f"{where}: the response routes to expert {highest}, past --experts {experts}: give "
            "the model's routed experts per layer"
        )
    if experts is None and highest >= MAX_EXPERTS:
        raise InfrastructureError(
            f"{where}: the response routes to expert {highest}, past any model's "
            f"({MAX_EXPERTS}): the routing is corrupt, or give --experts"
        )


@dataclass
class RouteRows:
    """Every response's routing, in request order, as trace rows: only the routed layers;
    ``dense_layers`` are the model layers every response left as zeros."""

    experts: list[npt.NDArray[Any]] = field(default_factory=list)
    prefill: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    steps: list[npt.NDArray[np.int64]] = field(default_factory=list)
    next_step: int = 0
    model_layers: int = 0
    dense_layers: tuple[int, ...] = ()

    @property
    def moe_layers(self) -> list[int]:
        """The model layer of each trace layer."""
        return [layer for layer in range(self.model_layers) if layer not in self.dense_layers]

    def add(self, routes: npt.NDArray[Any], prompt_tokens: int) -> None:
        """One response (routed layers only): its first ``prompt_tokens`` rows are one prefill
        step, the rest one decode step each."""
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

    def write(self, out_dir: Path, width: int | None = None) -> tuple[Path, Path]:
        """``route-trace.npz`` and ``counts.json`` (every row), ``width`` experts per layer
        (the model's, above every id: :func:`collect_response_routes` refused any past it;
        None: up to the highest id seen)."""
        experts = np.concatenate(self.experts)
        prefill = np.concatenate(self.prefill)
        trace = out_dir / "route-trace.npz"
        with atomic_binary_writer(trace) as handle:
            np.savez_compressed(
                handle, routed_experts=experts, prefill=prefill, step=np.concatenate(self.steps),
                dense_layers=np.asarray(self.dense_layers, dtype=np.int64),
                moe_layers=np.asarray(self.moe_layers, dtype=np.int64),
            )  # fmt: skip
        # Every model layer, dense ones as zeros: a placement needs num_hidden_layers rows.
        layers = self.model_layers or experts.shape[1]
        counts = np.zeros((layers, width or int(experts.max()) + 1), dtype=np.int64)
        for column, layer in enumerate(self.moe_layers or range(layers)):
            np.add.at(counts[layer], experts[:, column, :].ravel(), 1)
        counts_path = out_dir / "counts.json"
        write_count_dump(counts_path, counts, time.time())
        return counts_path, trace


def collect_response_routes(
    spec: DriveSpec,
    items: list[WorkItem],
    routes: ResponseRoutesSpec,
    top_k: int | None = None,
    experts: int | None = None,
) -> tuple[RouteRows, int]:
    """Send each item whole (not streamed), in order, with the profile's ``request_fields``;
    returns the routing rows and the tokens generated. A failed request, a response without
    routing, or an id past ``experts`` stops the collection at once."""
    rows = RouteRows()
    tokens = 0
    for index, item in enumerate(items):
        path, body = request_body(spec, item)
        body["stream"] = False
        body.pop("stream_options", None)
        body.update(routes.request_fields)
        where = f"request {index + 1} of {len(items)} (prompt {item.prompt_id})"
        status, answer = http_json(spec.base_url + path, body, timeout_s=spec.timeout_s)
        if status != 200 or not isinstance(answer, dict):
            raise InfrastructureError(f"{where}: HTTP {status}: {str(answer)[:300]}")
        usage = answer.get("usage") or {}
        prompt_tokens, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt_tokens, int) or not isinstance(completion, int):
            raise InfrastructureError(f"{where}: the response has no usage token counts")
        if not (0 <= prompt_tokens < MAX_ROWS and 0 <= completion < MAX_ROWS):
            raise InfrastructureError(
                f"{where}: usage says {prompt_tokens} prompt and {completion} completion tokens; "
                f"a response routes fewer than {MAX_ROWS:,}"
            )
        array = decode_routes(answer, routes, prompt_tokens + completion - 1, where, top_k)
        check_ids(array, experts, where)
        dense = placeholder_layers(array)
        if index == 0:
            rows.model_layers, rows.dense_layers = array.shape[1], dense
        elif (array.shape[1], dense) != (rows.model_layers, rows.dense_layers):
            raise InfrastructureError(
                f"{where}: {array.shape[1]} layers with dense (all-zero) layers {list(dense)}, "
                f"where the first response had {rows.model_layers} with {list(rows.dense_layers)}"
                ": one model routes the same layers in every response"
            )
        array = np.delete(array, dense, axis=1)
        rows.add(array, prompt_tokens)
        tokens += completion
    return rows, tokens
