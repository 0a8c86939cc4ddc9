"""``harness report DIR``: a campaign directory analysed, gated and rendered; nothing is rerun."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK

__all__ = ["register"]


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``harness report DIR`` to the CLI's subparsers."""
    parser = verbs.add_parser(
        "report", help="render the HTML report of a campaign directory (analysis and gates)"
    )
    parser.add_argument("dir", metavar="DIR", help="the campaign directory `harness run` printed")
    parser.add_argument("--no-figures", action="store_true", help="tables only (faster)")
    parser.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from harness.analyze.campaign import analyze_campaign
    from harness.gate.evaluate import evaluate_gates
    from harness.report import copy_path, render_report
    from harness.report.terminal import note_unsealed

    root = Path(args.dir)
    analysis = analyze_campaign(root)
    note_unsealed(analysis)
    verdict = evaluate_gates(analysis)
    path = render_report(root, analysis, verdict, figures=not args.no_figures)
    out.write(f"verdict: {verdict.word}\nreport: {path}\n")
    copy = copy_path(root, analysis.card.campaign)
    if copy is not None:
        out.write(f"copy: {copy}\n")
    return EXIT_OK
