"""SGLang's Paged Experts residency, replayed: which experts each step finds on the GPU.

SGLang 0.5.23's Paged Experts (``--enable-paged-experts``) keeps K routed experts per MoE layer in
K GPU slots and pages the rest in from pinned host memory, but counts no hits or page-ins. This
replays its host-planned residency (``srt/layers/moe/paged_experts/residency.py``: ``LRUPolicy``
and ``plan_waves``, as ``executor.py``'s ``EagerExecutor`` drives them) over routing the harness
recorded, so a run gets a hit rate that is **replayed, not measured**:

* one policy per MoE layer (``method.py``: a ``PagedExpertsMoEMethod`` per layer), K =
  ``min(paged_experts_num_resident, experts)`` slots holding experts 0..K-1 at boot, least
  recently used first;
* per forward step, the layer's distinct routed experts in ascending order (``torch.unique``);
  ``plan_waves`` puts the resident ones first and cuts the list into waves of at most K;
  ``LRUPolicy.place`` moves each wave's resident experts to the most recent end, then gives each
  missing one the least recently used slot (one page-in each);
* a lookup is one distinct expert of one step and layer, a miss one page-in: the hit rate is
  resident experts / distinct experts, per step and layer, not per token's selection.

What it does not follow: with CUDA graphs on, a step of at most K routed entries (decode of up to
``K // top_k`` requests) is decided on the GPU (``paged_experts.cuh``, ``paged_experts_decide``),
which evicts the same least recently used experts but breaks ties between experts last used in
the same step by lowest slot, where the host policy keeps the order they were placed; and the
replay starts from the boot's residency, not the state the runtime's warm-up (or an earlier run
on a shared boot) left. Pure and deterministic; imports nothing of ours but errors.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError, TraceError

__all__ = ["PagedExpertsLru", "ReplayedResidency", "replay_paged_experts"]


class PagedExpertsLru:
    """One MoE layer's slots as SGLang's ``LRUPolicy`` keeps them."""

    def __init__(self, num_slots: int) -> None:
        """K slots holding experts 0..K-1, least recently used first (as SGLang boots them)."""
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise KnobError(f"num_slots: must be a positive integer, got {num_slots!r}")
        self.num_slots = num_slots
        self.resident: OrderedDict[int, int] = OrderedDict((e, e) for e in range(num_slots))

    def place(self, experts: list[int]) -> int:
        """Make one wave's ``experts`` (at most K) resident; returns its page-ins (misses)."""
        for expert in experts:
            if expert in self.resident:
                self.resident.move_to_end(expert)
        loads = 0
        for expert in experts:
            if expert not in self.resident:
                # Every expert of the wave is at the most recent end, so the head is none of them.
                _, slot = self.resident.popitem(last=False)
                self.resident[expert] = slot
                loads += 1
        return loads

    def step(self, distinct: list[int]) -> int:
        """One forward step's distinct experts (ascending), in waves as ``plan_waves`` cuts
        them; returns the step's page-ins."""
        ordered = [e for e in distinct if e in self.resident]
        ordered += [e for e in distinct if e not in self.resident]
        k = self.num_slots
        return sum(self.place(ordered[i : i + k]) for i in range(0, len(ordered), k))


@dataclass(frozen=True)
class ReplayedResidency:
    """What the replay found: distinct experts per step and layer that were resident (hits)
    and that were paged in (misses)."""

    hits: int
    misses: int

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None when nothing was routed."""
        total = self.hits + self.misses
        return self.hits / total if total else None


def replay_paged_experts(counts: npt.ArrayLike, num_resident: int) -> ReplayedResidency:
    """Replay Paged Experts over per-pass routing ``[passes, layers, experts]`` (expert
    selections per forward pass: SGLang's recorder's ``logical_count``; an expert counted in a
    pass was routed in it), with ``num_resident`` slots per layer (capped at the layer's experts,
    as SGLang caps them)."""
    array = np.asarray(counts)
    if array.ndim != 3:
        raise TraceError(
            f"counts must have shape [passes, layers, experts], got {list(array.shape)}"
        )
    if isinstance(num_resident, bool) or not isinstance(num_resident, int) or num_resident < 1:
        raise KnobError(f"num_resident: must be a positive integer, got {num_resident!r}")
    passes, layers, experts = array.shape
    slots = min(num_resident, experts) if experts else num_resident
    policies = [PagedExpertsLru(slots) for _ in range(layers)]
    hits = misses = 0
    for index in range(passes):
        for layer, policy in enumerate(policies):
            distinct = np.flatnonzero(array[index, layer] > 0).tolist()
            loads = policy.step(distinct)
            hits += len(distinct) - loads
            misses += loads
    return ReplayedResidency(hits, misses)
