"""Lockstep: a reference-runtime route trace replayed and checked, decision by decision.

The trace is replayed with its recorded knobs, live knob changes and hot sets (optionally with
``--override`` knobs), and every decision is compared with the swaps the runtime recorded; this
is ``harness simulate --lockstep`` and the input of the ``lockstep`` gate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import TraceError
from harness.policy.residency import PolicyKnobs
from harness.sim.replay import replay_fast, replay_reference
from harness.sim.traces import KnobChange, Trace

__all__ = ["DECISION_DEFINITION", "Lockstep", "lockstep", "lockstep_text", "parse_overrides"]

DECISION_DEFINITION = (
    "a decision = one layer at one drain point (the decode step completing drain_every decode "
    "steps since the last drain while the policy is adaptive, recorded or replayed): the "
    'ordered list of swaps applied there, "no swap" included'
)


@dataclass
class Lockstep:
    """Recorded vs replayed decisions of one reference-runtime route trace."""

    trace: str
    decisions: int
    divergent: int
    recorded_swaps: int
    replayed_swaps: int
    first: dict[str, Any] | None
    overrides: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The ``lockstep.json`` payload (the ``lockstep`` gate reads decisions/divergent)."""
        return {
            "trace": self.trace,
            "decisions": self.decisions,
            "divergent": self.divergent,
            "first": self.first,
            "recorded_swaps": self.recorded_swaps,
            "replayed_swaps": self.replayed_swaps,
            "overrides": self.overrides,
            "definition": DECISION_DEFINITION,
        }


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``KNOB=VALUE`` strings into typed PolicyKnobs fields (validated)."""
    out: dict[str, Any] = {}
    types = {f.name: f.type for f in dataclasses.fields(PolicyKnobs)}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or name not in types:
            raise TraceError(
                f"--override {pair!r}: expected KNOB=VALUE with KNOB one of {sorted(types)}"
            )
        try:
            if name == "policy":
                out[name] = text
            elif name in ("drain_every", "swaps_per_layer"):
                out[name] = int(text)
            else:
                out[name] = float(text)
        except ValueError:
            raise TraceError(f"--override {pair!r}: {text!r} is not a number") from None
    dataclasses.replace(PolicyKnobs(), **out).validate()
    return out


def _describe(swaps: list[list[int]], drained: bool) -> str:
    if not drained:
        return "no drain at this step"
    if not swaps:
        return "drain, no swap"
    return ", ".join(f"promote {p} evict {e}" for p, e in swaps)


def lockstep(
    trace: Trace, overrides: dict[str, Any] | None = None, *, fast: bool = True
) -> Lockstep:
    """Replay a reference-runtime trace with its recorded knobs and hot sets and compare every
    decision (see ``DECISION_DEFINITION``) with the swaps the runtime recorded."""
    replace = dataclasses.replace
    version = (trace.header or {}).get("version")
    if trace.format == "refbox" and version == 1:
        raise TraceError(
            f"{trace.path}: a version 1 route trace, recorded when drains fell on "
            "step % drain_every; this policy drains every drain_every decode steps, so the "
            "recorded decisions cannot be checked. Record it again (simulate and fit-map still "
            "read its routing)"
        )
    if trace.swaps is None or trace.knobs is None:
        raise TraceError(
            f"{trace.path}: a {trace.format} trace records no decisions; lockstep needs a "
            "reference-runtime --route-trace"
        )
    if trace.mode != "rowmap" or trace.hot is None:
        raise TraceError(
            f"{trace.path}: a cache-mode trace has no residency decisions to check; lockstep "
            "needs a rowmap-mode route trace (use `harness simulate` for cache mode)"
        )
    overrides = dict(overrides or {})
    start = replace(trace.knobs, **overrides)
    live = [replace(c, knobs=replace(c.knobs, **overrides)) for c in trace.knob_changes]
    run = replay_fast if fast else replay_reference
    result = run(trace, start, trace.hot, changes=live)
    recorded: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for swap in trace.swaps:
        recorded.setdefault((swap.step, swap.layer), []).append((swap.promoted, swap.evicted))
    replayed = result.decisions()
    recorded_drains = set(trace.drains or [])
    replayed_drains = set(result.drain_steps.tolist())
    keys = {
        (step, layer) for step in recorded_drains | replayed_drains for layer in range(trace.layers)
    }
    keys |= set(recorded) | set(replayed)
    # A drain one side made and the other did not diverges even when neither swapped.
    divergent = sorted(
        k
        for k in keys
        if recorded.get(k, []) != replayed.get(k, [])
        or ((k[0] in recorded_drains) != (k[0] in replayed_drains))
    )
    first: dict[str, Any] | None = None
    if divergent:
        step, layer = divergent[0]
        first = {
            "step": step,
            "layer": layer,
            "where": trace.where(step),
            "recorded": [list(s) for s in recorded.get((step, layer), [])],
            "replayed": [list(s) for s in replayed.get((step, layer), [])],
            "recorded_drain": step in recorded_drains,
            "replayed_drain": step in replayed_drains,
            "recorded_knobs": _knobs_at(trace.knobs, trace.knob_changes, step),
            "replayed_knobs": _knobs_at(start, live, step),
        }
    return Lockstep(
        trace=trace.path,
        decisions=len(keys),
        divergent=len(divergent),
        recorded_swaps=len(trace.swaps),
        replayed_swaps=len(result.swaps),
        first=first,
        overrides=overrides,
    )


def _knobs_at(start: PolicyKnobs, live: Sequence[KnobChange], step: int) -> dict[str, Any]:
    knobs = start
    for change in live:
        if change.step <= step:
            knobs = change.knobs
    return dataclasses.asdict(knobs)


def lockstep_text(result: Lockstep) -> str:
    """What ``harness simulate --lockstep`` prints."""
    lines = [
        f"lockstep {result.trace}: {result.decisions:,} decisions, {result.divergent:,} divergent",
        f"  ({DECISION_DEFINITION})",
        f"  swaps recorded {result.recorded_swaps:,}, replayed {result.replayed_swaps:,}",
    ]
    if result.overrides:
        changed = ", ".join(f"{k}={v}" for k, v in result.overrides.items())
        lines.append(f"  replayed with overrides: {changed}")
    first = result.first
    if first is not None:
        lines += [
            f"first divergence: step {first['step']} ({first['where']}), layer {first['layer']}",
            f"  recorded: {_describe(first['recorded'], first['recorded_drain'])}",
            f"  replayed: {_describe(first['replayed'], first['replayed_drain'])}",
            f"  recorded knobs at that step: {first['recorded_knobs']}",
            f"  replayed knobs at that step: {first['replayed_knobs']}",
        ]
    return "\n".join(lines) + "\n"
