"""vLLM plugin: route counts (and optionally a per-step route trace) from the MoE router.

Installed into the vLLM venv by ``scripts/build-vllm.sh`` as the module ``harness_vllm_routes``
of the distribution ``harness-vllm-routes``, under vLLM's ``vllm.general_plugins`` entry point,
so every vLLM process calls :func:`register` at start. It imports nothing of the harness (the
vLLM venv has no harness), only the standard library and, once enabled, torch and vLLM.

Enabled by environment variables (unset: the plugin does nothing at all):

* ``HARNESS_VLLM_ROUTES=PATH``: the CUDA lane's route-count dump (``MEGA_COUNT``'s format,
  docs/design.md): ``{"layers": {"0": [count per expert…], …}, "time": epoch_s}``, cumulative
  since the engine started, rewritten atomically (temp file + rename) at most every
  ``HARNESS_VLLM_ROUTES_EVERY_S`` seconds (default 0.5) while it changes, and at exit;
* ``HARNESS_VLLM_ROUTE_TRACE=PATH``: JSONL, one ``{"step", "layer", "top_indices", "prefill"}``
  record per forward step and MoE layer (the Megatron-style trace ``harness simulate`` reads),
  ``top_indices`` one ``[top_k]`` list per token of the step; ``prefill`` is true when any
  sequence of the step fed more than one token (a prompt, or a chunk of one).

How it sees routing: each MoE layer's router (``BaseRouter``) has a capture callback that gets
the logical expert ids ``[tokens, top_k]`` of every forward pass; the plugin binds one per layer
when the layer is built. The callback calls a torch custom op declared as mutating its input, so
it stays in a ``torch.compile``d graph (not dead code) and runs eagerly with the real ids.
Only steps that carry attention metadata are counted: vLLM's dummy and profiling passes at
boot have none, so the counts are routing of real tokens only. Each token is counted once per
layer: counts of one layer sum to top_k x routed tokens (prompt tokens not served from the
prefix cache, plus every generated token but the last of each request).
"""

import atexit
import contextlib
import json
import os
import tempfile
import threading
import time
from typing import Any

ROUTES_ENV = "HARNESS_VLLM_ROUTES"
TRACE_ENV = "HARNESS_VLLM_ROUTE_TRACE"
EVERY_ENV = "HARNESS_VLLM_ROUTES_EVERY_S"


def _append_no_follow(path: str) -> Any:
    """The trace opened for appending, never through a link planted at its name."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "a", encoding="utf-8")


class _Recorder:
    """Cumulative counts per layer, the trace file, and the thread that flushes the dump."""

    def __init__(self, dump_path: str | None, trace_path: str | None, every_s: float) -> None:
        self.dump_path = dump_path
        self.trace_path = trace_path
        self.every_s = every_s
        self.lock = threading.Lock()
        self.counts: dict[int, list[int]] = {}
        self.dirty = False
        self.step = -1
        self.last_layer: int | None = None
        self.trace: Any = _append_no_follow(trace_path) if trace_path else None
        if dump_path:
            threading.Thread(target=self._flush_loop, name="harness-routes", daemon=True).start()
        atexit.register(self.flush)

    def add_layer(self, layer: int, experts: int) -> None:
        """A MoE layer exists: it appears in the dump (zeros) before it routes anything."""
        with self.lock:
            self.counts.setdefault(layer, [0] * experts)
            self.dirty = True

    def observe(self, layer: int, ids: list[list[int]], prefill: bool) -> None:
        """One layer's expert ids for one forward step."""
        with self.lock:
            row = self.counts[layer]
            for token in ids:
                for expert in token:
                    row[expert] += 1
            self.dirty = True
            if self.last_layer is None or layer <= self.last_layer:
                self.step += 1
            self.last_layer = layer
            if self.trace is not None:
                record = {"step": self.step, "layer": layer, "top_indices": ids, "prefill": prefill}
                self.trace.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        """Rewrite the dump atomically when the counts changed; flush the trace."""
        with self.lock:
            if self.trace is not None:
                self.trace.flush()
            if not self.dump_path or not self.dirty:
                return
            document = {
                "layers": {str(layer): list(row) for layer, row in sorted(self.counts.items())},
                "time": time.time(),
            }
            self.dirty = False
        # A random name created exclusively (mkstemp), so no link planted beside the dump is
        # followed; removed when the write fails (a full disk).
        folder, name = os.path.split(os.path.abspath(self.dump_path))
        descriptor, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), 0o644)
                json.dump(document, handle, separators=(",", ":"))
            os.replace(tmp, self.dump_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _flush_loop(self) -> None:
        while True:
            time.sleep(self.every_s)
            # A full disk or a removed run directory must not kill the server.
            with contextlib.suppress(OSError):
                self.flush()


_RECORDER: _Recorder | None = None


def _is_real_step() -> tuple[bool, bool]:
    """(real, prefill) for the current forward pass, from vLLM's forward context."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return False, False
    metadata = get_forward_context().attn_metadata
    if not metadata:
        return False, False  # dummy and profiling passes carry no attention metadata
    if isinstance(metadata, list):
        metadata = metadata[0]
    first = next(iter(metadata.values()), None)
    max_query_len = getattr(first, "max_query_len", 1)
    return True, int(max_query_len) > 1


def _define_op() -> Any:
    # Annotations here are evaluated at definition (this module has no `from __future__ import
    # annotations`): torch.library reads them to build the op's schema.
    import torch

    @torch.library.custom_op("harness_routes::observe", mutates_args=("topk_ids",))
    def observe(topk_ids: torch.Tensor, layer: int) -> None:
        # Declared as mutating its input so compiled graphs keep it; it only reads.
        real, prefill = _is_real_step()
        if real and _RECORDER is not None:
            _RECORDER.observe(layer, topk_ids.to("cpu", torch.int64).tolist(), prefill)

    @observe.register_fake
    def _(topk_ids: torch.Tensor, layer: int) -> None:
        return None

    return observe


def _bind(runner: Any, op: Any) -> None:
    """Give one MoE layer's router a capture callback for its layer index."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    router = getattr(runner, "router", None)
    if not isinstance(router, BaseRouter) or _RECORDER is None:
        return
    layer = int(runner.layer_id)
    _RECORDER.add_layer(layer, int(router.global_num_experts))

    def capture(topk_ids: Any) -> None:
        op(topk_ids, layer)

    router.set_capture_fn(capture)


def register() -> None:
    """vLLM's ``vllm.general_plugins`` hook: bind the routers of every MoE layer built later."""
    global _RECORDER
    dump_path = os.environ.get(ROUTES_ENV) or None
    trace_path = os.environ.get(TRACE_ENV) or None
    if (dump_path is None and trace_path is None) or _RECORDER is not None:
        return
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    _RECORDER = _Recorder(dump_path, trace_path, float(os.environ.get(EVERY_ENV) or 0.5))
    op = _define_op()
    original_init = MoERunner.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _bind(self, op)

    MoERunner.__init__ = init
