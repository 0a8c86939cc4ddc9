"""``harness report DIR``: a campaign directory analysed, gated and rendered (:mod:`harness.spine`);
nothing is rerun, and the verdict and the results store are left as ``harness gate`` wrote them."""

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
    parser.add_argument(
        "--no-figures",
        action="store_true",
        help="tables only (faster); the page it writes replaces the one with figures",
    )
    parser.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from harness.report import copy_path
    from harness.spine import report_campaign

    root = Path(args.dir)
    concluded = report_campaign(root, figures=not args.no_figures)
    record = concluded.report.with_name("record.md")
    out.write(
        f"verdict: {concluded.decision.verdict.word}\nreport: {concluded.report}\n"
        f"record: {record}\n"
        "rewrote report.html and record.md from the records; verdict.json, JUnit and the "
        "results store are as `harness gate` last wrote them\n"
    )
    if args.no_figures:
        out.write(
            f"report.html has no figures now (--no-figures): `harness report {root}` draws "
            "them again\n"
        )
    copy = copy_path(root, concluded.decision.analysis.card.campaign)
    if copy is not None:
        out.write(f"copy: {copy}\n")
    return EXIT_OK
