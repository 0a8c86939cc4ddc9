"""What the runtime says it applied, checked against the knobs a run set; and counters read at exit.

A knob that a build ignores measures the wrong arm silently: one ds4 fork branch dropped
``DS4_METAL_STREAMING_EXPERT_HOTLIST_PRIORITY`` and ran "legacy" and "adaptive" as one code path.
ds4 prints the policy it applied (``… hotlist seed source=%s … priority=%s:%u``), so a profile's
``telemetry.applied`` names such lines and a run whose line disagrees with its knob fails.

Some counters exist only at exit (ds4 prints its streaming cache line at process cleanup, never
while it serves): a profile marks them ``at: exit``; they start at 0 with the boot and are read
from the log after the graceful stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.formats.textfile import compile_pattern
from harness.profiles.telemetry import AppliedCheck, LogCounter
from harness.runtimes.log_counters import log_snapshot


def applied_problems(
    checks: Sequence[AppliedCheck], knobs: Mapping[str, str], text: str, *, where: str = "log"
) -> list[str]:
    """Why the run's log disagrees with its knobs (empty: it agrees, or nothing is checked)."""
    problems: list[str] = []
    lines = text.splitlines()
    for check in checks:
        value = knobs.get(check.knob)
        expected = check.expected(value)
        if expected is None:
            continue
        shown = f"{check.knob}={value}" if value is not None else f"{check.knob} unset"
        pattern = compile_pattern(check.pattern)
        seen: list[tuple[int, str]] = []
        for number, line in enumerate(lines, start=1):
            match = pattern.search(line)
            if match is not None and match.group("applied") is not None:
                seen.append((number, match.group("applied")))
        if not seen:
            if check.required:
                problems.append(
                    f"{shown}: the runtime printed no line saying what it applied "
                    f"(pattern {check.pattern!r} in {where}); this build may not have the knob"
                )
            continue
        wrong = [(n, applied) for n, applied in seen if applied != expected]
        if wrong:
            number, applied = wrong[0]
            problems.append(
                f"{shown} expects {expected!r}, but the runtime applied {applied!r} "
                f"({where}:{number}): this build ignores or overrides the knob"
            )
    return problems


# Enough for a fit plan over several devices; a log that matches more is cut, and says so.
_IDENTITY_LINES_MAX = 64


def identity_lines(patterns: Sequence[str], text: str) -> list[str]:
    """The log lines matching any of ``patterns``, in order, stripped; at most 64, then a line
    saying how many more matched."""
    compiled = [compile_pattern(p) for p in patterns]
    kept = [line.strip() for line in text.splitlines() if any(c.search(line) for c in compiled)]
    if len(kept) > _IDENTITY_LINES_MAX:
        extra = len(kept) - _IDENTITY_LINES_MAX
        kept = [*kept[:_IDENTITY_LINES_MAX], f"... {extra} more matching lines"]
    return kept


def exit_specs(specs: Sequence[LogCounter]) -> list[LogCounter]:
    """The log counters printed only when the process ends."""
    return [spec for spec in specs if spec.at == "exit"]


def live_specs(specs: Sequence[LogCounter]) -> list[LogCounter]:
    """The log counters printed while the runtime runs."""
    return [spec for spec in specs if spec.at == "live"]


def add_exit_counters(
    payload: dict[str, Any], specs: Sequence[LogCounter], text: str, *, where: str
) -> dict[str, Any]:
    """``counters.json`` with the exit counters read from the log after the stop: before 0 (the
    process counted from its boot), after and delta the value printed; missing when no line."""
    exits = exit_specs(specs)
    if not exits:
        return payload
    snapshot = log_snapshot(text, exits, where=where)
    before = dict(payload.get("before") or {})
    after = dict(payload.get("after") or {})
    delta = dict(payload.get("delta") or {})
    missing = dict(payload.get("missing") or {})
    for spec in exits:
        for name in spec.counters():
            if name in snapshot:
                before[name] = 0.0
                after[name] = snapshot[name]
                delta[name] = snapshot[name]
                missing.pop(name, None)
            else:
                missing[name] = (
                    "no log line gave it after the stop (printed only when the process exits "
                    "gracefully, and only by builds that print it)"
                )
    return {**payload, "before": before, "after": after, "delta": delta, "missing": missing}
