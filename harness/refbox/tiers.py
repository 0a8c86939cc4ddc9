"""The two-tier expert store: hot resident arrays (or a cache) over a slow memory-mapped tier.

Both tiers hold the same float32 bytes, so which one serves a lookup changes only the cost:
a cold lookup is a real read and copy of a whole slow-tier record, counted in
:class:`TierCounters` (lookups, cold lookups, expert loads, bytes read). :class:`RowmapTiers`
keeps a fixed number of hot slots per layer that the residency policy swaps;
:class:`CacheTiers` lets an :class:`~harness.policy.residency.ExpertCache` decide hits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from harness.policy.residency import ExpertCache
from harness.refbox.model import F32, ExpertSource, ModelConfig, expert_weights


class SlowTier:
    """Every expert's record in one memory-mapped file; each read copies a whole record.

    A load (:meth:`load`: a cold lookup or an expert promoted by a swap) may be made lossy or
    faulty on purpose (``--cold-bits``, ``--fault swap-weights``) to prove the harness's
    canaries and equivalence endpoint; the boot's hot fill is always exact.

    A record is the expert's float32 weights padded to ``record_bytes``, so the cost of a cold
    lookup (a real page-cache read and copy, never a sleep) scales with ``--expert-bytes``.
    With ``--cold-dir`` the file is kept there, named by everything that determines its bytes,
    and reused by later boots: like a real model file it can then be evicted from the page cache
    for a ``cold`` run. Without it the file is a temporary, unlinked as soon as it is mapped.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        record_bytes: int,
        directory: str | None,
        *,
        bits: int = 0,
        swap_every: int = 0,
    ) -> None:
        """Map the slow-tier file under ``directory``, writing it first when it is missing.

        ``bits`` (1..16, 0 = exact): loads are quantized to that many bits and copy that share
        of the record, like a lower-precision cold copy. ``swap_every`` (0 = never): every that
        many loads hand back the weights of the expert's neighbour, a broken eviction.
        """
        self.cfg = cfg
        self.bits = bits
        self.swap_every = swap_every
        self.loads = 0
        self.record_bytes = max(record_bytes, cfg.expert_weight_bytes)
        self._weight_bytes = cfg.expert_weight_bytes
        if directory is None:
            fd, path = tempfile.mkstemp(prefix="refbox-cold-", suffix=".bin")
            try:
                with open(fd, "wb") as handle:
                    self._fill(handle)
                self._map = np.memmap(path, dtype=np.uint8, mode="r+")
            finally:
                os.unlink(path)
            return
        path = os.path.join(directory, self.file_name())
        size = cfg.layers * cfg.experts * self.record_bytes
        if not (os.path.isfile(path) and os.path.getsize(path) == size):
            fd, tmp = tempfile.mkstemp(prefix=".refbox-slow-", suffix=".tmp", dir=directory)
            with open(fd, "wb") as handle:
                self._fill(handle)
                # Written back now, at boot: left dirty, a large file is flushed during the
                # next runs and slows them, which a campaign would read as drift.
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)  # atomic: a concurrent boot never maps half a file
        self._map = np.memmap(path, dtype=np.uint8, mode="r+")

    def file_name(self) -> str:
        """Name of the persistent file: a digest of everything that determines its bytes."""
        key = f"{dataclasses.astuple(self.cfg)!r}-{self.record_bytes}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return f"refbox-slow-{digest}.bin"

    def _fill(self, handle: BinaryIO) -> None:
        pad = bytes(self.record_bytes - self._weight_bytes)
        for layer in range(self.cfg.layers):
            weights = expert_weights(self.cfg, layer)
            for e in range(self.cfg.experts):
                handle.write(weights[e].tobytes())
                handle.write(pad)

    def offset(self, layer: int, expert: int) -> int:
        """Byte offset of one expert's record."""
        return (layer * self.cfg.experts + expert) * self.record_bytes

    def read(self, layer: int, expert: int, share: float = 1.0) -> F32:
        """Copy one record (``share`` of it, never less than its weights) out of the file and
        return its weights (a fresh array)."""
        start = self.offset(layer, expert)
        size = max(self._weight_bytes, int(self.record_bytes * share))
        record = np.array(self._map[start : start + size])
        return record[: self._weight_bytes].view(np.float32)

    @property
    def exact(self) -> bool:
        """Loads return the experts' own full-precision weights."""
        return self.bits == 0 and self.swap_every == 0

    def load(self, layer: int, expert: int) -> F32:
        """An expert brought in from the slow tier: exact, or as ``bits``/``swap_every`` say."""
        self.loads += 1
        if self.swap_every and self.loads % self.swap_every == 0:
            expert ^= 1  # the neighbour's weights, as from an eviction that swapped two records
        if self.bits == 0:
            return self.read(layer, expert)
        weights = self.read(layer, expert, self.bits / 32.0)
        # Symmetric uniform quantization of the whole expert to ``bits`` bits.
        levels = float(2 ** (self.bits - 1) - 1) or 1.0
        scale = float(np.abs(weights).max()) / levels or 1.0
        quantized: F32 = (np.round(weights / scale) * scale).astype(np.float32)
        return quantized

    def write(self, layer: int, expert: int, weights: F32) -> None:
        """Copy weights back into an expert's record (the eviction half of a swap)."""
        start = self.offset(layer, expert)
        self._map[start : start + self._weight_bytes] = weights.view(np.uint8)


