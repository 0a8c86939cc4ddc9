"""The engine: one model and its tiers, run step by step with policy, counters, ring and trace.

Host steps are defined on :class:`Engine`. Route trace (JSONL, ``--route-trace``), everything
the policy saw, in order:

* ``{"kind": "header", "version": 2, "layers", "experts", "top_k", "hot_slots", "mode":
  "rowmap"|"cache", "knobs": {policy knobs + phase}, "hot": [[ids] per layer]}`` (``hot`` is
  empty in cache mode);
* per host step ``{"kind": "step", "step": n, "prefill": bool, "phase": p, "experts": ...}``:
  a decode step carries ``[[top_k ids] per layer]``, a prefill step one such list per prompt
  token (BOS first): ``[[[...] per layer] per token]``. The engine calls
  ``ResidencyPolicy.observe`` once per host step (a prefill step is not counted);
* after a step line that drained the swap queue, ``{"kind": "drain", "step", "swaps",
  "saturated"}`` (saturated: layers pinned at the budget), then one ``{"kind": "swap", "step",
  "layer", "promoted", "evicted"}`` per swap the policy applied, in the policy's order;
* ``{"kind": "knobs", "step": n, "knobs": {...}}`` when live knobs change; they apply from step
  ``n`` (the next step to run) on;
* ``{"kind": "reset", "step": n, "knobs": {...}, "hot": [...]}`` when the engine went back to its
  boot state (``POST /admin/reset`` or the control file), possibly on a live map. A run of
  a shared boot keeps the part after its reset (:mod:`harness.formats.route_trace`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from harness.errors import KnobError
from harness.formats.ring import ROUTE_TRACE_VERSION, RingGeometry, RingWriter
from harness.formats.safe_write import open_in_place
from harness.policy import kernels as policy_kernels
from harness.policy.residency import ExpertCache, PolicyKnobs, ResidencyPolicy, Swap
from harness.refbox.heat import BoxHeat, HeatSettings
from harness.refbox.lossy import LossyMode, runner_up
from harness.refbox.model import (
    BOS,
    F32,
    GENERATED_CONTEXT_WEIGHT,
    I64,
    DecodeState,
    Model,
    ModelConfig,
    pick_token,
)
from harness.refbox.recorder import ExpertRecorder
from harness.refbox.tiers import CacheTiers, RowmapTiers, SlowTier

LIVE_KNOBS = (
    "policy",
    "decay_half_life_steps",
    "promote_threshold",
    "hysteresis",
    "drain_every",
    "swaps_per_layer",
    "phase",
)


@dataclass(frozen=True)
class EngineOptions:
    """Everything about a runtime instance except the model geometry."""

    hot_slots: int = 48
    expert_bytes: int = 512 * 1024
    cold_dir: str | None = None
    rowmap: list[list[int]] | None = None  # hot experts per layer; None = first hot_slots
    knobs: PolicyKnobs | None = None  # None = adaptation frozen with default knobs
    cache_records: int = 0  # > 0 selects cache mode
    hotlist: list[tuple[int, int]] = field(default_factory=list)
    hotlist_priority: Literal["legacy", "adaptive"] | int = "adaptive"
    ring_path: str | None = None
    ring_capacity: int = 65536
    route_trace_path: str | None = None
    drift_pct_per_min: float = 0.0
    drift_origin_s: float = 0.0
    carry_over_pct: float = 0.0  # this boot's carried-over slowdown (options.carried_over_pct)
    heat: HeatSettings | None = None  # the box's heat (--heat-*), None = no heat state
    step_slowdown_pct: float = 0.0  # every decode step this much slower (--step-slowdown-pct)
    # A change that silently never takes effect (--fault): "empty-hot" keeps no expert resident
    # while the header, knobs and counters report the hot slots as set; "ignore-policy" reports
    # the policy knobs as given and runs the residency frozen. One that breaks the outputs:
    # "swap-weights" hands every SWAP_WEIGHTS_EVERY-th expert loaded from the slow tier its
    # neighbour's weights.
    # "scale-logits" multiplies every logit by SCALE_LOGITS_BY: the argmax, and so every greedy
    # output, stays; only the log-probabilities show it (a scale applied twice).
    fault: Literal["none", "empty-hot", "ignore-policy", "swap-weights", "scale-logits"] = "none"
    cold_bits: int = 0  # a lossy mode: experts loaded from the slow tier quantized (0 = exact)
    lossy: LossyMode = field(default_factory=LossyMode)  # modes of a known divergence
    phase: int = 0
    # SGLang's recorder dialect: None (off) or "stat"; masks: KT's GPU masks in each dump.
    expert_recorder: str | None = None
    expert_recorder_masks: bool = False


SWAP_WEIGHTS_EVERY = 5
SCALE_LOGITS_BY = 1.1

COUNTER_NAMES = (
    "tokens",
    "steps",
    "lookups",
    "cold_lookups",
    "hits",
    "misses",
    "expert_loads",
    "bytes_read",
    "swaps",
    "evictions",
    "prefill_tokens",
    "decode_tokens",
    "generated_tokens",
    "requests",
)


class Engine:
    """A model plus its tiers, residency policy, counters, ring and route trace.

    Host steps: a request's prefill (BOS + prompt) is one step and yields the first generated
    token; every later generated token costs one decode step. Step numbers count host steps
    over the life of the engine, from 0. All methods are thread-safe: a step holds ``lock``,
    so admin calls (knobs, dumps, counters) land between steps.
    """

    def __init__(self, cfg: ModelConfig, opts: EngineOptions) -> None:
        """Build the weights, write the slow tier, fill the hot tier, open ring and trace."""
        self.cfg = cfg
        self.opts = opts
        self.boot_opts = opts  # what a reset goes back to
        self.model = Model(cfg)
        self.lock = threading.Lock()
        self.slow = SlowTier(
            cfg,
            opts.expert_bytes,
            opts.cold_dir,
            bits=opts.cold_bits,
            swap_every=SWAP_WEIGHTS_EVERY if opts.fault == "swap-weights" else 0,
        )
        self.knobs = opts.knobs or PolicyKnobs(policy="frozen")
        self.phase = opts.phase
        self.step_no = 0
        self.closed = False
        self.requests = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.generated_tokens = 0
        self.swaps = 0
        self.route_counts = np.zeros((cfg.layers, cfg.experts), dtype=np.int64)
        self.policy: ResidencyPolicy | None = None
        self.cache: ExpertCache | None = None
        self.source: RowmapTiers | CacheTiers
        if opts.cache_records > 0:
            self.cache = ExpertCache(
                opts.cache_records, opts.hotlist, opts.hotlist_priority, cfg.layers, cfg.experts
            )
            self.source = CacheTiers(self.slow, self.cache)
            hot_slots = opts.cache_records
        else:
            hot = self._resident(opts.rowmap or [list(range(opts.hot_slots))] * cfg.layers)
            self.source = RowmapTiers(self.slow, hot)
            self.policy = ResidencyPolicy(self._applied(self.knobs), hot, cfg.experts)
            hot_slots = opts.hot_slots
            # Compile (or load) the policy's drain now, not inside the first timed request.
            policy_kernels.warm_up()
        self.ring: RingWriter | None = None
        if opts.ring_path:
            geometry = RingGeometry(cfg.layers, cfg.experts, cfg.top_k, hot_slots)
            self.ring = RingWriter(opts.ring_path, opts.ring_capacity, geometry)
        self._trace: TextIO | None = None
        if opts.route_trace_path:
            self._trace = open_in_place(opts.route_trace_path, "w")
            self._trace_line(
                {
                    "kind": "header",
                    "version": ROUTE_TRACE_VERSION,
                    "layers": cfg.layers,
                    "experts": cfg.experts,
                    "top_k": cfg.top_k,
                    "hot_slots": hot_slots,
                    "mode": "cache" if self.cache else "rowmap",
                    "knobs": self.knob_dict(),
                    "hot": self.source.hot_sets() if isinstance(self.source, RowmapTiers) else [],
                }
            )
        self._burn = np.ones((32, 32), dtype=np.float32)
        # The box's heat outlives a reset (it is the box's, not the boot's): reset() keeps it.
        self.heat = BoxHeat(opts.heat) if opts.heat is not None else None
        self.recorder: ExpertRecorder | None = None
        if opts.expert_recorder is not None:
            self.recorder = ExpertRecorder(
                cfg.layers, cfg.experts, masks=opts.expert_recorder_masks
            )

    # -- faults: changes that never take effect -----------------------------------------------

    def _resident(self, hot: list[list[int]]) -> list[list[int]]:
        """The hot sets the tiers really keep: none under the empty-hot fault."""
        return [[] for _ in hot] if self.opts.fault == "empty-hot" else hot

    def _applied(self, knobs: PolicyKnobs) -> PolicyKnobs:
        """The knobs the residency really runs: frozen under the ignore-policy fault."""
        if self.opts.fault == "ignore-policy":
            return dataclasses.replace(knobs, policy="frozen")
        return knobs

    # -- knobs and counters -------------------------------------------------------------------

    def knob_dict(self) -> dict[str, Any]:
        """The live policy knobs plus the phase tag, as JSON-ready values."""
        knobs = dataclasses.asdict(self.knobs)
        knobs["phase"] = self.phase
        return knobs

    def set_knobs(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply live knob changes (validated first, all or nothing); returns the new knobs."""
        unknown = sorted(set(changes) - set(LIVE_KNOBS))
        if unknown:
            raise KnobError(f"unknown knob(s) {unknown}; live knobs are {list(LIVE_KNOBS)}")
        phase = changes.get("phase", self.phase)
        if isinstance(phase, bool) or not isinstance(phase, int):
            raise KnobError(f"phase: must be an integer, got {phase!r}")
        fields = {k: v for k, v in changes.items() if k != "phase"}
        try:
            knobs = dataclasses.replace(self.knobs, **fields)
        except TypeError as exc:
            raise KnobError(str(exc)) from exc
        knobs.validate()
        with self.lock:
            self.knobs = knobs
            self.phase = phase
            if self.policy is not None:
                self.policy.set_knobs(self._applied(knobs))
            self._trace_line({"kind": "knobs", "step": self.step_no, "knobs": self.knob_dict()})
            return self.knob_dict()

    def reset(self, hot: list[list[int]] | None = None) -> None:
        """Back to the boot state: the hot tier refilled (from ``hot``, a live map, else the
        boot's), the policy's adaptive state and the boot's knobs restored, counters cleared.

        Step numbers, the ring's sequence and the route trace go on, so a reader of the ring
        takes each run's records as those after the previous run's last sequence. A live map
        keeps the boot's hot-slot count: the ring's geometry is fixed when it is created.
        """
        cfg, opts = self.cfg, self.boot_opts
        if hot is not None and self.cache is not None:
            raise KnobError("a map is for rowmap mode; this boot runs the hotlist cache")
        if hot is not None:
            if len(hot) != cfg.layers or {len(layer) for layer in hot} != {opts.hot_slots}:
                raise KnobError(
                    f"a live map must keep the boot's geometry: {cfg.layers} layers of "
                    f"{opts.hot_slots} hot experts"
                )
            opts = dataclasses.replace(opts, rowmap=hot)
        with self.lock:
            self.opts = opts
            self.knobs = opts.knobs or PolicyKnobs(policy="frozen")
            self.phase = opts.phase  # the next run's first records are tagged as a boot's
            self.requests = self.prefill_tokens = self.decode_tokens = 0
            self.generated_tokens = self.swaps = 0
            self.route_counts[:] = 0
            if self.cache is not None:
                self.cache = ExpertCache(
                    opts.cache_records, opts.hotlist, opts.hotlist_priority, cfg.layers, cfg.experts
                )
                self.source = CacheTiers(self.slow, self.cache)
            else:
                boot_hot = self._resident(opts.rowmap or [list(range(opts.hot_slots))] * cfg.layers)
                self.source = RowmapTiers(self.slow, boot_hot)
                self.policy = ResidencyPolicy(self._applied(self.knobs), boot_hot, cfg.experts)
            hot_now = self.source.hot_sets() if isinstance(self.source, RowmapTiers) else []
            self._trace_line(
                {"kind": "reset", "step": self.step_no, "knobs": self.knob_dict(), "hot": hot_now}
            )
            if self._trace is not None:
                self._trace.flush()  # rare, and a reader may look for it at once

    def counters(self) -> dict[str, int]:
        """Cumulative counters (see COUNTER_NAMES); hits/misses are hot/cold lookups."""
        with self.lock:
            tiers = self.source.counters
            cache = self.cache
            return {
                "tokens": self.prefill_tokens + self.decode_tokens,
                "steps": self.step_no,
                "lookups": tiers.lookups,
                "cold_lookups": tiers.cold_lookups,
                "hits": cache.hits if cache else tiers.lookups - tiers.cold_lookups,
                "misses": cache.misses if cache else tiers.cold_lookups,
                "expert_loads": tiers.expert_loads,
                "bytes_read": tiers.bytes_read,
                "swaps": self.swaps,
                "evictions": cache.evictions if cache else self.swaps,
                "prefill_tokens": self.prefill_tokens,
                "decode_tokens": self.decode_tokens,
                "generated_tokens": self.generated_tokens,
                "requests": self.requests,
            }

    def route_count_dump(self, *, cumulative: bool = False) -> npt.NDArray[np.float64]:
        """Counts per layer and expert for map fitting: the policy's decayed counts (rowmap
        mode, by default), else the raw cumulative decode route counts."""
        with self.lock:
            if self.policy is not None and not cumulative:
                return np.asarray(self.policy.counts(), dtype=np.float64)
            return self.route_counts.astype(np.float64)

    def hot_sets(self) -> list[list[int]]:
        """Current hot experts per layer (rowmap mode; empty in cache mode)."""
        with self.lock:
            if isinstance(self.source, RowmapTiers):
                return self.source.hot_sets()
            return []

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self,
        prompt: bytes,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        routes: list[I64] | None = None,
        logits_out: list[F32] | None = None,
    ) -> Iterator[int]:
        """Yield exactly ``max_tokens`` generated bytes for ``prompt`` (no stop condition).

        ``routes``, when given, receives each forwarded token's ``[layers, top_k]`` experts: the
        prompt's (BOS first), then every generated token but the last, which is never forwarded.
        ``logits_out``, when given, receives the logits each yielded byte was picked from.
        """
        state = DecodeState.fresh(self.cfg)
        rng = np.random.default_rng(seed) if temperature > 0.0 else None
        with self.lock:
            self.requests += 1
        if max_tokens <= 0:
            self._request_done()
            return
        logits = self._step([BOS, *prompt], state, prefill=True, routes=routes)
        lossy = self.opts.lossy
        for i in range(max_tokens):
            if self.opts.fault == "scale-logits":
                logits = logits * np.float32(SCALE_LOGITS_BY)
            logits = lossy.logits(logits)
            token = pick_token(logits, temperature, rng)
            if lossy.flips(self.cfg.seed, prompt, i):
                token = runner_up(logits)
            if logits_out is not None:
                logits_out.append(logits)
            with self.lock:
                self.generated_tokens += 1
            yield token
            if i + 1 < max_tokens:
                if self.closed:  # shutting down: stop generating rather than finish the request
                    return
                logits = self._step([token], state, prefill=False, routes=routes)
        self._request_done()

    def _request_done(self) -> None:
        """A request completed (every token generated): the box's heat moves one request."""
        if self.heat is not None:
            self.heat.request_done()

    def _step(
        self,
        tokens: list[int],
        state: DecodeState,
        *,
        prefill: bool,
        routes: list[I64] | None = None,
    ) -> F32:
        """One host step over ``tokens``: forward, policy, swaps, drift, ring and trace."""
        with self.lock:
            tiers = self.source.counters
            lookups0, cold0, bytes0 = tiers.lookups, tiers.cold_lookups, tiers.bytes_read
            t0 = time.perf_counter_ns()
            step = self.step_no
            step_routes: list[I64] = []
            applied: list[Swap] = []
            logits: F32 | None = None
            weight = 1.0 if prefill else GENERATED_CONTEXT_WEIGHT
            recorder = self.recorder if self.recorder and self.recorder.recording else None
            # The resident set the pass's lookups see: swaps land after the forward pass.
            hot_at_start = (
                self.source.hot_sets()
                if recorder and recorder.masks and isinstance(self.source, RowmapTiers)
                else None
            )
            last = len(tokens) - 1
            for i, token in enumerate(tokens):
                if i < last:  # only the last token's logits pick the next one
                    experts = self.model.route(state, token, self.source, weight)
                else:
                    out = self.model.step(state, token, self.source, weight)
                    experts, logits = out.experts, out.logits
                step_routes.append(experts)
                if not prefill:
                    for layer in range(self.cfg.layers):
                        self.route_counts[layer, experts[layer]] += 1
            if recorder is not None:
                recorder.add(np.stack(step_routes), hot_at_start)
            drained = False
            if self.policy is not None:
                # One policy call per host step: a prefill step is not counted, a decode step
                # (one token here) is, and may drain.
                drained = not prefill and self.policy.drain_due()
                applied = self.policy.observe(step, np.stack(step_routes), prefill=prefill)
                for swap in applied:
                    assert isinstance(self.source, RowmapTiers)
                    self.source.swap(swap.layer, swap.promoted, swap.evicted)
            if routes is not None:
                routes.extend(r.copy() for r in step_routes)  # the model may reuse its buffers
            self._drift(time.perf_counter_ns() - t0, prefill=prefill)
            t1 = time.perf_counter_ns()
            self.swaps += len(applied)
            if prefill:
                self.prefill_tokens += len(tokens)
            else:
                self.decode_tokens += len(tokens)
            self.step_no += 1
            if self.ring is not None:
                self.ring.append(
                    (
                        t1,
                        t1 - t0,
                        len(tokens),
                        tiers.lookups - lookups0,
                        tiers.cold_lookups - cold0,
                        len(applied),
                        tiers.bytes_read - bytes0,
                        self.phase,
                    )
                )
            if self._trace is not None:
                experts_json: Any = (
                    [r.tolist() for r in step_routes] if prefill else step_routes[0].tolist()
                )
                self._trace_line(
                    {
                        "kind": "step",
                        "step": step,
                        "prefill": prefill,
                        "phase": self.phase,
                        "experts": experts_json,
                    }
                )
                if drained:
                    assert self.policy is not None
                    self._trace_line(
                        {
                            "kind": "drain",
                            "step": step,
                            "swaps": len(applied),
                            "saturated": self.policy.saturated_layers(),
                        }
                    )
                for swap in applied:
                    self._trace_line(
                        {
                            "kind": "swap",
                            "step": swap.step,
                            "layer": swap.layer,
                            "promoted": swap.promoted,
                            "evicted": swap.evicted,
                        }
                    )
            assert logits is not None
            return logits

    def _drift(self, work_ns: int, *, prefill: bool) -> None:
        """Injected drift, carry-over, heat and a set slowdown: extra real work proportional to
        the step.

        Drift grows with the minutes since its origin; carry-over is a fixed share for the
        whole boot, set when the boot before it on the box was another cell's; heat slows decode
        steps by its slowdown times the box's heat now, which moves as requests complete.
        """
        pct = self.opts.drift_pct_per_min
        carry = self.opts.carry_over_pct
        heat = self.heat.step_slowdown_pct() if self.heat is not None and not prefill else 0.0
        if not prefill:
            heat += self.opts.step_slowdown_pct
        if pct <= 0.0 and carry <= 0.0 and heat <= 0.0:
            return
        minutes = max(0.0, time.time() - self.opts.drift_origin_s) / 60.0
        extra_s = work_ns * 1e-9 * (pct * minutes + carry + heat) / 100.0
        deadline = time.perf_counter() + extra_s
        burn = self._burn
        while time.perf_counter() < deadline:
            burn = np.tanh(burn @ self._burn * np.float32(0.01))

    def _trace_line(self, record: dict[str, Any]) -> None:
        if self._trace is not None:
            self._trace.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        """Push the trace and ring to disk (between requests and at shutdown)."""
        with self.lock:
            if self._trace is not None:
                self._trace.flush()
            if self.ring is not None:
                self.ring.flush()

    def close(self) -> None:
        """Flush and close the ring and the trace; closing twice is harmless."""
        with self.lock:
            self.closed = True
            if self._trace is not None:
                self._trace.close()
                self._trace = None
            if self.ring is not None:
                self.ring.close()
                self.ring = None
