"""``harness gate DIR``: the card's gates over a finished campaign (:mod:`harness.spine`), printed.

:func:`print_conclusion` is what every verb that gates prints (``gate`` and ``run``): the
verdict table, the tally of labels and where the report is.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from harness.spine import Concluded

__all__ = ["print_conclusion", "register"]


def print_conclusion(concluded: Concluded, out: TextIO, *, quiet: bool) -> None:
    """The verdict table and the labels' tally (unless ``quiet``), then the report's path."""
    from harness.report.terminal import label_tally, print_verdict

    analysis, verdict = concluded.decision.analysis, concluded.decision.verdict
    if not quiet:
        print_verdict(verdict, out)
        tally = label_tally([c.comparison.label for c in analysis.comparisons], verdict.passed)
        if tally:
            out.write(tally + "\n")
    out.write(f"report: {concluded.report}\n")


def _cmd_gate(args: argparse.Namespace, out: TextIO) -> int:
    from harness.spine import gate_campaign

    concluded = gate_campaign(Path(args.dir))
    print_conclusion(concluded, out, quiet=args.quiet)
    return concluded.exit_code


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gate``."""
    gate = verbs.add_parser(
        "gate", help="evaluate the card's gates (exit 0 pass, 1 fail, 3 runs incomplete)"
    )
    gate.add_argument("dir", metavar="DIR")
    gate.add_argument("--quiet", action="store_true", help="no verdict table")
    gate.set_defaults(handler=_cmd_gate)
