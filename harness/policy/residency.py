"""Residency policies: the decision code shared by the reference runtime and the simulator.

Pure and deterministic, no I/O, and it imports nothing of ours but the errors and its compiled
kernels, so a simulator replaying a routing trace makes exactly the decisions the runtime makes
(seed 000 checked its simulator against production in lockstep: 28,329 decisions, zero
divergence).

Two policies:

* :class:`ResidencyPolicy`, seed 000's adaptive hot/cold residency: per-expert route counters
  read into an EWMA with a half-life in steps at every drain, a swap queue drained every
  ``drain_every`` decode steps with a per-layer budget, and a promotion rule with a threshold and
  hysteresis. Its drain is compiled (:mod:`harness.policy.kernels`) and shared with the fast
  replay's compiled loop.
* :class:`ExpertCache`, seed 004's SSD expert cache: LFU priorities, LRU among equals, seeded
  from a hotlist under the ``legacy`` (rank-sized priorities), ``adaptive`` (all 1) or uniform
  ``N`` prior.

Order is total everywhere, so ties can never depend on hash or sort stability: an expert is
*stronger* than another when its count is higher, or equal with a lower expert id.

Both policies live in one module because they share that contract and its argument checks,
and because this module and :mod:`.kernels` are all the reference runtime and the replays import
of each other: what decides a swap is in one place.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError, MapError, TraceError
from harness.policy import kernels as policy_kernels

__all__ = [
    "MAX_PRIORITY",
    "ExpertCache",
    "PolicyKnobs",
    "PolicyState",
    "ResidencyPolicy",
    "Swap",
    "parse_priority",
]

# ds4 parses the uniform prior into a C int; larger values are refused rather than wrapped.
MAX_PRIORITY = 2**31 - 1
_PRIORITY_RULE = "must be one of legacy, adaptive, or a positive integer"

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


@dataclass(frozen=True)
class PolicyKnobs:
    """Knobs of the adaptive residency policy, with seed 000's shipped defaults."""

    policy: Literal["adaptive", "frozen"] = "adaptive"
    decay_half_life_steps: float = 256.0  # EWMA half-life of per-expert counters; inf = no decay
    promote_threshold: float = 2.0  # a cold expert's decayed count must reach this
    hysteresis: float = 0.25  # ...and exceed the weakest hot expert's count by this fraction
    drain_every: int = 64  # the swap queue is drained every N decode steps
    swaps_per_layer: int = 2  # promotions allowed per layer per drain

    def decay_rate(self) -> float:
        """Decay per host step, ``ln 2 / half-life`` (0 for an infinite half-life)."""
        return math.log(2.0) / float(self.decay_half_life_steps)

    def validate(self) -> None:
        """Raise :class:`KnobError` naming the first invalid knob and the values it allows."""
        if self.policy not in ("adaptive", "frozen"):
            raise KnobError(f"policy: must be one of adaptive, frozen; got {self.policy!r}")
        half_life = self.decay_half_life_steps
        if not _is_number(half_life) or math.isnan(half_life) or half_life <= 0:
            raise KnobError(
                "decay_half_life_steps: must be a positive number of steps (inf disables "
                f"decay); got {half_life!r}"
            )
        for name in ("promote_threshold", "hysteresis"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise KnobError(f"{name}: must be a finite number >= 0; got {value!r}")
        if not _is_int(self.drain_every) or self.drain_every < 1:
            raise KnobError(
                f"drain_every: must be an integer >= 1 (steps); got {self.drain_every!r}"
            )
        if not _is_int(self.swaps_per_layer) or self.swaps_per_layer < 0:
            raise KnobError(
                "swaps_per_layer: must be an integer >= 0 (0 never swaps); "
                f"got {self.swaps_per_layer!r}"
            )


@dataclass(frozen=True)
class Swap:
    """One applied swap: at ``step``, ``promoted`` took the HBM slot of ``evicted`` in ``layer``."""

    step: int
    layer: int
    promoted: int
    evicted: int


def _plain_ids(ids: list[Any], experts: int) -> bool:
    """True when every id is an integer (not a bool) in ``0..experts-1``."""
    kinds = set(map(type, ids))
    if bool in kinds or not all(issubclass(kind, int | np.integer) for kind in kinds):
        return False
    return not ids or (min(ids) >= 0 and max(ids) < experts)


def _hot_mask(hot: Sequence[Sequence[int]], experts: int) -> BoolArray:
    if not _is_int(experts) or experts < 1:
        raise MapError(f"experts: must be a positive integer, got {experts!r}")
    if len(hot) < 1:
        raise MapError("hot sets: need at least one layer")
    mask = np.zeros((len(hot), experts), dtype=bool)
    for layer, ids in enumerate(hot):
        ids = list(ids)
        if _plain_ids(ids, experts):
            # The common case at C speed (a 40 x 295 map is 11,800 ids).
            mask[layer, ids] = True
            if int(np.count_nonzero(mask[layer])) == len(ids):
                continue
            mask[layer] = False
        bad = [e for e in ids if not _is_int(e) or not 0 <= e < experts]
        if bad:
            raise MapError(f"hot set of layer {layer}: ids {bad} are not in 0..{experts - 1}")
        duplicated = sorted(e for e, n in Counter(ids).items() if n > 1)
        if duplicated:
            raise MapError(f"hot set of layer {layer}: ids {duplicated} are listed twice")
        mask[layer, ids] = True
    return mask


class ResidencyPolicy:
    """Seed 000's adaptive residency: read-time EWMA counts, threshold, hysteresis, budget.

    Counting, as the CUDA lane's route counter does it: every decode step adds 1 to the integer
    count of each (layer, expert) its tokens chose; prefill steps are not counted. Each drain
    *reads* the counters: the decayed counts become ``counts * 0.5 ** (elapsed / half_life) +
    new counts`` (elapsed = host steps since the previous read) and the integer counters restart
    at zero. So between drains nothing decays and the counts are exact integers, and a drain is
    a pure function of the previous counts, the counts since, and the hot sets.

    Draining: the swap queue is drained at the decode step that completes ``drain_every`` decode
    steps since the last drain (prefill steps neither count nor drain, so a drain is never lost
    to a prefill step), while the policy is adaptive; frozen, nothing drains, and the first
    decode step after unfreezing drains when one fell due meanwhile. In each layer the i-th
    strongest cold expert pairs with the i-th weakest hot expert and the pair swaps when the cold
    count reaches ``promote_threshold`` and exceeds the hot count by ``hysteresis``; at most
    ``swaps_per_layer`` pairs per layer apply (see :func:`harness.policy.kernels.drain`, the one
    implementation every caller shares); a layer with more pairs meeting the rule is saturated.
    """

    def __init__(self, knobs: PolicyKnobs, hot: Sequence[Sequence[int]], experts: int) -> None:
        """Start from ``hot`` (the hot expert ids of each layer) with all counts at zero."""
        knobs.validate()
        self._knobs = knobs
        self._hot = _hot_mask(hot, experts)
        self._hot_view = self._hot.view()
        self._hot_view.flags.writeable = False
        self._layers, self._experts = (int(size) for size in self._hot.shape)
        self._ewma: FloatArray = np.zeros(self._hot.shape, dtype=np.float64)
        self._raw: npt.NDArray[np.int64] = np.zeros(self._hot.shape, dtype=np.int64)
        self._flat_raw = self._raw.reshape(-1)
        self._rows: IntArray = np.arange(self._layers, dtype=np.intp)
        self._offsets: IntArray = self._rows[:, None] * self._experts
        self._rate = knobs.decay_rate()
        self._fold_step: int | None = None
        self._last_step: int | None = None
        self._since_drain = 0
        self._saturated_layers = 0
        self._swap_buffer = np.zeros((self._layers * knobs.swaps_per_layer, 4), dtype=np.int64)

    @property
    def knobs(self) -> PolicyKnobs:
        """The knobs in force."""
        return self._knobs

    @property
    def layers(self) -> int:
        """Number of layers."""
        return self._layers

    @property
    def experts(self) -> int:
        """Experts per layer."""
        return self._experts

    @property
    def hot_mask(self) -> BoolArray:
        """Current residency, bool ``[layers, experts]``; a read-only view that tracks swaps."""
        return self._hot_view

    def hot_sets(self) -> list[list[int]]:
        """Hot expert ids of each layer, ascending."""
        return [np.flatnonzero(row).tolist() for row in self._hot]

    def counts(self) -> FloatArray:
        """Decayed counts ``[layers, experts]`` as a read at the last observed step would see
        them (a copy; reading them changes nothing)."""
        if self._fold_step is None or self._last_step is None:
            return self._raw.astype(np.float64)
        factor = policy_kernels.decay_factor(self._last_step - self._fold_step, self._rate)
        return self._ewma * factor + self._raw

    def count_cold(self, experts: npt.ArrayLike) -> int:
        """Cold lookups among ``experts`` (``[layers, top_k]`` or ``[tokens, layers, top_k]``)
        under the current residency."""
        chosen = np.asarray(experts, dtype=np.intp)
        return int(np.count_nonzero(~self._hot[self._rows[:, None], chosen]))

    def set_knobs(self, knobs: PolicyKnobs) -> None:
        """Change knobs live. Counts so far are read under the old half-life first, so the new
        one applies only to what comes after; the decode steps since the last drain carry on."""
        knobs.validate()
        if self._last_step is not None and knobs.decay_half_life_steps != (
            self._knobs.decay_half_life_steps
        ):
            elapsed = 0 if self._fold_step is None else self._last_step - self._fold_step
            policy_kernels.fold(self._ewma, self._raw, elapsed, self._rate)
            self._fold_step = self._last_step
        self._knobs = knobs
        self._rate = knobs.decay_rate()
        if len(self._swap_buffer) < self._layers * knobs.swaps_per_layer:
            self._swap_buffer = np.zeros((self._layers * knobs.swaps_per_layer, 4), np.int64)
        if knobs.policy == "frozen":
            self._saturated_layers = 0

    def saturated_layers(self) -> int:
        """Layers whose candidates exceeded the budget at the last drain (pinned at the budget)."""
        return self._saturated_layers

    def _check_step(self, step: int, chosen: IntArray) -> None:
        if self._last_step is not None and step < self._last_step:
            raise TraceError(
                f"step {step} comes after step {self._last_step}; steps must not go backwards"
            )
        if chosen.ndim not in (2, 3) or chosen.shape[-2] != self._layers:
            raise TraceError(
                f"step {step}: experts must have shape [{self._layers}, top_k] (or [tokens, "
                f"{self._layers}, top_k]), got {list(chosen.shape)}"
            )
        # One unsigned comparison catches negative ids too (they wrap to huge values).
        if chosen.size and (chosen.view(np.uintp) >= self._experts).any():
            outside = chosen[(chosen < 0) | (chosen >= self._experts)]
            raise TraceError(
                f"step {step}: expert ids {sorted(set(outside.tolist()))} "
                f"are not in 0..{self._experts - 1}"
            )

    def observe(self, step: int, experts: npt.ArrayLike, *, prefill: bool = False) -> list[Swap]:
        """Count one host step's choices and drain when one is due.

        ``experts`` is ``[layers, top_k]`` for one token or ``[tokens, layers, top_k]`` for all
        the decode tokens of a batched step; one call is one host step. Returns the swaps applied
        at this step (empty unless this decode step drained).
        """
        chosen = np.asarray(experts, dtype=np.intp)
        self._check_step(step, chosen)
        self._last_step = step
        if prefill:
            return []
        due = self.drain_due()
        # add.at, unlike fancy +=, counts an expert listed twice in a row twice.
        np.add.at(self._flat_raw, (chosen + self._offsets).reshape(-1), 1)
        self._since_drain += 1
        return self._drain(step) if due else []

    def drain_due(self) -> bool:
        """Whether the next decode step drains (the queue is due and the policy adaptive)."""
        knobs = self._knobs
        return knobs.policy == "adaptive" and self._since_drain + 1 >= knobs.drain_every

    def _drain(self, step: int) -> list[Swap]:
        knobs = self._knobs
        elapsed = 0 if self._fold_step is None else step - self._fold_step
        count, self._saturated_layers = policy_kernels.drain(
            self._ewma,
            self._raw,
            self._hot,
            elapsed,
            self._rate,
            float(knobs.promote_threshold),
            1.0 + knobs.hysteresis,
            knobs.swaps_per_layer,
            step,
            self._swap_buffer,
            0,
        )
        self._fold_step = step
        self._since_drain = 0
        return [Swap(*row) for row in self._swap_buffer[:count].tolist()]

    def export_state(self) -> PolicyState:
        """The mutable state, for a compiled loop that drives the same kernels (the fast
        replay); :meth:`import_state` takes it back."""
        return PolicyState(
            ewma=self._ewma,
            raw=self._raw,
            hot=self._hot,
            fold_step=-1 if self._fold_step is None else self._fold_step,
            last_step=-1 if self._last_step is None else self._last_step,
            since_drain=self._since_drain,
            saturated=self._saturated_layers,
        )

    def import_state(self, state: PolicyState) -> None:
        """Take back the scalars a compiled loop advanced (the arrays are shared, not copied)."""
        lent = (self._ewma, self._raw, self._hot)
        if any(ours is not theirs for ours, theirs in zip(lent, state.arrays(), strict=True)):
            raise ValueError("import_state takes back the state export_state lent, not another")
        self._fold_step = None if state.fold_step < 0 else state.fold_step
        self._last_step = None if state.last_step < 0 else state.last_step
        self._since_drain = state.since_drain
        self._saturated_layers = state.saturated


@dataclass
class PolicyState:
    """A policy's mutable state, lent to a compiled loop: the arrays are the policy's own."""

    ewma: FloatArray
    raw: npt.NDArray[np.int64]
    hot: BoolArray
    fold_step: int  # step of the last read, -1 before the first
    last_step: int  # last observed step, -1 before the first
    since_drain: int  # decode steps since the last drain
    saturated: int  # saturated layers at the last drain

    def arrays(self) -> tuple[FloatArray, npt.NDArray[np.int64], BoolArray]:
        """The lent arrays: counts, counters since the last read, residency."""
        return self.ewma, self.raw, self.hot


def parse_priority(value: str) -> Literal["legacy", "adaptive"] | int:
    """Parse ds4's ``DS4_METAL_STREAMING_EXPERT_HOTLIST_PRIORITY``: legacy, adaptive or N >= 1."""
    # Exact spelling, as ds4's parser: " 7" or "Legacy" fail startup there too.
    text = value
    if text == "legacy":
        return "legacy"
    if text == "adaptive":
        return "adaptive"
    if not (text.isascii() and text.isdigit()):
        raise KnobError(f"priority {value!r}: {_PRIORITY_RULE}")
    number = int(text)
    if number < 1:
        raise KnobError(f"priority {value!r}: {_PRIORITY_RULE}")
    if number > MAX_PRIORITY:
        raise KnobError(f"priority {value!r}: {_PRIORITY_RULE} (at most {MAX_PRIORITY})")
    return number


class ExpertCache:
    """Seed 004's SSD expert cache: LFU priorities, LRU among equals, seeded from a hotlist.

    Records are (layer, expert) pairs. The first ``capacity`` distinct hotlist entries are
    preloaded with a prior: ``legacy`` gives rank-sized priorities (n down to 1 for n preloaded
    entries, so a stale hotlist locks in), ``adaptive`` gives every entry 1, an int N gives every
    entry N. Every real selection adds 1; a miss loads the record at priority 1, evicting the
    lowest priority, least recently used record (then the lowest (layer, expert)). Preloaded
    entries count as used before the first selection in reverse rank order, so among equal
    priorities the worst-ranked seed goes first. A lazy-deletion heap keeps each access O(log n).
    """

    def __init__(
        self,
        capacity: int,
        hotlist: Sequence[tuple[int, int]],
        priority: Literal["legacy", "adaptive"] | int,
        layers: int,
        experts: int,
    ) -> None:
        """Preload ``hotlist`` (rank order) into an empty cache of ``capacity`` records."""
        if not _is_int(capacity) or capacity < 1:
            raise KnobError(f"capacity: must be a positive number of records, got {capacity!r}")
        for name, size in (("layers", layers), ("experts", experts)):
            if not _is_int(size) or size < 1:
                raise KnobError(f"{name}: must be a positive integer, got {size!r}")
        if priority not in ("legacy", "adaptive") and not (
            _is_int(priority) and 1 <= int(priority) <= MAX_PRIORITY
        ):
            raise KnobError(f"priority {priority!r}: {_PRIORITY_RULE}")
        self._capacity = capacity
        self._layers = layers
        self._experts = experts
        self._priority: dict[int, int] = {}
        self._used: dict[int, int] = {}
        self._heap: list[tuple[int, int, int]] = []
        self._clock = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._last_evicted: tuple[int, int] | None = None
        seeds: list[int] = []
        seen: set[int] = set()
        for rank, (layer, expert) in enumerate(hotlist):
            key = self._key(layer, expert, f"hotlist entry {rank}")
            if key not in seen:
                seen.add(key)
                seeds.append(key)
            if len(seeds) == capacity:
                break
        preloaded = len(seeds)
        for rank, key in enumerate(seeds):
            if priority == "legacy":
                prior = preloaded - rank
            elif priority == "adaptive":
                prior = 1
            else:
                prior = int(priority)
            self._set(key, prior, -(rank + 1))
        self._preloaded = preloaded

    def _key(self, layer: int, expert: int, what: str) -> int:
        if not (0 <= layer < self._layers and 0 <= expert < self._experts):
            raise TraceError(
                f"{what}: (layer {layer}, expert {expert}) is outside "
                f"{self._layers} layers x {self._experts} experts"
            )
        return layer * self._experts + expert

    def _set(self, key: int, priority: int, used: int) -> None:
        self._priority[key] = priority
        self._used[key] = used
        heapq.heappush(self._heap, (priority, used, key))

    def _evict(self) -> None:
        heap = self._heap
        while True:
            priority, used, key = heapq.heappop(heap)
            # Entries superseded by a later access are stale; skip them.
            if self._used.get(key) == used and self._priority[key] == priority:
                del self._priority[key]
                del self._used[key]
                self._evictions += 1
                self._last_evicted = divmod(key, self._experts)
                return

    def _compact(self) -> None:
        self._heap = [(self._priority[k], self._used[k], k) for k in self._priority]
        heapq.heapify(self._heap)

    def access(self, layer: int, expert: int) -> bool:
        """Select (layer, expert) once; True on a hit. A miss loads it, evicting if full."""
        key = self._key(layer, expert, "access")
        self._clock += 1
        self._last_evicted = None
        priority = self._priority.get(key)
        if priority is not None:
            self._hits += 1
            self._set(key, priority + 1, self._clock)
            hit = True
        else:
            self._misses += 1
            if len(self._priority) >= self._capacity:
                self._evict()
            self._set(key, 1, self._clock)
            hit = False
        if len(self._heap) > 4 * self._capacity + 64:
            self._compact()
        return hit

    def access_step(self, experts: npt.ArrayLike) -> tuple[int, int]:
        """Select a step's experts (``[layers, top_k]``, row = layer); returns (hits, misses)."""
        chosen = np.asarray(experts)
        if chosen.ndim != 2 or chosen.shape[0] != self._layers:
            raise TraceError(
                f"experts must have shape [{self._layers}, top_k], got {list(chosen.shape)}"
            )
        hits = 0
        for layer, row in enumerate(chosen.tolist()):
            for expert in row:
                hits += self.access(layer, expert)
        return hits, chosen.size - hits

    def resident(self) -> list[tuple[int, int]]:
        """Cached (layer, expert) records, sorted."""
        return [divmod(key, self._experts) for key in sorted(self._priority)]

    def priority_of(self, layer: int, expert: int) -> int | None:
        """Current priority of a cached record, None when it is not cached."""
        return self._priority.get(self._key(layer, expert, "priority_of"))

    @property
    def last_evicted(self) -> tuple[int, int] | None:
        """The (layer, expert) record the latest ``access`` evicted, None when it evicted none."""
        return self._last_evicted

    @property
    def capacity(self) -> int:
        """Records the cache holds."""
        return self._capacity

    @property
    def preloaded(self) -> int:
        """Records preloaded from the hotlist."""
        return self._preloaded

    @property
    def hits(self) -> int:
        """Selections served from the cache."""
        return self._hits

    @property
    def misses(self) -> int:
        """Selections that had to load their record."""
        return self._misses

    @property
    def loads(self) -> int:
        """Records loaded on demand (every miss loads; preloads are not counted)."""
        return self._misses

    @property
    def evictions(self) -> int:
        """Records evicted to make room."""
        return self._evictions
