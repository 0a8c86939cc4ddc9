"""A bisect's own report: the conclusion, then every step with its verdict, cycles and box time.

``report.md`` and ``report.html`` in the bisect's folder; each step links its campaign's own
``report.html``. The conclusion's words are :func:`conclusion`'s, the terminal's too.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from harness.bisect.run import BisectState, StepRecord
from harness.bisect.search import Outcome
from harness.formats.safe_write import write_text_atomic
from harness.stats.build_step import StepCall
from harness.stats.distributions import t_isf


def _pct(log_value: float) -> str:
    return f"{100 * math.expm1(log_value):+.2f}%"


def _interval(step: StepRecord) -> str:
    """D̄'s 95% t-interval on the step's m − 1 df (a normal one is too narrow at a few cycles)."""
    if step.se is None or step.note or step.cycles < 2:
        return ""
    half = t_isf(0.025, step.cycles - 1) * step.se
    return f"[{_pct(step.effect - half)}, {_pct(step.effect + half)}]"


def conclusion(state: BisectState) -> str:
    """One paragraph: the culprit, no culprit, a range, or what stayed undecided."""
    search = state.search()
    outcome = search.outcome()
    builds = state.builds
    if outcome is Outcome.RUNNING:
        return f"not finished: {len(state.steps)} steps so far; resume it to go on"
    first = state.steps[0]
    if outcome is Outcome.NO_CULPRIT:
        return (
            f"no culprit: the bad build {builds[-1].name} did not reproduce the regression "
            f"({state.metric} {_pct(first.effect)} {_interval(first)}, {first.label})"
        )
    if outcome is Outcome.UNDECIDED:
        return (
            f"undecided: the bad build {builds[-1].name} against the good one stayed "
            f"{first.label or 'undecided'} after {first.cycles} cycles ({state.metric} "
            f"{_pct(first.effect)} {_interval(first)}); rerun with a larger "
            "--reproduce-max-cycles, or with less noise on the box"
        )
    low, high = search.culprit_range()
    slower = _pct(search.regression())
    if outcome is Outcome.CULPRIT:
        return (
            f"culprit: {builds[low].name} ({builds[low].source}), the first build as slow as "
            f"the bad one ({state.metric} {slower} against the good build); "
            f"{builds[low - 1].name} before it is as fast as the good one"
        )
    skipped = [builds[i].name for i in search.skipped() if low <= i <= high]
    return (
        f"culprit in a range: one of {', '.join(b.name for b in builds[low : high + 1])} "
        f"({state.metric} {slower}); undecided at {state.design.max_cycles} cycles: "
        f"{', '.join(skipped)}: a step grown further (--max-cycles) could decide it"
    )


def _rows(state: BisectState) -> list[list[str]]:
    rows = []
    for number, step in enumerate(state.steps, 1):
        what = "reproduction" if number == 1 else "search"
        call = step.call if not step.note else f"{StepCall.UNDECIDED} ({step.note})"
        rows.append(
            [
                str(number),
                state.builds[step.build].name,
                what,
                call,
                _pct(step.effect) if not step.note else "",
                _interval(step),
                step.label,
                str(step.cycles),
                f"{step.box_s:.0f} s",
                step.campaign,
            ]
        )
    return rows


HEADER = ["step", "build", "kind", "call", "effect", "95% interval", "label", "cycles", "box time",
          "campaign"]  # fmt: skip


def write_report(folder: Path, state: BisectState) -> Path:
    """Write ``report.md`` and ``report.html``; the HTML's path."""
    rows = _rows(state)
    total = sum(s.box_s for s in state.steps)
    said = conclusion(state)
    builds = f"{len(state.builds)} builds, {state.builds[0].name} (good) … {state.builds[-1].name}"
    lines = [
        "# Bisect",
        "",
        said,
        "",
        f"{builds}; metric {state.metric}; {len(rows)} steps, box time {total:.0f} s.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    write_text_atomic(folder / "report.md", "\n".join(lines))
    cells = []
    for row in rows:
        link = html.escape(row[-1])
        tds = "".join(f"<td>{html.escape(value)}</td>" for value in row[:-1])
        cells.append(f'<tr>{tds}<td><a href="{link}/report.html">{link}</a></td></tr>')
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Bisect</title></head><body>"
        f"<h1>Bisect</h1><p id='conclusion'>{html.escape(said)}</p>"
        f"<p>{html.escape(builds)}; metric {html.escape(state.metric)}; {len(rows)} steps, "
        f"box time {total:.0f} s.</p><table border='1'><tr>"
        + "".join(f"<th>{h}</th>" for h in HEADER)
        + "</tr>"
        + "".join(cells)
        + "</table></body></html>\n"
    )
    path = folder / "report.html"
    write_text_atomic(path, page)
    return path


__all__ = ["conclusion", "write_report"]
