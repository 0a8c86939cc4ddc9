"""``harness gate DIR``: the card's gates over a finished campaign, and what every run ends with.

:func:`analyze_and_gate` is the one path from a campaign directory to its verdict, shared by
``harness gate`` and ``harness run``: the analysis written, the gates evaluated and written,
the verdict recorded in the results store (and the campaign's trends from it written to
``analysis/history.json``), the table printed and the report rendered.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from harness.gate.evaluate import Verdict

__all__ = ["analyze_and_gate", "register"]


def analyze_and_gate(root: Path, out: TextIO, *, quiet: bool) -> Verdict:
    """Analyse, gate, record and render ``root``; print the verdict table unless ``quiet``."""
    from harness.analyze.campaign import analyze_campaign, write_analysis
    from harness.gate.evaluate import evaluate_gates, write_verdict
    from harness.history.store import append_history
    from harness.history.trends import record_campaign_trends
    from harness.report import render_report
    from harness.report.terminal import label_tally, note_unsealed, print_verdict

    analysis = analyze_campaign(root)
    note_unsealed(analysis)
    write_analysis(analysis)
    verdict = evaluate_gates(analysis)
    write_verdict(verdict, root)
    append_history(analysis, bool(verdict.passed))
    record_campaign_trends(analysis)
    if not quiet:
        print_verdict(verdict, out)
        tally = label_tally([c.comparison.label for c in analysis.comparisons], verdict.passed)
        if tally:
            out.write(tally + "\n")
    out.write(f"report: {render_report(root, analysis, verdict)}\n")
    return verdict


def _cmd_gate(args: argparse.Namespace, out: TextIO) -> int:
    from harness.formats.lock import locked_campaign

    with locked_campaign(Path(args.dir)):
        return analyze_and_gate(Path(args.dir), out, quiet=args.quiet).exit_code()


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gate``."""
    gate = verbs.add_parser(
        "gate", help="evaluate the card's gates (exit 0 pass, 1 fail, 3 runs incomplete)"
    )
    gate.add_argument("dir", metavar="DIR")
    gate.add_argument("--quiet", action="store_true", help="no verdict table")
    gate.set_defaults(handler=_cmd_gate)
