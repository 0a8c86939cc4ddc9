"""llama.cpp's MoE expert cache, as the simulator replays it: one LRU over every cached layer.

The experimental cache (``--moe-cache-mib``) keeps copies of host-resident experts in a GPU
memory budget. Its rules, as modelled here:

* the budget is bytes, an expert (its gate, up and down matrices) a fixed number of bytes, so
  the cache holds ``budget_bytes // expert_bytes`` experts (none when an expert is larger than
  the budget: every lookup misses);
* one recency order over (layer, expert) across all cached layers: a miss uploads the expert and,
  when full, evicts the least recently used one, whatever its layer;
* only the experts of host-resident layers go through the cache (``--n-cpu-moe N``: the first N
  layers; ``--cpu-moe``: all); the other layers' experts live on the GPU and are not looked up;
* within one graph evaluation (a host step: one token when decoding, a micro-batch when
  prefilling) a layer fetches each distinct expert its tokens chose once, in first-chosen order.

Hits, misses and uploaded bytes are what the cache prints when its context is destroyed
(``llama_moe_cache: … hits = N, misses = M, hit rate = X%, uploaded = Y MiB``), so a replay is
comparable with a run's counters. Pure and deterministic; imports nothing of ours but errors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError, TraceError

__all__ = ["GlobalLruCache"]


def _positive_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) > 0


class GlobalLruCache:
    """A byte-budgeted LRU over (layer, expert) shared by every cached layer."""

    def __init__(
        self,
        budget_bytes: int,
        expert_bytes: int,
        layers: int,
        experts: int,
        cached_layers: Sequence[int] | None = None,
    ) -> None:
        """An empty cache of ``budget_bytes``; ``cached_layers`` (default: all) are the layers
        whose experts live in host memory and so go through it."""
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int | np.integer):
            raise KnobError(f"budget_bytes: must be a whole number of bytes, got {budget_bytes!r}")
        if budget_bytes < 0:
            raise KnobError(f"budget_bytes: must not be negative, got {budget_bytes}")
        sizes = (("expert_bytes", expert_bytes), ("layers", layers), ("experts", experts))
        for name, size in sizes:
            if not _positive_int(size):
                raise KnobError(f"{name}: must be a positive integer, got {size!r}")
        chosen = list(range(layers)) if cached_layers is None else list(cached_layers)
        bad = [layer for layer in chosen if not 0 <= layer < layers]
        if bad:
            raise KnobError(f"cached_layers: {bad[0]} is outside 0..{layers - 1}")
        self._capacity = int(budget_bytes) // int(expert_bytes)
        self._expert_bytes = int(expert_bytes)
        self._layers = layers
        self._experts = experts
        self._cached = np.zeros(layers, dtype=bool)
        self._cached[chosen] = True
        self._order: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def access(self, layer: int, expert: int) -> bool:
        """Look (layer, expert) up once; True on a hit. A miss uploads it, evicting the least
        recently used expert of any layer when the cache is full. The layer must be cached."""
        if not (0 <= layer < self._layers and 0 <= expert < self._experts):
            raise TraceError(
                f"(layer {layer}, expert {expert}) is outside "
                f"{self._layers} layers x {self._experts} experts"
            )
        if not self._cached[layer]:
            raise TraceError(f"layer {layer} is not a cached (host-resident) layer")
        key = layer * self._experts + expert
        if key in self._order:
            self._order.move_to_end(key)
            self._hits += 1
            return True
        self._misses += 1
        if self._capacity == 0:
            return False  # nothing fits: the expert is used from host memory, never kept
        if len(self._order) >= self._capacity:
            self._order.popitem(last=False)
            self._evictions += 1
        self._order[key] = None
        return False

    def access_step(self, experts: npt.ArrayLike) -> tuple[int, int]:
        """One host step's selections, ``[tokens, layers, top_k]`` (or ``[layers, top_k]`` for
        one token): per layer in order, each distinct expert once. Returns (lookups, misses)."""
        chosen = np.asarray(experts)
        if chosen.ndim == 2:
            chosen = chosen[np.newaxis]
        if chosen.ndim != 3 or chosen.shape[1] != self._layers:
            raise TraceError(
                f"experts must have shape [tokens, {self._layers}, top_k], got {list(chosen.shape)}"
            )
        lookups = misses = 0
        for layer in np.flatnonzero(self._cached).tolist():
            ids = chosen[:, layer, :].reshape(-1).tolist()
            for expert in dict.fromkeys(ids):
                lookups += 1
                misses += not self.access(layer, int(expert))
        return lookups, misses

    def resident(self) -> list[tuple[int, int]]:
        """Cached (layer, expert) pairs, least recently used first."""
        return [divmod(key, self._experts) for key in self._order]

    @property
    def capacity(self) -> int:
        """Experts the budget holds."""
        return self._capacity

    @property
    def hits(self) -> int:
        """Lookups served from the cache."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups that uploaded (or, with no room at all, read from host memory) the expert."""
        return self._misses

    @property
    def evictions(self) -> int:
        """Experts evicted to make room."""
        return self._evictions

    @property
    def uploaded_bytes(self) -> int:
        """Bytes copied to the GPU: one expert per miss (none when nothing fits)."""
        return self._misses * self._expert_bytes if self._capacity else 0
