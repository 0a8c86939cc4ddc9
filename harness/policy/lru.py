"""llama.cpp's MoE expert cache, as the simulator replays it: upstream's plan, step by step.

The experimental cache (``--moe-cache-mib``; upstream ``src/llama-moe-cache.cpp``, read at
ggml-org/llama.cpp 4b060f27) keeps copies of host-resident experts in a GPU memory budget. Its
rules, as modelled here (one device, every layer's experts of one layout: one group, one LRU):

* the budget is bytes and an expert (its gate, up and down matrices) a fixed number of bytes;
  upstream allocates one spare slot past the last (CUDA's MMQ may read past it), so the cache
  holds ``budget_bytes // expert_bytes - 1`` experts (alignment padding left out);
* one recency order over (layer, expert) across the group's layers: a miss uploads the expert
  into the least recently used slot, whatever its layer;
* only the experts of host-resident layers go through it (``--n-cpu-moe N``: the first N
  layers; ``--cpu-moe``: all); the other layers' experts live on the GPU;
* a ubatch (a host step: one token when decoding, a micro-batch when prefilling) of more than
  32 tokens, or whose tokens could select more experts than there are slots, does not use the
  cache at all: it is neither a hit nor a miss (upstream's large batches only copy experts that
  happen to be cached, printed apart and not modelled here);
* within a ubatch a layer's distinct experts are planned together: the hits move to the most
  recent end first (so no miss of the same ubatch evicts them), then the misses, in ascending
  expert order, each take the least recently used slot.

Hits, misses and uploaded bytes are what the cache prints when its context is destroyed, one line
per class (ubatches of up to 8 tokens, and of 9-32), so a replay is comparable with a run's
counters, which sum them. Pure and deterministic; imports nothing of ours but errors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError, TraceError

__all__ = ["MAX_BATCH", "SMALL_BATCH", "GlobalLruCache"]

# Ubatches of more tokens skip the cache (upstream's max_batch), and of up to this many are
# counted in the "ubatch <= 8" line, the rest in "ubatch  > 8".
MAX_BATCH = 32
SMALL_BATCH = 8


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
        self._capacity = self.slots_for(int(budget_bytes), int(expert_bytes))
        self._expert_bytes = int(expert_bytes)
        self._layers = layers
        self._experts = experts
        self._cached = np.zeros(layers, dtype=bool)
        self._cached[chosen] = True
        self._order: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._small = [0, 0]  # hits, misses of ubatches of up to SMALL_BATCH tokens
        self._bypassed = 0  # ubatches that did not use the cache
        # Keys in the order the cache served them (hits touched, then uploads), when a caller
        # asks: the sequence an oracle bound must be computed on to be a floor under this cache.
        self.trail: list[int] | None = None

    @staticmethod
    def slots_for(budget_bytes: int, expert_bytes: int) -> int:
        """Experts a budget holds: one spare slot past the last, as upstream allocates it."""
        return max(0, budget_bytes // expert_bytes - 1)

    def _check(self, layer: int, expert: int) -> None:
        if not (0 <= layer < self._layers and 0 <= expert < self._experts):
            raise TraceError(
                f"(layer {layer}, expert {expert}) is outside "
                f"{self._layers} layers x {self._experts} experts"
            )
        if not self._cached[layer]:
            raise TraceError(f"layer {layer} is not a cached (host-resident) layer")

    def _upload(self, key: int) -> None:
        self._misses += 1
        if self.trail is not None:
            self.trail.append(key)
        if self._capacity == 0:
            return  # nothing fits: the expert is used from host memory, never kept
        if len(self._order) >= self._capacity:
            self._order.popitem(last=False)
            self._evictions += 1
        self._order[key] = None

    def access(self, layer: int, expert: int) -> bool:
        """Look (layer, expert) up once; True on a hit. A miss uploads it, evicting the least
        recently used expert of any layer when the cache is full. The layer must be cached."""
        self._check(layer, expert)
        key = layer * self._experts + expert
        if key in self._order:
            self._order.move_to_end(key)
            self._hits += 1
            if self.trail is not None:
                self.trail.append(key)
            return True
        self._upload(key)
        return False

    def access_step(self, experts: npt.ArrayLike) -> tuple[int, int]:
        """One ubatch's selections, ``[tokens, layers, top_k]`` (or ``[layers, top_k]`` for
        one token), planned per cached layer as upstream plans them. Returns (lookups, misses):
        (0, 0) for a ubatch that skips the cache."""
        chosen = np.asarray(experts)
        if chosen.ndim == 2:
            chosen = chosen[np.newaxis]
        if chosen.ndim != 3 or chosen.shape[1] != self._layers:
            raise TraceError(
                f"experts must have shape [tokens, {self._layers}, top_k], got {list(chosen.shape)}"
            )
        tokens, _, top_k = chosen.shape
        if tokens > MAX_BATCH or min(tokens * top_k, self._experts) > self._capacity:
            self._bypassed += 1
            return 0, 0
        lookups = misses = 0
        for layer in np.flatnonzero(self._cached).tolist():
            distinct = [int(e) for e in dict.fromkeys(chosen[:, layer, :].reshape(-1).tolist())]
            base = layer * self._experts
            cold: list[int] = []
            for expert in distinct:
                self._check(layer, expert)
                if base + expert in self._order:
                    self._order.move_to_end(base + expert)
                    self._hits += 1
                    if self.trail is not None:
                        self.trail.append(base + expert)
                else:
                    cold.append(expert)
            for expert in sorted(cold):
                self._upload(base + expert)
            lookups += len(distinct)
            misses += len(cold)
            if tokens <= SMALL_BATCH:
                self._small[0] += len(distinct) - len(cold)
                self._small[1] += len(cold)
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
    def small_batches(self) -> tuple[int, int]:
        """(hits, misses) of ubatches of up to 8 tokens: upstream's "ubatch <= 8" line; the
        rest of :attr:`hits` and :attr:`misses` is its "ubatch  > 8" line."""
        return self._small[0], self._small[1]

    @property
    def bypassed(self) -> int:
        """Ubatches that did not use the cache (over 32 tokens, or more experts than slots)."""
        return self._bypassed

    @property
    def evictions(self) -> int:
        """Experts evicted to make room."""
        return self._evictions

    @property
    def uploaded_bytes(self) -> int:
        """Bytes copied to the GPU: one expert per miss (none when nothing fits)."""
        return self._misses * self._expert_bytes if self._capacity else 0
