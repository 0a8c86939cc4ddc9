"""Is a shift phase long enough to measure T90 in? Said at ``validate`` and ``plan``.

T90 needs, after the shift, the transient and then ``converged_span_s`` whose median is the
converged value, and the recovery must hold ``hold_s`` before the phase ends; a phase shorter
than ``converged_span_s + hold_s`` cannot separate them, and its T90 reads "never" or includes
the transient (docs/design.md#runtime-side). The analysis notes that per run from the measured
phase; this module says it before a campaign runs, from the phase's ``duration_s`` or, for a
phase of ``requests``, the runtime profile's estimate of a request's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.card.checks import display_path
from harness.card.load import LoadedCard
from harness.card.schema import AnalysisSpec, Phase


def t90_min_phase_s(analysis: AnalysisSpec | None = None, **override: float) -> float:
    """The shortest shift phase T90 can be measured in: converged_span_s + hold_s.

    The one definition used by this check and by the analysis's per-run note.
    """
    spec = analysis or AnalysisSpec()
    span = override.get("converged_span_s", spec.converged_span_s)
    hold = override.get("hold_s", spec.hold_s)
    return float(span + hold)


@dataclass(frozen=True)
class PhaseEstimate:
    """A phase's length: exact from ``duration_s``, else estimated from its request count."""

    seconds: float
    basis: str  # how it was found, for a reviewer to weigh it
    per_request_s: float | None  # the estimate's time per request (None for a timed phase)


def request_s(loaded: LoadedCard) -> float:
    """Estimated seconds per request: first token (prefill) plus decode at the profile's speed."""
    runtime = loaded.runtime
    return runtime.expected_ttft_s + loaded.card.workload.max_tokens / runtime.expected_tok_s


def estimate_phase(loaded: LoadedCard, phase: Phase) -> PhaseEstimate:
    """How long ``phase`` lasts: its duration_s, or requests × :func:`request_s`."""
    if phase.duration_s is not None:
        return PhaseEstimate(phase.duration_s, "its duration_s", None)
    runtime = loaded.runtime
    count = phase.requests or sum(
        1 for p in loaded.split("heldout") if p.domain in set(phase.domains)
    )
    each = request_s(loaded)
    basis = (
        f"{count} requests × ({runtime.expected_ttft_s:g} s first token + "
        f"{loaded.card.workload.max_tokens} tokens at {runtime.expected_tok_s:g} tok/s), "
        f"the expected_ttft_s and expected_tok_s of runtime profile {runtime.name}"
    )
    return PhaseEstimate(count * each, basis, each)


def shift_phase_warnings(loaded: LoadedCard, *, scale: float = 1.0) -> list[str]:
    """A warning for each shift phase too short for T90 at the card's analysis settings.

    ``loaded`` is the card as it will run (already scaled); ``scale`` is only named in the text.
    """
    analysis = loaded.card.analysis
    scaled = f" at --scale {scale:g}" if scale != 1 else ""
    if analysis.window_steps is not None:
        return _step_clock_warnings(loaded, scaled, scale)
    minimum = t90_min_phase_s(analysis)
    out: list[str] = []
    for phase in loaded.card.workload.phases or []:
        if not phase.shift:
            continue
        length = estimate_phase(loaded, phase)
        if length.seconds >= minimum:
            continue
        if phase.until_recovered and length.per_request_s:
            cap_s = length.seconds + phase.until_recovered * length.per_request_s
            if cap_s >= minimum:
                continue  # the extension reaches it: the phase runs until recovery is measured
            out.append(
                f"{display_path(loaded.path)}: workload.phases.{phase.name}: even with all "
                f"{phase.until_recovered} until_recovered requests the shift phase lasts about "
                f"{cap_s:.1f} s{scaled} ({length.basis}), under the {minimum:g} s T90 needs; "
                f"raise until_recovered to at least "
                f"{math.ceil((minimum - length.seconds) / length.per_request_s)}"
            )
            continue
        if length.per_request_s:
            need = math.ceil(minimum / length.per_request_s)
            if scale != 1:
                need = math.ceil(need / scale)
            fix = f"give it at least {need} requests{' (before scaling)' if scale != 1 else ''}"
        else:
            fix = f"give it duration_s of at least {minimum / scale:g}"
        out.append(
            f"{display_path(loaded.path)}: workload.phases.{phase.name}: shift phase lasts about "
            f"{length.seconds:.1f} s{scaled} ({length.basis}), under the {minimum:g} s T90 needs "
            f"at analysis.converged_span_s={analysis.converged_span_s:g} + "
            f'hold_s={analysis.hold_s:g}: its T90 would read "never" or include the transient; '
            f"{fix}, or lower converged_span_s/hold_s"
        )
    return out


def _step_clock_warnings(loaded: LoadedCard, scaled: str, scale: float) -> list[str]:
    """:func:`shift_phase_warnings` on the step clock, where a phase's length is exact: a
    request is max_tokens host steps (a prefill and max_tokens − 1 decodes), shared among the
    requests in flight. A timed phase's steps depend on the box's speed: not checked here."""
    analysis, workload = loaded.card.analysis, loaded.card.workload
    window = analysis.window_steps or 1
    span = analysis.converged_span_steps or 4 * window
    hold = analysis.hold_steps if analysis.hold_steps is not None else 2 * window
    minimum = span + hold
    per_request = workload.max_tokens / max(1, workload.concurrency)
    out: list[str] = []
    for phase in workload.phases or []:
        if not phase.shift or phase.duration_s is not None:
            continue
        count = phase.requests or sum(
            1 for p in loaded.split("heldout") if p.domain in set(phase.domains)
        )
        most = (count + (phase.until_recovered or 0)) * per_request
        if most >= minimum:
            continue
        out.append(
            f"{display_path(loaded.path)}: workload.phases.{phase.name}: the shift phase serves "
            f"at most {most:,.0f} host steps{scaled} ({count} requests"
            f"{f' + {phase.until_recovered} until_recovered' if phase.until_recovered else ''} × "
            f"{workload.max_tokens} tokens ÷ concurrency {workload.concurrency}), under the "
            f"{minimum:,} T90 needs at analysis.converged_span_steps={span} + hold_steps={hold}: "
            f'its T90 would read "never" or include the transient; give it at least '
            f"{math.ceil(minimum / per_request / scale)} requests"
            f"{' (before scaling)' if scale != 1 else ''}, or lower "
            "converged_span_steps/hold_steps"
        )
    return out


def scored_requests(loaded: LoadedCard) -> float:
    """Requests a run scores: its phases' counts (a timed phase at the profile's expected
    request time), or one pass over the held-out prompts per ``passes``."""
    workload = loaded.card.workload
    if not workload.phases:
        return float(len(loaded.split("heldout")) * workload.passes)
    total = 0.0
    for phase in workload.phases:
        estimate = estimate_phase(loaded, phase)
        total += estimate.seconds / (estimate.per_request_s or request_s(loaded))
    return total


def washout_requests(loaded: LoadedCard) -> int:
    """Requests of a block's own cell sent, and not scored, before it is measured
    (``design.washout`` × the requests a run scores, at least one; 0 when the card sends none,
    and on a card of one cell, a soak say, where no other arm's block runs before a block)."""
    share = loaded.card.design.washout
    if share <= 0 or len(loaded.card.cells) < 2:
        return 0
    return max(1, math.ceil(share * scored_requests(loaded)))


__all__ = [
    "PhaseEstimate",
    "estimate_phase",
    "request_s",
    "scored_requests",
    "shift_phase_warnings",
    "t90_min_phase_s",
    "washout_requests",
]