@dataclass
class TierCounters:
    """Cost counters of the tiers, cumulative over the process."""

    lookups: int = 0
    cold_lookups: int = 0
    bytes_read: int = 0
    expert_loads: int = 0


class RowmapTiers(ExpertSource):
    """Per layer, ``hot_slots`` experts in resident arrays; the rest read from the slow tier."""

    def __init__(self, slow: SlowTier, hot: Sequence[Sequence[int]]) -> None:
        """Fill the hot arrays from the slow tier, one slot per hot expert of each layer."""
        cfg = slow.cfg
        self.slow = slow
        self.counters = TierCounters()
        self.hot_slots = len(hot[0]) if hot else 0
        self.rows = np.zeros((cfg.layers, self.hot_slots, cfg.expert_floats), dtype=np.float32)
        self.slot_of = np.full((cfg.layers, cfg.experts), -1, dtype=np.int64)
        for layer, experts in enumerate(hot):
            for slot, e in enumerate(experts):
                self.rows[layer, slot] = slow.read(layer, e)
                self.slot_of[layer, e] = slot

    def fetch(self, layer: int, expert: int) -> F32:
        """Hot: a view of the resident row. Cold: a real read and copy from the slow tier."""
        self.counters.lookups += 1
        slot = int(self.slot_of[layer, expert])
        if slot >= 0:
            hot_row: F32 = self.rows[layer, slot]
            return hot_row
        self.counters.cold_lookups += 1
        self.counters.bytes_read += self.slow.record_bytes
        self.counters.expert_loads += 1
        return self.slow.load(layer, expert)

    def swap(self, layer: int, promoted: int, evicted: int) -> None:
        """Move ``evicted`` out to the slow tier and ``promoted`` into its slot, copying both."""
        slot = int(self.slot_of[layer, evicted])
        if slot < 0 or self.slot_of[layer, promoted] >= 0:
            raise ValueError(f"bad swap at layer {layer}: promote {promoted}, evict {evicted}")
        if self.slow.exact:  # a lossy or faulty row must never reach the shared file
            self.slow.write(layer, evicted, self.rows[layer, slot])
        self.rows[layer, slot] = self.slow.load(layer, promoted)
        self.counters.bytes_read += self.slow.record_bytes
        self.counters.expert_loads += 1
        self.slot_of[layer, evicted] = -1
        self.slot_of[layer, promoted] = slot

    def hot_sets(self) -> list[list[int]]:
        """The hot experts of each layer, sorted."""
        return [sorted(np.flatnonzero(row >= 0).tolist()) for row in self.slot_of]


_PRUNE_SLACK = 64


class CacheTiers(ExpertSource):
    """Cache mode (seed 004): an ExpertCache decides hits; a miss reads the slow tier.

    Resident weights are kept for exactly the (layer, expert) pairs the cache holds, so a hit is
    served from memory and a miss costs a real slow-tier read.
    """

    def __init__(self, slow: SlowTier, cache: ExpertCache) -> None:
        """Preload the cache's initial residents (the hotlist prefix) into memory."""
        self.slow = slow
        self.cache = cache
        self.counters = TierCounters()
        self.resident: dict[tuple[int, int], F32] = {}
        for key in cache.resident():
            self.resident[key] = slow.read(*key)

    def fetch(self, layer: int, expert: int) -> F32:
        """Ask the cache; serve a hit from memory, a miss from the slow tier (then keep it)."""
        self.counters.lookups += 1
        key = (layer, expert)
        hit = self.cache.access(layer, expert)
        weights = self.resident.get(key) if hit else None
        if weights is not None:
            return weights
        self.counters.cold_lookups += 1
        self.counters.bytes_read += self.slow.record_bytes
        self.counters.expert_loads += 1
        weights = self.slow.load(layer, expert)
        self.resident[key] = weights  # a miss always loads the record into the cache
        # The cache does not say which record it evicted; prune in batches so the scan is rare.
        if len(self.resident) > self.cache.capacity + _PRUNE_SLACK:
            for stale in [k for k in self.resident if self.cache.priority_of(*k) is None]:
                del self.resident[stale]
        return weights
